"""What several benchmarks do the same way: fill a stream fast, and measure the raw baseline
(the shared pull loop receiving and acking, doing nothing else)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig

from healthplane.runtime.processor import Processor
from healthplane.runtime.publish import Publisher
from healthplane.runtime.pull import Delivery, PullLoop

WINDOW = 4096


async def publish_all(nc: NATS, items: Iterable[tuple[str, bytes]]) -> float:
    """Publish every (subject, payload), acks checked; returns records per second."""
    publisher = Publisher(nc, window=WINDOW)
    count = 0
    started = time.perf_counter()
    for subject, payload in items:
        await publisher.publish(subject, payload)
        count += 1
        if count % WINDOW == 0:
            await publisher.flush()
    await publisher.flush()
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


async def processor_rate(proc: Processor[Any], stream: str, count: int) -> float:
    """Records per second a started Processor folds from ``stream`` until it reaches ``count``,
    start-up excluded; it is stopped (and snapshots) afterwards."""
    started = time.perf_counter()
    task = asyncio.create_task(proc.run())
    while proc.positions.get(stream, 0) < count:
        await asyncio.sleep(0.02)
    rate = count / (time.perf_counter() - started)
    proc.stop()
    await task
    return rate
