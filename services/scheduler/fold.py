"""The reference scheduler's fold: the Processor core (EVI-8).

Inputs: ``HP_ALLOCATIONS`` (submitted jobs, and this scheduler's own allocation records),
``HP_DIRECTIVES`` (eviction's requeue / fail / terminate), ``HP_NODES`` (the scorer's node
views: status, holds, score, definition), ``HP_CONFIG`` (``drainBelow`` per definition) and
``HP_COMMANDS`` filtered to ``hp.provision`` (its own answers to terminations) and
``hp.provider`` (``sim provider reject|accept``). Outputs: ``hp.alloc`` records,
``hp.provision`` answers and one ``hp.jobend`` outcome per ended step (JOB-1).

``step`` only folds; every decision is the ``tick``'s, and every decision is written as a
record that the fold turns back into the same state. Directives wait in the state until the
next tick, which runs only once every input is caught up: after a restart the tick sees what
the scheduler already did (its records) before it obeys a directive a second time.

Pure: a directive the tick does not obey is a note it returns in its ``Step``, never a log
line; the Processor tells the tick's notes (a tick runs on live state only, never in a replay).
"""

from __future__ import annotations

import heapq
from datetime import datetime, timedelta
from typing import Any, Final

from healthplane.contracts import gating, subjects, wire
from healthplane.contracts.subjects import job_key, node_key
from healthplane.runtime.fold import Emit, Inbound, Input, Note, Reject, Step, its_own
from healthplane_scheduler.rules import (
    ACTIVE,
    TERMINAL,
    JobState,
    NodeState,
    SchedulerState,
    StepState,
    advances,
    allocation_id,
    check_job,
    default_rejection,
    doom,
    parse_allocation_id,
    pinnable,
    run_seconds,
    schedulable,
    simulated_end,
)

SERVICE = "scheduler"
INPUTS = (
    Input("HP_ALLOCATIONS"),
    Input("HP_DIRECTIVES"),
    Input("HP_NODES"),
    Input("HP_CONFIG"),
    Input("HP_COMMANDS", ("hp.provision.>", "hp.provider.>", "hp.hardware.>")),
)
OUTPUTS = ("HP_ALLOCATIONS", "HP_COMMANDS", "HP_JOB_OUTCOMES")

_ANY: Final = "\x01"  # the group of every node in a cluster, whatever its definition

QueueEntry = tuple[datetime, str, int, int]  # (queued since, job_key, step, attempt)


def _any_group(cluster: str) -> str:
    return f"{cluster}\x00{_ANY}"


def _group(cluster: str, definition: str | None) -> str:
    return _any_group(cluster) if definition is None else f"{cluster}\x00{definition}"


