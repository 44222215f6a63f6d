"""Issue 25, the load generator's own ceiling and memory (``healthplane sim load``): reports per
second per core of CPU it sends and gets acknowledged, against raw pipelined publishes of one
pre-encoded report through the same Publisher in the same run (the floor of what any
generator in this process could do), and the memory each simulated node holds once every node
has reported. Goals: >= 20,000 reports/s on one core; <= 1 KB per simulated node."""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from healthplane.contracts import subjects
from healthplane.runtime import converge, logs
from healthplane.runtime.connect import connect
from healthplane.runtime.publish import Publisher
from healthplane.stack.natsserver import NatsServer
from healthplane_collector.loadgen import LoadFleet, Templates
from tests.bench import harness

pytestmark = pytest.mark.insecure
NODES = 100_000
RUN_S = 6.0


async def _raw_rate(nc: Any, payload: bytes, seconds: float) -> float:
    """Acknowledged publishes per CPU second, one payload over and over, 4,096 in flight."""
    publisher = Publisher(nc, window=4096)
    acked = 0

    def done(future: asyncio.Future[Any]) -> None:
        nonlocal acked
        if not future.cancelled() and future.exception() is None:
            acked += 1

    cpu, end = time.process_time(), time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        (await publisher.submit(subjects.report("raw", f"n{i % NODES}"), payload)).add_done_callback(done)
        i += 1
    await asyncio.sleep(1.0)  # the last acks
    return acked / (time.process_time() - cpu)


async def test_loadgen_ceiling_and_memory_per_node(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats").start()
    nc = await connect(server.url, name="bench", give_up_after=10)
    try:
        await converge.ensure(nc.jetstream())
        # Memory: every node's first cycle made (its identity kept), nothing sent.
        fleet = LoadFleet(NODES, "bench", interval_s=1)
        templates = await Templates.build("bench", 1, 8)
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        now = datetime.now(UTC)
        for index in range(NODES):
            fleet.records(index, templates, now)
        per_node = (tracemalloc.get_traced_memory()[0] - before) / NODES
        tracemalloc.stop()

        # Ceiling: a fresh fleet asked for 100,000 reports/s (more than it can send).
        fleet = LoadFleet(NODES, "bench", interval_s=1)
        stopping = asyncio.Event()
        log = logs.configure("bench-loadgen")
        cpu = time.process_time()
        running = asyncio.create_task(fleet.run(nc, stopping, log))
        await asyncio.sleep(RUN_S)
        stopping.set()
        await running
        await asyncio.sleep(1.0)
        loadgen = fleet.sent / (time.process_time() - cpu)
        raw = await _raw_rate(nc, templates.report_scheduled.fill([b"x"] * 11 + [b"2026-12-01T09:00:00Z"]), RUN_S)
    finally:
        await nc.close()
        server.stop()
    print(f"loadgen: {loadgen:,.0f} reports/s per CPU second (raw publish {raw:,.0f}), {per_node:.0f} B per node")
    harness.record("loadgen.reports_per_cpu_s", loadgen, "reports/s", baseline=raw, target="value >= 20000")
    harness.record("loadgen.bytes_per_node", per_node, "B", target="value <= 1024")
