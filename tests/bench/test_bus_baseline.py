"""The baseline every later benchmark compares to, on the same server in the same run:
raw JetStream publish_async rate, consume-and-ack through the shared pull loop (against
nats-py fetch()), and ordered-consumer replay, for a 600-byte report."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig

from healthplane.runtime.pull import Delivery, PullLoop
from healthplane.runtime.replay import replay
from tests.bench import harness

# In-process services run as the test's own identity: on an open server, as the other
# component benches (what identities cost is tests/bench/test_auth_pipeline.py's).
pytestmark = pytest.mark.insecure

MESSAGES = 50_000
PAYLOAD = b"x" * 600
STREAM = "BENCH"


async def _fill(js: JetStreamContext, stream: str, count: int) -> float:
    await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"], allow_direct=True)
    started = time.perf_counter()
    window = []
    for i in range(count):
        window.append(await js.publish_async(f"{stream.lower()}.n{i % 1000}", PAYLOAD))
        if len(window) >= 2000:
            await asyncio.gather(*window)
            window.clear()
    await asyncio.gather(*window)
    return count / (time.perf_counter() - started)


async def _pull_loop_rate(nc, js: JetStreamContext, stream: str) -> float:  # type: ignore[no-untyped-def]
    await js.add_consumer(stream, ConsumerConfig(durable_name="loop", ack_policy=AckPolicy.EXPLICIT,
                                                 max_ack_pending=20_000))
    done = asyncio.Event()
    seen = 0

    async def handler(batch: list[Delivery]) -> None:
        nonlocal seen
        seen += len(batch)
        if seen >= MESSAGES:
            done.set()

    loop = PullLoop(nc, stream, "loop", handler, batch=500)
    started = time.perf_counter()
    task = asyncio.create_task(loop.run())
    await done.wait()
    elapsed = time.perf_counter() - started
    loop.stop()
    await task
    return MESSAGES / elapsed


async def _fetch_rate(js: JetStreamContext, stream: str) -> float:
    sub = await js.pull_subscribe(f"{stream.lower()}.>", durable="fetch", stream=stream,
                                  config=ConsumerConfig(max_ack_pending=20_000))
    seen = 0
    started = time.perf_counter()
    while seen < MESSAGES:
        for msg in await sub.fetch(500, timeout=5):
            await msg.ack()
            seen += 1
    return MESSAGES / (time.perf_counter() - started)


async def _replay_rate(js: JetStreamContext, stream: str) -> float:
    started = time.perf_counter()
    count = 0
    async for _ in replay(js, stream, f"{stream.lower()}.>"):
        count += 1
    assert count == MESSAGES
    return count / (time.perf_counter() - started)


async def test_bus_baseline(nc, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    publish = await _fill(js, STREAM, MESSAGES)
    fetch = await _fetch_rate(js, STREAM)
    pull = await _pull_loop_rate(nc, js, STREAM)
    replayed = await _replay_rate(js, STREAM)
    harness.record("bus.publish_async", publish, "msg/s")
    harness.record("bus.fetch_consume_ack", fetch, "msg/s")
    harness.record("bus.pull_loop_consume_ack", pull, "msg/s", baseline=fetch, target="ratio >= 3")
    harness.record("bus.ordered_replay", replayed, "msg/s", baseline=publish)