class _Index:
    """What placement needs fast, derived from the state and rebuilt from it after a restore:
    per group (cluster, or cluster and definition) a heap of nodes that may have a free slot,
    the queue in order, the placed steps to start, the started ones by finish time. Entries are
    checked against the state when they are used, so a stale one costs one look."""

    def __init__(self, state: SchedulerState, slots: int, validation_s: float) -> None:
        self.state = state
        self.slots = slots
        self.validation_s = validation_s
        self.pinned: list[QueueEntry] = []  # queued steps of jobs pinned to their nodes (validation runs)
        self.load: dict[str, int] = {}  # node_key -> active allocations
        self.free: dict[str, list[str]] = {}  # group -> heap of node keys
        self.offered: set[tuple[str, str]] = set()  # (group, node_key) in a heap
        self.queue: list[QueueEntry] = []
        self.to_start: dict[tuple[str, int], int] = {}  # (job_key, step) -> attempt
        self.running: list[QueueEntry] = []  # (finishes at, job_key, step, attempt)
        for key, job in state.jobs.items():
            for i, step in enumerate(job.steps):
                self.moved(key, job, i, StepState(status="queued", since=step.since), step)
        for key in state.nodes:
            self.offer(key)
        heapq.heapify(self.queue)
        heapq.heapify(self.pinned)
        heapq.heapify(self.running)

    def entered(self, key: str, job: JobState, i: int, step: StepState) -> None:
        """``step`` of ``job`` has just entered its status: queue it, start it or time it."""
        if step.status == "queued":
            heapq.heappush(self.pinned if job.job.nodes else self.queue, (step.since, key, i, step.attempt))
        elif step.status == "placed":
            self.to_start[(key, i)] = step.attempt
        elif step.status == "started":
            doomed = doom(self.state, job, i)
            finish = step.since + timedelta(seconds=run_seconds(job.job, self.validation_s, doomed))
            heapq.heappush(self.running, (finish, key, i, step.attempt))

    def moved(self, key: str, job: JobState, i: int, old: StepState, new: StepState) -> None:
        """A step went from ``old`` to ``new``: slots taken and freed, then the new status."""
        before = node_key(job.job.cluster, old.node_id) if old.status in ACTIVE and old.node_id else None
        after = node_key(job.job.cluster, new.node_id) if new.status in ACTIVE and new.node_id else None
        if before != after:
            if after is not None:
                self.load[after] = self.load.get(after, 0) + 1
            if before is not None:
                self.load[before] = self.load.get(before, 1) - 1
                self.offer(before)
        self.entered(key, job, i, new)

    def placeable(self, key: str) -> bool:
        node = self.state.nodes.get(key)
        return node is not None and self.load.get(key, 0) < self.slots and schedulable(self.state, node)

    def offer(self, key: str) -> None:
        """Put a node that can take work into the heaps of its groups (once per group)."""
        if not self.placeable(key):
            return
        node = self.state.nodes[key]
        groups = [_any_group(node.cluster)]
        if node.definition is not None:
            groups.append(_group(node.cluster, node.definition))
        for group in groups:
            if (group, key) not in self.offered:
                self.offered.add((group, key))
                heapq.heappush(self.free.setdefault(group, []), key)

    def pick(self, group: str, avoid: list[str]) -> str | None:
        """The first node of ``group`` (by key) with a free slot that ``avoid`` does not name."""
        heap = self.free.get(group)
        if not heap:
            return None
        set_aside: list[str] = []
        found = None
        while heap:
            key = heap[0]
            node = self.state.nodes.get(key)
            if node is None or not self.placeable(key) or group not in (
                    _any_group(node.cluster), _group(node.cluster, node.definition)):
                heapq.heappop(heap)  # full, closed or moved to another definition since offered
                self.offered.discard((group, key))
                continue
            if node.node_id in avoid:
                set_aside.append(heapq.heappop(heap))
                continue
            found = key
            break
        for key in set_aside:
            heapq.heappush(heap, key)
        return found


