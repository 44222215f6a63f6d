"""Issue 25 / HA-5, CPU per report at a fleet's pace: health-ingest (a fenced holder, as in
production) folding reports that arrive at RATE/s, a fleet of 30 RATE nodes at a 30 s
interval, not a backlog. A caught-up consumer's batches are thin (a few reports each), and
each batch costs a write, its acks and a settlement; the Processor's pull loops linger
``LINGER_S`` for more (runtime.processor.LINGER_S). Client and server CPU per report with the
linger and without it, in the same run; the pacing publisher alone is measured too and taken
off the client's figure. Each mode runs twice; the better figure counts."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from healthplane.runtime import converge
from healthplane.runtime import processor as processor_module
from healthplane.runtime.connect import connect
from healthplane.runtime.processor import Processor
from healthplane.runtime.publish import Publisher
from healthplane.stack.natsserver import NatsServer
from healthplane_health_ingest.fold import INPUTS, OUTPUTS, IngestCore
from healthplane_health_ingest.rules import IngestState
from tests.bench import harness
from tests.bench.bus import CpuMeter, fleet_reports

pytestmark = pytest.mark.insecure
RATE = 2000  # reports/s: a 60,000-node fleet at a 30 s interval
SECONDS = 15
TICK_S = 0.005  # as `sim load` sends (loadgen.TICK_S)


async def _paced(nc: Any, reports: list[tuple[str, bytes]]) -> None:
    publisher = Publisher(nc)
    per_tick = int(RATE * TICK_S)
    started = time.monotonic()
    for tick, start in enumerate(range(0, len(reports), per_tick)):
        await publisher.store_all([(s, p, None) for s, p in reports[start:start + per_tick]])
        await asyncio.sleep(max(0.0, started + (tick + 1) * TICK_S - time.monotonic()))


async def _run(server: NatsServer, nc: Any, js: Any, reports: list[tuple[str, bytes]], linger_s: float | None,
               name: str) -> tuple[float, float]:
    """(client µs, server µs) per report while ``reports`` arrive paced; ``None``: no fold."""
    await js.purge_stream("HP_REPORTS")  # each fold starts on an empty input: nothing to replay
    proc = None
    if linger_s is not None:
        processor_module.LINGER_S = linger_s
        proc = Processor(nc=nc, js=js, service=name, core=IngestCore(), state_type=IngestState, inputs=INPUTS,
                         outputs=OUTPUTS, snapshot_every_inputs=10**9, snapshot_every_s=10**9, fence=lambda: 1)
        await proc.start()
    first = (await js.stream_info("HP_REPORTS")).state.last_seq
    task = asyncio.create_task(proc.run()) if proc is not None else None
    meter = CpuMeter(server).start()
    await _paced(nc, reports)
    if proc is not None:
        while proc.positions.get("HP_REPORTS", 0) < first + len(reports):
            await asyncio.sleep(0.01)
    reading = meter.per(len(reports))
    if proc is not None and task is not None:
        proc.stop()
        await task
    return reading


async def test_cpu_per_report_at_a_fleets_pace(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats").start()
    nc = await connect(server.url, name="bench", give_up_after=10)
    js = nc.jetstream()
    await converge.ensure(js)
    reports = await fleet_reports(RATE * SECONDS)
    try:
        results: dict[str, list[tuple[float, float]]] = {"alone": [], "none": [], "linger": []}
        for round_ in range(2):
            results["alone"].append(await _run(server, nc, js, reports, None, "none"))
            results["none"].append(await _run(server, nc, js, reports, 0.0, f"ingest-none-{round_}"))
            results["linger"].append(await _run(server, nc, js, reports, 0.02, f"ingest-linger-{round_}"))
    finally:
        processor_module.LINGER_S = 0.02
        await nc.close()
        server.stop()
    alone = min(c for c, _ in results["alone"])
    alone_server = min(s for _, s in results["alone"])
    client = {mode: min(c for c, _ in results[mode]) - alone for mode in ("none", "linger")}
    served = {mode: min(s for _, s in results[mode]) - alone_server for mode in ("none", "linger")}
    harness.record("linger.ingest_client_cpu_us_per_report_at_2000_per_s", client["linger"], "us",
                   baseline=client["none"], target="ratio <= 1.0")
    harness.record("linger.server_cpu_us_per_report_at_2000_per_s", served["linger"], "us",
                   baseline=served["none"], target="ratio <= 1.0")
