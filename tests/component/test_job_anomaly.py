"""JOB-2, JOB-3: health-ingest as its own process on a real nats-server, reading job outcomes
(``hp.jobend``) and raising ``job_failures_anomalous`` on the node whose jobs die (docs/jobs.md)."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from healthplane.contracts import streams, subjects, wire
from healthplane.runtime.replay import replay
from healthplane.stack.natsserver import NatsServer
from healthplane_collector.agent import Collector, Settings
from healthplane_collector.sim import SimNode
from tests.support.secure import env_for

pytestmark = pytest.mark.nats
NOW = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
NODES = [f"cn-{i:02d}" for i in range(20)]


async def report_of(node_id: str, cluster: str) -> bytes:
    node = SimNode(node_id)
    collector = Collector(Settings(node_id=node_id, cluster=cluster, interval_s=3600), node, node.kmsg)
    collector.refresh_inventory()
    return wire.encode(await collector.collect("scheduled", NOW))


def fleet(cluster: str, seed: int, *, black_hole: str | None, bad_user: str | None) -> list[wire.JobOutcome]:
    """400 single-node jobs over 20 nodes, 5 % failing; ``black_hole`` fails every job within
    seconds; ``bad_user``'s application fails at once on every node, half its jobs on cn-05 (the
    node these failures would be blamed on if they named no user)."""
    rng = random.Random(seed)
    out = []
    for i in range(400):
        node, user = rng.choice(NODES), f"user{rng.randrange(6)}"
        if user == bad_user:
            node = "cn-05" if rng.random() < 0.5 else node
            failed, runtime = True, 2.0
        elif node == black_hole:
            failed, runtime = True, 4.0
        else:
            failed, runtime = rng.random() < 0.05, 900.0
        ended = NOW + timedelta(seconds=10 * i)
        out.append(wire.JobOutcome(job_id=f"job-{i}", node_id=node, cluster=cluster,
                                   outcome="failed" if failed else "completed", ended_at=ended,
                                   started_at=ended - timedelta(seconds=runtime), runtime_seconds=runtime,
                                   exit_code=1 if failed else 0, scheduler="reference", user=user,
                                   partition="gpu"))
    return out


async def test_job2_job3_the_black_hole_alone_is_flagged_with_the_numbers_and_a_failing_user_blames_no_node(
        nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-m", "healthplane.cli", "service", "health-ingest"],
                               env=env_for(nats_server, "health-ingest"), stdout=subprocess.DEVNULL,
                               stderr=open(tmp_path / "ingest.log", "ab"))
    try:
        for cluster in ("lab", "apps"):
            for node in NODES:
                await js.publish(subjects.report(cluster, node), await report_of(node, cluster))

        async def assessed() -> bool:  # every node has reported: a condition is written when raised
            for cluster in ("lab", "apps"):
                for node in NODES:
                    try:
                        await js.get_last_msg("HP_ASSESSMENTS", subjects.assessment(cluster, node))
                    except NotFoundError:
                        return False
            return True

        async with asyncio.timeout(60):
            while not await assessed():
                await asyncio.sleep(0.1)
        # lab: cn-13 kills every job within seconds; apps: no bad node, one user's application
        # fails at once wherever it runs (and in lab too, beside the black hole).
        records = fleet("lab", 1, black_hole="cn-13", bad_user="user4") + fleet("apps", 2, black_hole=None,
                                                                                  bad_user="user4")
        last = 0
        for record in records:
            ack = await js.publish(subjects.job_outcome(record.cluster, record.node_id, record.job_id),
                                   wire.encode(record))
            last = ack.seq

        async def folded() -> bool:  # every outcome folded and acked: what it raised is written
            try:
                info = await js.consumer_info("HP_JOB_OUTCOMES",
                                              streams.consumer_name("health-ingest", "HP_JOB_OUTCOMES"))
            except Exception:
                return False
            return info.ack_floor.stream_seq >= last and info.num_ack_pending == 0

        async with asyncio.timeout(60):
            while not await folded():
                await asyncio.sleep(0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    found = [wire.decode(wire.NodeEvent, m.data) async for m in replay(js, "HP_NODE_EVENTS", "hp.event.>")]
    raised = [e for e in found if e.condition is not None and e.condition.type == "job_failures_anomalous"]
    assert [(e.cluster, e.node_id, e.type) for e in raised] == [("lab", "cn-13", "CONDITION_RAISED")]
    condition = raised[0].condition
    assert condition is not None and (condition.reason, condition.severity) == ("JobFailuresAnomalous", "warning")
    message = condition.message
    assert "runs failed within 60s of their start (black hole)" in message
    assert "vs a peer rate of" in message and "p = " in message and "< threshold" in message
    assert "falseAlarmRate 0.01 / (2 tests x 20 nodes x 256 looks)" in message
    assert "left out as failing everywhere: user4" in message
    assessment = wire.decode(wire.Assessment, (await js.get_last_msg(
        "HP_ASSESSMENTS", subjects.assessment("lab", "cn-13"))).data)
    assert "job_failures_anomalous" in {c.type for c in assessment.conditions}
