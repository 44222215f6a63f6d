"""Eviction's fold: the Processor core (commands, allocations, health events and the
provisioner's answers in; holds, node events, directives and command outcomes out).

Inputs: ``HP_COMMANDS`` (``hp.cmd.>`` and the provisioner's ``hp.provision.>``),
``HP_ALLOCATIONS`` (``hp.alloc.>``: what runs where, with each step's retry declarations),
``HP_NODE_EVENTS`` (conditions and heartbeat, for fault eviction, node loss and attribution),
``HP_RESOURCES`` (registration, readiness, whether the control plane provisioned the
instance) and ``HP_CONFIG``. Every decision is folded into the state in the same step that
emits it, so a restart from a snapshot plus a replay decides nothing twice (REL-1).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from healthplane import configstore, subjects, wire
from healthplane.runtime.processor import Emit, Inbound, Input, Reject
from healthplane.subjects import node_key
from healthplane_eviction import rules

SERVICE = "eviction"
INPUTS = (
    # Commands are judged against what the other inputs hold: they wait for those to fold.
    Input("HP_COMMANDS", ("hp.cmd.>", "hp.provision.>"), after_others=True),
    Input("HP_ALLOCATIONS", ("hp.alloc.>",)),
    Input("HP_NODE_EVENTS", tuple(f"hp.event.*.*.{t}" for t in (
        "CONDITION_RAISED", "CONDITION_CLEARED", "HEARTBEAT_MISSED", "HEARTBEAT_RESUMED"))),
    Input("HP_RESOURCES"),
    Input("HP_CONFIG"),
)
OUTPUTS = ("HP_NODE_EVENTS", "HP_DIRECTIVES", "HP_COMMANDS")

# Hold ids look like the reference's (UUIDs) and are derived from the command, so a replayed
# command recreates the very same hold.
HOLD_NAMESPACE = uuid.UUID("6f1d3c52-7b0e-4a7e-9d55-0c1f2b9e8a41")


class Limits(msgspec.Struct, frozen=True):
    max_eviction_restarts: int = 3
    evict_on_fault_classes: tuple[str, ...] = ()


class EvictionConfig(msgspec.Struct, frozen=True):
    cluster: Limits = Limits()
    definitions: dict[str, Limits] = {}

    def limits(self, definition: str | None) -> Limits:
        return self.definitions.get(definition, self.cluster) if definition else self.cluster


class Node(msgspec.Struct):
    cluster: str
    node_id: str
    known: bool = False
    provisioned: bool | None = None  # None: no resource report yet (EVI-4's retryable case)
    ready: bool = True
    offline: bool = False
    definition: str | None = None
    faults: dict[str, str] = {}  # active condition type -> severity
    holds: dict[str, wire.Hold] = {}
    running: dict[str, wire.Allocation] = {}
    ending: list[str] = []  # told to requeue or fail; still on the node until the scheduler says so
    # Allocations an operator's command ended: their failure is not the hardware's (EVI-7).
    operator_ended: list[str] = []
    teardown: str | None = None  # "deprovision" | "replace" | "force": terminate once empty
    teardown_actor: str | None = None
    terminate_directive: str | None = None  # sent, awaiting the provisioner's answer
    force_command: str | None = None  # a --force command waiting for that answer
    gone: bool = False


class EvictionState(msgspec.Struct):
    nodes: dict[str, Node] = {}
    config: EvictionConfig = EvictionConfig()



def status(node: Node) -> wire.NodeStatus:
    """SPEC.md's precedence, from what eviction folds itself."""
    if node.offline:
        return "OFFLINE"
    if not node.ready:
        return "NOT_READY"
    return "CORDONED" if node.holds else "READY"


