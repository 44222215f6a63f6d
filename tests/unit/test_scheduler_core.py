"""The reference scheduler's pure core with an injected clock (EVI-8, POL-5, REL-1).

Given node views, jobs and directives folded as the Processor would fold them, when the tick
runs at a given time, then these allocation records and provisioner answers come out.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import parse_cluster_config
from healthplane.runtime.fold import Emit, Inbound, Reject
from healthplane_scheduler.fold import SchedulerCore
from healthplane_scheduler.rules import SchedulerState, allocation_id, parse_allocation_id

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
CLUSTER = "c"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def view(node: str, *, status: wire.NodeStatus = "READY", held: bool = False, score: int | None = None,
         definition: str | None = "gpu-pool", cluster: str = CLUSTER) -> wire.NodeView:
    holds = [wire.Hold(id=f"hold-{node}", effect="cordon", reason="test", actor="operator", created_at=T0)] if held else []
    return wire.NodeView(node_id=node, cluster=cluster, hostname=node, status=status, health="UNKNOWN",
                         last_reported_at=None if score is None else T0, score=score, score_explanation=None,
                         conditions=[], attributed_failures=wire.AttributedFailures(), holds=holds,
                         definition=definition)


def job(job_id: str, *, steps: int = 1, duration: float = 60, definition: str | None = None,
        retry_on: list[str] | None = None, retry_attempts: int = 0,
        restart: wire.RestartPolicy = "never", cluster: str = CLUSTER) -> wire.Job:
    return wire.Job(id=job_id, cluster=cluster, steps=steps, duration_seconds=duration, submitted_at=T0,
                    submitted_by="test", retry_on=retry_on or [], retry_attempts=retry_attempts, restart=restart,
                    definition=definition)


def directive(directive_id: str, node: str, action: wire.DirectiveAction, alloc: str | None = None,
              message: str = "because") -> wire.Directive:
    return wire.Directive(id=directive_id, node_id=node, cluster=CLUSTER, action=action, message=message,
                          issued_at=T0, allocation_id=alloc)


def config(data: dict[str, Any], version: int = 1) -> wire.ConfigEnvelope:
    return wire.ConfigEnvelope(version=version, applied_at=T0, actor="test",
                               config=parse_cluster_config(data).to_wire())


def provider(node: str, reject: bool, message: str | None = None) -> wire.ProviderSetting:
    return wire.ProviderSetting(node_id=node, cluster=CLUSTER, reject_terminations=reject, message=message,
                                set_at=T0, actor="test")


def subject_of(record: wire.Record) -> tuple[str, str]:
    """(stream, subject) a record is appended on."""
    match record:
        case wire.NodeView():
            return "HP_NODES", subjects.node_view(record.cluster, record.node_id)
        case wire.Job():
            return "HP_ALLOCATIONS", subjects.job(record.cluster, record.id)
        case wire.Directive():
            return "HP_DIRECTIVES", subjects.directive(record.cluster, record.node_id)
        case wire.ConfigEnvelope():
            return "HP_CONFIG", subjects.CONFIG
        case wire.ProviderSetting():
            return "HP_COMMANDS", subjects.provider(record.cluster, record.node_id)
    raise AssertionError(record)


def stream_of(emit: Emit) -> str:
    if emit.subject.startswith("hp.jobend."):
        return "HP_JOB_OUTCOMES"  # JOB-1: written, never folded back (not an input)
    return "HP_COMMANDS" if emit.subject.startswith("hp.provision.") else "HP_ALLOCATIONS"


def decoded(emit: Emit) -> wire.Allocation | wire.TerminationResult:
    if emit.subject.startswith("hp.provision."):
        return wire.decode(wire.TerminationResult, emit.payload)
    return wire.decode(wire.Allocation, emit.payload)


@dataclass
class Bus:
    """Streams as lists and one scheduler folding them in stream order, as the Processor does.
    Records the tick emits are appended to their streams and folded back at once (``echo``)."""

    slots: int = 1
    echo: bool = True
    core: SchedulerCore = field(init=False)
    state: SchedulerState = field(init=False)
    streams: dict[str, list[tuple[str, bytes, datetime]]] = field(default_factory=lambda: defaultdict(list))
    outcomes: list[wire.JobOutcome] = field(default_factory=list)  # JOB-1: written, never an input

    def __post_init__(self) -> None:
        self.core = SchedulerCore(self.slots)
        self.state = self.core.initial_state()

    def append(self, stream: str, subject: str, payload: bytes, when: datetime) -> Inbound:
        self.streams[stream].append((subject, payload, when))
        return Inbound(stream, len(self.streams[stream]), subject, payload, {}, when, True)

    def put(self, *records: wire.Record, when: datetime = T0) -> None:
        for record in records:
            stream, subject = subject_of(record)
            self.state, emits, _ = self.core.step(self.state, self.append(stream, subject, wire.encode(record), when))
            assert not emits  # the fold decides nothing

    def tick(self, seconds: float) -> list[Any]:
        now = at(seconds)
        self.state, emits, _ = self.core.tick(self.state, now)
        out = []
        for emit in emits:
            if stream_of(emit) == "HP_JOB_OUTCOMES":
                self.outcomes.append(wire.decode(wire.JobOutcome, emit.payload))
                continue
            inbound = self.append(stream_of(emit), emit.subject, emit.payload, now)
            if self.echo:
                self.state, again, _ = self.core.step(self.state, inbound)
                assert not again
            out.append(decoded(emit))
        return out


def states(records: list[Any]) -> list[tuple[str, str, str]]:
    return [(r.id, r.state, r.node_id) for r in records if isinstance(r, wire.Allocation)]


# ---------------------------------------------------------------------------- placement


def test_places_only_on_ready_nodes_without_holds() -> None:
    """EVI-8: cordons (holds), NOT_READY and OFFLINE nodes get no new work."""
    bus = Bus()
    bus.put(view("n-cordoned", status="CORDONED", held=True), view("n-not-ready", status="NOT_READY"),
            view("n-offline", status="OFFLINE"), view("n-ready"), job("j1", steps=4))
    assert states(bus.tick(0)) == [("j1.0.0", "placed", "n-ready")]
    assert states(bus.tick(1)) == [("j1.0.0", "started", "n-ready")]  # the other steps keep waiting
    bus.put(view("n-ready", held=True, status="CORDONED"))
    assert bus.tick(2) == []  # nothing new lands on a node that became cordoned


def test_placed_then_started_then_finished_after_its_duration() -> None:
    """EVI-8: placed, started on the next tick, finished once the duration has elapsed, not before."""
    bus = Bus()
    bus.put(view("n1"), job("j1", duration=30, retry_on=["node"], retry_attempts=2, restart="on-node-fault"))
    placed = bus.tick(0)
    assert states(placed) == [("j1.0.0", "placed", "n1")]
    assert (placed[0].retry_on, placed[0].retry_attempts, placed[0].restart, placed[0].node_fault_restarts) == (
        ["node"], 2, "on-node-fault", 0)
    assert states(bus.tick(1)) == [("j1.0.0", "started", "n1")]
    assert bus.tick(30.9) == []
    assert states(bus.tick(31)) == [("j1.0.0", "finished", "n1")]
    assert bus.state.done == {f"{CLUSTER}\x00j1": "finished"} and bus.state.jobs == {}


def test_a_freed_slot_takes_the_next_queued_step_in_order() -> None:
    bus = Bus()
    bus.put(view("n1"), job("first", duration=5), job("second", duration=5))
    assert states(bus.tick(0)) == [("first.0.0", "placed", "n1")]
    bus.tick(1)
    assert states(bus.tick(6)) == [("first.0.0", "finished", "n1"), ("second.0.0", "placed", "n1")]


def test_slots_per_node() -> None:
    bus = Bus(slots=2)
    bus.put(view("n1"), job("j1", steps=3))
    assert states(bus.tick(0)) == [("j1.0.0", "placed", "n1"), ("j1.1.0", "placed", "n1")]


def test_score_below_drain_below_gates_and_a_node_that_never_reported_does_not() -> None:
    """POL-5: no new placement below drainBelow (45 by default) in every mode; a degraded node
    above it and a node that has never reported (no score) are not gated."""
    bus = Bus()
    bus.put(config({"nodeHealth": {"mode": "observe"}}),
            view("n-44", score=44), view("n-never", score=None), view("n-46", score=46), job("j1", steps=3))
    assert sorted(n for _, _, n in states(bus.tick(0))) == ["n-46", "n-never"]
    bus.put(view("n-44", score=45))  # recovered to the threshold: placeable again
    assert states(bus.tick(1))[-1] == ("j1.2.0", "placed", "n-44")


def test_a_definitions_own_drain_below_gates_on_its_own_number() -> None:
    """POL-5: the threshold is resolved per provisioner definition."""
    bus = Bus()
    bus.put(config({"nodeHealth": {"drainBelow": 45},
                    "provisionerDefinitions": {"gpu-pool": {"nodeHealth": {"drainBelow": 20, "cordonBelow": 30}}}}),
            view("gpu-1", score=30, definition="gpu-pool"), view("cpu-1", score=30, definition="cpu-pool"),
            job("j1", steps=2))
    assert states(bus.tick(0)) == [("j1.0.0", "placed", "gpu-1")]
    bus.put(config({"nodeHealth": {"drainBelow": 25}}, version=2))  # the definition's override is gone
    assert states(bus.tick(1))[-1] == ("j1.1.0", "placed", "cpu-1")


def test_work_that_names_a_definition_runs_only_there() -> None:
    bus = Bus()
    bus.put(view("cpu-1", definition="cpu-pool"), view("gpu-1", definition="gpu-pool"),
            job("gpu-job", steps=2, definition="gpu-pool"))
    bus.put(job("any-job"), when=at(0.5))  # queued after: the gpu step left waiting does not block it
    assert states(bus.tick(0)) == [("gpu-job.0.0", "placed", "gpu-1"), ("any-job.0.0", "placed", "cpu-1")]


def test_work_stays_in_its_cluster() -> None:
    bus = Bus()
    bus.put(view("n1", cluster="other"), job("j1"))
    assert bus.tick(0) == []
    bus.put(view("n1"))
    assert states(bus.tick(1)) == [("j1.0.0", "placed", "n1")]


# ---------------------------------------------------------------------------- directives


def test_requeue_directive_ends_the_allocation_and_places_the_step_elsewhere() -> None:
    """EVI-8: requeue -> `requeued` with the directive's message; the step runs again on another
    node with node_fault_restarts + 1."""
    bus = Bus()
    bus.put(view("n1"), view("n2", definition="cpu-pool"), job("j1", duration=100, retry_on=["node"], retry_attempts=3))
    bus.tick(0)
    bus.tick(1)
    bus.put(directive("d1", "n1", "requeue", "j1.0.0", "node n1 was held: failing disk; requeued"))
    out = bus.tick(2)
    assert [(r.id, r.state, r.node_id, r.reason, r.node_fault_restarts) for r in out] == [
        ("j1.0.0", "requeued", "n1", "node n1 was held: failing disk; requeued", 0),
        ("j1.0.1", "placed", "n2", None, 1),
    ]
    assert out[1].retry_on == ["node"] and out[1].retry_attempts == 3
    assert states(bus.tick(3)) == [("j1.0.1", "started", "n2")]


def test_a_requeued_step_is_not_placed_back_on_the_node_it_was_taken_off() -> None:
    bus = Bus()
    bus.put(view("n1"), job("j1"))
    bus.tick(0)
    bus.put(directive("d1", "n1", "requeue", "j1.0.0"))
    assert states(bus.tick(1)) == [("j1.0.0", "requeued", "n1")]  # n1 is free, yet not chosen
    bus.put(view("n2"))
    assert states(bus.tick(2)) == [("j1.0.1", "placed", "n2")]


def test_fail_directive_fails_the_step_and_its_job_without_retry() -> None:
    bus = Bus()
    bus.put(view("n1"), view("n2"), job("j1", steps=2, retry_on=["node"], retry_attempts=3))
    bus.tick(0)
    bus.tick(1)
    bus.put(directive("d1", "n1", "fail", "j1.0.0", "node n1 was held: bad GPU; job failed"))
    out = bus.tick(2)
    assert [(r.id, r.state, r.reason) for r in out] == [("j1.0.0", "failed", "node n1 was held: bad GPU; job failed")]
    assert states(bus.tick(200)) == [("j1.1.0", "finished", "n2")]  # the failed step is not run again
    assert bus.state.done == {f"{CLUSTER}\x00j1": "failed"}


def test_job1_each_ended_step_is_an_outcome_on_its_node() -> None:
    """JOB-1: a step that ran to its end is `completed`, one a fail directive ended `cancelled`
    with the directive's words; each with its runtime, the job's size and who submitted it; a
    requeued step has none (its job goes on)."""
    bus = Bus()
    bus.put(view("n1"), view("n2"), view("n3"), job("j1", steps=2, duration=30, retry_on=["node"], retry_attempts=3))
    bus.tick(0)
    bus.tick(1)
    bus.put(directive("d1", "n1", "fail", "j1.0.0", "node n1 was held: bad GPU; job failed"))
    bus.tick(2)
    bus.tick(200)
    found = {(o.node_id, o.outcome): o for o in bus.outcomes}
    assert set(found) == {("n1", "cancelled"), ("n2", "completed")}
    cancelled, completed = found[("n1", "cancelled")], found[("n2", "completed")]
    assert cancelled.reason == "node n1 was held: bad GPU; job failed" and cancelled.runtime_seconds == 1
    assert (completed.size, completed.scheduler, completed.job_id, completed.runtime_seconds) == (2, "reference", "j1", 199)


def test_a_directive_for_work_that_already_ended_changes_nothing() -> None:
    bus = Bus()
    bus.put(view("n1"), job("j1", duration=1))
    bus.tick(0)
    bus.tick(1)
    bus.tick(2)  # finished
    bus.put(directive("d1", "n1", "requeue", "j1.0.0"), directive("d2", "n1", "fail", "nope.0.0"))
    assert bus.tick(3) == []
    assert bus.state.pending == []


def test_terminate_is_answered_and_the_node_never_gets_work_again() -> None:
    """EVI-8: the scheduler plays the provisioner; an accepted termination means the instance is gone."""
    bus = Bus()
    bus.put(view("n1"), directive("t1", "n1", "terminate", message="replace by policy: no work left"))
    out = bus.tick(0)
    assert [(r.directive_id, r.node_id, r.accepted, r.message) for r in out] == [
        ("t1", "n1", True, "instance n1 terminated")]
    bus.put(view("n1"), job("j1"))  # the last view still says READY
    assert bus.tick(1) == []


def test_terminate_is_rejected_on_request_and_accepted_again_after() -> None:
    bus = Bus()
    bus.put(view("n1"), provider("n1", True, "RequestLimitExceeded: Request limit exceeded."),
            directive("t1", "n1", "terminate"))
    out = bus.tick(0)
    assert [(r.accepted, r.message) for r in out] == [(False, "RequestLimitExceeded: Request limit exceeded.")]
    bus.put(job("j1"))
    assert states(bus.tick(1)) == [("j1.0.0", "placed", "n1")]  # a rejection changes nothing
    bus.put(provider("n1", False), directive("t2", "n1", "terminate"))
    answers = [r for r in bus.tick(2) if isinstance(r, wire.TerminationResult)]
    assert [(r.directive_id, r.accepted) for r in answers] == [("t2", True)]


def test_default_rejection_reads_like_a_cloud_api() -> None:
    bus = Bus()
    bus.put(provider("n9", True), directive("t1", "n9", "terminate"))
    (answer,) = bus.tick(0)
    assert not answer.accepted and answer.message.startswith("TerminateInstances failed for n9: ")


# ---------------------------------------------------------------------------- records and replay


def test_allocation_ids_are_deterministic_and_parse_back() -> None:
    assert allocation_id("job-1.2", 3, 4) == "job-1.2.3.4"
    assert parse_allocation_id("job-1.2.3.4") == ("job-1.2", 3, 4)
    assert parse_allocation_id("job-1") is None and parse_allocation_id("j.01.0") is None


@pytest.mark.parametrize("bad", [job("j", steps=0), job("j", duration=-1), job("j", steps=10_001)])
def test_a_job_that_cannot_run_is_rejected(bad: wire.Job) -> None:
    """REL-3: refused with a reason; nothing is queued."""
    bus = Bus()
    with pytest.raises(Reject, match="job j"):
        bus.put(bad)
    assert bus.state.jobs == {}


def test_the_same_job_submitted_twice_runs_once() -> None:
    bus = Bus()
    bus.put(view("n1"), view("n2"), job("j1"), job("j1"))
    assert states(bus.tick(0)) == [("j1.0.0", "placed", "n1")]


def test_folding_its_own_records_again_changes_nothing() -> None:
    """REL-1: the state a tick reached is the state its records fold to."""
    bus = Bus(echo=False)
    bus.put(view("n1"), view("n2"), job("j1", steps=3, duration=5))
    for second in (0, 1, 2, 7):
        bus.tick(second)
    before = msgspec.json.encode(bus.state)
    for stream in ("HP_ALLOCATIONS", "HP_COMMANDS"):
        for seq, (subject, payload, when) in enumerate(bus.streams[stream], 1):
            bus.state, _, _ = bus.core.step(bus.state, Inbound(stream, seq, subject, payload, {}, when, True))
    assert msgspec.json.encode(bus.state) == before


def test_ten_thousand_nodes_take_ten_thousand_steps_in_one_tick() -> None:
    bus = Bus()
    bus.put(*[view(f"n{i:05d}") for i in range(10_000)], job("big", steps=10_000), job("waits"))
    placed = states(bus.tick(0))
    assert len(placed) == 10_000 and len({n for _, _, n in placed}) == 10_000
    assert bus.tick(1)[-1].state == "started" and len(bus.state.jobs[f"{CLUSTER}\x00waits"].steps) == 1


# ---------------------------------------------------------------------------- replay equals live

NODES = ("n0", "n1", "n2")
STREAMS = ("HP_ALLOCATIONS", "HP_DIRECTIVES", "HP_NODES", "HP_CONFIG", "HP_COMMANDS")
# What happens next: an input arrives, or time passes (a tick). Each comes with a delivery of
# some records of one stream to the live scheduler, which folds every stream late and in order.
happening = st.one_of(
    st.tuples(st.just("tick"), st.sampled_from([0, 0.5, 1, 2])),
    st.tuples(st.just("job"), st.integers(1, 3), st.sampled_from([0, 1, 3]), st.sampled_from([None, "gpu-pool"])),
    st.tuples(st.just("view"), st.sampled_from(NODES), st.sampled_from(["READY", "READY", "CORDONED", "OFFLINE"]),
              st.sampled_from([None, 30, 90]), st.sampled_from(["gpu-pool", "gpu-pool", "cpu-pool"])),
    st.tuples(st.just("requeue"), st.integers(0, 5)),
    st.tuples(st.just("fail"), st.integers(0, 5)),
    st.tuples(st.just("terminate"), st.sampled_from(NODES)),
    st.tuples(st.just("provider"), st.sampled_from(NODES), st.booleans()),
    st.tuples(st.just("config"), st.sampled_from([30, 45, 95])),
    st.tuples(st.just("snapshot")),
)
delivery = st.tuples(st.sampled_from(STREAMS), st.sampled_from([0, 1, 1, 2, 9]))
op = st.tuples(happening, delivery, delivery)


class Live:
    """A scheduler whose inputs arrive late and per stream in order, with ticks in between."""

    def __init__(self) -> None:
        self.core = SchedulerCore()
        self.state = self.core.initial_state()
        self.streams: dict[str, list[tuple[str, bytes, datetime]]] = defaultdict(list)
        self.cursor: dict[str, int] = defaultdict(int)
        self.now = T0
        self.snapshot: tuple[bytes, dict[str, int]] | None = None
        self.msg_ids: list[str | None] = []
        self.latest: dict[str, wire.Allocation] = {}  # allocation id -> its latest record
        self.outcomes: list[wire.JobOutcome] = []

    def append(self, stream: str, subject: str, payload: bytes) -> None:
        if stream == "HP_JOB_OUTCOMES":  # JOB-1: not an input of the scheduler's
            self.outcomes.append(wire.decode(wire.JobOutcome, payload))
            return
        self.streams[stream].append((subject, payload, self.now))
        if subject.startswith("hp.alloc."):
            alloc = wire.decode(wire.Allocation, payload)
            self.latest[alloc.id] = alloc

    def deliver(self, stream: str, count: int) -> None:
        for _ in range(count):
            if self.cursor[stream] >= len(self.streams[stream]):
                return
            self.cursor[stream] += 1
            seq = self.cursor[stream]
            subject, payload, when = self.streams[stream][seq - 1]
            self.state, _, _ = self.core.step(self.state, Inbound(stream, seq, subject, payload, {}, when, True))

    def tick(self) -> list[Emit]:
        self.state, emits, _ = self.core.tick(self.state, self.now)
        for emit in emits:
            self.append(stream_of(emit), emit.subject, emit.payload)
            self.msg_ids.append(emit.msg_id)
        return list(emits)

    def active_allocations(self) -> list[wire.Allocation]:
        return [a for a in self.latest.values() if a.state in ("placed", "started")]


def replay(streams: dict[str, list[tuple[str, bytes, datetime]]], order: list[str], core: SchedulerCore,
           state: SchedulerState, start: dict[str, int] | None = None) -> SchedulerState:
    """Fold every stream in its own order, interleaved as ``order`` says, from ``start``."""
    cursor = dict(start or {})
    names = sorted(streams)
    remaining = sum(len(streams[n]) - cursor.get(n, 0) for n in names)
    turn = 0
    while remaining:
        name = order[turn % len(order)] if order else names[0]
        turn += 1
        if cursor.get(name, 0) >= len(streams[name]):
            name = next(n for n in names if cursor.get(n, 0) < len(streams[n]))
        cursor[name] = cursor.get(name, 0) + 1
        subject, payload, when = streams[name][cursor[name] - 1]
        state, _, _ = core.step(state, Inbound(name, cursor[name], subject, payload, {}, when, True))
        remaining -= 1
    return state


@settings(max_examples=100, deadline=None)
@given(st.lists(op, min_size=20, max_size=60), st.lists(st.sampled_from(STREAMS), min_size=1, max_size=12))
def test_replaying_the_records_equals_the_live_state(ops: list[tuple[Any, ...]], order: list[str]) -> None:
    """REL-1: no decision is made twice while inputs (its own records included) arrive late,
    and a scheduler rebuilt from the records (from nothing, or from a snapshot taken mid-run)
    holds the live state and decides exactly what the live one decides next."""
    live = Live()
    for node in NODES:
        live.append("HP_NODES", subjects.node_view(CLUSTER, node), wire.encode(view(node)))
    jobs = directives = 0
    for happened, *deliveries in ops:
        kind = happened[0]
        record: wire.Record | None = None
        if kind == "job":
            jobs += 1
            record = job(f"j{jobs}", steps=happened[1], duration=happened[2], definition=happened[3])
        elif kind == "view":
            record = view(happened[1], status=happened[2], held=happened[2] == "CORDONED", score=happened[3],
                          definition=happened[4])
        elif kind in ("requeue", "fail"):
            running = live.active_allocations()  # eviction only names allocations it has seen
            if running:
                target = running[happened[1] % len(running)]
                directives += 1
                record = directive(f"d{directives}", target.node_id, kind, target.id)
        elif kind == "terminate":
            directives += 1
            record = directive(f"d{directives}", happened[1], "terminate")
        elif kind == "provider":
            record = provider(happened[1], happened[2])
        elif kind == "config":
            record = config({"nodeHealth": {"drainBelow": happened[1], "cordonBelow": max(happened[1], 60)}},
                            version=jobs)
        elif kind == "tick":
            live.now += timedelta(seconds=happened[1])
            live.tick()
        else:
            live.snapshot = (msgspec.json.encode(live.state), dict(live.cursor))
        if record is not None:
            stream, subject = subject_of(record)
            live.append(stream, subject, wire.encode(record))
        for stream, count in deliveries:
            live.deliver(stream, count)
    for stream in list(live.streams):
        live.deliver(stream, len(live.streams[stream]))
    assert len(set(live.msg_ids)) == len(live.msg_ids)  # no decision made twice

    rebuilt = [replay(live.streams, order, SchedulerCore(), SchedulerState())]
    if live.snapshot is not None:
        restored = msgspec.json.decode(live.snapshot[0], type=SchedulerState)
        rebuilt.append(replay(live.streams, order, SchedulerCore(), restored, live.snapshot[1]))
    then = live.now + timedelta(seconds=5)
    live_state, live_next, _ = live.core.tick(live.state, then)
    for state in rebuilt:
        state, next_emits, _ = SchedulerCore().tick(state, then)
        assert [(e.subject, e.payload, e.msg_id) for e in next_emits] == [
            (e.subject, e.payload, e.msg_id) for e in live_next]
        assert state == live_state


def test_capacity_and_tick_come_from_the_environment() -> None:
    from healthplane_scheduler.main import Settings

    settings_from = Settings.from_env

    assert settings_from({}) == Settings(slots_per_node=1, tick_seconds=1.0)
    assert settings_from({"HEALTHPLANE_SCHEDULER_SLOTS": "4", "HEALTHPLANE_SCHEDULER_TICK_SECONDS": "0.2"}) == \
        Settings(slots_per_node=4, tick_seconds=0.2)
    for bad in ({"HEALTHPLANE_SCHEDULER_SLOTS": "0"}, {"HEALTHPLANE_SCHEDULER_SLOTS": "two"},
                {"HEALTHPLANE_SCHEDULER_TICK_SECONDS": "0"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            settings_from(bad)
