"""What runs beside the bridge's fold: the bucket's cap and size (BRG-1, BRG-3) and the count
of refused puts (BRG-2). The fold (fold.py) runs on the Processor: a rejected put (bucket
full, or a report larger than the one it replaces) leaves the report for redelivery with a
growing delay (``Emit.may_wait``); here it is counted, and logged at most once per 30 s.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pydantic
from nats.js import JetStreamContext

from healthplane.runtime import configstore
from healthplane.runtime.lifecycle import ServiceContext
from healthplane.runtime.logs import LogBudget
from healthplane.runtime.publish import Outbound, PublishError
from healthplane.runtime.settings import EnvSettings
from healthplane_substrate_bridge.fold import BUCKET_STREAM, BUCKET_SUBJECT_PREFIX
from healthplane_substrate_bridge.metrics import GAUGES, PUT_FAILURES
from healthplane_substrate_bridge.rules import REJECTION_LOG_INTERVAL_S, decide_cap


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


class BucketWatch:
    """Beside the bridge's Processor while this replica leads: logs the cap in force once
    (BRG-1), samples the bucket's size every ``sample_interval_s`` (BRG-3), and counts and logs
    the puts the bucket refused (BRG-2: the Processor's ``on_wait``)."""

    def __init__(self, ctx: ServiceContext, settings: Settings) -> None:
        self._ctx = ctx
        self._settings = settings
        # BRG-2: at most one error line per interval about refused puts; the rest are counted.
        self._rejections = LogBudget(interval_s=REJECTION_LOG_INTERVAL_S)
        self._stopped = asyncio.Event()

    def rejected(self, refused: Outbound, exc: PublishError) -> None:
        """A put the bucket refused: not a dead letter, its report comes back (BRG-2)."""
        PUT_FAILURES.inc()
        if self._rejections.allow(time.monotonic()):
            self._ctx.log.error("substrate-nodes bucket rejected a resource report; it will be redelivered",
                                key=refused[0].removeprefix(BUCKET_SUBJECT_PREFIX),
                                reason=str(exc) or type(exc).__name__,
                                suppressed_since_last=self._rejections.take_suppressed())

    async def run(self) -> None:
        await report_cap(self._ctx.js, self._ctx.log, self._settings)
        while not self._stopped.is_set():
            try:
                info = await self._ctx.js.stream_info(BUCKET_STREAM)
                GAUGES.sample = (info.state.bytes, info.config.max_bytes or 0)
            except Exception as exc:
                self._ctx.log.warning("bucket sample failed", error=str(exc))
            try:
                await asyncio.wait_for(self._stopped.wait(), self._settings.bucket_sample_seconds)
            except TimeoutError:
                pass

    def stop(self) -> None:
        self._stopped.set()