class Out:
    """The records one input produces, with ids derived from that input (deterministic)."""

    def __init__(self, inbound: Inbound) -> None:
        self.at = inbound.at
        self.stem = f"{SERVICE}:{inbound.stream}:{inbound.seq}"
        self.emits: list[Emit] = []
        self.event_ids: list[str] = []
        self.hold_ids: list[str] = []

    def _id(self) -> str:
        return f"{self.stem}:{len(self.emits)}"

    def event(self, node: Node, kind: wire.EventType, message: str, actor: str, **fields: Any) -> str:
        event = wire.NodeEvent(id=self._id(), node_id=node.node_id, cluster=node.cluster, type=kind,
                               occurred_at=self.at, message=message, actor=actor, **fields)
        self.emits.append(Emit(subjects.event(node.cluster, node.node_id, kind), wire.encode(event)))
        self.event_ids.append(event.id)
        return event.id

    def directive(self, node: Node, action: wire.DirectiveAction, message: str,
                  allocation_id: str | None = None) -> str:
        directive = wire.Directive(id=self._id(), node_id=node.node_id, cluster=node.cluster, action=action,
                                   message=message, issued_at=self.at, allocation_id=allocation_id)
        self.emits.append(Emit(subjects.directive(node.cluster, node.node_id), wire.encode(directive)))
        return directive.id

    def outcome(self, command: wire.Command, result: wire.CommandResult, message: str, **fields: Any) -> None:
        outcome = wire.CommandOutcome(command_id=command.id, node_id=command.node_id, cluster=command.cluster,
                                      verb=command.verb, result=result, message=message, decided_at=self.at,
                                      event_ids=list(self.event_ids), hold_ids=list(self.hold_ids), **fields)
        self.emits.append(Emit(subjects.command_outcome(command.cluster, command.node_id), wire.encode(outcome)))


