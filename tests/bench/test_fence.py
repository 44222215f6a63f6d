"""What the server's fence costs a lease holder (HA-3, runtime.fencing): health-ingest folding
the same 50,000 reports as a holder behind a lease (its records as atomic batches bound to its
mark) and unfenced (pipelined, as before), back to back in the same run, on one server and on
a three-server cluster (R3). Client CPU per report, and reports/s."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from healthplane import streams
from healthplane.natsserver import NatsCluster, NatsServer
from healthplane.runtime.connect import connect
from healthplane.runtime.processor import Processor
from healthplane_health_ingest.fold import INPUTS, OUTPUTS, IngestCore
from healthplane_health_ingest.rules import IngestState
from tests.bench import harness
from tests.bench.bus import CpuMeter, fleet_reports, processor_rate, publish_all

# The bench measures the runtime's write path, not the permissions (tests/component covers those).
pytestmark = pytest.mark.insecure
NODES = 50_000


@pytest.fixture(params=["one server", "three servers"])
def servers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NatsServer | NatsCluster]:
    running: NatsServer | NatsCluster = (NatsServer(tmp_path / "nats").start() if request.param == "one server"
                                         else NatsCluster(tmp_path / "cluster").start())
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
async def bus(servers: NatsServer | NatsCluster) -> AsyncIterator[tuple[object, object]]:
    nc = await connect(servers.url, name="bench", give_up_after=10)
    js = nc.jetstream()
    await streams.ensure(js, servers=len(nc.servers))
    try:
        yield nc, js
    finally:
        await nc.close()


async def test_fence_cost_per_report(servers: NatsServer | NatsCluster, bus) -> None:  # type: ignore[no-untyped-def]
    nc, js = bus
    await publish_all(nc, await fleet_reports(NODES))
    where = "1" if isinstance(servers, NatsServer) else "3"
    meter_server = servers if isinstance(servers, NatsServer) else servers.servers[0]
    results: dict[str, tuple[float, float]] = {}
    for kind in ("plain", "fenced", "plain-again", "fenced-again"):
        proc = Processor(nc=nc, js=js, service=f"ingest-{kind}", core=IngestCore(), state_type=IngestState,
                         inputs=INPUTS, outputs=OUTPUTS, batch=512, snapshot_every_inputs=10**9,
                         snapshot_every_s=10**9, fence=(lambda: 1) if kind.startswith("fenced") else None)
        await proc.start()
        meter = CpuMeter(meter_server)  # type: ignore[arg-type]
        rate = await processor_rate(proc, "HP_REPORTS", NODES, meter)
        results[kind] = (rate, meter.reading[0])
        await asyncio.sleep(0.5)
    plain = max(results["plain"][0], results["plain-again"][0])
    fenced = max(results["fenced"][0], results["fenced-again"][0])
    plain_cpu = min(results["plain"][1], results["plain-again"][1])
    fenced_cpu = min(results["fenced"][1], results["fenced-again"][1])
    harness.record(f"fence.ingest_reports_per_s.{where}_servers", fenced, "reports/s", baseline=plain,
                   target="ratio >= 0.9")
    harness.record(f"fence.ingest_client_cpu_us_per_report.{where}_servers", fenced_cpu, "us", baseline=plain_cpu,
                   target="ratio <= 1.1")
