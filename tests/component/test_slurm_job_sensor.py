"""The scheduler as a sensor on a real Slurm 22.05 (tests/support/slurm.py) and a real
nats-server: an administrator's drain is a node event and the ``scheduler_drained`` condition
(JOB-4), and jobs run with ``sbatch`` are outcomes on their nodes, listed by ``jobs impact``
(JOB-1). The test plays the rest of the control plane, as tests/component/test_slurm_adapter.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.contracts import wire
from healthplane.runtime.fold import Inbound
from healthplane.runtime.replay import read_all
from healthplane.stack.natsserver import NatsServer
from healthplane_health_ingest.fold import IngestCore
from tests.component.test_slurm_adapter import (  # the adapter process as a fixture, and its helpers
    Adapter,
    adapter,  # noqa: F401
    drained,
    put,
    reason,
    until,
    view,
)
from tests.support.secure import env_for
from tests.support.slurm import SlurmCluster

pytestmark = [pytest.mark.nats, pytest.mark.slurm]


async def scheduler_events(nc: NATS, js: JetStreamContext) -> list[tuple[int, wire.NodeEvent]]:
    found = await read_all(nc, js, "HP_NODE_EVENTS", ["hp.event.*.*.SCHEDULER_DRAINED", "hp.event.*.*.SCHEDULER_UNDRAINED"])
    return [(m.seq, wire.decode(wire.NodeEvent, m.data)) for m in found]


async def outcomes(nc: NATS, js: JetStreamContext) -> list[wire.JobOutcome]:
    return [wire.decode(wire.JobOutcome, m.data) for m in await read_all(nc, js, "HP_JOB_OUTCOMES", "hp.jobend.>")]


def report(node: str, at: datetime) -> wire.HealthReport:
    quiet = wire.Signals(edac=wire.EdacSignal(status="ok"), smart=wire.SmartSignal(status="ok"),
                         ioerr=wire.IoerrSignal(status="ok"), kmsg=wire.KmsgSignal(status="ok"),
                         mounts=wire.MountsSignal(status="ok"), gpu=wire.GpuSignal(status="unavailable"))
    return wire.HealthReport(node_id=node, cluster="default", hostname=node, sent_at=at, interval_seconds=30,
                             trigger="scheduled", signals=quiet)


async def test_job4_an_administrators_drain_is_an_event_and_a_condition_never_undone(
        nc: NATS, js: JetStreamContext, slurm: SlurmCluster, adapter: Adapter) -> None:  # noqa: F811
    """JOB-4: `scontrol update state=drain reason="bad DIMM, ticket 4711"` by an administrator
    becomes SCHEDULER_DRAINED with the reason and the user within one reconcile; health-ingest
    folds it into `scheduler_drained` with both; the adapter never resumes the node; the
    administrator's resume is SCHEDULER_UNDRAINED, which clears the condition. A FAIL is one too."""
    await put(js, view("sim-000"), view("sim-001"))
    slurm.drain("sim-000", "bad DIMM, ticket 4711")
    slurm.run("scontrol", "update", "nodename=sim-001", "state=fail", "reason=flaky PSU")

    async def both() -> bool:
        return {e.node_id for _, e in await scheduler_events(nc, js) if e.type == "SCHEDULER_DRAINED"} == {
            "sim-000", "sim-001"}

    await until(both, what="SCHEDULER_DRAINED for both nodes")
    drains = {e.node_id: e for _, e in await scheduler_events(nc, js)}
    dimm = drains["sim-000"].scheduler
    assert dimm is not None
    assert (dimm.state, dimm.reason, dimm.set_by, dimm.scheduler) == ("DRAIN", "bad DIMM, ticket 4711", "root", "slurm")
    assert drains["sim-000"].message == "drained in Slurm by root: bad DIMM, ticket 4711"
    assert drains["sim-000"].actor == "slurm-adapter" and dimm.set_at is not None
    assert drains["sim-001"].scheduler is not None and drains["sim-001"].scheduler.state == "FAIL"

    # Never undone, never overwritten: several passes later Slurm still says what the administrator said.
    await until(lambda: "healthplane_slurm_reconcile_passes_total" in adapter.metrics(), what="metrics")
    passes = _passes(adapter.metrics())
    await until(lambda: _passes(adapter.metrics()) >= passes + 4, what="four more passes")
    assert drained(slurm, "sim-000") and reason(slurm, "sim-000") == "bad DIMM, ticket 4711"
    assert len([e for _, e in await scheduler_events(nc, js) if e.node_id == "sim-000"]) == 1, "recorded twice"

    slurm.resume("sim-000")

    async def lifted() -> bool:
        return any(e.type == "SCHEDULER_UNDRAINED" and e.node_id == "sim-000" for _, e in await scheduler_events(nc, js))

    await until(lifted, what="SCHEDULER_UNDRAINED")

    # What health-ingest makes of them, from the stream's own records: the condition with the
    # reason and the user, raised on the node's report, cleared by the administrator's resume.
    core, state = IngestCore(plugins=[]), IngestCore(plugins=[]).initial_state()
    at = datetime.now(UTC)
    state = core.step(state, _inbound("HP_REPORTS", 1, "hp.report.default.sim-000", wire.encode(report("sim-000", at)),
                                      at)).state
    raised: list[wire.Assessment] = []
    for seq, event in await scheduler_events(nc, js):
        if event.node_id != "sim-000":
            continue
        done = core.step(state, _inbound("HP_NODE_EVENTS", seq, f"hp.event.default.sim-000.{event.type}",
                                         wire.encode(event), at + timedelta(seconds=seq)))
        state = done.state
        raised += [wire.decode(wire.Assessment, e.payload) for e in done.emits if e.subject.startswith("hp.assess.")]
    first, last = raised[0], raised[-1]
    condition = {c.type: c for c in first.conditions}["scheduler_drained"]
    assert (condition.reason, condition.severity) == ("SchedulerDrain", "warning")
    assert "bad DIMM, ticket 4711" in condition.message and "by root" in condition.message
    assert first.health == "HEALTHY" and not first.real_fault, "the scheduler's word is no fault of Healthplane's"
    assert "scheduler_drained" not in {c.type for c in last.conditions}


