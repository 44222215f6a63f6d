"""The shared pull loop delivers every message exactly once across consumer and server restarts."""

from __future__ import annotations

import asyncio

import pytest
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig

from healthplane.runtime.connect import connect
from healthplane.runtime.pull import Delivery, PullLoop
from healthplane.stack.natsserver import NatsServer

# The runtime on streams of the test's own, outside the product's stream table: no product
# identity may touch those (SEC-1 gives each only its own subjects), so this module's servers
# run open. Every product stream and service is tested with auth on elsewhere.
pytestmark = [pytest.mark.nats, pytest.mark.insecure]

STREAM = "PULL_TEST"


async def _publish(js: JetStreamContext, first: int, count: int) -> None:
    futures = [await js.publish_async(f"pull.test.n{i % 7}", str(i).encode()) for i in range(first, first + count)]
    await asyncio.gather(*futures)


async def _durable(js: JetStreamContext, name: str = "t") -> None:
    await js.add_stream(name=STREAM, subjects=["pull.test.>"])
    await js.add_consumer(STREAM, ConsumerConfig(durable_name=name, ack_policy=AckPolicy.EXPLICIT, ack_wait=30))


async def _consume_until(loop: PullLoop, seen: list[int], total: int, timeout: float = 20.0) -> None:
    task = asyncio.create_task(loop.run())
    async with asyncio.timeout(timeout):
        while len(seen) < total:
            await asyncio.sleep(0.02)
    loop.stop()
    await task


async def test_every_message_once_across_consumer_restart(nc, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    await _durable(js)
    await _publish(js, 0, 3000)
    seen: list[int] = []

    async def handler(batch: list[Delivery]) -> None:
        seen.extend(int(d.msg.data) for d in batch)

    first = PullLoop(nc, STREAM, "t", handler, batch=100)
    await _consume_until(first, seen, 1200)
    # The batch in hand was settled; whatever was buffered went back to the server.
    second = PullLoop(nc, STREAM, "t", handler, batch=100)
    await _publish(js, 3000, 1000)
    await _consume_until(second, seen, 4000)
    assert sorted(seen) == list(range(4000))
    assert len(seen) == len(set(seen))
    info = await js.consumer_info(STREAM, "t")
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_every_message_once_across_server_restart(nats_server: NatsServer) -> None:
    # REL-2: the loop resumes by itself after nats-server restarts.
    nc = await connect(nats_server.url, name="t", give_up_after=5)
    js = nc.jetstream()
    await _durable(js)
    await _publish(js, 0, 500)
    seen: list[int] = []

    async def handler(batch: list[Delivery]) -> None:
        seen.extend(int(d.msg.data) for d in batch)

    loop = PullLoop(nc, STREAM, "t", handler, batch=50, idle_heartbeat_s=0.5)
    task = asyncio.create_task(loop.run())
    async with asyncio.timeout(10):
        while len(seen) < 500:
            await asyncio.sleep(0.02)
    await asyncio.to_thread(nats_server.restart)
    async with asyncio.timeout(15):
        while not nc.is_connected:
            await asyncio.sleep(0.05)
    await _publish(js, 500, 500)
    async with asyncio.timeout(20):
        while len(seen) < 1000:
            await asyncio.sleep(0.05)
    loop.stop()
    await task
    await nc.close()
    assert sorted(seen) == list(range(1000))


async def test_terminated_message_is_not_redelivered(nc, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    # REL-3: a poison message is settled once and never blocks the ones behind it.
    await _durable(js)
    await _publish(js, 0, 20)
    seen: list[int] = []

    async def handler(batch: list[Delivery]) -> None:
        for d in batch:
            if int(d.msg.data) == 3:
                d.term("bad")
            seen.append(int(d.msg.data))

    loop = PullLoop(nc, STREAM, "t", handler, batch=8)
    await _consume_until(loop, seen, 20)
    await asyncio.sleep(0.3)
    assert sorted(seen) == list(range(20))
    info = await js.consumer_info(STREAM, "t")
    assert info.num_ack_pending == 0


async def test_a_batch_settles_acks_terms_and_naks_together(nc, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    # The batch's settlements go out as one write: each message still gets its own answer.
    await _durable(js)
    await _publish(js, 0, 30)
    deliveries: list[tuple[int, int]] = []

    async def handler(batch: list[Delivery]) -> None:
        for d in batch:
            value = int(d.msg.data)
            deliveries.append((value, d.delivered))
            if value == 7:
                d.term("poison")
            elif value == 11 and d.delivered == 1:
                d.nak(0.2)  # once: the redelivery is acked

    loop = PullLoop(nc, STREAM, "t", handler, batch=30)
    task = asyncio.create_task(loop.run())
    async with asyncio.timeout(10):
        while len(deliveries) < 31:
            await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)  # a term or an ack lost would show up as a redelivery here
    loop.stop()
    await task
    assert sorted(deliveries) == sorted([(i, 1) for i in range(30)] + [(11, 2)])
    info = await js.consumer_info(STREAM, "t")
    assert info.num_ack_pending == 0 and info.num_pending == 0 and info.num_redelivered == 0
