"""Issue 43.6, pure: the reference scheduler's failure models for JOB-2's cases — a node that kills
jobs (``sim inject --fault job-killer --rate R``: a black hole, each step failing within a
second), one dying slowly (``--fault slow-death``: the chance rising over a ramp, each failing at
its normal end) and a bad application (``sim submit --fails-everywhere``: every step fails
wherever it runs). Drawn from each allocation's id: the same step ends the same way in every
tick and every rebuilt index."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest

from healthplane.contracts import subjects, wire
from healthplane_collector.sim import FaultError, SimNode, job_failures
from healthplane_scheduler.rules import KILLED_AFTER_S, draw, failure_chance
from tests.unit.test_scheduler_core import CLUSTER, T0, Bus, at, job, view


def killer(bus: Bus, node: str, model: wire.SimJobFailures | None, gpus: list[int] | None = None) -> None:
    truth = wire.SimHardware(node_id=node, cluster=CLUSTER, failing_gpus=gpus or [], set_at=T0, actor="test",
                             jobs=model)
    bus.state, emits, _ = bus.core.step(bus.state, bus.append("HP_COMMANDS", subjects.hardware(CLUSTER, node),
                                                              wire.encode(truth), T0))
    assert not emits


def run_all(bus: Bus, until: float, every: float = 0.5) -> None:
    t = 0.0
    while t <= until:
        bus.tick(t)
        t += every


def test_job_killer_at_rate_1_fails_every_step_within_a_second_and_its_peers_run_on() -> None:
    """JOB-2 (43.6): a black hole: every step on the node fails KILLED_AFTER_S after its start; the
    healthy node's steps run their full duration and complete."""
    bus = Bus()
    bus.put(view("n-bad"), view("n-good"), *[job(f"j{i}", duration=30) for i in range(6)])
    killer(bus, "n-bad", wire.SimJobFailures(model="job-killer", rate=1.0, since=T0))
    run_all(bus, 200)
    bad = [o for o in bus.outcomes if o.node_id == "n-bad"]
    good = [o for o in bus.outcomes if o.node_id == "n-good"]
    assert bad and good and len(bad) + len(good) == 6
    assert {o.outcome for o in bad} == {"failed"} and {o.outcome for o in good} == {"completed"}
    assert {o.runtime_seconds for o in bad} == {KILLED_AFTER_S} and {o.runtime_seconds for o in good} == {30.0}
    assert all("simulated job-killer node" in (o.reason or "") for o in bad)
    assert len(bad) > len(good)  # its quick deaths drain the queue into it


def test_job_killer_at_rate_0_9_fails_about_nine_in_ten() -> None:
    """JOB-2 (43.6): the rate is the chance per step (a binomial count: 200 steps at 0.9 fail 165..195)."""
    bus = Bus()
    bus.put(view("n-bad"), *[job(f"j{i}", duration=2) for i in range(200)])
    killer(bus, "n-bad", wire.SimJobFailures(model="job-killer", rate=0.9, since=T0))
    run_all(bus, 800)
    assert len(bus.outcomes) == 200
    failed = [o for o in bus.outcomes if o.outcome == "failed"]
    assert 165 <= len(failed) <= 195
    assert {o.runtime_seconds for o in failed} == {1.0}


def test_slow_death_rises_over_its_ramp_and_its_steps_fail_at_their_normal_end() -> None:
    """JOB-2 (43.6): the chance rises linearly from 0 at the injection to the rate over the ramp: the
    first steps of a 400 s ramp mostly complete, those after it mostly fail, each failure after
    its full duration (not a black hole)."""
    model = wire.SimJobFailures(model="slow-death", rate=1.0, since=T0, ramp_seconds=400)
    assert [failure_chance(model, at(s)) for s in (-5, 0, 100, 200, 400, 900)] == [0, 0, 0.25, 0.5, 1.0, 1.0]
    bus = Bus()
    bus.put(view("n-dying"), *[job(f"j{i:03d}", duration=5) for i in range(120)])
    killer(bus, "n-dying", model)
    run_all(bus, 800)
    assert len(bus.outcomes) == 120
    early = [o for o in bus.outcomes if o.started_at and o.started_at < at(100)]
    late = [o for o in bus.outcomes if o.started_at and o.started_at >= at(400)]
    assert sum(o.outcome == "failed" for o in early) <= len(early) // 2  # chance 0 to 0.25: 5 of 19 here
    assert all(o.outcome == "failed" for o in late) and late
    assert {o.runtime_seconds for o in bus.outcomes} == {5.0}