def _passes(metrics: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("healthplane_slurm_reconcile_passes_total{"))


def _inbound(stream: str, seq: int, subject: str, data: bytes, at: datetime) -> Inbound:
    return Inbound(stream=stream, seq=seq, subject=subject, data=data, headers={}, at=at, caught_up=True)


async def test_job1_sbatch_jobs_become_outcomes_and_jobs_impact_lists_the_failed_one(
        nc: NATS, js: JetStreamContext, nats_server: NatsServer, slurm: SlurmCluster,
        adapter: Adapter) -> None:  # noqa: F811
    """JOB-1: jobs that succeed, fail with exit code 3 and get cancelled are outcomes on their
    nodes (completed; failed with the exit code; cancelled), each once, with size, runtime,
    partition and user, from the adapter's own records (this Slurm keeps no accounting);
    `healthplane jobs impact --since 1h` lists the failed job with its node."""
    ok = slurm.sbatch("sleep 1", node="sim-000")
    bad = slurm.sbatch("sleep 1; exit 3", node="sim-001")
    cancelled = slurm.sbatch("sleep 600", node="sim-002")
    await until(lambda: slurm.job(cancelled) is not None and slurm.job(cancelled)["job_state"] == "RUNNING",  # type: ignore[index]
                what="the job to run")
    slurm.run("scancel", cancelled)

    async def three() -> bool:
        return {o.job_id for o in await outcomes(nc, js)} >= {ok, bad, cancelled}

    await until(three, what="three outcomes")
    found = {o.job_id: o for o in await outcomes(nc, js)}
    assert (found[ok].outcome, found[ok].node_id, found[ok].exit_code) == ("completed", "sim-000", 0)
    assert (found[bad].outcome, found[bad].node_id, found[bad].exit_code, found[bad].signal) == (
        "failed", "sim-001", 3, None)
    assert found[cancelled].outcome == "cancelled" and found[cancelled].node_id == "sim-002"
    for record in found.values():
        assert (record.scheduler, record.source, record.size, record.partition, record.user) == (
            "slurm", "observed", 1, "batch", "root")
        assert record.started_at is not None and record.runtime_seconds is not None and record.runtime_seconds >= 0
    assert found[bad].runtime_seconds is not None and found[bad].runtime_seconds >= 1
    counts = Counter(o.job_id for o in await outcomes(nc, js))
    assert max(counts.values()) == 1, f"an outcome written twice: {counts}"

    shown = subprocess.run([sys.executable, "-m", "healthplane.cli", "jobs", "impact", "--since", "1h", "-o", "json"],
                           env=env_for(nats_server, "viewer", "alice"), capture_output=True, text=True, timeout=60,
                           check=False)
    assert shown.returncode == 0, shown.stderr
    jobs = json.loads(shown.stdout)["jobs"]
    assert [j["jobId"] for j in jobs] == [bad]
    assert jobs[0]["exitCode"] == 3 and [n["nodeId"] for n in jobs[0]["nodes"]] == ["sim-001"]
    text = subprocess.run([sys.executable, "-m", "healthplane.cli", "jobs", "impact", "--since", "1h"],
                          env=env_for(nats_server, "viewer", "alice"), capture_output=True, text=True, timeout=60,
                          check=False)
    assert f"job {bad} failed (exit code 3)" in text.stdout and "sim-001: no conditions" in text.stdout
