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
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import decode_config
from healthplane.contracts.subjects import job_key, node_key
from healthplane.runtime.fold import Emit, Inbound, Input, Note, Reject, Step, note
from healthplane_eviction import isolation, rules
from healthplane_eviction import ladder as remediation
from healthplane_eviction import remediating as rem
from healthplane_eviction import validation as vrules
from healthplane_eviction.run_verdict import Rule, Verdict, judge, rule_of
from healthplane_eviction.validation import Gate, Isolating, Run, SeenJob

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
OUTPUTS = ("HP_NODE_EVENTS", "HP_DIRECTIVES", "HP_COMMANDS", "HP_ALLOCATIONS")

# Hold ids look like the reference's (UUIDs) and are derived from the command, so a replayed
# command recreates the very same hold.
HOLD_NAMESPACE = uuid.UUID("6f1d3c52-7b0e-4a7e-9d55-0c1f2b9e8a41")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Limits(msgspec.Struct, frozen=True):
    max_eviction_restarts: int = 3
    evict_on_fault_classes: tuple[str, ...] = ()


class EvictionConfig(msgspec.Struct, frozen=True):
    cluster: Limits = Limits()
    definitions: dict[str, Limits] = {}
    validation: vrules.Policy = vrules.Policy()
    remediation: rem.RemediationPolicy = rem.RemediationPolicy()

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
    gpus: int | None = None  # from its resource report: a suite that needs more excludes it (VAL-4)
    fault_seen: bool = False  # a hardware fault since its last passed validation (VAL-2)
    gate: Gate | None = None  # a release waiting for this node to pass validation (VAL-2)
    fault_details: dict[str, rem.Fault] = {}  # active condition type -> what picks its ladder (REM-1)
    climb: remediation.Climb | None = None  # the remediation episode under way or ended (REM-1)
    climb_actor: str | None = None
    climb_ladder: rem.LadderSpec | None = None
    climb_request: str | None = None  # the agent step whose outcome is awaited
    climb_hold: str | None = None  # the cordon hold the episode placed
    remediation_attempts: list[datetime] = []  # agent steps started, within the window (the bound)
    needs_attention: str | None = None  # why it stopped at NODE_NEEDS_ATTENTION, until service


class EvictionState(msgspec.Struct):
    nodes: dict[str, Node] = {}
    config: EvictionConfig = EvictionConfig()
    runs: dict[str, Run] = {}  # validation job id -> the run in flight (VAL-1)
    isolations: dict[str, Isolating] = {}  # failed job's key -> its isolation (VAL-3)
    jobs: dict[str, SeenJob] = {}  # job key -> where it ran: running jobs, and failed ones kept
    climbing: list[str] = []  # node keys with a remediation step that can time out (the tick's work)



def status(node: Node) -> wire.NodeStatus:
    """SPEC.md's precedence, from what eviction folds itself."""
    if node.offline:
        return "OFFLINE"
    if not node.ready:
        return "NOT_READY"
    return "CORDONED" if node.holds else "READY"


class Out:
    """The records one input produces, with ids derived from that input (deterministic)."""

    def __init__(self, at: datetime, stem: str, *, tick: bool = False) -> None:
        self.at = at
        self.stem = stem
        self.emits: list[Emit] = []
        self.event_ids: list[str] = []
        self.hold_ids: list[str] = []
        self.notes: list[Note] = []  # told by the Processor, for a live input only
        # A tick has no input whose position dedupes its records after a restart: its records
        # carry their (deterministic) ids as message ids instead.
        self.tick = tick

    @classmethod
    def of(cls, inbound: Inbound) -> Out:
        return cls(inbound.at, f"{SERVICE}:{inbound.stream}:{inbound.seq}")

    def _id(self) -> str:
        return f"{self.stem}:{len(self.emits)}"

    def _emit(self, subject: str, record: wire.Record, record_id: str) -> None:
        self.emits.append(Emit(subject, wire.encode(record), msg_id=record_id if self.tick else None))

    def event(self, node: Node, kind: wire.EventType, message: str, actor: str, **fields: Any) -> str:
        event = wire.NodeEvent(id=self._id(), node_id=node.node_id, cluster=node.cluster, type=kind,
                               occurred_at=self.at, message=message, actor=actor, **fields)
        self._emit(subjects.event(node.cluster, node.node_id, kind), event, event.id)
        self.event_ids.append(event.id)
        return event.id

    def directive(self, node: Node, action: wire.DirectiveAction, message: str,
                  allocation_id: str | None = None) -> str:
        directive = wire.Directive(id=self._id(), node_id=node.node_id, cluster=node.cluster, action=action,
                                   message=message, issued_at=self.at, allocation_id=allocation_id)
        self._emit(subjects.directive(node.cluster, node.node_id), directive, directive.id)
        return directive.id

    def job(self, job: wire.Job) -> None:
        self._emit(subjects.job(job.cluster, job.id), job, f"{self.stem}:job:{job.id}")

    def remediate(self, request: wire.RemediationRequest) -> None:
        self._emit(subjects.remediate(request.cluster, request.node_id), request, request.id)

    def outcome(self, command: wire.Command, result: wire.CommandResult, message: str, **fields: Any) -> None:
        outcome = wire.CommandOutcome(command_id=command.id, node_id=command.node_id, cluster=command.cluster,
                                      verb=command.verb, result=result, message=message, decided_at=self.at,
                                      event_ids=list(self.event_ids), hold_ids=list(self.hold_ids), **fields)
        self._emit(subjects.command_outcome(command.cluster, command.node_id), outcome,
                   f"{self.stem}:outcome:{command.id}")


