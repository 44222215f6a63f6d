"""health-ingest as its own process on a real nats-server (ING-*, REL-1, REL-3)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from healthplane.contracts import subjects, wire
from healthplane.runtime.replay import replay
from healthplane.stack.natsserver import NatsServer
from healthplane_collector.agent import Collector, Settings
from healthplane_collector.sim import SimNode
from tests.support.secure import env_for

pytestmark = pytest.mark.nats
NOW = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def start_ingest(server: NatsServer, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "healthplane.cli", "service", "health-ingest"],
                            env=env_for(server, "health-ingest"),
                            stdout=subprocess.DEVNULL, stderr=open(log, "ab"))


async def report_of(node: SimNode, cluster: str = "lab", interval: int = 30) -> bytes:
    collector = Collector(Settings(node_id=node.node_id, cluster=cluster, interval_s=interval), node, node.kmsg)
    collector.refresh_inventory()
    return wire.encode(await collector.collect("scheduled", NOW))


async def events(js: JetStreamContext) -> list[wire.NodeEvent]:
    return [wire.decode(wire.NodeEvent, m.data) async for m in replay(js, "HP_NODE_EVENTS", "hp.event.>")]


async def until(predicate, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.05)


async def test_fault_to_condition_events_and_assessment(nats_server: NatsServer, js: JetStreamContext,
                                                        tmp_path: Path) -> None:
    process = start_ingest(nats_server, tmp_path / "ingest.log")
    try:
        node = SimNode("gpu-7")
        await js.publish(subjects.report("lab", "gpu-7"), await report_of(node))
        node.inject("smart-failing", None, NOW)
        await js.publish(subjects.report("lab", "gpu-7"), await report_of(node))
        await js.publish(subjects.report("lab", "bad"), b'{"nodeId": 42}')  # REL-3: refused, nothing else hurt
        node.inject("xid:13", 2, NOW)
        await js.publish(subjects.report("lab", "gpu-7"), await report_of(node))

        async def raised() -> bool:  # the events and the assessment of the last report: two streams
            try:
                last = wire.decode(wire.Assessment, (await js.get_last_msg(
                    "HP_ASSESSMENTS", subjects.assessment("lab", "gpu-7"))).data)
            except NotFoundError:
                return False
            return len([e for e in await events(js) if e.type == "CONDITION_RAISED"]) >= 2 and len(last.conditions) == 2

        await until(raised)
        found = await events(js)
        raised_types = [e.condition.type for e in found if e.type == "CONDITION_RAISED" and e.condition]
        assert raised_types == ["disk_degraded", "gpu_xid_errors"]
        assessment = wire.decode(wire.Assessment, (await js.get_last_msg("HP_ASSESSMENTS", subjects.assessment("lab", "gpu-7"))).data)
        assert assessment.health == "DEGRADED"
        assert {c.type: c.reason for c in assessment.conditions} == {"disk_degraded": "SmartFailing",
                                                                     "gpu_xid_errors": "GpuXidApplication"}
        assert assessment.interval_seconds == 30
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    assert "input rejected" in (tmp_path / "ingest.log").read_text()


async def test_collector_once_output_is_assessed(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> None:
    once = subprocess.run([sys.executable, "-m", "healthplane.cli", "collector", "--once", "-o", "json", "--node-id",
                           "this-host", "--cluster", "lab", "--state-dir", str(tmp_path / "s")],
                          capture_output=True, timeout=120, check=True)
    process = start_ingest(nats_server, tmp_path / "ingest.log")
    try:
        await js.publish(subjects.report("lab", "this-host"), once.stdout)

        async def assessed() -> bool:
            try:
                await js.get_last_msg("HP_ASSESSMENTS", subjects.assessment("lab", "this-host"))
            except Exception:
                return False
            return True

        await until(assessed)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(20)
    report = wire.decode(wire.HealthReport, once.stdout)
    assessment = wire.decode(wire.Assessment, (await js.get_last_msg("HP_ASSESSMENTS", subjects.assessment("lab", "this-host"))).data)
    failed = [n for n in ("edac", "smart", "ioerr", "kmsg", "mounts", "gpu") if getattr(report.signals, n).status == "failed"]
    assert ("collector_failed" in {c.type for c in assessment.conditions}) == bool(failed)


async def test_silent_node_is_missed_on_time_and_resumes(nats_server: NatsServer, js: JetStreamContext,
                                                         tmp_path: Path) -> None:
    # ING-4: interval 1 s, threshold 3 -> the 15 s floor applies.
    process = start_ingest(nats_server, tmp_path / "ingest.log")
    try:
        node = SimNode("quiet-1")
        await js.publish(subjects.report("lab", "quiet-1"), await report_of(node, interval=1))
        sent = asyncio.get_running_loop().time()

        async def missed() -> bool:
            return any(e.type == "HEARTBEAT_MISSED" for e in await events(js))

        await until(missed, timeout=30)
        waited = asyncio.get_running_loop().time() - sent
        assert 14 <= waited <= 20

        async def logged() -> bool:  # the service's line lands after its event: a moment later
            return "quiet-1" in (tmp_path / "ingest.log").read_text()

        await until(logged, timeout=10)
        await js.publish(subjects.report("lab", "quiet-1"), await report_of(node, interval=1))

        async def resumed() -> bool:
            return any(e.type == "HEARTBEAT_RESUMED" for e in await events(js))

        await until(resumed)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(20)
    kinds = [e.type for e in await events(js)]
    assert kinds.count("HEARTBEAT_MISSED") == 1
    assert [k for k in kinds if k.startswith("CONDITION")] == ["CONDITION_RAISED", "CONDITION_CLEARED"]


async def test_kill_9_and_restart_emits_nothing_twice(nats_server: NatsServer, js: JetStreamContext,
                                                      tmp_path: Path) -> None:
    # REL-1: a stream of raising and clearing reports across 50 nodes; kill -9 mid-way.
    nodes = [SimNode(f"n{i:02d}") for i in range(50)]
    payloads: list[tuple[str, bytes]] = []
    for round_ in range(12):
        for node in nodes:
            if round_ % 3 == 1:
                node.inject("xid:13", 0, NOW)  # climbs, then clears on the next quiet report
            payloads.append((subjects.report("lab", node.node_id), await report_of(node)))
    futures = [await js.publish_async(subject, data) for subject, data in payloads]
    await asyncio.gather(*futures)

    first = start_ingest(nats_server, tmp_path / "first.log")

    async def some() -> bool:
        return (await js.stream_info("HP_ASSESSMENTS")).state.messages >= 20

    await until(some, timeout=60)
    await asyncio.sleep(0.2)
    first.send_signal(signal.SIGKILL)
    first.wait()
    second = start_ingest(nats_server, tmp_path / "second.log")

    async def all_raised() -> bool:
        return Counter(e.type for e in await events(js))["CONDITION_RAISED"] >= 4 * 50

    async def second_started() -> bool:  # on a loaded machine the first life may have done it all
        log = tmp_path / "second.log"
        return log.exists() and "service started" in log.read_text()

    try:
        await until(second_started, timeout=60)
        await until(all_raised, timeout=60)
        await asyncio.sleep(1)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(20)
    found = await events(js)
    ids = [e.id for e in found]
    assert len(ids) == len(set(ids))
    per_node: dict[str, list[str]] = {}
    for event in found:
        per_node.setdefault(event.node_id, []).append(event.type)
    # Rounds 1, 4, 7, 10 raise, each after the Xid's FAULT_OBSERVED (RUL-1); the round after
    # each clears: exactly 4 of each per node.
    for node_id, kinds in per_node.items():
        assert kinds == ["FAULT_OBSERVED", "CONDITION_RAISED", "CONDITION_CLEARED"] * 4, (node_id, kinds)
    assert msgspec.json.decode((tmp_path / "second.log").read_text().splitlines()[0])["service"] == "health-ingest"


async def test_service_record_clears_sticky_conditions(nats_server: NatsServer, js: JetStreamContext,
                                                       tmp_path: Path) -> None:
    # ING-3 through the bus: NODE_SERVICED (eviction's record of `node service`) clears a sticky fault.
    process = start_ingest(nats_server, tmp_path / "ingest.log")
    try:
        node = SimNode("svc-1")
        await js.publish(subjects.report("lab", "svc-1"), await report_of(node))
        node.inject("mce-fatal", None, NOW)
        await js.publish(subjects.report("lab", "svc-1"), await report_of(node))

        async def raised() -> bool:
            return any(e.type == "CONDITION_RAISED" for e in await events(js))

        await until(raised)
        serviced = wire.NodeEvent(id="evt-serviced-1", node_id="svc-1", cluster="lab", type="NODE_SERVICED",
                                  occurred_at=NOW, message="Node svc-1 serviced: replaced DIMM", actor="operator")
        await js.publish(subjects.event("lab", "svc-1", "NODE_SERVICED"), wire.encode(serviced))

        async def cleared() -> bool:
            return any(e.type == "CONDITION_CLEARED" for e in await events(js))

        await until(cleared)
        assessment = wire.decode(wire.Assessment, (await js.get_last_msg(
            "HP_ASSESSMENTS", subjects.assessment("lab", "svc-1"))).data)
        assert assessment.conditions == [] and assessment.health == "HEALTHY"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(20)
