"""The publisher's batch path: a whole batch in one write, every ack still checked, and acks
read through the parser's fast lane without disturbing anything else on the connection."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from healthplane.runtime import publish
from healthplane.runtime.connect import connect
from healthplane.runtime.publish import Ack, Publisher, PublishError, header_block
from healthplane.stack.natsserver import NatsServer

# The runtime on streams of the test's own, outside the product's stream table: no product
# identity may touch those (SEC-1 gives each only its own subjects), so this module's servers
# run open. Every product stream and service is tested with auth on elsewhere.
pytestmark = [pytest.mark.nats, pytest.mark.insecure]

STREAM = "PUB_TEST"


async def _stream(js: JetStreamContext) -> None:
    await js.add_stream(name=STREAM, subjects=["pub.test.>"], duplicate_window=60)


def _records(first: int, count: int) -> list[publish.Outbound]:
    return [(f"pub.test.n{i % 7}", f"record {i}".encode(), {"Nats-Msg-Id": f"id-{i}", "Hp-Causation": f"IN:{i}"})
            for i in range(first, first + count)]


async def test_a_batch_is_stored_in_order_with_its_headers_and_every_ack(nc, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    # REL-1's building block: each record's ack comes back; ids de-duplicate a repeat.
    await _stream(js)
    publisher = Publisher(nc)
    acks = await publisher.store_all(_records(0, 1500))
    assert [a.seq for a in acks] == list(range(1, 1501))
    assert not any(a.duplicate for a in acks) and {a.stream for a in acks} == {STREAM}
    stored = await js.get_msg(STREAM, 1234)
    assert stored.data == b"record 1233"
    assert stored.headers is not None and stored.headers["Hp-Causation"] == "IN:1233"

    again = await publisher.store_all(_records(1000, 600))  # 500 repeats, 100 new
    assert [a.duplicate for a in again] == [True] * 500 + [False] * 100
    assert (await js.stream_info(STREAM)).state.messages == 1600
    assert publisher.fast_acks


async def test_refusals_are_reported_per_record_and_the_rest_is_stored(nc, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    # REL-3 for what we write: a refused record is named, never taken for stored.
    await _stream(js)
    publisher = Publisher(nc)
    await publisher.store_all([("pub.test.a", b"first", None)])
    records: list[publish.Outbound] = [
        ("pub.test.a", b"wrong expectation", {"Nats-Expected-Last-Subject-Sequence": "99"}),
        ("pub.test.b", b"fine", None),
        ("nobody.stores.this", b"lost", None),  # a 503 status: the ack carries headers
        ("pub.test.a", b"right expectation", {"Nats-Expected-Last-Subject-Sequence": "1"}),
    ]
    outcomes = await publisher.store_each(records)
    assert isinstance(outcomes[0], PublishError) and outcomes[0].err_code == 10071
    assert isinstance(outcomes[1], Ack) and outcomes[1].seq == 2
    assert isinstance(outcomes[2], PublishError) and outcomes[2].code == 503
    assert isinstance(outcomes[3], Ack) and outcomes[3].seq == 3
    with pytest.raises(PublishError, match=r"pub\.test\.a"):
        await publisher.store_all(records[:2])


async def test_the_fast_lane_leaves_every_other_message_where_it_was(nc, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    # Deliveries to other subscriptions, with and without headers, requests and JetStream API
    # calls all work while acks take the lane, interleaved with a batch in flight.
    await _stream(js)
    publisher = Publisher(nc)
    await publisher.store_all(_records(0, 10))
    assert publisher.fast_acks
    seen: list[tuple[str, bytes, dict[str, str] | None]] = []

    async def on_msg(msg: Msg) -> None:
        seen.append((msg.subject, msg.data, msg.headers))

    await nc.subscribe("side.>", cb=on_msg)

    async def answer(msg: Msg) -> None:
        await msg.respond(b"pong:" + msg.data)

    await nc.subscribe("service.ping", cb=answer)

    async def chatter() -> None:
        for i in range(300):
            await nc.publish(f"side.{i % 3}", f"side {i}".encode(), headers={"K": str(i)} if i % 2 else None)

    stored, _ = await asyncio.gather(publisher.store_all(_records(10, 2000)), chatter())
    assert len(stored) == 2000
    reply = await nc.request("service.ping", b"x", timeout=5)
    assert reply.data == b"pong:x"
    assert (await js.stream_info(STREAM)).state.messages == 2010
    await nc.flush()
    assert [data for _, data, _ in seen] == [f"side {i}".encode() for i in range(300)]
    assert seen[1][2] == {"K": "1"} and seen[0][2] is None


async def test_the_fast_lane_survives_a_server_restart(nats_server: NatsServer) -> None:
    # REL-2: after a reconnect the lane still reads acks, and nothing is lost.
    nc = await connect(nats_server.url, name="t", give_up_after=5)
    js = nc.jetstream()
    await _stream(js)
    publisher = Publisher(nc, ack_timeout_s=3)
    await publisher.store_all(_records(0, 100))
    await asyncio.to_thread(nats_server.restart)
    async with asyncio.timeout(15):
        while not nc.is_connected:
            await asyncio.sleep(0.05)
    async with asyncio.timeout(30):
        while True:
            try:
                await publisher.store_all(_records(100, 100))
                break
            except PublishError:  # JetStream may still be starting: the same ids again
                await asyncio.sleep(0.2)
    assert publisher.fast_acks
    assert (await js.stream_info(STREAM)).state.messages == 200
    await nc.close()


async def test_a_batch_the_connection_cannot_take_is_refused_whole(nc, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    await _stream(js)
    publisher = Publisher(nc)
    with pytest.raises(PublishError, match="not a subject"):
        await publisher.store_all([("pub.test.ok", b"1", None), ("pub.test.with space", b"2", None)])
    with pytest.raises(PublishError, match="exceeds"):
        await publisher.store_all([("pub.test.big", b"x" * (nc.max_payload + 1), None)])
    await nc.flush()
    assert (await js.stream_info(STREAM)).state.messages == 0  # nothing of either batch went out
    assert len(await publisher.store_all(_records(0, 3))) == 3  # and the connection is fine


@pytest.mark.parametrize("write", ["store_all", "store_each"])
async def test_a_write_whose_connection_closes_while_it_waits_for_acks_raises_at_once(
        nats_server: NatsServer, nc, write: str) -> None:  # type: ignore[no-untyped-def]
    # REL-1: a service stopping (its connection closed) mid-write learns at once that no ack
    # will come, instead of after the ack timeout: its stop, and the restart after it, are
    # not held up. A listener that never answers keeps the acks away (no 503 either).
    heard = await nc.subscribe("never.answered.>")
    writer = await connect(nats_server.url, name="writer", give_up_after=5)
    publisher = Publisher(writer, ack_timeout_s=60)
    waiting = asyncio.create_task(getattr(publisher, write)([("never.answered.a", b"1", None)]))
    assert (await heard.next_msg(timeout=5)).data == b"1"
    closed_at = asyncio.get_running_loop().time()
    await writer.close()
    with pytest.raises(PublishError, match="connection closed"):
        async with asyncio.timeout(5):
            outcomes = await waiting
            raise outcomes[0] if isinstance(outcomes[0], PublishError) else AssertionError(outcomes)
    assert asyncio.get_running_loop().time() - closed_at < 2  # the 60 s ack timeout was not waited out


async def test_without_the_frame_writer_the_same_batch_goes_message_by_message(
        nc, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    # A nats-py whose internals differ: ordinary publishes, same outcomes.
    monkeypatch.setattr(publish, "writes_frames", lambda nc: False)
    await _stream(js)
    publisher = Publisher(nc)
    acks = await publisher.store_all(_records(0, 300))
    assert [a.seq for a in acks] == list(range(1, 301))
    assert not publisher.fast_acks
    outcomes = await publisher.store_each([("nobody.stores.this", b"lost", None)])
    assert isinstance(outcomes[0], PublishError) and outcomes[0].code == 503


def test_a_header_cannot_smuggle_in_another() -> None:
    # As nats-py writes headers: line breaks in a value become spaces, a bad name is refused.
    assert header_block({"A": "1", "B": "two"}) == b"NATS/1.0\r\nA: 1\r\nB: two\r\n\r\n"
    assert header_block({"Nats-Msg-Id": "x\r\nNats-Expected-Stream: OTHER", "B": "2"}) == (
        b"NATS/1.0\r\nNats-Msg-Id: x  Nats-Expected-Stream: OTHER\r\nB: 2\r\n\r\n")
    with pytest.raises(ValueError, match="not a header name"):
        header_block({"Bad: name": "1"})
