"""What several benchmarks do the same way: fill a stream fast, and measure the raw baseline
(the shared pull loop receiving and acking, doing nothing else)."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig

from healthplane.contracts import subjects, wire
from healthplane.runtime import heap
from healthplane.runtime.fold import Inbound
from healthplane.runtime.processor import Processor
from healthplane.runtime.publish import Outbound, Publisher
from healthplane.runtime.pull import Delivery, PullLoop
from healthplane.stack.natsserver import NatsServer
from healthplane_collector.agent import Collector, Settings
from healthplane_collector.sim import SimNode
from tests.bench import harness

WINDOW = 4096


async def publish_all(nc: NATS, items: Iterable[tuple[str, bytes]]) -> float:
    """Publish every (subject, payload), ``WINDOW`` records a write, every ack checked: the
    path services append with (``Publisher.store_all``), so as a baseline (raw KV puts) it is
    the same machinery the service under test uses. Returns records per second."""
    publisher = Publisher(nc)
    window: list[Outbound] = []
    started = time.perf_counter()
    count = 0
    for subject, payload in items:
        window.append((subject, payload, None))
        if len(window) == WINDOW:
            count += len(await publisher.store_all(window))
            window = []
    count += len(await publisher.store_all(window))
    return count / (time.perf_counter() - started)


async def raw_consume_rate(nc: NATS, js: JetStreamContext, stream: str, count: int, batch: int = 512) -> float:
    """Records per second the shared pull loop receives and acks from ``stream``, doing nothing."""
    await js.add_consumer(stream, ConsumerConfig(durable_name="raw-baseline", ack_policy=AckPolicy.EXPLICIT,
                                                 max_ack_pending=20_000))
    seen, done = 0, asyncio.Event()

    async def handle(deliveries: list[Delivery]) -> None:
        nonlocal seen
        seen += len(deliveries)
        if seen >= count:
            done.set()

    loop = PullLoop(nc, stream, "raw-baseline", handle, batch=batch)
    started = time.perf_counter()
    task = asyncio.create_task(loop.run())
    await done.wait()
    rate = count / (time.perf_counter() - started)
    loop.stop()
    await task
    await js.delete_consumer(stream, "raw-baseline")
    return rate


class CpuMeter:
    """CPU time spent by this process (the client) and by the nats-server between ``start()``
    and ``per(count)``, in microseconds per record: where a rate's time goes, which a wall-clock
    ratio on a shared 2-core machine does not show. The server's share is read from
    ``/proc``; elsewhere it is reported as 0. ``processor_rate`` takes the reading itself,
    before the stop (and its snapshot), into ``reading``."""

    def __init__(self, server: NatsServer) -> None:
        self._server = server
        self._started = (0.0, 0.0)
        self.reading = (0.0, 0.0)

    def _now(self) -> tuple[float, float]:
        server_s = 0.0
        process = self._server.process
        if process is not None and os.path.exists(f"/proc/{process.pid}/stat"):
            with open(f"/proc/{process.pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            server_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        return time.process_time(), server_s

    def start(self) -> CpuMeter:
        self._started = self._now()
        return self

    def per(self, count: int) -> tuple[float, float]:
        """(client µs, server µs) per record since ``start()``."""
        client, server = self._now()
        return (client - self._started[0]) / count * 1e6, (server - self._started[1]) / count * 1e6


async def processor_rate(proc: Processor[Any], stream: str, count: int, meter: CpuMeter | None = None) -> float:
    """Records per second a started Processor folds from ``stream`` until it reaches sequence
    ``count`` (from where it started: a snapshot's position), start-up excluded; it is stopped
    (and snapshots) afterwards."""
    count_from = proc.positions.get(stream, 0)
    if meter is not None:
        meter.start()
    started = time.perf_counter()
    task = asyncio.create_task(proc.run())
    while proc.positions.get(stream, 0) < count:
        await asyncio.sleep(0.02)
    rate = (count - count_from) / (time.perf_counter() - started)
    if meter is not None:
        meter.reading = meter.per(count - count_from)
    proc.stop()
    await task
    return rate


def core_cpu_per_record(core: Any, state: Any, inbounds: list[Inbound]) -> float:
    """CPU microseconds per record of ``core.step`` alone over ``inbounds``: decoding, the
    rules and building the output records, with no bus, no framework and no I/O around it
    (the heap settled as a service settles it)."""
    heap.settle()
    try:
        started = time.process_time()
        for inbound in inbounds:
            state, _, _ = core.step(state, inbound)
        return (time.process_time() - started) / len(inbounds) * 1e6
    finally:
        gc.unfreeze()


def ceiling_rate(raw_rate: float, core_us: float) -> float:
    """Records per second of a service whose framework cost nothing: the baseline's receive
    and ack plus the core's own work, one after the other on one core. Its ratio to the
    baseline is the highest any implementation of the framework could reach with this core."""
    return 1 / (1 / raw_rate + core_us / 1e6)


def record_service_loop(service: str, record: str, rate: float, raw: float, cpu: tuple[float, float],
                        raw_cpu: tuple[float, float], core_us: float) -> None:
    """The figures of a service that folds one stream (health-ingest, scorer), against the
    pull-loop baseline of the same run: its rate (target 0.5), where its time goes per
    record (this process, the server) against the baseline's, its core alone (``core_us``,
    from ``core_cpu_per_record``) and the ceiling that core leaves any framework."""
    harness.record(f"{service}.{record}s_per_s_100k_nodes", rate, f"{record}s/s", baseline=raw,
                   target="ratio >= 0.5")
    harness.record(f"{service}.client_cpu_per_{record}", cpu[0], "us", baseline=raw_cpu[0])
    harness.record(f"{service}.server_cpu_per_{record}", cpu[1], "us", baseline=raw_cpu[1])
    harness.record(f"{service}.core_cpu_per_{record}", core_us, "us", baseline=raw_cpu[0])
    harness.record(f"{service}.ceiling_free_framework", ceiling_rate(raw, core_us), f"{record}s/s", baseline=raw)


REPORTS_T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


async def fleet_reports(count: int, cluster: str = "bench") -> list[tuple[str, bytes]]:
    """One valid collector report for each of ``count`` nodes (``cn-000000``…), each sent a
    second after the one before: a fleet's worth of input for a fold."""
    node = SimNode("template")
    collector = Collector(Settings(node_id="template", cluster=cluster, interval_s=3600), node, node.kmsg)
    collector.refresh_inventory()
    template = await collector.collect("scheduled", REPORTS_T0)
    fields = {f: getattr(template, f) for f in template.__struct_fields__}
    return [(subjects.report(cluster, f"cn-{i:06d}"), wire.encode(wire.HealthReport(
        **{**fields, "node_id": f"cn-{i:06d}", "hostname": f"cn-{i:06d}",
           "sent_at": REPORTS_T0 + timedelta(seconds=i)})))
        for i in range(count)]
