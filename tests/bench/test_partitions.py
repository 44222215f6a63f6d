"""HA-5, scale-out overhead: client CPU per report for health-ingest and the scorer folding
the same fleet as P = 1, 2 and 4 partitions (HA-4), all partitions in this process, on a
partitioned install (the streams append each node's slot). CPU, not wall time: two cores
cannot show a speed-up, but they show what partitioning costs per report (more consumers,
more pull requests, smaller batches per partition). P = 1 runs first and last; the better of
the two is the same-run baseline. Goal: P = 4 within 10 % of P = 1."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from nats.js import JetStreamContext

from healthplane.runtime import converge
from healthplane.runtime.connect import connect
from healthplane.runtime.fold import Input
from healthplane.runtime.processor import Processor
from healthplane.stack.natsserver import NatsServer
from healthplane_health_ingest.fold import INPUTS as INGEST_INPUTS
from healthplane_health_ingest.fold import OUTPUTS as INGEST_OUTPUTS
from healthplane_health_ingest.fold import IngestCore
from healthplane_health_ingest.rules import IngestState
from healthplane_scorer.fold import INPUTS as SCORER_INPUTS
from healthplane_scorer.fold import OUTPUTS as SCORER_OUTPUTS
from healthplane_scorer.fold import ScorerCore, ScorerState
from tests.bench import harness
from tests.bench.bus import fleet_reports, publish_all

# The bench measures the partitioned fold, not the permissions (tests/component covers those).
pytestmark = pytest.mark.insecure
NODES = 20_000


@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[tuple[Any, JetStreamContext]]:
    server = NatsServer(tmp_path / "nats").start()
    nc = await connect(server.url, name="bench", give_up_after=10)
    js = nc.jetstream()
    await converge.ensure(js, slotted=True)
    try:
        yield nc, js
    finally:
        await nc.close()
        server.stop()


async def _fold(nc: Any, js: JetStreamContext, service: str, core: Any, state_type: type, inputs: Sequence[Input],
                outputs: Sequence[str], stream: str, partitions: int) -> float:
    """Client CPU microseconds per record of ``stream`` for ``partitions`` Processors folding
    all of it, start-up excluded."""
    procs = [Processor(nc=nc, js=js, service=service, core=core(), state_type=state_type, inputs=inputs,
                       outputs=outputs, batch=512, snapshot_every_inputs=10**9, snapshot_every_s=10**9,
                       partition=k, partitions=partitions) for k in range(partitions)]
    for proc in procs:
        await proc.start()
    total = (await js.stream_info(stream)).state.messages
    consumers = [f"{proc.producer}-{stream}".replace(".", "_") for proc in procs]
    started = time.process_time()
    tasks = [asyncio.create_task(proc.run()) for proc in procs]
    while True:
        infos = [await js.consumer_info(stream, name) for name in consumers]
        if sum(info.ack_floor.stream_seq > 0 and info.num_pending == 0 and info.num_ack_pending == 0
               for info in infos) == partitions and sum(info.delivered.consumer_seq for info in infos) >= total:
            break
        await asyncio.sleep(0.05)
    used = time.process_time() - started
    for proc in procs:
        proc.stop()
    await asyncio.gather(*tasks)
    return used / total * 1e6


async def test_partitions_cost_per_report(bus) -> None:  # type: ignore[no-untyped-def]
    nc, js = bus
    await publish_all(nc, await fleet_reports(NODES))
    cpu: dict[str, dict[int, list[float]]] = {"ingest": {}, "scorer": {}}
    for run, partitions in enumerate((1, 2, 4, 1)):
        ingest = await _fold(nc, js, f"ingest-r{run}", IngestCore, IngestState, INGEST_INPUTS, INGEST_OUTPUTS,
                             "HP_REPORTS", partitions)
        scorer = await _fold(nc, js, f"scorer-r{run}", ScorerCore, ScorerState, SCORER_INPUTS, SCORER_OUTPUTS,
                             "HP_ASSESSMENTS", partitions)
        cpu["ingest"].setdefault(partitions, []).append(ingest)
        cpu["scorer"].setdefault(partitions, []).append(scorer)
        print(f"P={partitions}: ingest {ingest:.1f} us/report, scorer {scorer:.1f} us/assessment")
    for service, figures in cpu.items():
        baseline = min(figures[1])
        for partitions in (2, 4):
            harness.record(f"partitions.{service}_client_cpu_us_per_record.p{partitions}", figures[partitions][0],
                           "us", baseline=baseline, target="ratio <= 1.1")
