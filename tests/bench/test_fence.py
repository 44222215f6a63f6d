"""What the server's fence costs a lease holder (HA-3, runtime.fencing), fenced against unfenced
(pipelined, no expectations) back to back in the same run, on one server and on a
three-server cluster (R3): health-ingest folding the same 50,000 reports (one output stream:
a batch's assessments are one run), and the scorer scoring 20,000 nodes for the first time
(two output streams in turn: each assessment's SCORE_CHANGED, then its node view, the
startup wave's worst case). Client CPU per record, and records/s."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from healthplane.runtime import converge
from healthplane.runtime.connect import connect
from healthplane.runtime.processor import Processor
from healthplane.stack.natsserver import NatsCluster, NatsServer
from healthplane_health_ingest.fold import INPUTS, OUTPUTS, IngestCore
from healthplane_health_ingest.rules import IngestState
from healthplane_scorer.fold import INPUTS as SCORER_INPUTS
from healthplane_scorer.fold import OUTPUTS as SCORER_OUTPUTS
from healthplane_scorer.fold import ScorerCore, ScorerState
from tests.bench import harness
from tests.bench.bus import CpuMeter, fleet_reports, processor_rate, publish_all

# The bench measures the runtime's write path, not the permissions (tests/component covers those).
pytestmark = pytest.mark.insecure
NODES = 50_000
FIRST_SCORES = 20_000


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
    await converge.ensure(js, servers=len(nc.servers))
    try:
        yield nc, js
    finally:
        await nc.close()


async def _back_to_back(servers: NatsServer | NatsCluster, nc: Any, js: Any, name: str, stream: str, count: int,
                        before_each: Callable[[], Awaitable[object]] | None = None, **fold: Any) -> dict[str, float]:
    """Unfenced, fenced, and both again, each a fresh Processor folding ``count`` records of
    ``stream``: the best rate and the lowest client CPU per record of each kind."""
    meter_server = servers if isinstance(servers, NatsServer) else servers.servers[0]
    results: dict[str, list[tuple[float, float]]] = {"plain": [], "fenced": []}
    for kind in ("plain", "fenced", "plain", "fenced"):
        if before_each is not None:
            await before_each()
        proc = Processor(nc=nc, js=js, service=f"{name}-{kind}-{len(results[kind])}", batch=512,
                         snapshot_every_inputs=10**9, snapshot_every_s=10**9,
                         fence=(lambda: 1) if kind == "fenced" else None, **fold)
        await proc.start()
        meter = CpuMeter(meter_server)  # type: ignore[arg-type]
        rate = await processor_rate(proc, stream, count, meter)
        results[kind].append((rate, meter.reading[0]))
        await asyncio.sleep(0.5)
    return {"plain": max(r for r, _ in results["plain"]), "fenced": max(r for r, _ in results["fenced"]),
            "plain_cpu": min(c for _, c in results["plain"]), "fenced_cpu": min(c for _, c in results["fenced"])}


async def test_fence_cost_per_report(servers: NatsServer | NatsCluster, bus) -> None:  # type: ignore[no-untyped-def]
    nc, js = bus
    await publish_all(nc, await fleet_reports(NODES))
    where = "1" if isinstance(servers, NatsServer) else "3"
    got = await _back_to_back(servers, nc, js, "ingest", "HP_REPORTS", NODES, core=IngestCore(),
                              state_type=IngestState, inputs=INPUTS, outputs=OUTPUTS)
    harness.record(f"fence.ingest_reports_per_s.{where}_servers", got["fenced"], "reports/s", baseline=got["plain"],
                   target="ratio >= 0.9")
    harness.record(f"fence.ingest_client_cpu_us_per_report.{where}_servers", got["fenced_cpu"], "us",
                   baseline=got["plain_cpu"], target="ratio <= 1.1")


async def test_fence_cost_per_first_score(servers: NatsServer | NatsCluster, bus) -> None:  # type: ignore[no-untyped-def]
    nc, js = bus
    await publish_all(nc, await fleet_reports(FIRST_SCORES))
    ingest = Processor(nc=nc, js=js, service="ingest", core=IngestCore(), state_type=IngestState, inputs=INPUTS,
                       outputs=OUTPUTS, batch=512, snapshot_every_inputs=10**9, snapshot_every_s=10**9)
    await ingest.start()
    await processor_rate(ingest, "HP_REPORTS", FIRST_SCORES)
    where = "1" if isinstance(servers, NatsServer) else "3"
    got = await _back_to_back(
        servers, nc, js, "scorer", "HP_ASSESSMENTS", FIRST_SCORES,
        # each scorer's views replace nothing: the same work each time
        before_each=lambda: js.purge_stream("HP_NODES"), core=ScorerCore(), state_type=ScorerState,
        inputs=[spec for spec in SCORER_INPUTS if spec.stream in ("HP_ASSESSMENTS", "HP_CONFIG")],
        outputs=SCORER_OUTPUTS)
    harness.record(f"fence.scorer_first_scores_per_s.{where}_servers", got["fenced"], "assessments/s",
                   baseline=got["plain"], target="ratio >= 0.9")
    harness.record(f"fence.scorer_client_cpu_us_per_first_score.{where}_servers", got["fenced_cpu"], "us",
                   baseline=got["plain_cpu"], target="ratio <= 1.1")
