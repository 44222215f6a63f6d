"""Eviction: time from an injected uncorrectable GPU ECC error on a node with running work to
NODE_EVICTED (report → health-ingest → eviction, both as real service processes), and
`node drain --all` over 10,000 nodes as a user runs it."""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import ClusterConfig
from healthplane.runtime import configstore
from healthplane.stack.natsserver import NatsServer
from healthplane_collector.agent import Collector, Settings
from healthplane_collector.sim import SimNode
from tests.bench import harness
from tests.bench.bus import publish_all

# In-process services run as the test's own identity: on an open server, as the other
# component benches (what identities cost is tests/bench/test_auth_pipeline.py's).
pytestmark = pytest.mark.insecure

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
FAULTS = 100
DRAIN_NODES = 10_000


@contextmanager
def services(server: NatsServer, tmp_path: Path, *names: str) -> Iterator[None]:
    processes = [subprocess.Popen([sys.executable, "-m", "healthplane.cli", "service", name],
                                  env={**os.environ, "HEALTHPLANE_NATS_URL": server.url},
                                  stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{name}.log", "ab"))
                 for name in names]
    try:
        deadline = time.monotonic() + 30
        while not all("service started" in (tmp_path / f"{n}.log").read_text() for n in names):
            assert time.monotonic() < deadline, "services did not start"
            time.sleep(0.05)
        yield
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=20)


async def report(node: SimNode) -> bytes:
    collector = Collector(Settings(node_id=node.node_id, cluster="bench", interval_s=30), node, node.kmsg)
    collector.refresh_inventory()
    return wire.encode(await collector.collect("kmsg", datetime.now(UTC)))


async def test_fault_to_node_evicted_latency(nats_server: NatsServer, nc, js: JetStreamContext,  # type: ignore[no-untyped-def]
                                             tmp_path: Path) -> None:
    await configstore.apply(js, ClusterConfig.model_validate(
        {"cluster": "bench", "nodeHealth": {"evictOnFaultClasses": ["GPU_ECC_ERRORS"]}}), actor="bench")
    nodes = [SimNode(f"gpu-{i:03d}", gpus=8) for i in range(FAULTS)]
    for node in nodes:
        await js.publish(subjects.resource("bench", node.node_id), wire.encode(wire.ResourceReport(
            node_id=node.node_id, cluster="bench", hostname=node.node_id, sent_at=T0, ready=True, cores=192,
            memory_bytes=1 << 40)))
        await js.publish(subjects.allocation("bench", node.node_id, f"{node.node_id}-job.0.0"), wire.encode(
            wire.Allocation(id=f"{node.node_id}-job.0.0", job_id=f"{node.node_id}-job", node_id=node.node_id,
                            cluster="bench", state="started", at=T0, restart="on-node-fault")))
        await js.publish(subjects.report("bench", node.node_id), await report(node))
    evicted: dict[str, float] = {}
    arrived = asyncio.Event()

    async def on_evicted(msg) -> None:  # type: ignore[no-untyped-def]
        evicted[wire.decode(wire.NodeEvent, msg.data).node_id] = time.perf_counter()
        arrived.set()

    await nc.subscribe("hp.event.*.*.NODE_EVICTED", cb=on_evicted)
    latencies = []
    with services(nats_server, tmp_path, "health-ingest", "eviction"):
        await asyncio.sleep(2)  # both have folded the healthy first reports
        for node in nodes:
            arrived.clear()
            started = time.perf_counter()
            node.inject("ecc-uncorrectable", 0, datetime.now(UTC))
            await js.publish(subjects.report("bench", node.node_id), await report(node))
            await asyncio.wait_for(arrived.wait(), 10)
            latencies.append(evicted[node.node_id] - started)
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    harness.record("eviction.fault_to_node_evicted_p50", p50 * 1000, "ms")
    harness.record("eviction.fault_to_node_evicted_p99", p99 * 1000, "ms", target="value <= 1500")


async def test_drain_all_10k_nodes(nats_server: NatsServer, nc, js: JetStreamContext,  # type: ignore[no-untyped-def]
                                   tmp_path: Path) -> None:
    await publish_all(nc, [(subjects.resource("bench", f"cn-{i:05d}"), wire.encode(wire.ResourceReport(
        node_id=f"cn-{i:05d}", cluster="bench", hostname=f"cn-{i:05d}", sent_at=T0, ready=True, cores=192,
        memory_bytes=1 << 40))) for i in range(DRAIN_NODES)])
    with services(nats_server, tmp_path, "scorer", "eviction"):
        async def views() -> int:
            info = await js.stream_info("HP_NODES")
            return info.state.messages

        while await views() < DRAIN_NODES:
            await asyncio.sleep(0.2)
        await asyncio.sleep(1)  # eviction has folded the registrations too
        started = time.perf_counter()
        drained = await asyncio.to_thread(subprocess.run, [
            sys.executable, "-m", "healthplane.cli", "node", "drain", "--all", "--cluster", "bench", "--timeout",
            "120", "--nats-url", nats_server.url], capture_output=True, text=True, timeout=180)
        elapsed = time.perf_counter() - started
    assert drained.stdout.strip() == f"Cordoned {DRAIN_NODES} node(s)", drained.stderr
    harness.record("eviction.drain_all_10k_nodes", elapsed, "s", target="value <= 10")