class SchedulerCore:
    def __init__(self, slots_per_node: int = 1, validation_seconds: float = 5.0) -> None:
        if slots_per_node < 1:
            raise ValueError(f"slots per node must be at least 1 (got {slots_per_node})")
        self.slots = slots_per_node
        # How long a simulated validation run takes (the reference scheduler runs no command).
        self.validation_s = validation_seconds

    def initial_state(self) -> SchedulerState:
        return SchedulerState()

    def index(self, state: SchedulerState) -> _Index:
        """The placement index, derived from ``state`` and kept on it (never encoded): a state
        restored from a snapshot, or a new one, rebuilds its own."""
        found: _Index | None = getattr(state, "placement_index", None)
        if found is None or found.slots != self.slots or found.validation_s != self.validation_s:
            found = state.placement_index = _Index(state, self.slots, self.validation_s)  # type: ignore[attr-defined]
        return found

    # ------------------------------------------------------------------ the fold

    def step(self, state: SchedulerState, inbound: Inbound) -> Step[SchedulerState]:
        index = self.index(state)
        kind = inbound.subject.split(".", 2)[1] if inbound.subject.count(".") >= 2 else inbound.subject
        if inbound.stream == "HP_ALLOCATIONS" and kind == "job":
            self._on_job(state, index, wire.decode(wire.Job, inbound.data), inbound.at)
        elif inbound.stream == "HP_ALLOCATIONS" and kind == "alloc":
            self._on_allocation(state, index, its_own(inbound, wire.decode(wire.Allocation, inbound.data)))
        elif inbound.stream == "HP_DIRECTIVES":
            self._on_directive(state, its_own(inbound, wire.decode(wire.Directive, inbound.data)))
        elif inbound.stream == "HP_NODES":
            self._on_view(state, index, its_own(inbound, wire.decode(wire.NodeView, inbound.data)))
        elif inbound.stream == "HP_CONFIG":
            self._on_config(state, wire.decode(wire.ConfigEnvelope, inbound.data))
        elif inbound.stream == "HP_COMMANDS" and kind == "provision":
            self._on_termination(state, index, its_own(inbound, wire.decode(wire.TerminationResult, inbound.data)))
        elif inbound.stream == "HP_COMMANDS" and kind == "provider":
            self._on_provider(state, its_own(inbound, wire.decode(wire.ProviderSetting, inbound.data)))
        elif inbound.stream == "HP_COMMANDS" and kind == "hardware":
            truth = its_own(inbound, wire.decode(wire.SimHardware, inbound.data))
            key = node_key(truth.cluster, truth.node_id)
            if truth.failing_gpus:
                state.hardware[key] = sorted(set(truth.failing_gpus))
            else:
                state.hardware.pop(key, None)
            if truth.jobs is not None:
                state.killers[key] = truth.jobs
            else:
                state.killers.pop(key, None)
        else:
            raise Reject(f"unexpected input {inbound.subject} on {inbound.stream}")
        return Step(state, ())

    def _on_job(self, state: SchedulerState, index: _Index, job: wire.Job, at: datetime) -> None:
        problem = check_job(job)
        if problem is not None:
            raise Reject(problem)
        key = job_key(job.cluster, job.id)
        if key in state.jobs or key in state.done:
            return  # the same job submitted again: it runs once
        entry = state.jobs[key] = JobState(job=job, steps=[StepState(status="queued", since=at)
                                                           for _ in range(job.steps)], open_steps=job.steps)
        for i, step in enumerate(entry.steps):
            index.entered(key, entry, i, step)

    def _on_allocation(self, state: SchedulerState, index: _Index, alloc: wire.Allocation) -> None:
        parsed = parse_allocation_id(alloc.id)
        if parsed is None or parsed[0] != alloc.job_id:
            return  # not an id this scheduler makes
        key = job_key(alloc.cluster, alloc.job_id)
        job = state.jobs.get(key)
        _, i, attempt = parsed
        if job is None or not 0 <= i < len(job.steps) or not advances(job.steps[i], attempt, alloc.state):
            return  # already reflected: a record folded again after a snapshot, or a finished job's
        self._apply(state, index, key, job, i, alloc.state, attempt, alloc.node_id, alloc.at)

    def _on_directive(self, state: SchedulerState, directive: wire.Directive) -> None:
        if directive.action in ("requeue", "fail") and not directive.allocation_id:
            raise Reject(f"directive {directive.id}: {directive.action} needs an allocationId")
        if directive.action == "terminate" and directive.id in state.answered:
            return  # answered before this directive was folded again
        state.pending.append(directive)

    def _on_view(self, state: SchedulerState, index: _Index, view: wire.NodeView) -> None:
        key = node_key(view.cluster, view.node_id)
        node = self._node(state, view.cluster, view.node_id)
        node.known, node.status, node.held = True, view.status, bool(view.holds)
        node.score, node.definition = view.score, view.definition
        index.offer(key)

    def _on_config(self, state: SchedulerState, envelope: wire.ConfigEnvelope) -> None:
        state.drain_below, state.drain_below_by_definition = gating.thresholds(envelope)
        state.config_version = envelope.version
        state.placement_index = None  # type: ignore[attr-defined]  # every gate may have moved: rebuild

    def _on_termination(self, state: SchedulerState, index: _Index, result: wire.TerminationResult) -> None:
        state.answered[result.directive_id] = result.accepted
        node = self._node(state, result.cluster, result.node_id)
        node.terminated = node.terminated or result.accepted
        if any(d.id == result.directive_id for d in state.pending):
            state.pending = [d for d in state.pending if d.id != result.directive_id]

    def _on_provider(self, state: SchedulerState, setting: wire.ProviderSetting) -> None:
        node = self._node(state, setting.cluster, setting.node_id)
        node.reject_terminations, node.reject_message = setting.reject_terminations, setting.message

    @staticmethod
    def _node(state: SchedulerState, cluster: str, node_id: str) -> NodeState:
        key = node_key(cluster, node_id)
        node = state.nodes.get(key)
        if node is None:
            node = state.nodes[key] = NodeState(cluster=cluster, node_id=node_id)
        return node

    def _apply(self, state: SchedulerState, index: _Index, key: str, job: JobState, i: int,
               record_state: str, attempt: int, node_id: str, at: datetime) -> None:
        """One allocation record's effect on its step; the tick and the fold both come here."""
        old = job.steps[i]
        if record_state == "requeued":
            new = StepState(status="queued", since=at, attempt=attempt + 1, avoid=[*old.avoid, node_id])
        else:
            new = StepState(status=record_state, since=at, attempt=attempt,  # type: ignore[arg-type]
                            node_id=node_id, avoid=old.avoid)
        job.steps[i] = new
        index.moved(key, job, i, old, new)
        if new.status in TERMINAL:
            job.open_steps -= 1
            job.failed = job.failed or new.status == "failed"
            if job.open_steps == 0:
                # Forgotten once every step has ended; the tombstone keeps a repeat from running again.
                state.done[key] = "failed" if job.failed else "finished"
                del state.jobs[key]

    # ------------------------------------------------------------------ time

    def tick(self, state: SchedulerState, now: datetime) -> Step[SchedulerState]:
        """Obey, finish, start and place; what it has to say (a directive not obeyed) are its
        notes (a tick runs on live state only: the Processor tells each once)."""
        index = self.index(state)
        emits: list[Emit] = []
        notes: list[Note] = []
        self._obey(state, index, now, emits, notes)
        self._finish(state, index, now, emits)
        self._start(state, index, now, emits)
        self._place(state, index, now, emits)
        return Step(state, emits, notes)

    def _obey(self, state: SchedulerState, index: _Index, now: datetime, emits: list[Emit],
              notes: list[Note]) -> None:
        pending, state.pending = state.pending, []
        for directive in pending:
            if directive.action == "terminate":
                self._terminate(state, directive, now, emits)
                continue
            parsed = parse_allocation_id(directive.allocation_id or "")
            key = job_key(directive.cluster, parsed[0]) if parsed else ""
            job = state.jobs.get(key)
            if parsed is None or job is None or not 0 <= parsed[1] < len(job.steps):
                notes.append(_stale(directive, "no such allocation running"))
                continue
            _, i, attempt = parsed
            step = job.steps[i]
            if step.status not in ACTIVE or step.attempt != attempt or step.node_id != directive.node_id:
                notes.append(_stale(directive, f"allocation is {step.status if step.attempt == attempt else 'superseded'}"))
                continue
            outcome: wire.AllocationState = "requeued" if directive.action == "requeue" else "failed"
            emits.append(self._record(job.job, i, attempt, directive.node_id, outcome, now, directive.message))
            if outcome == "failed":  # ended from outside the job: the job's own end it is not (JOB-1)
                emits += self._outcome(job.job, i, attempt, directive.node_id, "cancelled", step, now,
                                       directive.message)
            self._apply(state, index, key, job, i, outcome, attempt, directive.node_id, now)

    def _terminate(self, state: SchedulerState, directive: wire.Directive, now: datetime,
                   emits: list[Emit]) -> None:
        if directive.id in state.answered:
            return
        node = self._node(state, directive.cluster, directive.node_id)
        if node.terminated:
            accepted, message = True, f"instance {node.node_id} already terminated"
        elif node.reject_terminations:
            accepted, message = False, node.reject_message or default_rejection(node.node_id)
        else:
            accepted, message = True, f"instance {node.node_id} terminated"
            node.terminated = True  # gone: never placed on again
        state.answered[directive.id] = accepted
        result = wire.TerminationResult(directive_id=directive.id, node_id=node.node_id, cluster=node.cluster,
                                        accepted=accepted, message=message, at=now)
        emits.append(Emit(subjects.provision(node.cluster, node.node_id), wire.encode(result),
                          msg_id=f"{SERVICE}:{node.cluster}:terminate:{directive.id}"))

    def _finish(self, state: SchedulerState, index: _Index, now: datetime, emits: list[Emit]) -> None:
        while index.running and index.running[0][0] <= now:
            _, key, i, attempt = heapq.heappop(index.running)
            job = state.jobs.get(key)
            if job is None or job.steps[i].status != "started" or job.steps[i].attempt != attempt:
                continue  # ended otherwise (a directive) since it started
            node_id = job.steps[i].node_id or ""
            ended, details = simulated_end(state, job, node_id, self.validation_s, doom(state, job, i))
            emits.append(self._record(job.job, i, attempt, node_id, ended, now, **details))
            emits += self._outcome(job.job, i, attempt, node_id, "completed" if ended == "finished" else "failed",
                                   job.steps[i], now, details.get("reason"))
            self._apply(state, index, key, job, i, ended, attempt, node_id, now)

    def _start(self, state: SchedulerState, index: _Index, now: datetime, emits: list[Emit]) -> None:
        placed, index.to_start = index.to_start, {}
        for (key, i), attempt in sorted(placed.items()):  # an order a rebuilt index shares
            job = state.jobs.get(key)
            if job is None or job.steps[i].status != "placed" or job.steps[i].attempt != attempt:
                continue
            node_id = job.steps[i].node_id or ""
            emits.append(self._record(job.job, i, attempt, node_id, "started", now))
            self._apply(state, index, key, job, i, "started", attempt, node_id, now)

    def _place(self, state: SchedulerState, index: _Index, now: datetime, emits: list[Emit]) -> None:
        """Queued steps in order onto free nodes. A group found full is not searched again this
        tick, and the loop ends once every cluster is full, so a deep queue on a full fleet costs
        little."""
        self._place_pinned(state, index, now, emits)
        # Clusters with a node that may take work; a cluster leaves once its every-node group is full.
        open_clusters = {group for group, heap in index.free.items() if heap and group.endswith(_ANY)}
        deferred: list[QueueEntry] = []
        full: set[str] = set()
        while index.queue and open_clusters:
            entry = heapq.heappop(index.queue)
            _, key, i, attempt = entry
            job = state.jobs.get(key)
            if job is None or job.steps[i].status != "queued" or job.steps[i].attempt != attempt:
                continue  # stale: placed or ended since it was queued
            group = _group(job.job.cluster, job.job.definition)
            if group in full or _any_group(job.job.cluster) not in open_clusters:
                deferred.append(entry)
                continue
            step = job.steps[i]
            chosen = index.pick(group, step.avoid)
            if chosen is None:
                deferred.append(entry)
                if not step.avoid or index.pick(group, []) is None:
                    full.add(group)
                    open_clusters.discard(group)
                continue
            node_id = state.nodes[chosen].node_id
            emits.append(self._record(job.job, i, attempt, node_id, "placed", now))
            self._apply(state, index, key, job, i, "placed", attempt, node_id, now)
        for entry in deferred:
            heapq.heappush(index.queue, entry)

    def _place_pinned(self, state: SchedulerState, index: _Index, now: datetime, emits: list[Emit]) -> None:
        """Steps pinned to a node (validation runs, VAL-1) go first, each onto its own node once
        that node has a free slot, held or not: a held node takes no user work, so a run there
        waits only for what already runs (VAL-4: queued, never failed)."""
        waiting: list[QueueEntry] = []
        while index.pinned:
            entry = heapq.heappop(index.pinned)
            _, key, i, attempt = entry
            job = state.jobs.get(key)
            if job is None or job.steps[i].status != "queued" or job.steps[i].attempt != attempt:
                continue
            node_id = (job.job.nodes or [])[i]
            target = node_key(job.job.cluster, node_id)
            node = state.nodes.get(target)
            if node is None or not pinnable(node) or index.load.get(target, 0) >= self.slots:
                waiting.append(entry)
                continue
            emits.append(self._record(job.job, i, attempt, node_id, "placed", now))
            self._apply(state, index, key, job, i, "placed", attempt, node_id, now)
        for entry in waiting:
            heapq.heappush(index.pinned, entry)

    # ------------------------------------------------------------------ records

    @staticmethod
    def _outcome(job: wire.Job, step: int, attempt: int, node_id: str, kind: wire.JobOutcomeKind,
                 before: StepState, at: datetime, reason: str | None) -> list[Emit]:
        """JOB-1: how the step's run ended on its node; none for a validation run (Healthplane's
        own test, not a user's job). A step is one node's share of its job: ``size`` is the
        job's step count."""
        if job.validation is not None:
            return []
        started = before.since if before.status == "started" else None
        record = wire.JobOutcome(
            job_id=job.id, node_id=node_id, cluster=job.cluster, outcome=kind, ended_at=at, scheduler="reference",
            attempt=attempt, started_at=started,
            runtime_seconds=(at - started).total_seconds() if started is not None else None,
            size=job.steps, user=job.submitted_by, partition=job.definition, reason=reason)
        alloc_id = allocation_id(job.id, step, attempt)
        return [Emit(subjects.job_outcome(job.cluster, node_id, alloc_id), wire.encode(record),
                     msg_id=f"{SERVICE}:{job.cluster}:{alloc_id}:outcome")]

    @staticmethod
    def _record(job: wire.Job, step: int, attempt: int, node_id: str, record_state: wire.AllocationState,
                at: datetime, reason: str | None = None, **details: Any) -> Emit:
        """Every record of one allocation carries the step's declared policy and the number of
        times the step was requeued before this allocation (its attempt)."""
        alloc_id = allocation_id(job.id, step, attempt)
        record = wire.Allocation(id=alloc_id, job_id=job.id, node_id=node_id, cluster=job.cluster,
                                 state=record_state, at=at, reason=reason, retry_on=list(job.retry_on),
                                 retry_attempts=job.retry_attempts, restart=job.restart,
                                 node_fault_restarts=attempt, **details)
        return Emit(subjects.allocation(job.cluster, node_id, alloc_id), wire.encode(record),
                    msg_id=f"{SERVICE}:{job.cluster}:{alloc_id}:{record_state}")


def _stale(directive: wire.Directive, why: str) -> Note:
    return Note("info", "directive not obeyed", "directive_not_obeyed",
                {"directive_id": directive.id, "action": directive.action, "node_id": directive.node_id,
                 "allocation_id": directive.allocation_id, "reason": why})
