"""Adapters of the bridge: HP_RESOURCES -> KV ``substrate-nodes`` (+ NODE_REGISTERED).

Puts are pipelined (``publish_async`` to the bucket's subjects) and every ack is checked: a
rejected put (bucket full, or a report larger than the one it replaces) leaves the report
for redelivery with a delay, counts it, and logs at most once per 30 s (BRG-2).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NoKeysError
from prometheus_client import REGISTRY, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from healthplane import configstore, streams, subjects, wire
from healthplane.runtime import metrics
from healthplane.runtime.lifecycle import ServiceContext, run_service, until_stopped
from healthplane.runtime.publish import Outbound, Publisher, PublishError
from healthplane.runtime.pull import Delivery, PullLoop
from healthplane.runtime.replay import read_all
from healthplane_substrate_bridge.core import decide_cap, registration_event, rejection_log

SERVICE = "substrate-bridge"
CONSUMER = "substrate-bridge"
BUCKET_STREAM = f"KV_{streams.NODES_BUCKET}"
BUCKET_SUBJECT_PREFIX = f"$KV.{streams.NODES_BUCKET}."
RETRY_DELAY_S = 2.0

PUT_FAILURES = Counter(
    "healthplane_substrate_nodes_bucket_put_failures_total",
    "Resource reports the substrate-nodes bucket rejected (each redelivery counts again)",
)


class BucketGauges(Collector):
    """``…_bytes_used`` / ``…_bytes_max``: absent until the first successful sample (BRG-3)."""

    def __init__(self) -> None:
        self.sample: tuple[int, int] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.sample is None:
            return
        used, cap = self.sample
        yield GaugeMetricFamily("healthplane_substrate_nodes_bucket_bytes_used",
                                "Bytes stored in the substrate-nodes bucket", value=used)
        yield GaugeMetricFamily("healthplane_substrate_nodes_bucket_bytes_max",
                                "Size cap of the substrate-nodes bucket", value=cap)


GAUGES = BucketGauges()
REGISTRY.register(GAUGES)


def _configured_cap(applied: configstore.InForce | None) -> int | None:
    """The cap from the environment (an unvalidated path) or else the applied config."""
    from_env = os.environ.get("HEALTHPLANE_NODES_BUCKET_MAX_BYTES")
    if from_env:
        return int(from_env)
    return applied.config.substrate.nodes_bucket_max_bytes if applied else None


async def apply_cap(js: JetStreamContext, log: Any) -> None:
    """Resize the bucket in place to the configured cap (BRG-1) and log the cap in force."""
    found = await configstore.read(js)
    for record in found.skipped:
        log.warning("config record skipped", seq=record.seq, reason=record.reason)
    decision = decide_cap(_configured_cap(found.in_force))
    info = await js.stream_info(BUCKET_STREAM)
    if decision.in_force is not None and info.config.max_bytes != decision.in_force:
        info.config.max_bytes = decision.in_force
        await js.update_stream(info.config)
    in_force = decision.in_force if decision.in_force is not None else info.config.max_bytes
    if decision.clamped:
        log.warning("nodes bucket cap in force", cap_bytes=in_force, configured_bytes=decision.configured)
    else:
        log.info("nodes bucket cap in force", cap_bytes=in_force)


class Bridge:
    def __init__(self, ctx: ServiceContext, sample_interval_s: float) -> None:
        self._ctx = ctx
        self._js = ctx.js
        self._log = ctx.log
        self._known: set[str] = set()
        self._registered: set[str] = set()  # NODE_REGISTERED subjects in HP_NODE_EVENTS
        self._rejections = rejection_log()
        self._sample_interval_s = sample_interval_s
        self._rejected = metrics.MESSAGES_REJECTED
        self._publisher = Publisher(ctx.nc, window=4096)
        self._processed = metrics.MESSAGES_PROCESSED.labels(SERVICE, "HP_RESOURCES")
        self.loop = PullLoop(ctx.nc, "HP_RESOURCES", CONSUMER, self.handle, service=SERVICE,
                             batch=2048, log=ctx.log, recreate=self.ensure_consumer)

    async def start(self) -> None:
        await self.ensure_consumer()
        kv = await self._js.key_value(streams.NODES_BUCKET)
        try:
            self._known = set(await kv.keys())
        except NoKeysError:
            self._known = set()
        # This service is the one writer of NODE_REGISTERED: read once what is there, and the
        # set stays complete as it registers (a request per newcomer held a fleet coming up
        # to ~4,600 registrations/s).
        registered: set[str] = set()
        await read_all(self._ctx.nc, self._js, "HP_NODE_EVENTS", "hp.event.*.*.NODE_REGISTERED",
                       last_per_subject=True, headers_only=True, sink=lambda msg: registered.add(msg.subject))
        self._registered = registered
        self._log.info("bridge started", nodes=len(self._known), registered=len(registered))

    async def ensure_consumer(self) -> None:
        # A durable consumer: the KV is the bridge's state, so it resumes where it acked.
        await self._js.add_consumer("HP_RESOURCES", ConsumerConfig(
            durable_name=CONSUMER, ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
            ack_wait=60.0, max_ack_pending=8192, max_waiting=64))

    async def handle(self, batch: list[Delivery]) -> None:
        reports: list[tuple[Delivery, wire.ResourceReport, str]] = []
        for delivery in batch:
            try:
                report = wire.decode(wire.ResourceReport, delivery.msg.data)
            except wire.WireError as exc:
                delivery.term(str(exc))
                self._rejected.labels(SERVICE, "HP_RESOURCES", "malformed").inc()
                self._log.warning("resource report rejected", seq=delivery.stream_seq,
                                  subject=delivery.msg.subject, reason=str(exc))
                continue
            reports.append((delivery, report, subjects.kv_node_key(report.cluster, report.node_id)))
        # Registration first, so that a node in the bucket always has its NODE_REGISTERED.
        newcomers = {key: (d, r) for d, r, key in reports if key not in self._known}
        if newcomers:
            try:
                await self._register(list(newcomers.values()))
            except PublishError as exc:
                self._log.warning("registration not stored; reports left for redelivery", error=str(exc))
                for delivery, _, key in reports:
                    if key in newcomers:
                        delivery.nak(RETRY_DELAY_S)
                reports = [entry for entry in reports if entry[2] not in newcomers]
        puts: list[Outbound] = [(f"{BUCKET_SUBJECT_PREFIX}{key}", delivery.msg.data, None)
                                for delivery, _, key in reports]
        try:
            outcomes = await self._publisher.store_each(puts)
        except PublishError as exc:  # the connection refused the whole batch
            outcomes = [exc] * len(puts)
        stored = 0
        for (delivery, report, key), outcome in zip(reports, outcomes, strict=True):
            if isinstance(outcome, PublishError):
                self._on_rejected(delivery, report, outcome)
                continue
            self._known.add(key)
            stored += 1
        self._processed.inc(stored)

    async def _register(self, newcomers: list[tuple[Delivery, wire.ResourceReport]]) -> None:
        """NODE_REGISTERED for nodes the bucket has not seen, unless the event stream already
        has one (a put failed after registering, or the bucket lost the key)."""
        events: list[Outbound] = []
        for delivery, report in newcomers:
            subject = subjects.event(report.cluster, report.node_id, "NODE_REGISTERED")
            if subject in self._registered:
                continue
            occurred_at = datetime.fromtimestamp(delivery.timestamp_ns / 1e9, UTC)
            event = registration_event(report, occurred_at)
            events.append((subject, wire.encode(event), {
                "Nats-Msg-Id": event.id, "Hp-Producer": SERVICE,
                "Hp-Causation": f"HP_RESOURCES:{delivery.stream_seq}"}))
        await self._publisher.store_all(events)
        self._registered.update(subject for subject, _, _ in events)

    def _on_rejected(self, delivery: Delivery, report: wire.ResourceReport, exc: Exception) -> None:
        delivery.nak(RETRY_DELAY_S)
        PUT_FAILURES.inc()
        if self._rejections.allow(time.monotonic()):
            self._log.error("substrate-nodes bucket rejected a resource report; it will be redelivered",
                            node_id=report.node_id, cluster=report.cluster,
                            reason=str(exc) or type(exc).__name__,
                            suppressed_since_last=self._rejections.take_suppressed())

    async def sample_forever(self) -> None:
        while not self._ctx.stopping.is_set():
            try:
                info = await self._js.stream_info(BUCKET_STREAM)
                GAUGES.sample = (info.state.bytes, info.config.max_bytes or 0)
            except Exception as exc:
                self._log.warning("bucket sample failed", error=str(exc))
            try:
                await asyncio.wait_for(self._ctx.stopping.wait(), self._sample_interval_s)
            except TimeoutError:
                pass

    def stop(self) -> None:
        self.loop.stop()

    async def run(self) -> None:
        sampler = asyncio.create_task(self.sample_forever())
        try:
            await self.loop.run()
        finally:
            sampler.cancel()


def main(args: argparse.Namespace) -> int:
    sample_interval_s = float(os.environ.get("HEALTHPLANE_BUCKET_SAMPLE_SECONDS", "60"))

    async def serve(ctx: ServiceContext) -> None:
        await apply_cap(ctx.js, ctx.log)
        bridge = Bridge(ctx, sample_interval_s)
        await bridge.start()
        await until_stopped(ctx, bridge)

    return run_service(SERVICE, serve, nats_url=args.nats_url, creds=args.creds,
                       metrics_port=args.metrics_port)
