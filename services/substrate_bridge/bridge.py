"""Wiring of the bridge: HP_RESOURCES -> KV ``substrate-nodes`` (+ NODE_REGISTERED), as
``fold.decide`` plans it. A malformed report is set aside as a dead letter.

Puts are pipelined (``publish_async`` to the bucket's subjects) and every ack is checked: a
rejected put (bucket full, or a report larger than the one it replaces) leaves the report
for redelivery with a delay, counts it, and logs at most once per 30 s (BRG-2).
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pydantic
from nats.js import JetStreamContext
from nats.js.errors import NoKeysError

from healthplane.contracts import streams, subjects, wire
from healthplane.runtime import configstore, consumers, metrics
from healthplane.runtime.backoff import Backoff
from healthplane.runtime.deadletters import SetAside
from healthplane.runtime.lifecycle import ServiceContext
from healthplane.runtime.logs import LogBudget
from healthplane.runtime.publish import Outbound, Publisher, PublishError
from healthplane.runtime.pull import Delivery, PullLoop
from healthplane.runtime.replay import read_all
from healthplane.runtime.settings import EnvSettings
from healthplane_substrate_bridge import fold
from healthplane_substrate_bridge.metrics import GAUGES, PUT_FAILURES
from healthplane_substrate_bridge.rules import REJECTION_LOG_INTERVAL_S, decide_cap

SERVICE = "substrate-bridge"
CONSUMER = "substrate-bridge"
STREAM = "HP_RESOURCES"
BUCKET_STREAM = f"KV_{streams.NODES_BUCKET}"
BUCKET_SUBJECT_PREFIX = f"$KV.{streams.NODES_BUCKET}."
# A refused report comes back after 2 s, then 4, 8 … up to a minute (±20 %): a full bucket
# at 100,000 nodes would otherwise redeliver tens of thousands of reports every 2 s.
REDELIVERY = Backoff(2.0, 60.0, jitter=0.2)


class Settings(EnvSettings):
    # A cap from the environment is an unvalidated path: decide_cap clamps it (BRG-1).
    nodes_bucket_max_bytes: int | None = pydantic.Field(None, gt=0, alias="NODES_BUCKET_MAX_BYTES")
    bucket_sample_seconds: float = pydantic.Field(60.0, gt=0, alias="BUCKET_SAMPLE_SECONDS")


def _configured_cap(settings: Settings, applied: configstore.InForce | None) -> int | None:
    """The cap from the environment, or else the applied config."""
    if settings.nodes_bucket_max_bytes is not None:
        return settings.nodes_bucket_max_bytes
    return applied.config.substrate.nodes_bucket_max_bytes if applied else None


async def report_cap(js: JetStreamContext, log: Any, settings: Settings) -> None:
    """Log the nodes bucket's cap in force (BRG-1), and the configured one where it differs.
    The bridge may not change a stream (SEC-10): stream administration (``healthplane up`` at
    each start, ``healthplane streams converge``) resizes the bucket in place."""
    found = await configstore.read(js)
    for record in found.skipped:
        log.warning("config record skipped", seq=record.seq, reason=record.reason)
    decision = decide_cap(_configured_cap(settings, found.in_force))
    in_force = (await js.stream_info(BUCKET_STREAM)).config.max_bytes
    if decision.clamped:
        log.warning("nodes bucket cap clamped", configured_bytes=decision.configured, clamped_bytes=decision.in_force)
    if decision.in_force is not None and decision.in_force != in_force:
        log.warning("nodes bucket cap in force differs from the configured one", cap_bytes=in_force,
                    configured_bytes=decision.in_force,
                    fix="healthplane streams converge (the maintainer), or the next healthplane up, resizes it in place")
    else:
        log.info("nodes bucket cap in force", cap_bytes=in_force)


class Bridge:
    def __init__(self, ctx: ServiceContext, sample_interval_s: float) -> None:
        self._ctx = ctx
        self._js = ctx.js
        self._log = ctx.log
        self.state = fold.BridgeState()
        self.caught_up = False  # /readyz: every resource report stored when this one started is in the bucket
        # BRG-2: at most one error line per interval about rejected puts; the rest are counted.
        self._rejections = LogBudget(interval_s=REJECTION_LOG_INTERVAL_S)
        self._sample_interval_s = sample_interval_s
        self._publisher = Publisher(ctx.nc, window=4096)
        self._set_aside = SetAside(ctx.nc, self._publisher, SERVICE, f"{SERVICE}.0", ctx.log)
        self._processed = metrics.MESSAGES_PROCESSED.labels(SERVICE, STREAM)
        self.loop = PullLoop(ctx.nc, STREAM, CONSUMER, self.handle, service=SERVICE,
                             batch=2048, log=ctx.log, recreate=self.ensure_consumer)

    async def start(self) -> None:
        await self.ensure_consumer()
        kv = await self._js.key_value(streams.NODES_BUCKET)
        try:
            known = await kv.keys()
        except NoKeysError:
            known = []
        # This service is the one writer of NODE_REGISTERED: read once what is there, and the
        # set stays complete as it registers (a request per newcomer held a fleet coming up
        # to ~4,600 registrations/s).
        registered: set[str] = set()
        await read_all(self._ctx.nc, self._js, "HP_NODE_EVENTS", "hp.event.*.*.NODE_REGISTERED",
                       last_per_subject=True, sink=lambda msg: registered.add(subjects.published(msg.subject)))
        self.state = fold.initial_state(known, registered)
        self._log.info("bridge started", nodes=len(self.state.known), registered=len(registered))

    async def ensure_consumer(self) -> None:
        # A durable consumer: the KV is the bridge's state, so it resumes where it acked.
        await consumers.ensure(self._js, STREAM, consumers.durable(
            CONSUMER, ack_wait_s=60.0, max_ack_pending=8192))

    async def handle(self, batch: list[Delivery]) -> None:
        if batch and batch[-1].pending == 0:
            self.caught_up = True
        deliveries: list[Delivery] = []
        reports: list[fold.Report] = []
        for delivery in batch:
            try:
                report = wire.decode(wire.ResourceReport, delivery.msg.data)
            except wire.WireError as exc:
                await self._set_aside.reject(delivery, str(exc))
                continue
            if not subjects.names_node(delivery.msg.subject, report.cluster, report.node_id):
                # SEC-7: the subject is the identity; another node's report never reaches the bucket.
                metrics.IDENTITY_MISMATCH.labels(SERVICE, STREAM).inc()
                await self._set_aside.reject(delivery, f"{delivery.msg.subject} carries a record of node "
                                             f"{report.node_id!r} in cluster {report.cluster!r}: the subject is "
                                             "the identity (SEC-7)")
                continue
            deliveries.append(delivery)
            reports.append(fold.Report(delivery.stream_seq, delivery.timestamp_ns, report))
        plan = fold.decide(self.state, reports)
        puts, skipped = plan.puts, plan.skipped
        if plan.registrations:
            try:
                await self._publisher.store_all([_registration(r) for r in plan.registrations])
                fold.evolve(self.state, fold.Registered(tuple(r.subject for r in plan.registrations)))
            except PublishError as exc:
                self._log.warning("registration not stored; reports left for redelivery", error=str(exc))
                puts, waiting, not_registered = plan.without_newcomers()
                for put in waiting:
                    deliveries[put.at].nak(REDELIVERY.after(deliveries[put.at].delivered))
                skipped += not_registered
        for skip in skipped:
            self._log.debug("registration skipped", key=skip.key, reason=skip.reason)
        outbound: list[Outbound] = [(f"{BUCKET_SUBJECT_PREFIX}{put.key}", deliveries[put.at].msg.data, None)
                                    for put in puts]
        try:
            outcomes = await self._publisher.store_each(outbound)
        except PublishError as exc:  # the connection refused the whole batch
            outcomes = [exc] * len(outbound)
        stored: list[str] = []
        for put, outcome in zip(puts, outcomes, strict=True):
            if isinstance(outcome, PublishError):
                self._on_rejected(deliveries[put.at], reports[put.at].report, outcome)
                continue
            stored.append(put.key)
        fold.evolve(self.state, fold.Stored(tuple(stored)))
        self._processed.inc(len(stored))

    def _on_rejected(self, delivery: Delivery, report: wire.ResourceReport, exc: Exception) -> None:
        """BRG-2: not a dead letter: the report is redelivered until the bucket has room."""
        delivery.nak(REDELIVERY.after(delivery.delivered))
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


def _registration(register: fold.Register) -> Outbound:
    return (register.subject, wire.encode(register.event), {
        "Nats-Msg-Id": register.event.id, "Hp-Producer": SERVICE,
        "Hp-Causation": f"{STREAM}:{register.seq}"})
