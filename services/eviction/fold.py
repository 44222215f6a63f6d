"""Eviction's fold: the Processor core (commands, allocations, health events and the
provisioner's answers in; holds, node events, directives and command outcomes out).

Inputs: ``HP_COMMANDS`` (``hp.cmd.>`` and the provisioner's ``hp.provision.>``),
``HP_ALLOCATIONS`` (``hp.alloc.>``: what runs where, with each step's retry declarations),
``HP_NODE_EVENTS`` (conditions and heartbeat, for fault eviction, node loss and attribution;
promotion rules that ask for a validation run),
``HP_RESOURCES`` (registration, readiness, whether the control plane provisioned the
instance) and ``HP_CONFIG``. Every decision is folded into the state in the same step that
emits it, so a restart from a snapshot plus a replay decides nothing twice (REL-1).

The fold only routes: each concern is one module with its own handlers and rules —
``commands`` (an operator's or policy's command), ``holds`` (holds, and ending a node's work:
where a lost node's work is released), ``work`` (allocations and the provisioner's answers),
``faults`` (health events), ``runs`` (validation and isolation, VAL), ``climbing`` (the
remediation ladder, REM); ``state`` holds the state they share.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

from healthplane.contracts import domains, subjects, wire
from healthplane.contracts.config import decode_config
from healthplane.contracts.subjects import node_key
from healthplane.runtime.fold import (
    Emit,
    IdentityMismatch,
    Inbound,
    Input,
    Step,
    decoder,
    its_own,
    node_record,
    record_of,
)
from healthplane_eviction import climbing, commands, faults, rules, runs, work
from healthplane_eviction import ladder as remediation
from healthplane_eviction import remediating as rem
from healthplane_eviction import validation as vrules
from healthplane_eviction.run_verdict import rule_of
from healthplane_eviction.state import SERVICE as SERVICE
from healthplane_eviction.state import EvictionConfig, Limits, Node, Out, node_of
from healthplane_eviction.state import EvictionState as EvictionState

INPUTS = (
    # Commands are judged against what the other inputs hold: they wait for those to fold.
    Input("HP_COMMANDS", ("hp.cmd.>", "hp.provision.>"), after_others=True),
    Input("HP_ALLOCATIONS", ("hp.alloc.>",)),
    Input("HP_NODE_EVENTS", tuple(f"hp.event.*.*.{t}" for t in (
        "CONDITION_RAISED", "CONDITION_CLEARED", "HEARTBEAT_MISSED", "HEARTBEAT_RESUMED", "RULE_FIRED"))),
    Input("HP_RESOURCES"),
    Input("HP_CONFIG"),
)
OUTPUTS = ("HP_NODE_EVENTS", "HP_DIRECTIVES", "HP_COMMANDS", "HP_ALLOCATIONS")


def _commands_record(inbound: Inbound) -> wire.Command | wire.TerminationResult:
    """``HP_COMMANDS`` carries commands and, on ``hp.provision.>``, the provisioner's answers."""
    if inbound.subject.startswith(f"{subjects.PREFIX}.provision."):
        return its_own(inbound, wire.decode(wire.TerminationResult, inbound.data))
    return its_own(inbound, wire.decode(wire.Command, inbound.data))


CODECS: Final = {"HP_COMMANDS": _commands_record, "HP_ALLOCATIONS": node_record(wire.Allocation),
                 "HP_NODE_EVENTS": node_record(wire.NodeEvent), "HP_RESOURCES": node_record(wire.ResourceReport),
                 "HP_CONFIG": decoder(wire.ConfigEnvelope)}


