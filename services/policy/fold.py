"""The policy's fold: the Processor core (which input means what, the records it appends).

Inputs: the node events the rules read (scores, conditions, registration, holds, cordons,
drains, replacements), the scorer's per-report node views (a re-check on every report),
allocations (what a node waiting for replacement still runs), resource reports (the node
object of rule sets), the commands stream filtered to eviction's outcomes, the provisioner's
termination results and operators' policy instructions, and the config. Outputs: POLICY_*
node events, DOMAIN_* events (DOM-3, on a domain's reserved id) and commands, nothing else.

``now`` for a record is the time the record itself carries (``occurredAt``, ``at``,
``issuedAt``, ``appliedAt``): time is data, so a replay decides exactly as the first run did,
and tests inject a clock by writing the times they need.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import decode_config
from healthplane.runtime.fold import (
    Emit,
    Inbound,
    Input,
    Note,
    Reject,
    Step,
    its_own,
    note,
    record_of,
)
from healthplane_policy.rules import PolicyState, Record, decide, policy_config

SERVICE = "policy"
EVENT_TYPES = (
    "SCORE_CHANGED", "CONDITION_RAISED", "CONDITION_CLEARED", "NODE_REGISTERED", "HOLD_CREATED", "HOLD_RELEASED",
    "NODE_UNCORDONED", "NODE_DRAINED", "NODE_REPLACED", "NODE_DEPROVISIONED",
    # Its own decisions, read back: after a crash they restore what was decided (REL-1).
    "POLICY_RECOMMENDED", "POLICY_ACTED", "POLICY_HALTED", "DOMAIN_DEGRADED", "DOMAIN_RECOVERED",
)
INPUTS = (
    Input("HP_NODE_EVENTS", tuple(f"hp.event.*.*.{t}" for t in EVENT_TYPES)),
    Input("HP_NODES"),
    Input("HP_ALLOCATIONS", ("hp.alloc.>",)),  # not the reference scheduler's hp.job records
    Input("HP_RESOURCES"),
    Input("HP_COMMANDS", ("hp.outcome.>", "hp.provision.>", "hp.policy.>")),
    Input("HP_CONFIG"),
)
OUTPUTS = ("HP_NODE_EVENTS", "HP_COMMANDS")


# Each stream's codec: the record the core folds and the time it carries (None for records
# whose time decides nothing: inventory, config, operator instructions).
Timed = tuple[Record, datetime | None]


def _event(inbound: Inbound) -> Timed:
    event = its_own(inbound, wire.decode(wire.NodeEvent, inbound.data))
    return event, event.occurred_at


def _view(inbound: Inbound) -> Timed:
    view = its_own(inbound, wire.decode(wire.NodeView, inbound.data))
    return view, view.last_reported_at or inbound.at


def _allocation(inbound: Inbound) -> Timed:
    allocation = its_own(inbound, wire.decode(wire.Allocation, inbound.data))
    return allocation, allocation.at


def _resources(inbound: Inbound) -> Timed:
    return its_own(inbound, wire.decode(wire.ResourceReport, inbound.data)), None


def _commands(inbound: Inbound) -> Timed:
    """``HP_COMMANDS`` as policy reads it: eviction's outcomes, the provisioner's answers and
    operators' policy instructions, told apart by their subject."""
    kind = inbound.subject.split(".", 2)[1]
    if kind == "outcome":
        outcome = its_own(inbound, wire.decode(wire.CommandOutcome, inbound.data))
        return outcome, outcome.decided_at
    if kind == "provision":
        result = its_own(inbound, wire.decode(wire.TerminationResult, inbound.data))
        return result, result.at
    if kind == "policy":
        command = wire.decode(wire.PolicyCommand, inbound.data)
        sender = subjects.sender(inbound.subject, 4)  # bound by nats-server (SEC-1)
        if sender is not None and sender != command.actor:
            raise Reject(f"breaker reset names actor {command.actor!r} but was sent by {sender!r}")
        return command, None
    raise Reject(f"unexpected subject {inbound.subject}")


def _config(inbound: Inbound) -> Timed:
    envelope = wire.decode(wire.ConfigEnvelope, inbound.data)
    return policy_config(decode_config(envelope), envelope.version), None


CODECS: Final = {"HP_NODE_EVENTS": _event, "HP_NODES": _view, "HP_ALLOCATIONS": _allocation,
                 "HP_RESOURCES": _resources, "HP_COMMANDS": _commands, "HP_CONFIG": _config}


def emit_of(output: wire.NodeEvent | wire.Command) -> Emit:
    # The record's own id is its Nats-Msg-Id: ids are numbered per node, so a decision taken
    # again after a crash (triggered by another input) is still recognised as the same one.
    if isinstance(output, wire.NodeEvent):
        return Emit(subjects.event(output.cluster, output.node_id, output.type), wire.encode(output), msg_id=output.id)
    return Emit(subjects.command(output.cluster, output.node_id, output.verb, output.actor), wire.encode(output),
                msg_id=output.id)


class PolicyCore:
    def initial_state(self) -> PolicyState:
        return PolicyState()

    def step(self, state: PolicyState, inbound: Inbound) -> Step[PolicyState]:
        record, at = record_of(CODECS, inbound)
        notes: tuple[Note, ...] = ()
        if isinstance(record, wire.PolicyCommand):  # told by the Processor, for a live input only
            notes = (note("warning", "circuit breaker reset", counter="breaker_reset",
                          cluster=record.cluster, actor=record.actor, reason=record.reason),)
        state, outputs = decide(state, record, at, f"{inbound.stream}:{inbound.seq}", act=inbound.wants_output)
        if not inbound.wants_output:
            return Step(state, (), notes)  # a restart refolding what is already in the streams
        return Step(state, [emit_of(o) for o in outputs], notes)