class EvictionCore:
    def initial_state(self) -> EvictionState:
        return EvictionState()

    def step(self, state: EvictionState, inbound: Inbound) -> tuple[EvictionState, Sequence[Emit]]:
        out = Out(inbound)
        if inbound.stream == "HP_COMMANDS":
            if inbound.subject.startswith(f"{subjects.PREFIX}.provision."):
                self._termination(state, wire.decode(wire.TerminationResult, inbound.data), out)
            else:
                self._command(state, wire.decode(wire.Command, inbound.data), inbound.subject, out)
        elif inbound.stream == "HP_ALLOCATIONS":
            self._allocation(state, wire.decode(wire.Allocation, inbound.data), out)
        elif inbound.stream == "HP_NODE_EVENTS":
            self._health(state, wire.decode(wire.NodeEvent, inbound.data), out)
        elif inbound.stream == "HP_RESOURCES":
            report = wire.decode(wire.ResourceReport, inbound.data)
            node = self._node(state, report.cluster, report.node_id)
            node.known, node.provisioned, node.ready = True, report.provisioned, report.ready
            node.definition = report.definition
        elif inbound.stream == "HP_CONFIG":
            state.config = _config(configstore.decode_config(wire.decode(wire.ConfigEnvelope, inbound.data)))
        else:
            raise Reject(f"unexpected input stream {inbound.stream}")
        return state, out.emits

    @staticmethod
    def _node(state: EvictionState, cluster: str, node_id: str) -> Node:
        key = node_key(cluster, node_id)
        node = state.nodes.get(key)
        if node is None:
            node = state.nodes[key] = Node(cluster=cluster, node_id=node_id)
        return node

    # ------------------------------------------------------------------ commands

    def _command(self, state: EvictionState, command: wire.Command, subject: str, out: Out) -> None:
        parsed = subjects.parse(subject)
        if (parsed.cluster, parsed.node_id, parsed.rest) != (command.cluster, command.node_id, command.verb):
            raise Reject(f"command {command.id} does not match its subject {subject}")
        # The subject's last token is who sent it, bound by nats-server (SEC-1): a payload
        # that names anyone else is a forgery, never applied.
        if parsed.actor is not None and parsed.actor != command.actor:
            raise Reject(f"command {command.id} names actor {command.actor!r} but was sent by {parsed.actor!r}")
        node = state.nodes.get(node_key(command.cluster, command.node_id))
        if node is None or not node.known or node.gone:
            out.outcome(command, "refused", rules.unknown_node(command.node_id))
            return
        handlers: dict[str, Callable[[EvictionState, Node, wire.Command, Out], None]] = {
            "cordon": self._cordon, "uncordon": self._uncordon, "drain": self._drain, "evict": self._evict,
            "deprovision": self._deprovision, "replace": self._deprovision, "hold-release": self._release,
            "service": self._service,
        }
        handlers[command.verb](state, node, command, out)

    def _hold(self, node: Node, command: wire.Command, effect: wire.HoldEffect, out: Out) -> wire.Hold:
        hold = wire.Hold(id=str(uuid.uuid5(HOLD_NAMESPACE, f"{command.id}:{effect}")), effect=effect,
                         reason=command.reason, actor=command.actor, created_at=out.at)
        node.holds = {**node.holds, hold.id: hold}
        out.event(node, "HOLD_CREATED", f"{effect} hold created: {command.reason or 'no reason given'}",
                  command.actor, hold=hold, command_id=command.id)
        out.hold_ids.append(hold.id)
        return hold

    def _release_holds(self, node: Node, holds: list[wire.Hold], command: wire.Command, out: Out) -> None:
        for hold in holds:
            node.holds = {k: v for k, v in node.holds.items() if k != hold.id}
            out.event(node, "HOLD_RELEASED", f"{hold.effect} hold released", command.actor, hold=hold,
                      command_id=command.id)
            out.hold_ids.append(hold.id)
        if node.teardown in ("deprovision", "replace") and node.terminate_directive is None \
                and not any(h.effect == "deprovision" for h in node.holds.values()):
            node.teardown = node.teardown_actor = None  # releasing the deprovision hold cancels teardown

    def _cordon(self, state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
        hold = self._hold(node, command, "cordon", out)
        out.event(node, "NODE_CORDONED", f"cordoned: {command.reason or 'no reason given'}", command.actor,
                  command_id=command.id)
        out.outcome(command, "applied", rules.hold_created("cordon", node.node_id, hold.id))

    def _uncordon(self, state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
        cordons = [h for h in node.holds.values() if h.effect == "cordon"]
        self._release_holds(node, cordons, command, out)
        if cordons:
            out.event(node, "NODE_UNCORDONED", f"uncordoned: {len(cordons)} cordon hold(s) released",
                      command.actor, command_id=command.id)
        out.outcome(command, "applied", rules.uncordoned(node.node_id, len(cordons), node.holds.values()))

    def _drain(self, state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
        current = status(node)
        if command.batch_id is not None and current != "READY":
            # --all counts what it took out of service, so anything not READY is skipped.
            out.outcome(command, "refused", f"skipped {node.node_id}: {current}", skipped=True)
            return
        if current not in ("READY", "CORDONED"):
            out.outcome(command, "refused", rules.not_drainable(node.node_id, current))
            return
        self._hold(node, command, "cordon", out)
        moved, stuck = 0, []
        if command.active:
            for alloc in list(node.running.values()):
                if alloc.requeueable is False:  # the scheduler cannot run it again (Slurm --no-requeue)
                    stuck.append(alloc)
                    self._end(node, alloc, "fail", rules.drain_fail_message(node.node_id, command.reason, alloc.job_id),
                              out, by_operator=True)
                    continue
                self._end(node, alloc, "requeue", rules.drain_requeue_message(node.node_id, command.reason), out,
                          by_operator=True)
                moved += 1
        mode = "active" if command.active else "passive"
        detail = f"; {moved} allocation(s) requeued" if command.active else ""
        if stuck:
            detail += f"; {len(stuck)} failed, not requeueable: job {', '.join(a.job_id for a in stuck)}"
        out.event(node, "NODE_DRAINED", f"drained ({mode}){detail}", command.actor, drain_mode=mode, moved=moved,
                  failed=len(stuck) if stuck else None, command_id=command.id)
        message = "Cordoned 1 node(s)" + (f"; requeued {moved} allocation(s)" if command.active else "")
        if stuck:
            message += f"; failed {len(stuck)} that cannot be requeued"
        out.outcome(command, "applied", message, moved=moved, failed=len(stuck) if stuck else None)

    def _evict_running(self, state: EvictionState, node: Node, reason: str, out: Out) -> tuple[int, int]:
        limit = state.config.limits(node.definition).max_eviction_restarts
        return self._release_work(node, lambda a: rules.evict_fate(a, limit),
                                  lambda fate, a: rules.held_message(node.node_id, reason, fate, a.node_fault_restarts),
                                  out, by_operator=True)

    def _release_work(self, node: Node, fate_of: Callable[[wire.Allocation], rules.Fate],
                      message: Callable[[rules.Fate, wire.Allocation], str], out: Out, *,
                      by_operator: bool) -> tuple[int, int]:
        """Move or fail every allocation running on the node; (moved, failed)."""
        moved = failed = 0
        for alloc in list(node.running.values()):
            fate = fate_of(alloc)
            self._end(node, alloc, "requeue" if fate == "move" else "fail", message(fate, alloc), out,
                      by_operator=by_operator)
            moved, failed = moved + (fate == "move"), failed + (fate != "move")
        return moved, failed

    def _evict(self, state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
        hold = self._hold(node, command, "evict", out)
        moved, failed = self._evict_running(state, node, _reason(command), out)
        out.event(node, "NODE_EVICTED", f"evicted: {moved} moved, {failed} failed", command.actor, moved=moved,
                  failed=failed, command_id=command.id)
        out.outcome(command, "applied", rules.hold_created("evict", node.node_id, hold.id), moved=moved, failed=failed)

    def _deprovision(self, state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
        if node.provisioned is None:
            if command.batch_id is not None:
                out.outcome(command, "refused", rules.provisioning_unknown_skipped(node.node_id), skipped=True)
            else:
                out.outcome(command, "retry", rules.provisioning_unknown(node.node_id))
            return
        if not node.provisioned:
            if command.batch_id is not None:
                out.outcome(command, "refused", rules.static_skipped(node.node_id), skipped=True)
            else:
                out.outcome(command, "refused", rules.static_node(node.node_id))
            return
        if command.force:
            # No hold: the instance goes now, and the provisioner's own answer is the outcome.
            node.teardown, node.teardown_actor, node.force_command = "force", command.actor, command.id
            node.terminate_directive = out.directive(node, "terminate", f"deprovision --force by {command.actor}")
            return
        existing = next((h for h in node.holds.values() if h.effect == "deprovision"), None)
        if existing is not None:
            # Asked again (policy retrying a rejected replacement, an operator repeating
            # himself): one deprovision hold says it; only the teardown is tried again.
            lines = [f"deprovision hold already in place for {node.node_id}: {existing.id}"]
            out.hold_ids.append(existing.id)
        else:
            lines = [rules.hold_created("deprovision", node.node_id,
                                       self._hold(node, command, "deprovision", out).id)]
        moved = failed = 0
        if command.evict:  # scoped to where the deprovision hold landed: this node
            lines.append(rules.hold_created("evict", node.node_id, self._hold(node, command, "evict", out).id))
            moved, failed = self._evict_running(state, node, _reason(command), out)
            out.event(node, "NODE_EVICTED", f"evicted: {moved} moved, {failed} failed", command.actor, moved=moved,
                      failed=failed, command_id=command.id)
        node.teardown, node.teardown_actor = ("replace" if command.verb == "replace" else "deprovision"), command.actor
        self._teardown_when_empty(node, out)
        out.outcome(command, "applied", "\n".join(lines), moved=moved if command.evict else None,
                    failed=failed if command.evict else None)

    def _release(self, state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
        missing = [h for h in command.hold_ids if h not in node.holds]
        if missing:
            out.outcome(command, "refused", f"hold {missing[0]} not found on {node.node_id}")
            return
        chosen = [h for h in node.holds.values()
                  if (not command.hold_ids or h.id in command.hold_ids)
                  and (command.effect is None or h.effect == command.effect)]
        self._release_holds(node, chosen, command, out)
        out.outcome(command, "applied", rules.released(node.node_id, len(chosen), node.holds.values()))

    def _service(self, state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
        out.event(node, "NODE_SERVICED", f"serviced: {command.reason or 'no reason given'}", command.actor,
                  command_id=command.id)
        out.outcome(command, "applied", f"service recorded for {node.node_id}")

    # ------------------------------------------------------------------ work on the node

    def _end(self, node: Node, alloc: wire.Allocation, action: wire.DirectiveAction, message: str, out: Out, *,
             by_operator: bool) -> None:
        """Tell the scheduler to requeue or fail one allocation; it leaves the running set now so
        that nothing decides about it twice."""
        out.directive(node, action, message, alloc.id)
        node.running = {k: v for k, v in node.running.items() if k != alloc.id}
        node.ending = [*node.ending, alloc.id]
        if by_operator:
            node.operator_ended = [*node.operator_ended, alloc.id]

    def _allocation(self, state: EvictionState, alloc: wire.Allocation, out: Out) -> None:
        node = self._node(state, alloc.cluster, alloc.node_id)
        if alloc.state in ("placed", "started"):
            if alloc.id in node.ending:
                return  # already told to end; a late "started" does not bring it back
            node.running = {**node.running, alloc.id: alloc}
            evict = next((h for h in node.holds.values() if h.effect == "evict"), None)
            if evict is not None or node.gone:
                # The evict hold outlives the eviction: work that lands anyway is taken off again.
                limit = state.config.limits(node.definition).max_eviction_restarts
                fate = rules.evict_fate(alloc, limit)
                reason = (evict.reason if evict else None) or "deprovisioned"
                self._end(node, alloc, "requeue" if fate == "move" else "fail",
                          rules.held_message(node.node_id, reason, fate, alloc.node_fault_restarts), out,
                          by_operator=True)
            return
        node.running = {k: v for k, v in node.running.items() if k != alloc.id}
        node.ending = [a for a in node.ending if a != alloc.id]
        by_operator = alloc.id in node.operator_ended
        if by_operator:
            node.operator_ended = [a for a in node.operator_ended if a != alloc.id]
        fault = rules.worst_fault(node.faults)
        if alloc.state == "failed" and not by_operator and fault is not None:
            # EVI-7: the step failed on hardware that carries a real fault.
            out.event(node, "JOB_FAILURE_ATTRIBUTED",
                      f"job {alloc.job_id} failed on a node with {rules.fault_phrase(fault)}", SERVICE,
                      fault_class=rules.fault_class(fault), allocation_id=alloc.id)
        self._teardown_when_empty(node, out)

    def _teardown_when_empty(self, node: Node, out: Out) -> None:
        if (node.teardown in ("deprovision", "replace") and not node.running and not node.ending
                and node.terminate_directive is None):
            node.terminate_directive = out.directive(node, "terminate",
                                                     f"{node.teardown} by {node.teardown_actor}: no work left")

    def _termination(self, state: EvictionState, result: wire.TerminationResult, out: Out) -> None:
        node = state.nodes.get(node_key(result.cluster, result.node_id))
        if node is None or node.terminate_directive != result.directive_id:
            return  # not ours, or an answer to a directive already settled
        node.terminate_directive = None
        command_id, node.force_command = node.force_command, None
        teardown, actor = node.teardown, node.teardown_actor or SERVICE
        if result.accepted:
            kind: wire.EventType = "NODE_REPLACED" if teardown == "replace" else "NODE_DEPROVISIONED"
            for alloc in list(node.running.values()):  # --force: the work ends with the instance
                self._end(node, alloc, "fail", rules.teardown_message(node.node_id), out, by_operator=True)
            out.event(node, kind, f"{'replaced' if kind == 'NODE_REPLACED' else 'deprovisioned'}: {result.message}",
                      actor, provisioned=True)
            node.gone, node.teardown = True, None
        elif teardown == "force":
            node.teardown = None
        if command_id is not None:
            command = wire.Command(id=command_id, node_id=node.node_id, cluster=node.cluster, verb="deprovision",
                                   actor=actor, issued_at=out.at, force=True)
            out.outcome(command, "applied" if result.accepted else "refused", result.message)

    # ------------------------------------------------------------------ health

    def _health(self, state: EvictionState, event: wire.NodeEvent, out: Out) -> None:
        node = self._node(state, event.cluster, event.node_id)
        node.known = True
        if event.type == "CONDITION_RAISED" and event.condition is not None:
            condition = event.condition
            node.faults = {**node.faults, condition.type: condition.severity}
            limits = state.config.limits(node.definition)
            if (condition.severity == "critical" and condition.type not in rules.NOT_A_FAULT
                    and rules.fault_class(condition.type) in limits.evict_on_fault_classes and not node.gone):
                self._fault_evict(node, condition.type, limits.max_eviction_restarts, out)
        elif event.type == "CONDITION_CLEARED" and event.condition is not None:
            node.faults = {k: v for k, v in node.faults.items() if k != event.condition.type}
        elif event.type == "HEARTBEAT_MISSED":
            node.offline = True
            self._node_gone(state, node, out)
        elif event.type == "HEARTBEAT_RESUMED":
            node.offline = False

    def _fault_evict(self, node: Node, condition_type: str, limit: int, out: Out) -> None:
        """EVI-5: cordon, then move or fail each step by what it declared, then NODE_EVICTED."""
        if not any(h.actor == SERVICE and h.effect == "cordon" for h in node.holds.values()):
            hold = wire.Hold(id=str(uuid.uuid5(HOLD_NAMESPACE, f"{out.stem}:fault")), effect="cordon",
                             reason=rules.fault_phrase(condition_type), actor=SERVICE, created_at=out.at)
            node.holds = {**node.holds, hold.id: hold}
            out.event(node, "HOLD_CREATED", f"cordon hold created: {hold.reason}", SERVICE, hold=hold)
            out.event(node, "NODE_CORDONED", f"cordoned: {hold.reason}", SERVICE)
        moved, failed = self._release_work(
            node, lambda a: rules.fault_fate(a, limit),
            lambda fate, a: rules.fault_message(node.node_id, condition_type, fate, a.node_fault_restarts),
            out, by_operator=False)
        fault = rules.fault_class(condition_type)
        out.event(node, "NODE_EVICTED", f"{rules.fault_phrase(condition_type)}: {moved} moved, {failed} failed",
                  SERVICE, fault_class=fault, moved=moved, failed=failed)

    def _node_gone(self, state: EvictionState, node: Node, out: Out) -> None:
        """EVI-6: the node is gone and its work died with it: release it now, not after a timeout."""
        limit = state.config.limits(node.definition).max_eviction_restarts
        fault = rules.worst_fault(node.faults)
        self._release_work(node, lambda a: rules.fault_fate(a, limit),
                           lambda fate, a: rules.offline_message(node.node_id, fault, fate, a.node_fault_restarts),
                           out, by_operator=False)


def _reason(command: wire.Command) -> str:
    return command.reason or f"evicted by {command.actor}"


def _config(config: Any) -> EvictionConfig:
    def limits(health: Any) -> Limits:
        return Limits(health.max_eviction_restarts, tuple(health.evict_on_fault_classes))

    return EvictionConfig(cluster=limits(config.node_health),
                          definitions={name: limits(config.node_health_for(name))
                                       for name in config.provisioner_definitions})
