"""health-ingest and the scorer together on a real nats-server: the reference's GPU ECC
example end to end, SCORE_CHANGED only on change (SCO-1, SCO-5)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.runtime.replay import replay
from healthplane.stack.natsserver import NatsServer
from healthplane_collector.sim import SimNode
from tests.component.test_health_ingest import NOW, report_of, until
from tests.support.secure import env_for

pytestmark = pytest.mark.nats


def start(server: NatsServer, name: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "healthplane.cli", "service", name],
                            env=env_for(server, name),
                            stdout=subprocess.DEVNULL, stderr=open(log, "ab"))


async def score_events(js: JetStreamContext) -> list[wire.NodeEvent]:
    return [wire.decode(wire.NodeEvent, m.data)
            async for m in replay(js, "HP_NODE_EVENTS", "hp.event.*.*.SCORE_CHANGED")]


async def test_gpu_ecc_scores_100_90_55_end_to_end(nats_server: NatsServer, js: JetStreamContext,
                                                   tmp_path: Path) -> None:
    processes = [start(nats_server, "health-ingest", tmp_path / "ingest.log"),
                 start(nats_server, "scorer", tmp_path / "scorer.log")]
    try:
        # HP_ASSESSMENTS keeps the newest per node: a scorer that starts late sees only that,
        # so the reports go out once both services run, one at a time as a node sends them.
        async def running() -> bool:
            return all("service started" in (tmp_path / f).read_text() for f in ("ingest.log", "scorer.log"))

        await until(running)
        await asyncio.sleep(1)
        node = SimNode("gpu-14")
        subject = subjects.report("lab", "gpu-14")
        for fault in (None, None, "ecc-correctable", None, "ecc-uncorrectable", None):
            if fault:
                node.inject(fault, 0, NOW)
            await js.publish(subject, await report_of(node))
            await asyncio.sleep(0.5)

        async def three() -> bool:
            return len(await score_events(js)) >= 3

        await until(three)
        await asyncio.sleep(1)
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
            process.wait(20)
    found = await score_events(js)
    assert [e.message for e in found] == ["score 100", "score 100 -> 90", "score 90 -> 55"]
    last = found[-1]
    assert last.penalties == "cluster" and [(c.reason, c.points) for c in last.contributions or []] == [
        ("GpuEccUncorrectable", -45)]


def _scrape(port: int) -> str:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return ""


async def test_only_the_leader_exports_node_series_and_failover_moves_them(
        nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> None:
    # SCO-6: series from the lease holder only; absent score for an unscored node; a replica
    # takes over when the leader dies.
    from tests.support.records import resource_report
    from tests.support.service import spawn

    ingest = start(nats_server, "health-ingest", tmp_path / "ingest.log")
    started = [spawn("scorer", env_for(nats_server, "scorer", HEALTHPLANE_INSTANCE=f"scorer-{i}"),  # two replicas
                     tmp_path / f"scorer-{i}.log") for i in range(2)]
    scorers, ports = [process for process, _ in started], [port for _, port in started]
    try:
        await js.publish(subjects.resource("lab", "fresh-1"), wire.encode(resource_report("fresh-1", cluster="lab")))
        node = SimNode("gpu-1")
        node.inject("smart-failing", None, NOW)
        await js.publish(subjects.report("lab", "gpu-1"), await report_of(node))
        series = 'healthplane_node_reliability_score{cluster="lab",node_id="gpu-1"} 60.0'

        async def one_leader_exports() -> bool:
            texts = [_scrape(p) for p in ports]
            return sum(series in t for t in texts) == 1

        await until(one_leader_exports, timeout=30)
        texts = [_scrape(p) for p in ports]
        leader = 0 if series in texts[0] else 1
        text = texts[leader]
        assert 'healthplane_node_condition{cluster="lab",condition="disk_degraded",node_id="gpu-1"} 3.0' in text
        assert 'healthplane_node_condition{cluster="lab",condition="heartbeat_missed",node_id="gpu-1"} 0.0' in text
        assert 'healthplane_node_health{cluster="lab",node_id="fresh-1",state="unknown"} 1.0' in text
        assert 'node_id="fresh-1"' not in "\n".join(
            line for line in text.splitlines() if line.startswith("healthplane_node_reliability_score"))
        assert "gpu-1" not in texts[1 - leader]  # the follower exports no node series
        # Issue 25: the same port says whether each replica is alive and caught up.
        import httpx

        async with httpx.AsyncClient(timeout=5) as http:
            for port, said in ((ports[leader], "scorer: caught up"), (ports[1 - leader], "scorer: standby")):
                assert (await http.get(f"http://127.0.0.1:{port}/healthz")).text.strip() == "ok"
                answer = await http.get(f"http://127.0.0.1:{port}/readyz")
                assert (answer.status_code, answer.text.strip()) == (200, said)

        scorers[leader].send_signal(signal.SIGKILL)
        scorers[leader].wait()

        async def follower_took_over() -> bool:
            return series in _scrape(ports[1 - leader])

        await until(follower_took_over, timeout=30)
    finally:
        for process in [ingest, *scorers]:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(20)