class EvictionCore:
    def initial_state(self) -> EvictionState:
        return EvictionState()

    def step(self, state: EvictionState, inbound: Inbound) -> Step[EvictionState]:
        out = Out.of(inbound)
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
            node.gpus = sum(1 for device in report.devices if device.kind == "gpu")
            if report.remediation is not None:
                self._remediation_outcome(state, node, report.remediation, out, inbound)
        elif inbound.stream == "HP_CONFIG":
            state.config = _config(decode_config(wire.decode(wire.ConfigEnvelope, inbound.data)))
        else:
            raise Reject(f"unexpected input stream {inbound.stream}")
        return Step(state, out.emits, out.notes)

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
            "service": self._service, "validate": self._validate, "isolate": self._isolate,
            "remediate": self._remediate,
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
        if self._gated(state, node, command, cordons, out):
            return
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
        moved, stuck = self._drain_work(node, command, command.active, out)
        message = "Cordoned 1 node(s)" + (f"; requeued {moved} allocation(s)" if command.active else "")
        if stuck:
            message += f"; failed {len(stuck)} that cannot be requeued"
        out.outcome(command, "applied", message, moved=moved, failed=len(stuck) if stuck else None)

    def _drain_work(self, node: Node, command: wire.Command, active: bool,
                    out: Out) -> tuple[int, list[wire.Allocation]]:
        """EVI-2: active requeues what may run again and fails what may not; then NODE_DRAINED."""
        moved, stuck = 0, []
        if active:
            for alloc in list(node.running.values()):
                if alloc.requeueable is False:  # the scheduler cannot run it again (Slurm --no-requeue)
                    stuck.append(alloc)
                    self._end(node, alloc, "fail", rules.drain_fail_message(node.node_id, command.reason, alloc.job_id),
                              out, by_operator=True)
                    continue
                self._end(node, alloc, "requeue", rules.drain_requeue_message(node.node_id, command.reason), out,
                          by_operator=True)
                moved += 1
        mode = "active" if active else "passive"
        detail = f"; {moved} allocation(s) requeued" if active else ""
        if stuck:
            detail += f"; {len(stuck)} failed, not requeueable: job {', '.join(a.job_id for a in stuck)}"
        out.event(node, "NODE_DRAINED", f"drained ({mode}){detail}", command.actor, drain_mode=mode, moved=moved,
                  failed=len(stuck) if stuck else None, command_id=command.id)
        return moved, stuck

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
        if self._gated(state, node, command, chosen, out):
            return
        self._release_holds(node, chosen, command, out)
        out.outcome(command, "applied", rules.released(node.node_id, len(chosen), node.holds.values()))

    def _service(self, state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
        out.event(node, "NODE_SERVICED", f"serviced: {command.reason or 'no reason given'}", command.actor,
                  command_id=command.id)
        if node.climb is not None and node.climb.final:  # an operator took over: the episode is over
            node.climb = node.climb_ladder = node.climb_actor = node.climb_request = node.climb_hold = None
        node.needs_attention = None
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
        run = state.runs.get(alloc.job_id)
        if run is not None:
            self._run_step(state, run, alloc, out)
            return
        if alloc.job_id.startswith(vrules.RUN_PREFIX):
            return  # a finished run's late record: validation work is never the job index's
        node = self._node(state, alloc.cluster, alloc.node_id)
        seen = self._seen(state, alloc)
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
            seen.attributed = [*seen.attributed, node.node_id]
        elif alloc.state == "failed" and not by_operator:
            self._isolate_automatically(state, seen, out)
        self._teardown_when_empty(node, out)
        if node.climb is not None and node.climb.phase == "draining" and not node.running and not node.ending:
            policy = state.config.remediation
            self._climb(state, node, remediation.drained(node.climb, out.at, policy.max_attempts, policy.window), out)

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

    # ------------------------------------------------------------------ validation (VAL)

    def _start_run(self, state: EvictionState, cluster: str, rule: Rule, nodes: list[str],
                   purpose: vrules.Purpose, actor: str, out: Out, *, command_id: str | None = None,
                   isolating: Isolating | None = None, round_: int | None = None) -> Run:
        """Append a validation job pinned to ``nodes`` and say so on each node."""
        run = Run(id=vrules.run_id(out.stem, len(out.emits)), cluster=cluster, rule=rule, nodes=list(nodes),
                  purpose=purpose, actor=actor, command_id=command_id,
                  isolating=isolating.key if isolating else None, round=round_)
        state.runs[run.id] = run
        out.job(wire.Job(id=run.id, cluster=cluster, steps=len(nodes), duration_seconds=0, submitted_at=out.at,
                         submitted_by=SERVICE, nodes=list(nodes), validation=rule.suite))
        record = self._record(run, isolating)
        for node_id in run.nodes:
            out.event(self._node(state, cluster, node_id), "VALIDATION_STARTED", vrules.started_message(run),
                      actor, validation=record, command_id=command_id)
        return run

    @staticmethod
    def _record(run: Run, isolating: Isolating | None = None, verdict: Verdict | None = None) -> wire.ValidationRecord:
        return wire.ValidationRecord(
            suite=run.rule.suite.name, job=run.id, nodes=len(run.nodes), round=run.round,
            isolating=isolating.job_id if isolating else None,
            duration_seconds=round(run.seconds(), 3) if verdict is not None else None,
            reason=verdict.reason if verdict is not None else None)

    def _excluded(self, state: EvictionState, cluster: str, node_id: str, rule: Rule, *,
                  cordoned_excludes: bool = False) -> str | None:
        node = state.nodes.get(node_key(cluster, node_id))
        if node is None:
            return "not a known node"
        return vrules.excluded_reason(known=node.known, gone=node.gone, offline=node.offline, gpus=node.gpus,
                                      needs=rule.suite.gpus, suite=rule.suite.name,
                                      cordoned=cordoned_excludes and bool(node.holds))

    @staticmethod
    def _running_on(state: EvictionState, node: Node) -> Run | None:
        return next((r for r in state.runs.values() if r.cluster == node.cluster and node.node_id in r.nodes), None)

    def _validate(self, state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
        """VAL-1: run a suite on this node; the outcome comes when the run ends."""
        policy = state.config.validation
        problem = vrules.no_suite(command.suite, policy)
        if problem is not None:
            out.outcome(command, "refused", f"cannot validate {node.node_id}: {problem}")
            return
        busy = self._running_on(state, node)
        if busy is not None:
            out.outcome(command, "refused", f"{node.node_id} is already being validated (job {busy.id})")
            return
        rule = policy.rules[command.suite or policy.default_suite or ""]
        why = self._excluded(state, node.cluster, node.node_id, rule)
        if why is not None:
            out.outcome(command, "refused", f"cannot validate {node.node_id}: {why}", excluded={node.node_id: why})
            return
        self._start_run(state, node.cluster, rule, [node.node_id], "validate", command.actor, out,
                        command_id=command.id)

    def _gated(self, state: EvictionState, node: Node, command: wire.Command, releasing: list[wire.Hold],
               out: Out) -> bool:
        """VAL-2: releasing the last holds of a node that carried a hardware fault waits for it to
        pass the default suite. True when this command is answered here (waiting, or refused)."""
        if node.gate is not None:
            out.outcome(command, "refused", f"{node.node_id} is being validated before it returns to service "
                        f"(job {node.gate.run}); its holds are released if it passes")
            return True
        policy = state.config.validation
        left = [h for h in node.holds.values() if h not in releasing]
        if (not releasing or left or not node.fault_seen or not policy.before_return_for(node.definition)
                or policy.default_suite is None or policy.default_suite not in policy.rules):
            return False
        rule = policy.rules[policy.default_suite]
        why = self._excluded(state, node.cluster, node.node_id, rule)
        if why is not None:
            out.outcome(command, "refused", f"{node.node_id} carried a hardware fault and must pass suite "
                        f"{rule.suite.name} before it returns, but cannot be validated: {why}; its holds stay",
                        excluded={node.node_id: why})
            return True
        busy = self._running_on(state, node)
        if busy is not None:
            out.outcome(command, "refused", f"{node.node_id} is being validated (job {busy.id}); release its "
                        "holds once that run has ended")
            return True
        run = self._start_run(state, node.cluster, rule, [node.node_id], "gate", command.actor, out,
                              command_id=command.id)
        node.gate = Gate(run=run.id, command_id=command.id, verb=command.verb, actor=command.actor,
                         hold_ids=[h.id for h in releasing])
        out.outcome(command, "applied", f"{node.node_id} carried a hardware fault: it returns to service once "
                    f"suite {rule.suite.name} passes (validation job {run.id}); its {len(releasing)} hold(s) stay "
                    "until then")
        return True

    def _run_step(self, state: EvictionState, run: Run, alloc: wire.Allocation, out: Out) -> None:
        """One step of a run moved: started (its clock starts: VAL-4), or ended (judged)."""
        node_id = alloc.node_id
        if node_id not in run.nodes or node_id in run.results or alloc.state == "placed":
            return
        if alloc.state == "started":
            run.started = {**run.started, node_id: alloc.at}
            iso = state.isolations.get(run.isolating or "")
            if iso is not None and iso.first_started is None:
                iso.first_started = alloc.at
            return
        seconds = max(0.0, (alloc.at - run.started.get(node_id, alloc.at)).total_seconds())
        exit_code = alloc.exit_code if alloc.exit_code is not None or alloc.state != "finished" else 0
        said = alloc.output or alloc.reason
        verdict = judge(run.rule, exit_code, said or "", timed_out=alloc.timed_out)
        run.results = {**run.results, node_id: vrules.Result(verdict.passed, vrules.step_reason(verdict, said),
                                                              seconds)}
        if run.done:
            self._run_ended(state, run, out)

    def _run_ended(self, state: EvictionState, run: Run, out: Out) -> None:
        del state.runs[run.id]
        verdict = run.verdict()
        iso = state.isolations.get(run.isolating or "")
        record = self._record(run, iso, verdict)
        message = vrules.ended_message(run, verdict)
        kind: wire.EventType = "VALIDATION_PASSED" if verdict.passed else "VALIDATION_FAILED"
        for node_id in run.nodes:
            node = self._node(state, run.cluster, node_id)
            out.event(node, kind, message, run.actor, validation=record, command_id=run.command_id)
            if verdict.passed:
                node.fault_seen = False
        if run.purpose == "validate" and run.command_id is not None:
            command = wire.Command(id=run.command_id, node_id=run.nodes[0], cluster=run.cluster, verb="validate",
                                   actor=run.actor, issued_at=out.at, suite=run.rule.suite.name)
            out.outcome(command, "applied", f"{run.nodes[0]}: {message}", passed=verdict.passed)
        elif run.purpose == "gate":
            self._gate_ended(state, run, verdict, out)
        elif iso is not None:
            self._isolation_result(state, iso, run, verdict, out)

    def _gate_ended(self, state: EvictionState, run: Run, verdict: Verdict, out: Out) -> None:
        node = self._node(state, run.cluster, run.nodes[0])
        gate, node.gate = node.gate, None
        if gate is None or gate.run != run.id or not verdict.passed:
            return  # failed: the holds stay; the event says why and health-ingest raises validation_failed
        command = wire.Command(id=gate.command_id, node_id=node.node_id, cluster=node.cluster,
                               verb=gate.verb, actor=gate.actor, issued_at=out.at)  # type: ignore[arg-type]
        holds = [node.holds[h] for h in gate.hold_ids if h in node.holds]
        self._release_holds(node, holds, command, out)
        if gate.verb == "uncordon" and holds:
            out.event(node, "NODE_UNCORDONED", f"uncordoned after passing suite {run.rule.suite.name}: "
                      f"{len(holds)} cordon hold(s) released", gate.actor, command_id=gate.command_id)

    # ------------------------------------------------------------------ isolation (VAL-3)

    def _seen(self, state: EvictionState, alloc: wire.Allocation) -> SeenJob:
        """Keep where each job ran while it runs, and its failed ones (the newest, bounded)."""
        key = job_key(alloc.cluster, alloc.job_id)
        seen = state.jobs.get(key)
        if seen is None:
            seen = state.jobs[key] = SeenJob(cluster=alloc.cluster, job_id=alloc.job_id)
        seen.at = alloc.at
        if alloc.state in ("placed", "started"):
            seen.nodes = {**seen.nodes, alloc.node_id: alloc.id}
            if alloc.id not in seen.open:
                seen.open = [*seen.open, alloc.id]
            return seen
        seen.open = [a for a in seen.open if a != alloc.id]
        if alloc.state == "failed" and not seen.failed:
            seen.failed = True
            failed = [k for k, j in state.jobs.items() if j.failed and k not in state.isolations]
            for old in sorted(failed, key=lambda k: state.jobs[k].at or _EPOCH)[:-vrules.KEPT_FAILED_JOBS]:
                del state.jobs[old]
        if not seen.open and not seen.failed:
            state.jobs.pop(key, None)
        return seen

    def _isolate(self, state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
        """``healthplane isolate JOB``: bisect the failed job's nodes; the outcome comes at the end."""
        policy = state.config.validation
        problem = vrules.no_suite(command.suite, policy)
        seen = state.jobs.get(job_key(command.cluster, command.job_id or ""))
        if problem is None and seen is None:
            problem = (f"no record of job {command.job_id} in cluster {command.cluster}: isolation needs the "
                       "nodes it ran on (kept for running jobs and the newest failed ones)")
        if problem is None and seen is not None and job_key(seen.cluster, seen.job_id) in state.isolations:
            problem = f"job {command.job_id} is already being isolated"
        if problem is not None or seen is None:
            out.outcome(command, "refused", f"cannot isolate job {command.job_id}: {problem}")
            return
        rule = policy.rules[command.suite or policy.default_suite or ""]
        refusal = self._start_isolation(state, seen, rule, command.actor, out, command)
        if refusal is not None:
            out.outcome(command, "refused", refusal[0], excluded=refusal[1] or None)

    def _isolate_automatically(self, state: EvictionState, seen: SeenJob, out: Out) -> None:
        """VAL-3 "when configured": a multi-node job failed and no node of it carries a fault."""
        policy = state.config.validation
        if (not policy.isolate_auto or seen.isolated or len(seen.nodes) < 2 or policy.default_suite is None
                or policy.default_suite not in policy.rules):
            return
        if any(rules.worst_fault(state.nodes[node_key(seen.cluster, n)].faults) is not None
               for n in seen.nodes if node_key(seen.cluster, n) in state.nodes):
            return  # a node is named already (EVI-7)
        self._start_isolation(state, seen, policy.rules[policy.default_suite], SERVICE, out, None)

    def _start_isolation(self, state: EvictionState, seen: SeenJob, rule: Rule, actor: str, out: Out,
                         command: wire.Command | None) -> tuple[str, dict[str, str]] | None:
        excluded = {n: why for n in sorted(seen.nodes)
                    if (why := self._excluded(state, seen.cluster, n, rule, cordoned_excludes=True)) is not None}
        suspects = [n for n in sorted(seen.nodes) if n not in excluded]
        if not suspects:
            return f"cannot isolate job {seen.job_id}: none of its {len(seen.nodes)} node(s) can be validated", excluded
        policy = state.config.validation
        machine = isolation.start(seen.job_id, suspects, policy.isolate_max_concurrent)
        iso = Isolating(key=job_key(seen.cluster, seen.job_id), cluster=seen.cluster, job_id=seen.job_id, rule=rule,
                        actor=actor, max_concurrent=policy.isolate_max_concurrent, excluded=excluded,
                        command_id=command.id if command else None,
                        command_node=command.node_id if command else None, timeout_s=policy.isolate_timeout_s)
        iso.keep(machine)
        state.isolations[iso.key] = iso
        seen.isolated = True
        self._launch(state, iso, out)
        return None

    def _launch(self, state: EvictionState, iso: Isolating, out: Out) -> None:
        machine, started = isolation.launch(iso.machine())
        iso.keep(machine)
        for step in started:
            self._start_run(state, iso.cluster, iso.rule, list(step.nodes), "isolate", iso.actor, out,
                            isolating=iso, round_=step.round)

    def _isolation_result(self, state: EvictionState, iso: Isolating, run: Run, verdict: Verdict, out: Out) -> None:
        iso.keep(isolation.on_result(iso.machine(), tuple(run.nodes), verdict.passed))
        timed_out = (iso.first_started is not None
                     and (out.at - iso.first_started).total_seconds() > iso.timeout_s)
        if not timed_out:
            self._launch(state, iso, out)
        if not iso.running and (timed_out or not iso.waiting):
            self._isolation_ended(state, iso, out, timed_out)

    def _isolation_ended(self, state: EvictionState, iso: Isolating, out: Out, timed_out: bool) -> None:
        del state.isolations[iso.key]
        seen = state.jobs.get(iso.key)
        for node_id in iso.faulty:
            if seen is not None and node_id in seen.attributed:
                continue  # attributed when it failed there, for the fault it carried (EVI-7)
            node = self._node(state, iso.cluster, node_id)
            out.event(node, "JOB_FAILURE_ATTRIBUTED",
                      f"job {iso.job_id} failed on a node that failed validation (suite {iso.rule.suite.name}, "
                      f"isolated in {iso.rounds} round(s))", SERVICE, fault_class="VALIDATION_FAILED",
                      allocation_id=seen.nodes.get(node_id) if seen else None)
        message = vrules.isolation_summary(iso.job_id, iso.faulty, iso.cleared, iso.rounds, iso.validations)
        if timed_out:
            left = sorted({n for step in iso.waiting for n in step.nodes})
            message = (f"isolation of job {iso.job_id} stopped: it ran past {iso.timeout_s}s; "
                       f"faulty so far: {', '.join(iso.faulty) or 'none'}; not yet cleared: {', '.join(left)}")
        if iso.command_id is not None:
            command = wire.Command(id=iso.command_id, node_id=iso.command_node or iso.faulty[0], cluster=iso.cluster,
                                   verb="isolate", actor=iso.actor, issued_at=out.at, job_id=iso.job_id)
            out.outcome(command, "applied", message, faulty=list(iso.faulty), cleared=list(iso.cleared),
                        excluded=iso.excluded or None)

    # ------------------------------------------------------------------ remediation (REM)

    def _remediate(self, state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
        """REM-1: drain the node, then climb the ladder its worst fault calls for."""
        if node.needs_attention is not None:
            out.outcome(command, "refused", f"{node.node_id} needs attention ({node.needs_attention}): nothing "
                        "automatic touches it until service is recorded")
            return
        if node.climb is not None and not node.climb.final:
            out.outcome(command, "refused", f"{node.node_id} is being remediated already "
                        f"({node.climb.rung.action}, step {node.climb.step + 1} of {len(node.climb.rungs)})")
            return
        policy = state.config.remediation
        order = sorted(node.faults, key=lambda t: (-rules.SEVERITY_RANK.get(node.faults[t], 0),
                                                    wire.CONDITION_TYPES.index(t) if t in wire.CONDITION_TYPES else 99))
        ladder = rem.ladder_for(policy.ladders, node.fault_details, [t for t in order if t not in rules.NOT_A_FAULT])
        current = status(node)
        if current not in ("READY", "CORDONED"):
            out.outcome(command, "refused", rules.not_drainable(node.node_id, current))
            return
        hold = self._hold(node, command, "cordon", out)
        moved, stuck = self._drain_work(node, command, True, out)
        drained = f"drained: {moved} allocation(s) requeued" + (f", {len(stuck)} failed" if stuck else "")
        if ladder is None:
            out.outcome(command, "applied", f"no remediation ladder for the faults of {node.node_id}; {drained}",
                        moved=moved)
            return
        window = policy.window
        recent = [at for at in node.remediation_attempts if out.at - at < window]
        node.climb = remediation.begin(ladder.fault_class, ladder.rungs, tuple(recent))
        node.climb_ladder, node.climb_actor, node.climb_hold = ladder, command.actor, hold.id
        node.climb_request = None
        out.outcome(command, "applied", f"remediating {node.node_id} for {wire.condition_title(ladder.condition)}: "
                    f"{ladder.describe()}; {drained}", moved=moved)
        if not node.running and not node.ending:
            self._climb(state, node, remediation.drained(node.climb, out.at, policy.max_attempts, window), out)

    def _climb(self, state: EvictionState, node: Node, moved: tuple[remediation.Climb, remediation.Decision],
               out: Out) -> None:
        """Keep the ladder's new state and do what it decided."""
        node.climb, decision = moved
        key = node_key(node.cluster, node.node_id)
        if node.climb.final or node.climb.deadline is None:
            state.climbing = [k for k in state.climbing if k != key]
        elif key not in state.climbing:
            state.climbing = [*state.climbing, key]
        actor = node.climb_actor or SERVICE
        attempt = len(node.climb.attempts)
        if decision.action == "run" and decision.step is not None:
            request = wire.RemediationRequest(
                id=f"rem-{uuid.uuid5(HOLD_NAMESPACE, f'{out.stem}:{key}:{node.climb.step}').hex[:16]}",
                node_id=node.node_id, cluster=node.cluster, action=decision.step,  # type: ignore[arg-type]
                attempt=attempt, requested_at=out.at, timeout_seconds=node.climb.rung.timeout_s,
                reason=node.climb.fault_class)
            out.remediate(request)
            node.climb_request = request.id
            node.remediation_attempts = [*node.remediation_attempts[-49:], out.at]
            out.event(node, "REMEDIATION_STARTED", rem.started(decision.step, attempt, node.climb.fault_class), actor,
                      remediation=wire.RemediationRecord(action=decision.step, attempt=attempt,  # type: ignore[arg-type]
                                                         reason=node.climb.fault_class, request_id=request.id))
        elif decision.action == "succeeded" and decision.step is not None:
            node.climb_request = None
            out.event(node, "REMEDIATION_SUCCEEDED", rem.succeeded(decision.step, attempt, decision.why), actor,
                      remediation=wire.RemediationRecord(action=decision.step, attempt=attempt,  # type: ignore[arg-type]
                                                         reason=decision.why))
            self._after_remedy(state, node, out)
        elif decision.action == "replace":
            out.event(node, "REMEDIATION_STARTED", rem.started("replace", attempt, node.climb.fault_class), actor,
                      remediation=wire.RemediationRecord(action="replace", attempt=attempt,
                                                         reason=node.climb.fault_class))
            if node.provisioned:
                command = wire.Command(id=f"{out.stem}:replace", node_id=node.node_id, cluster=node.cluster,
                                       verb="replace", actor=actor, issued_at=out.at,
                                       reason=f"remediation: {node.climb.fault_class}")
                self._deprovision(state, node, command, out)
            else:
                self._needs_attention(node, f"{node.climb.fault_class}: the ladder ends in replace, but "
                                      "Healthplane did not provision this node", actor, out)
        elif decision.action == "needs-attention":
            self._needs_attention(node, decision.why, actor, out)

    def _needs_attention(self, node: Node, why: str, actor: str, out: Out) -> None:
        node.needs_attention = why
        node.climb_request = None
        out.event(node, "NODE_NEEDS_ATTENTION", rem.needs_attention(why), actor)

    def _after_remedy(self, state: EvictionState, node: Node, out: Out) -> None:
        """A step worked: the episode's hold is released, through validation when configured
        (the ladder's suite, or VAL-2's gate)."""
        hold = node.holds.get(node.climb_hold or "")
        if hold is None:
            return
        actor = node.climb_actor or SERVICE
        command = wire.Command(id=f"{out.stem}:return", node_id=node.node_id, cluster=node.cluster,
                               verb="hold-release", actor=actor, issued_at=out.at, hold_ids=[hold.id])
        ladder = node.climb_ladder
        policy = state.config.validation
        suite = ladder.validate_suite if ladder is not None and ladder.validate_suite else None
        if suite is None and policy.before_return_for(node.definition):
            suite = policy.default_suite
        rule = policy.rules.get(suite or "")
        if rule is None or self._running_on(state, node) is not None:
            self._release_holds(node, [hold], command, out)
            return
        run = self._start_run(state, node.cluster, rule, [node.node_id], "gate", actor, out, command_id=command.id)
        node.gate = Gate(run=run.id, command_id=command.id, verb="hold-release", actor=actor, hold_ids=[hold.id])

    def _remediation_outcome(self, state: EvictionState, node: Node, outcome: wire.RemediationOutcome,
                             out: Out, inbound: Inbound) -> None:
        """The agent's word on the step it was sent (REM-2): a reboot counts only with a new boot
        id; a step the host refused runs again after a backoff, up to its retries (REM-4)."""
        climb = node.climb
        if climb is None or node.climb_request != outcome.request_id or climb.phase != "running":
            return  # an outcome already read (the report is re-sent), or of a step no longer awaited
        node.climb_request = None
        ran = outcome.result == "succeeded"
        reason = outcome.reason
        if ran and outcome.action == "reboot" and (outcome.boot_id is None or outcome.boot_id == outcome.boot_id_before):
            ran, reason = False, f"boot id unchanged ({outcome.boot_id}): the reboot did not happen"
        active = climb.fault_class.lower() in node.faults
        policy = state.config.remediation
        moved = remediation.outcome(climb, out.at, ran=ran, reason=reason, fault_active=active,
                                    max_attempts=policy.max_attempts, window=policy.window)
        if not ran:
            said = reason + (f"; {moved[1].why}" if moved[1].action == "retry" else "")
            out.event(node, "REMEDIATION_FAILED", rem.failed(outcome.action, len(climb.attempts), said),
                      node.climb_actor or SERVICE, remediation=wire.RemediationRecord(
                          action=climb.rung.action, attempt=len(climb.attempts), reason=said,  # type: ignore[arg-type]
                          request_id=outcome.request_id))
            out.notes.append(note("warning", "remediation step refused", counter=f"remediation_{outcome.result}",
                                  node_id=node.node_id, action=outcome.action, reason=reason,
                                  retry=moved[1].why if moved[1].action == "retry" else None))
        self._climb(state, node, moved, out)

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
                self._climb(state, node, remediation.timed_out(climb, now, policy.max_attempts, policy.window), out)
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
            self._climb(state, node, remediation.timed_out(climb, now, policy.max_attempts, policy.window), out)
            emits += out.emits
        return Step(state, emits)

    # ------------------------------------------------------------------ health

    def _health(self, state: EvictionState, event: wire.NodeEvent, out: Out) -> None:
        node = self._node(state, event.cluster, event.node_id)
        node.known = True
        if event.type == "CONDITION_RAISED" and event.condition is not None:
            condition = event.condition
            node.faults = {**node.faults, condition.type: condition.severity}
            node.fault_details = {**node.fault_details, condition.type: rem.Fault(
                condition.severity, condition.reason, condition.message)}
            if condition.type not in rules.NOT_A_FAULT:
                node.fault_seen = True
            limits = state.config.limits(node.definition)
            if (condition.severity == "critical" and condition.type not in rules.NOT_A_FAULT
                    and rules.fault_class(condition.type) in limits.evict_on_fault_classes and not node.gone):
                self._fault_evict(node, condition.type, limits.max_eviction_restarts, out)
        elif event.type == "CONDITION_CLEARED" and event.condition is not None:
            node.faults = {k: v for k, v in node.faults.items() if k != event.condition.type}
            node.fault_details = {k: v for k, v in node.fault_details.items() if k != event.condition.type}
            if node.climb is not None and node.climb.fault_class.lower() == event.condition.type:
                self._climb(state, node, remediation.cleared(node.climb), out)
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

    validation = config.validation
    policy = vrules.Policy(
        rules={name: rule_of(name, suite) for name, suite in validation.suites.items()},
        default_suite=validation.default_suite, before_return=validation.validate_before_return,
        before_return_by_definition={name: config.validate_before_return_for(name)
                                     for name in config.provisioner_definitions},
        isolate_auto=validation.isolation.auto, isolate_max_concurrent=validation.isolation.max_concurrent,
        isolate_timeout_s=validation.isolation.timeout_seconds)
    return EvictionConfig(cluster=limits(config.node_health),
                          definitions={name: limits(config.node_health_for(name))
                                       for name in config.provisioner_definitions},
                          validation=policy, remediation=rem.policy_of(config))
