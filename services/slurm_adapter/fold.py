"""The Slurm adapter's core: a Processor fold and a pure reconcile pass (SLU-1..5, EVI-8).

Inputs: ``HP_NODES`` (the scorer's node views: holds, score, definition), ``HP_CONFIG``
(``drainBelow`` per definition), ``HP_DIRECTIVES`` (eviction's requeue / fail / terminate),
``HP_ALLOCATIONS`` (its own allocation records, and eviction's validation jobs on ``hp.job``)
and ``HP_COMMANDS`` filtered to ``hp.provision`` (its own answers to terminations). Outputs:
``hp.alloc`` records, ``hp.provision`` answers, and ``hp.cmd …hold-release.slurm`` when an
administrator resumed one of our drains in Slurm.

A validation job (VAL-1) runs as one ``sbatch`` job over its nodes inside a reservation of
them, created first and deleted once the job has ended and our drains are back; while it is in
flight our drain on those nodes is lifted, since a DRAIN node runs nothing, reservation or not.

``step`` only folds. ``reconcile(state, observation, now)`` is level-based: it compares what
Slurm shows with what the state requires and returns the records to store and the Slurm
commands to run; run again on the same inputs it asks for nothing new, so a lost command, a
restarted slurmctld or a restarted adapter heals at the next pass. ``settle`` folds the
commands' results back. Every record the pass writes is applied to the state at once, and
folding it again later changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from healthplane.contracts import gating, subjects, wire
from healthplane.runtime.fold import Emit, Inbound, Input, Note, Reject, Step, its_own
from healthplane_slurm_adapter.records import SlurmError, SlurmJob, SlurmNode
from healthplane_slurm_adapter.rules import (
    ENDED,
    OUTCOMES,
    RUNNING,
    SCHEDULER,
    AdapterState,
    ForeignDrain,
    NodeNames,
    NodeWant,
    Observation,
    Open,
    OurDrain,
    Validation,
    allocation_id,
    causes,
    confirmed,
    drain_message,
    drain_reason,
    end_reason,
    foreign_drain,
    is_ours,
    output_path,
    reservation_name,
    run_end,
    run_of_reservation,
    sbatch_argv,
    slurm_job_of,
    unix,
    wait_status,
)

SERVICE = "slurm-adapter"
ACTOR = "slurm"  # who an administrator's RESUME in Slurm is recorded as (its commands' actor)
INPUTS = (
    Input("HP_NODES"),
    Input("HP_CONFIG"),
    Input("HP_DIRECTIVES"),
    Input("HP_ALLOCATIONS", ("hp.alloc.>", "hp.job.>")),
    Input("HP_COMMANDS", ("hp.provision.>",)),
    # JOB-4: its own SCHEDULER_DRAINED / _UNDRAINED, so a restart knows what it recorded.
    Input("HP_NODE_EVENTS", ("hp.event.*.*.SCHEDULER_DRAINED", "hp.event.*.*.SCHEDULER_UNDRAINED")),
)
OUTPUTS = ("HP_ALLOCATIONS", "HP_COMMANDS", "HP_NODE_EVENTS", "HP_JOB_OUTCOMES")
# An ended allocation's tombstone outlives the job in Slurm's queue (MinJobAge, 300 s by
# default) by a wide margin, then goes.
TOMBSTONE_TTL: Final = timedelta(hours=6)


@dataclass(frozen=True, slots=True)
class Drain:
    node: str
    reason: str


@dataclass(frozen=True, slots=True)
class Resume:
    node: str


@dataclass(frozen=True, slots=True)
class Requeue:
    job_id: int
    directive_id: str


@dataclass(frozen=True, slots=True)
class Cancel:
    job_id: int
    directive_id: str


@dataclass(frozen=True, slots=True)
class PowerDown:
    node: str
    directive: wire.Directive


@dataclass(frozen=True, slots=True)
class Reserve:
    """A validation run's reservation of its nodes (VAL-1)."""

    name: str
    nodes: tuple[str, ...]
    user: str


@dataclass(frozen=True, slots=True)
class Unreserve:
    name: str


@dataclass(frozen=True, slots=True)
class Submit:
    """``sbatch`` of a validation run; the output directory is made first."""

    run_id: str
    argv: tuple[str, ...]
    output_dir: str


@dataclass(frozen=True, slots=True)
class CancelRun:
    """A second Slurm job of one validation run (an ``sbatch`` that timed out, yet landed)."""

    job_id: int
    run_id: str