class EvictionCore:
    def initial_state(self) -> EvictionState:
        return EvictionState()

    def step(self, state: EvictionState, inbound: Inbound) -> Step[EvictionState]:
        out = Out.of(inbound)
        match record_of(CODECS, inbound):
            case wire.Command() as command:
                _command(state, command, inbound.subject, out)
            case wire.TerminationResult() as result:
                work.termination(state, result, out)
            case wire.Allocation() as alloc:
                work.allocation(state, alloc, out)
            case wire.NodeEvent() as event:
                faults.health(state, event, out)
            case wire.ResourceReport() as report:
                node = node_of(state, report.cluster, report.node_id)
                node.known, node.provisioned, node.ready = True, report.provisioned, report.ready
                node.definition = report.definition
                node.gpus = sum(1 for device in report.devices if device.kind == "gpu")
                node.hardware_domains = domains.hardware_domains(report)
                if report.remediation is not None:
                    climbing.remediation_outcome(state, node, report.remediation, out, inbound)
            case wire.ConfigEnvelope() as envelope:
                state.config = _config(decode_config(envelope))
        return Step(state, out.emits, out.notes)

    def tick(self, state: EvictionState, now: datetime) -> Step[EvictionState]:
        """REM-1: a step whose outcome never came, or whose fault persisted, fails at its
        deadline into the next step; never a silent stop."""
        emits: list[Emit] = []
        policy = state.config.remediation
        for key in list(state.climbing):
            node = state.nodes.get(key)
            climb = node.climb if node is not None else None
            if node is None or climb is None or climb.deadline is None or now < climb.deadline:
                continue
            out = Out(now, f"{SERVICE}:tick:{key}:{climb.step}:{climb.deadline.isoformat()}", tick=True)
            if climb.phase == "backoff":  # its refusal was told when it came: the rung runs again
                climbing.step_ladder(state, node, remediation.timed_out(climb, now, policy.max_attempts, policy.window), out)
                emits += out.emits
                continue
            waited = climb.rung.timeout_s
            reason = (f"no outcome from the agent within {waited}s" if node.climb_request is not None
                      else f"{wire.condition_title(climb.fault_class.lower())} persisted {waited}s after it")
            out.event(node, "REMEDIATION_FAILED", rem.failed(climb.rung.action, len(climb.attempts), reason),
                      node.climb_actor or SERVICE, remediation=wire.RemediationRecord(
                          action=climb.rung.action, attempt=len(climb.attempts), reason=reason,  # type: ignore[arg-type]
                          request_id=node.climb_request))
            node.climb_request = None
            climbing.step_ladder(state, node, remediation.timed_out(climb, now, policy.max_attempts, policy.window), out)
            emits += out.emits
        return Step(state, emits)


def _command(state: EvictionState, command: wire.Command, subject: str, out: Out) -> None:
    parsed = subjects.parse(subject)
    if (parsed.cluster, parsed.node_id, parsed.rest) != (command.cluster, command.node_id, command.verb):
        raise IdentityMismatch(f"command {command.id} does not match its subject {subject}")
    # The subject's last token is who sent it, bound by nats-server (SEC-1): a payload
    # that names anyone else is a forgery, never applied.
    if parsed.actor is not None and parsed.actor != command.actor:
        raise IdentityMismatch(f"command {command.id} names actor {command.actor!r} but was sent by {parsed.actor!r}")
    node = state.nodes.get(node_key(command.cluster, command.node_id))
    if node is None or not node.known or node.gone:
        out.outcome(command, "refused", rules.unknown_node(command.node_id))
        return
    handlers: dict[str, Callable[[EvictionState, Node, wire.Command, Out], None]] = {
        "cordon": commands.cordon, "uncordon": commands.uncordon, "drain": commands.drain,
        "evict": commands.evict, "deprovision": commands.deprovision, "replace": commands.deprovision,
        "hold-release": commands.release, "service": commands.service, "validate": runs.validate,
        "isolate": runs.isolate, "remediate": climbing.remediate,
    }
    handlers[command.verb](state, node, command, out)


def _config(config: Any) -> EvictionConfig:
    def limits(health: Any) -> Limits:
        return Limits(health.max_eviction_restarts, tuple(health.evict_on_fault_classes))

    validation = config.validation
    policy = vrules.Policy(
        rules={name: rule_of(name, suite) for name, suite in validation.suites.items()},
        default_suite=validation.default_suite, before_return=validation.validate_before_return,
        before_return_by_definition={name: config.validate_before_return_for(name)
                                     for name in config.provisioner_definitions},
        isolate_auto=validation.isolation.auto, isolate_max_concurrent=validation.isolation.max_concurrent,
        isolate_timeout_s=validation.isolation.timeout_seconds,
        isolate_together=tuple(validation.isolation.keep_together))
    return EvictionConfig(cluster=limits(config.node_health),
                          definitions={name: limits(config.node_health_for(name))
                                       for name in config.provisioner_definitions},
                          validation=policy, remediation=rem.policy_of(config), domains=config.domains.spec())