def test_a_bad_application_fails_on_every_node_at_once() -> None:
    """JOB-2 (43.6): ``fails_everywhere``: every step fails within a second on healthy nodes alike,
    naming the application; the user's other jobs are untouched."""
    bus = Bus()
    bad = wire.Job(id="bad", cluster=CLUSTER, steps=1, duration_seconds=60, submitted_at=T0, submitted_by="mallory",
                   fails_everywhere=True)
    bus.put(view("n1"), view("n2"), view("n3"), *[msgspec_copy(bad, f"bad-{i}") for i in range(6)],
            job("fine", duration=10))
    run_all(bus, 120)
    mine = [o for o in bus.outcomes if o.job_id.startswith("bad-")]
    assert len(mine) == 6 and {o.outcome for o in mine} == {"failed"} and len({o.node_id for o in mine}) == 3
    assert {o.runtime_seconds for o in mine} == {KILLED_AFTER_S} and {o.user for o in mine} == {"mallory"}
    assert "simulated bad application" in (mine[0].reason or "")
    assert [o.outcome for o in bus.outcomes if o.job_id == "fine"] == ["completed"]


def msgspec_copy(record: wire.Job, job_id: str) -> wire.Job:
    return msgspec.structs.replace(record, id=job_id)


def test_a_job_killer_passes_its_validation_run_and_clear_ends_the_killing() -> None:
    """JOB-2 (43.6): a diagnostic checks the hardware, which is fine: the validation run on a job-killer
    passes (JOB-3's "passed and still failing"); ``clear`` (a record with no model) ends it."""
    bus = Bus()
    suite = wire.ValidationSuite(name="diag", command=["dcgmi", "diag"], timeout_seconds=60)
    bus.put(view("n-bad"), wire.Job(id="val", cluster=CLUSTER, steps=1, duration_seconds=0, submitted_at=T0,
                                    submitted_by="eviction", nodes=["n-bad"], validation=suite))
    killer(bus, "n-bad", wire.SimJobFailures(model="job-killer", rate=1.0, since=T0))
    ended = [a for t in range(0, 20) for a in bus.tick(t) if isinstance(a, wire.Allocation) and a.job_id == "val"]
    assert ended[-1].state == "finished" and ended[-1].exit_code == 0
    killer(bus, "n-bad", None)
    bus.put(job("after", duration=3))
    run_all(bus, 40)
    assert [o.outcome for o in bus.outcomes if o.job_id == "after"] == ["completed"]


def test_the_draw_is_fixed_by_the_allocation_id_and_uniform_enough() -> None:
    """JOB-2 (43.6), REL-1: a step's fate is a function of its allocation id."""
    draws = [draw(f"job-{i}.0.0") for i in range(4000)]
    assert draws[:50] == [draw(f"job-{i}.0.0") for i in range(50)]
    assert all(0.0 <= d < 1.0 for d in draws)
    for cut in (0.1, 0.5, 0.9):
        assert abs(sum(d < cut for d in draws) / len(draws) - cut) < 0.03


@pytest.mark.parametrize(("fault", "rate", "ramp", "error"), [
    ("job-killer", 1.5, None, "--rate must be a probability between 0 and 1 (got 1.5)"),
    ("job-killer", 0.9, 60.0, "--ramp is slow-death's"),
    ("slow-death", None, 0.0, "--ramp must be a number of seconds > 0 (got 0)"),
    ("slow-death", -0.1, None, "--rate must be a probability"),
])
def test_sim_inject_refuses_a_model_it_cannot_run_in_one_line(fault: str, rate: float | None, ramp: float | None,
                                                               error: str) -> None:
    """JOB-2 (43.6): a model the simulator cannot run is refused in one line."""
    with pytest.raises(FaultError, match="^" + error.replace("(", r"\(").replace(")", r"\)")):
        job_failures(fault, rate, ramp, T0)


def test_sim_node_keeps_the_model_until_clear_and_its_reports_stay_clean() -> None:
    """JOB-2 (43.6): the node keeps its model until clear; --rate on another fault is refused."""
    node = SimNode("n1")
    said = node.inject("job-killer", None, T0, rate=0.9)
    assert said == "job-killer injected on n1: each job it runs fails within seconds with probability 0.9"
    assert node.hardware.jobs == wire.SimJobFailures(model="job-killer", rate=0.9, since=T0)
    said = node.inject("slow-death", None, T0 + timedelta(seconds=1))
    assert "rises from 0 to 1 over 3600s" in said and node.hardware.jobs is not None
    node.inject("clear", None, T0)
    assert node.hardware.jobs is None
    with pytest.raises(FaultError, match=r"^--rate and --ramp are job-killer's and slow-death's, not xid:79's$"):
        node.inject("xid:79", 0, T0, rate=0.5)