Action = Drain | Resume | Requeue | Cancel | PowerDown | Reserve | Unreserve | Submit | CancelRun
Outcome = tuple[Action, SlurmError | None]


@dataclass
class Pass:
    """What one reconcile pass decided: records to store now, commands to run, what to say."""

    emits: list[Emit]
    actions: list[Action]
    notes: list[Note]


class AdapterCore:
    def __init__(self, cluster: str = "default", names: NodeNames | None = None, *,
                 reason_prefix: str = "healthplane:", max_requeue: int = 5, confirm_s: float = 10.0,
                 settle_s: float = 30.0, output_dir: str = "/var/lib/healthplane/slurm-adapter/validation",
                 partition: str | None = None, user: str = "root") -> None:
        self.cluster = cluster
        self.names = names or NodeNames()
        self.prefix = reason_prefix
        self.max_requeue = max_requeue  # Slurm's MaxBatchRequeue default: the retry budget it keeps
        self.confirm_s = confirm_s
        self.settle_s = settle_s  # a directive's command is not sent again sooner than this
        self.output_dir = output_dir  # where validation runs write their output (VAL-1)
        self.partition = partition  # validation runs' partition; None: Slurm's default
        self.user = user  # who submits validation runs: their reservations are for that user
        self._told: set[tuple[str, str]] = set()  # (what, whom) said once already

    def initial_state(self) -> AdapterState:
        return AdapterState()

    # ------------------------------------------------------------------ the fold

    def step(self, state: AdapterState, inbound: Inbound) -> Step[AdapterState]:
        if inbound.stream == "HP_NODES":
            view = its_own(inbound, wire.decode(wire.NodeView, inbound.data))
            if view.cluster == self.cluster:
                state.nodes[view.node_id] = NodeWant(holds=list(view.holds), score=view.score,
                                                     definition=view.definition)
        elif inbound.stream == "HP_CONFIG":
            envelope = wire.decode(wire.ConfigEnvelope, inbound.data)
            state.drain_below, state.drain_below_by_definition = gating.thresholds(envelope)
            state.config_version = envelope.version
        elif inbound.stream == "HP_DIRECTIVES":
            self._on_directive(state, its_own(inbound, wire.decode(wire.Directive, inbound.data)))
        elif inbound.stream == "HP_ALLOCATIONS" and inbound.subject.startswith(f"{subjects.PREFIX}.job."):
            self._on_job(state, wire.decode(wire.Job, inbound.data))
        elif inbound.stream == "HP_ALLOCATIONS":
            self._on_allocation(state, its_own(inbound, wire.decode(wire.Allocation, inbound.data)))
        elif inbound.stream == "HP_NODE_EVENTS":
            self._on_event(state, its_own(inbound, wire.decode(wire.NodeEvent, inbound.data)))
        elif inbound.stream == "HP_COMMANDS":
            result = its_own(inbound, wire.decode(wire.TerminationResult, inbound.data))
            if result.cluster == self.cluster:
                state.answered[result.directive_id] = result.accepted
                state.pending = [d for d in state.pending if d.id != result.directive_id]
        else:
            raise Reject(f"unexpected input {inbound.subject} on {inbound.stream}")
        return Step(state, ())

    def _on_event(self, state: AdapterState, event: wire.NodeEvent) -> None:
        """JOB-4: what it recorded of a drain someone else set, folded back."""
        drain = event.scheduler
        if event.cluster != self.cluster or drain is None or drain.scheduler != SCHEDULER:
            return
        if event.type == "SCHEDULER_DRAINED":
            state.foreign[drain.scheduler_node] = ForeignDrain(
                node_id=event.node_id, state=drain.state, reason=drain.reason, set_by=drain.set_by,
                set_at=int(drain.set_at.timestamp()) if drain.set_at else 0)
        elif event.type == "SCHEDULER_UNDRAINED":
            state.foreign.pop(drain.scheduler_node, None)

    def _on_directive(self, state: AdapterState, directive: wire.Directive) -> None:
        if directive.cluster != self.cluster:
            return
        if directive.action in ("requeue", "fail") and not directive.allocation_id:
            raise Reject(f"directive {directive.id}: {directive.action} needs an allocationId")
        if directive.id in state.answered or any(d.id == directive.id for d in state.pending):
            return  # folded again after a snapshot
        state.pending.append(directive)

    def _on_job(self, state: AdapterState, job: wire.Job) -> None:
        """Eviction's validation jobs only: any other job is the reference scheduler's (``sim submit``)."""
        if job.cluster != self.cluster or job.validation is None or job.id in state.validations:
            return
        if not job.nodes or len(job.nodes) != job.steps:
            raise Reject(f"validation job {job.id}: {job.steps} step(s) need as many nodes (got {job.nodes})")
        state.validations[job.id] = Validation(id=job.id, nodes=list(job.nodes), suite=job.validation)

    def _on_allocation(self, state: AdapterState, alloc: wire.Allocation) -> None:
        if alloc.cluster != self.cluster:
            return
        run = state.validations.get(alloc.job_id)
        if run is not None:
            self._step_recorded(run, alloc.node_id, alloc.state, slurm_job_of(alloc.id), alloc.at)
            return
        if not is_ours(alloc.id):
            return
        if alloc.state in ("placed", "started"):
            if alloc.id not in state.ended:
                state.open[alloc.id] = Open(job_id=alloc.job_id, node_id=alloc.node_id,
                                            attempt=alloc.node_fault_restarts)
        else:
            state.open.pop(alloc.id, None)
            state.ended[alloc.id] = alloc.at

    # ------------------------------------------------------------------ the pass

    def reconcile(self, state: AdapterState, seen: Observation, now: datetime) -> tuple[AdapterState, Pass]:
        out = Pass([], [], [])
        down = {node.name for node in seen.nodes if node.down}
        runs, validating = self._validations(state, seen, now, out)
        jobs = {str(job.job_id): job for job in seen.jobs if job.job_id not in runs}
        self._allocations(state, seen, jobs, down, now, out)
        self._directives(state, {node.name: node for node in seen.nodes}, jobs, now, out)
        draining = self._drains(state, seen, validating, now, out)
        self._foreign_drains(state, seen, now, out)
        self._reservations(state, seen, draining, out)
        # Tombstones of jobs Slurm no longer lists, once they are old.
        state.ended = {a: at for a, at in state.ended.items() if now - at < TOMBSTONE_TTL}
        state.validations = {k: run for k, run in state.validations.items()
                             if run.ended_at is None or now - run.ended_at < TOMBSTONE_TTL}
        state.job_reasons = {j: r for j, r in state.job_reasons.items() if j in jobs}
        return state, out

    def settle(self, state: AdapterState, outcomes: Sequence[Outcome], now: datetime) -> Step[AdapterState]:
        """The commands' results: a termination's answer; a directive whose command could not
        reach Slurm is sent again at the next pass, one Slurm refused is dropped and said."""
        emits: list[Emit] = []
        for action, error in outcomes:
            if isinstance(action, PowerDown):
                directive = action.directive
                if error is not None and error.transient:
                    state.in_flight.pop(directive.id, None)
                    continue
                accepted = error is None
                message = (f"{directive.node_id} powered down (Slurm node {action.node}, POWER_DOWN)" if accepted
                           else f"Slurm refused to power down {action.node}: {error.message if error else ''}")
                emits.append(self._answer(state, directive, accepted, message, now))
            elif isinstance(action, Requeue | Cancel) and error is not None:
                state.in_flight.pop(action.directive_id, None)
                if not error.transient:
                    state.pending = [d for d in state.pending if d.id != action.directive_id]
                    state.job_reasons.pop(str(action.job_id), None)  # Slurm did not do it: not our end
        return Step(state, emits)

    def _answer(self, state: AdapterState, directive: wire.Directive, accepted: bool, message: str,
                now: datetime) -> Emit:
        state.answered[directive.id] = accepted
        state.pending = [d for d in state.pending if d.id != directive.id]
        state.in_flight.pop(directive.id, None)
        result = wire.TerminationResult(directive_id=directive.id, node_id=directive.node_id, cluster=self.cluster,
                                        accepted=accepted, message=message, at=now)
        return Emit(subjects.provision(self.cluster, directive.node_id), wire.encode(result),
                    msg_id=f"{SERVICE}:{self.cluster}:terminate:{directive.id}")

    # ------------------------------------------------------------------ allocations (SLU-3)

    def _allocations(self, state: AdapterState, seen: Observation, jobs: dict[str, SlurmJob], down: set[str],
                     now: datetime, out: Pass) -> None:
        open_by_job: dict[str, list[str]] = {}
        for alloc_id, alloc in state.open.items():
            open_by_job.setdefault(alloc.job_id, []).append(alloc_id)
        for job_id, job in jobs.items():
            slurm_state = job.job_state.upper()
            requeued = False
            for alloc_id in open_by_job.get(job_id, []):
                if state.open[alloc_id].attempt < job.restart_cnt:  # run again since: requeued
                    reason = state.job_reasons.get(job_id) or f"requeued by Slurm ({job.state_reason})"
                    self._record(state, job, state.open[alloc_id], alloc_id, "requeued", reason, now, out)
                    requeued = True
            if requeued:  # our reason was that run's, never the next one's
                state.job_reasons.pop(job_id, None)
            if slurm_state in RUNNING:
                for name in job.node_names:
                    node_id = self.names.node_id(name)
                    alloc_id = allocation_id(job_id, job.restart_cnt, name)
                    if alloc_id not in state.open and alloc_id not in state.ended:
                        alloc = Open(job_id=job_id, node_id=node_id, attempt=job.restart_cnt)
                        self._record(state, job, alloc, alloc_id, "started", None, now, out)
            elif slurm_state in ENDED:
                for name in job.node_names:
                    alloc_id = allocation_id(job_id, job.restart_cnt, name)
                    if alloc_id in state.ended:
                        continue
                    alloc = state.open.get(alloc_id) or Open(job_id=job_id, node_id=self.names.node_id(name),
                                                            attempt=job.restart_cnt)
                    why = end_reason(job, slurm_state, down, state.job_reasons.get(job_id))
                    self._record(state, job, alloc, alloc_id, ENDED[slurm_state], why, now, out)
                state.job_reasons.pop(job_id, None)  # this run is over: a later one is Slurm's to explain
        # Jobs that left Slurm's queue while we were away: accounting says how they ended.
        for job_id, alloc_ids in open_by_job.items():
            if job_id in jobs or not job_id.isdigit():
                continue
            accounted = seen.ended.get(int(job_id))
            record_state = ENDED.get(accounted or "", "finished")
            reason = (f"{accounted} (from Slurm accounting)" if accounted
                      else "left Slurm's queue unobserved; end state unknown (no Slurm accounting)")
            found = seen.accounted.get(int(job_id))
            for alloc_id in alloc_ids:
                if alloc_id in state.open:
                    alloc = state.open[alloc_id]
                    self._record(state, None, alloc, alloc_id, record_state, reason, now, out)
                    if accounted:  # with no accounting its end is unknown: no outcome it cannot prove
                        self._outcome(alloc, alloc_id, accounted, seen.exits.get(int(job_id), 0), reason, now, out,
                                      source="accounting", started=found.started_at if found else 0,
                                      ended=found.ended_at if found else 0, account=found.account if found else "",
                                      user=found.user if found else "", partition=found.partition if found else "",
                                      size=found.size if found else len(alloc_ids))

    def _record(self, state: AdapterState, job: SlurmJob | None, alloc: Open, alloc_id: str,
                record_state: wire.AllocationState, reason: str | None, now: datetime, out: Pass) -> None:
        """One allocation record, applied to the state now. The job's requeue flag is its
        retry declaration: a requeueable Slurm job may be moved off a faulty node."""
        requeueable = job.requeue if job is not None else None
        record = wire.Allocation(
            id=alloc_id, job_id=alloc.job_id, node_id=alloc.node_id, cluster=self.cluster, state=record_state, at=now,
            reason=reason, retry_on=["node"] if requeueable else [],
            retry_attempts=self.max_requeue if requeueable else 0,
            restart="on-node-fault" if requeueable else "never", node_fault_restarts=alloc.attempt,
            requeueable=requeueable, user=job.user_name if job else None,
            partition=job.partition if job else None,
            nodes=[self.names.node_id(n) for n in job.node_names] if job else None)
        out.emits.append(Emit(subjects.allocation(self.cluster, alloc.node_id, alloc_id), wire.encode(record),
                              msg_id=f"{SERVICE}:{self.cluster}:{alloc_id}:{record_state}"))
        if job is not None and record_state in ("finished", "failed"):
            self._outcome(alloc, alloc_id, job.job_state.upper(), job.exit_code, reason, now, out,
                          started=job.start_time, ended=job.end_time, account=job.account, user=job.user_name,
                          partition=job.partition, size=job.node_count or len(job.node_names),
                          nodes=[self.names.node_id(n) for n in job.node_names])
        if record_state == "started":
            state.open[alloc_id] = alloc
        else:
            state.open.pop(alloc_id, None)
            state.ended[alloc_id] = now

    def _outcome(self, alloc: Open, alloc_id: str, slurm_state: str, status: int, reason: str | None,
                 now: datetime, out: Pass, *, source: wire.OutcomeSource = "observed", started: int = 0,
                 ended: int = 0, account: str = "", user: str = "", partition: str = "", size: int = 0,
                 nodes: list[str] | None = None) -> None:
        """JOB-1: how the run ended on this node, once, beside its last allocation record (same
        deterministic id, so a pass repeated after a restart is de-duplicated)."""
        kind = OUTCOMES.get(slurm_state)
        if kind is None:
            return
        exit_code, signal_number = wait_status(status)
        started_at, ended_at = unix(started), unix(ended) or now
        record = wire.JobOutcome(
            job_id=alloc.job_id, node_id=alloc.node_id, cluster=self.cluster, outcome=kind, ended_at=ended_at,
            scheduler=SCHEDULER, source=source, attempt=alloc.attempt, started_at=started_at,
            runtime_seconds=max(0.0, (ended_at - started_at).total_seconds()) if started_at else None,
            exit_code=exit_code, signal=signal_number, size=max(1, size), nodes=nodes or None,
            partition=partition or None, user=user or None, account=account or None,
            reason=reason if kind != "completed" else None)
        out.emits.append(Emit(subjects.job_outcome(self.cluster, alloc.node_id, f"{alloc.job_id}.{alloc.attempt}"),
                              wire.encode(record), msg_id=f"{SERVICE}:{self.cluster}:{alloc_id}:outcome"))

    # ------------------------------------------------------------------ Slurm's own word (JOB-4)

    def _foreign_drains(self, state: AdapterState, seen: Observation, now: datetime, out: Pass) -> None:
        """A drain, DOWN or FAIL someone else set becomes SCHEDULER_DRAINED (again when its state,
        reason or author changes), its end SCHEDULER_UNDRAINED. Evidence only: the drain
        logic above never resumes or overwrites it (SLU-2)."""
        for node in seen.nodes:
            found = foreign_drain(node, self.prefix)
            known = state.foreign.get(node.name)
            if found is not None:
                found.node_id = self.names.node_id(node.name)
                if known is None or (known.state, known.reason, known.set_by) != (found.state, found.reason,
                                                                                  found.set_by):
                    out.emits.append(self._drain_event("SCHEDULER_DRAINED", node.name, found, now))
                    state.foreign[node.name] = found
            elif known is not None:
                out.emits.append(self._drain_event("SCHEDULER_UNDRAINED", node.name, known, now))
                del state.foreign[node.name]

    def _drain_event(self, kind: wire.EventType, name: str, drain: ForeignDrain, now: datetime) -> Emit:
        event_id = f"{SERVICE}:{self.cluster}:{kind.lower()}:{name}:{drain.state}:{drain.set_at}"
        event = wire.NodeEvent(
            id=event_id, node_id=drain.node_id, cluster=self.cluster, type=kind, occurred_at=now,
            message=drain_message(drain, lifted=kind == "SCHEDULER_UNDRAINED"), actor=SERVICE,
            scheduler=wire.SchedulerDrain(scheduler=SCHEDULER, scheduler_node=name, state=drain.state,
                                          reason=drain.reason, set_by=drain.set_by, set_at=unix(drain.set_at)))
        return Emit(subjects.event(self.cluster, drain.node_id, kind), wire.encode(event), msg_id=event_id)

    # ------------------------------------------------------------------ directives (SLU-4)

    def _directives(self, state: AdapterState, nodes: dict[str, SlurmNode], jobs: dict[str, SlurmJob],
                    now: datetime, out: Pass) -> None:
        keep: list[wire.Directive] = []
        acted: set[str] = set()  # a job is requeued or cancelled once a pass, whatever its node count
        clock = now.timestamp()
        for directive in state.pending:
            sent_at = state.in_flight.get(directive.id)
            recent = sent_at is not None and clock - sent_at < self.settle_s
            if directive.action == "terminate":
                if directive.id in state.answered:
                    continue
                name = self.names.slurm_name(directive.node_id)
                if name is None or name not in nodes:
                    out.emits.append(self._answer(state, directive, False,
                                                  f"{directive.node_id} is not a node of this Slurm cluster", now))
                    continue
                keep.append(directive)
                if not recent:
                    state.in_flight[directive.id] = clock
                    out.actions.append(PowerDown(name, directive))
                continue
            alloc = state.open.get(directive.allocation_id or "")
            job = jobs.get(alloc.job_id) if alloc else None
            if alloc is None or job is None or job.restart_cnt != alloc.attempt or job.job_state.upper() not in RUNNING:
                state.in_flight.pop(directive.id, None)
                if sent_at is None:  # obeyed, then ended: nothing to say; else it was over before
                    out.notes.append(_not_obeyed(directive, "allocation is not running in Slurm"))
                continue
            keep.append(directive)
            if recent:
                acted.add(alloc.job_id)  # its command is still settling: none for the job's other directives
                continue
            if alloc.job_id in acted:
                state.in_flight.setdefault(directive.id, clock)  # the job's command is this one's too
                continue
            acted.add(alloc.job_id)
            state.in_flight[directive.id] = clock
            if directive.action == "requeue" and job.requeue:
                state.job_reasons[alloc.job_id] = directive.message
                out.actions.append(Requeue(job.job_id, directive.id))
            else:
                why = directive.message if directive.action == "fail" else (
                    f"{directive.message}; job {job.job_id} is not requeueable in Slurm, so it was cancelled")
                state.job_reasons[alloc.job_id] = why
                out.actions.append(Cancel(job.job_id, directive.id))
        state.pending = keep

    # ------------------------------------------------------------------ validation runs (VAL-1)

    def _validations(self, state: AdapterState, seen: Observation, now: datetime,
                     out: Pass) -> tuple[set[int], set[str]]:
        """Each run in flight, one step further: its reservation, then its job (submitted once:
        a job named after the run is found, whoever submitted it), then its records as Slurm
        shows the job. Returns the Slurm jobs that are validation runs (no one else's
        allocations) and the Slurm nodes whose reservation stands for a run in flight."""
        by_name: dict[str, list[SlurmJob]] = {}
        for listed in seen.jobs:
            if listed.name in state.validations:
                by_name.setdefault(listed.name, []).append(listed)
        runs = {listed.job_id for named in by_name.values() for listed in named}
        in_slurm = {node.name for node in seen.nodes}
        validating: set[str] = set()
        for run in state.validations.values():
            if run.ended_at is not None:
                continue
            names = [self.names.slurm_name(node_id) for node_id in run.nodes]
            slurm_nodes = [name for name in names if name is not None and name in in_slurm]
            # The job Slurm runs it as: the one a record named, else the first submitted.
            found = sorted(by_name.get(run.id, []), key=lambda j: (j.job_id != run.slurm_job, j.job_id))
            for extra in found[1:]:
                if extra.job_state.upper() not in ENDED:
                    out.actions.append(CancelRun(extra.job_id, run.id))
            job = found[0] if found else None
            if job is None and run.slurm_job is not None:
                self._run_left_queue(run, seen, now, out)
                continue
            if job is None and len(slurm_nodes) < len(run.nodes):  # it cannot run: say so, not wait forever
                missing = [n for n, name in zip(run.nodes, names, strict=True) if name is None or name not in in_slurm]
                self._run_ended(run, None, "failed", None, False,
                                f"not a node of this Slurm cluster: {', '.join(missing)}", None, now, out)
                continue
            if job is not None and job.job_state.upper() in ENDED:
                self._run_finished(run, job, seen, now, out)
                continue
            reservation = reservation_name(run.id)
            reserved = reservation in seen.reservations
            if not reserved:  # first, or gone since (deleted by hand): nothing may start before it
                out.actions.append(Reserve(reservation, tuple(slurm_nodes), self.user))
            else:
                validating.update(slurm_nodes)
            if job is None:
                if reserved:
                    argv = sbatch_argv(run, slurm_nodes, self.output_dir, self.partition)
                    out.actions.append(Submit(run.id, tuple(argv), self.output_dir))
                continue
            record_state: wire.AllocationState = "started" if job.job_state.upper() in RUNNING else "placed"
            for node_id, name in zip(run.nodes, names, strict=True):
                if not run.recorded(node_id, record_state):
                    self._run_record(run, job.job_id, node_id, name or node_id, record_state, now, out, job=job)
        return runs, validating

    def _run_finished(self, run: Validation, job: SlurmJob, seen: Observation, now: datetime, out: Pass) -> None:
        end = run_end(job.job_state.upper(), job.exit_code, job.state_reason)
        output = seen.outputs.get(run.id)
        if output is None:
            self._tell_once(out, "validation output not found: is the output directory shared with the nodes?",
                            "validation_output_missing", run.id, run_id=run.id,
                            path=output_path(self.output_dir, run.id))
        self._run_ended(run, job.job_id, end.state, end.exit_code, end.timed_out, end.reason, output, now, out,
                        job=job)

    def _run_left_queue(self, run: Validation, seen: Observation, now: datetime, out: Pass) -> None:
        """The run's job left Slurm's queue while we were away: accounting says how it ended; with
        none, nothing does, and the run is submitted again rather than judged on a guess."""
        job_id = run.slurm_job or 0
        accounted = seen.ended.get(job_id)
        if accounted is None:
            out.notes.append(Note("warning", "validation job left Slurm's queue unobserved; submitted again",
                                  "validation_resubmitted", {"run_id": run.id, "slurm_job": job_id}))
            run.slurm_job, run.steps = None, {}
            return
        end = run_end(accounted, seen.exits.get(job_id, 0))
        reason = f"{end.reason} (from Slurm accounting)" if end.reason else None
        self._run_ended(run, job_id, end.state, end.exit_code, end.timed_out, reason, seen.outputs.get(run.id), now,
                        out)

    def _run_ended(self, run: Validation, job_id: int | None, record_state: wire.AllocationState,
                   exit_code: int | None, timed_out: bool, reason: str | None, output: str | None, now: datetime,
                   out: Pass, job: SlurmJob | None = None) -> None:
        """Every step's end: one job over every node, so one exit status and output for all."""
        for node_id in run.nodes:
            if not run.recorded(node_id, record_state):
                self._run_record(run, job_id, node_id, self.names.slurm_name(node_id) or node_id, record_state, now,
                                 out, job=job, reason=reason, exit_code=exit_code, output=output, timed_out=timed_out)

    def _run_record(self, run: Validation, job_id: int | None, node_id: str, slurm_node: str,
                    record_state: wire.AllocationState, now: datetime, out: Pass, *, job: SlurmJob | None = None,
                    reason: str | None = None, exit_code: int | None = None, output: str | None = None,
                    timed_out: bool = False) -> None:
        """One step's record, applied to the state now. Its id names the Slurm job, so that the
        job is known again from the records alone after a restart."""
        alloc_id = allocation_id(str(job_id) if job_id is not None else "none", 0, slurm_node)
        record = wire.Allocation(
            id=alloc_id, job_id=run.id, node_id=node_id, cluster=self.cluster, state=record_state, at=now,
            reason=reason, requeueable=False, user=job.user_name if job else None,
            partition=job.partition if job else None, nodes=list(run.nodes), exit_code=exit_code, output=output,
            timed_out=timed_out)
        out.emits.append(Emit(subjects.allocation(self.cluster, node_id, alloc_id), wire.encode(record),
                              msg_id=f"{SERVICE}:{self.cluster}:{run.id}:{alloc_id}:{record_state}"))
        self._step_recorded(run, node_id, record_state, job_id, now)

    @staticmethod
    def _step_recorded(run: Validation, node_id: str, record_state: wire.AllocationState, job_id: int | None,
                       at: datetime) -> None:
        if node_id not in run.nodes or run.recorded(node_id, record_state):
            return
        run.steps = {**run.steps, node_id: record_state}
        if job_id is not None:
            run.slurm_job = job_id
        if all(run.recorded(n, "finished") for n in run.nodes):
            run.ended_at = at

    def _reservations(self, state: AdapterState, seen: Observation, draining: set[str], out: Pass) -> None:
        """Our reservations no run in flight needs go, a run's only once our drains are back on
        its nodes: between the run and the drain, user work could land on a held node."""
        for name in sorted(seen.reservations):
            run_id = run_of_reservation(name)
            if run_id is None:
                continue
            run = state.validations.get(run_id)
            if run is not None and run.ended_at is None:
                continue
            nodes = {self.names.slurm_name(node_id) for node_id in run.nodes} if run is not None else set()
            if not nodes & draining:
                out.actions.append(Unreserve(name))

    # ------------------------------------------------------------------ drains (SLU-2, SLU-5)

    def _drains(self, state: AdapterState, seen: Observation, validating: set[str], now: datetime,
                out: Pass) -> set[str]:
        """Our drains as the holds and the gate want them; the Slurm nodes drained this pass."""
        clock = seen.at.timestamp()
        for node in seen.nodes:
            node_id = self.names.node_id(node.name)
            want = state.nodes.get(node_id)
            why = causes(state, want)
            overridden = [c for c in state.overridden.get(node.name, []) if c in why]
            if overridden:
                state.overridden[node.name] = overridden
            else:
                state.overridden.pop(node.name, None)
            live = [c for c in why if c not in overridden]
            ours = node.reason.startswith(self.prefix)
            if node.name in validating:
                # A validation runs (or waits) here inside its reservation, which keeps user work
                # off: a DRAIN node would run nothing, so our drain is lifted until it has ended.
                state.our_drains.pop(node.name, None)
                if node.drained and ours:
                    out.actions.append(Resume(node.name))
                elif node.drained:
                    self._tell_once(out, "validation waits: node drained by hand", "validation_waits", node.name,
                                    node=node.name, reason=node.reason)
                continue
            # Someone else's reason on a drained or DOWN node (an administrator's, or Slurm's own
            # "Not responding"): draining would overwrite it, resuming would undo it.
            if node.drained or (node.down and node.reason and not ours):
                if not ours:
                    if live:
                        self._tell_once(out, "drained by hand; left alone", "left_alone", node.name,
                                        node=node.name, reason=node.reason)
                    state.our_drains.pop(node.name, None)
                    continue  # an administrator's drain: never resumed, never overwritten
                state.our_drains[node.name] = OurDrain(node.reason_changed_at, clock)
                if not live:
                    out.actions.append(Resume(node.name))
                    state.our_drains.pop(node.name)
                elif want is not None and node.reason != (reason := drain_reason(self.prefix, state, want, live)):
                    out.actions.append(Drain(node.name, reason))
                continue
            ours_before = state.our_drains.pop(node.name, None)
            if ours_before is not None and confirmed(ours_before, self.confirm_s) and why:
                # Our drain, gone without us: an administrator resumed the node in Slurm.
                state.overridden[node.name] = why
                out.emits += self._resumed_by_hand(node_id, want, node.name, ours_before, now)
                out.notes.append(Note("info", "administrator resumed our drain in Slurm", "resumed_in_slurm",
                                      {"node": node.name, "node_id": node_id, "overridden": why}))
            elif live and want is not None:
                out.actions.append(Drain(node.name, drain_reason(self.prefix, state, want, live)))
        in_slurm = {node.name for node in seen.nodes}
        for node_id, want in state.nodes.items():
            name = self.names.slurm_name(node_id)
            if (name is None or name not in in_slurm) and causes(state, want):
                self._tell_once(out, "no Slurm node for a node that must be drained", "no_slurm_node", node_id,
                                node_id=node_id,
                                slurm_name=name, template=self.names.template)
        return {action.node for action in out.actions if isinstance(action, Drain)}

    def _resumed_by_hand(self, node_id: str, want: NodeWant | None, name: str, drain: OurDrain,
                         now: datetime) -> list[Emit]:
        """An administrator's RESUME releases the holds the drain stood for, as the
        administrator: Slurm is where that person said the node is fine (docs/slurm.md)."""
        holds = [hold.id for hold in want.holds] if want else []
        if not holds:
            return []  # the score alone: nothing to release, the gate is overridden until it lifts
        command_id = f"slurm-resume-{name}-{drain.set_at}"
        command = wire.Command(id=command_id, node_id=node_id, cluster=self.cluster, verb="hold-release",
                               actor=ACTOR, issued_at=now, hold_ids=holds,
                               reason=f"resumed in Slurm by an administrator (node {name})")
        return [Emit(subjects.command(self.cluster, node_id, "hold-release", ACTOR), wire.encode(command),
                     msg_id=f"{SERVICE}:{self.cluster}:{command_id}")]

    def _tell_once(self, out: Pass, event: str, counter: str, whom: str, **fields: object) -> None:
        """Said once per node and adapter run: a condition that lasts is one line, not one a pass."""
        if (event, whom) not in self._told:
            self._told.add((event, whom))
            out.notes.append(Note("warning", event, counter, dict(fields)))


def _not_obeyed(directive: wire.Directive, why: str) -> Note:
    return Note("info", "directive not obeyed", "directive_not_obeyed",
                {"directive_id": directive.id, "action": directive.action, "node_id": directive.node_id,
                 "allocation_id": directive.allocation_id, "reason": why})
