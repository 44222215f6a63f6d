"""The fence around nats-py's internals (issue 16.4): a tested release, a self-test on the
real connection before a fast path is taken, a loud fallback, and one parser wrapper that
the publisher's acks and a bulk read's payloads share."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.protocol.parser import Parser
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from healthplane.runtime import nats_internals
from healthplane.runtime.connect import connect
from healthplane.runtime.publish import Ack, Outbound, Publisher
from healthplane.runtime.replay import read_all, read_payloads
from tests.component.test_read_payloads import _Connection

# The runtime on streams of the test's own, outside the product's stream table: no product
# identity may touch those (SEC-1 gives each only its own subjects), so this module's servers
# run open. Every product stream and service is tested with auth on elsewhere.
pytestmark = [pytest.mark.nats, pytest.mark.insecure]

STREAM = "FENCE"


def _gauge(path: str) -> float | None:
    return REGISTRY.get_sample_value("healthplane_fast_path_enabled", {"path": path})


def _records(first: int, count: int) -> list[Outbound]:
    return [(f"fence.n{i % 50}", b"record %d" % i, {"Nats-Msg-Id": f"id-{i}"} if i % 2 else None)
            for i in range(first, first + count)]


async def _stream(js: JetStreamContext) -> None:
    await js.add_stream(name=STREAM, subjects=["fence.>"], allow_direct=True)


def _spy_on_taps(monkeypatch: pytest.MonkeyPatch) -> list[nats_internals.DirectTap | None]:
    taps: list[nats_internals.DirectTap | None] = []
    tap_direct = nats_internals.tap_direct

    def spy(*args: Any) -> nats_internals.DirectTap | None:
        taps.append(tap_direct(*args))
        return taps[-1]

    monkeypatch.setattr(nats_internals, "tap_direct", spy)
    return taps


async def test_on_the_pinned_nats_py_every_fast_path_is_engaged(
        nc: NATS, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 16.4: the CI gate. With the nats-py pyproject.toml pins, the frame writer, the
    ack lane and the payload tap all pass their self-test and are used; a release that
    changed what the internals mean fails here, not silently in production."""
    assert nats_internals.version_tested(nats_internals.installed_version())
    await _stream(js)
    taps = _spy_on_taps(monkeypatch)
    publisher = Publisher(nc)
    with capture_logs() as logged:
        acks = await publisher.store_all(_records(0, 500))
        payloads = await read_payloads(nc, js, STREAM, "fence.>")
    assert [a.seq for a in acks] == list(range(1, 501))
    assert payloads == [b"record %d" % i for i in range(500)]
    assert nats_internals.fast_paths(nc) == nats_internals.FastPaths(frames=True, parser=True)
    assert publisher.fast_acks
    assert taps and taps[0] is not None
    assert _gauge("frames") == 1 and _gauge("parser") == 1
    assert not [entry for entry in logged if entry["log_level"] == "warning"]


async def test_the_ack_lane_and_the_payload_tap_share_one_connection(
        nc: NATS, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 16.4: batches in flight while a bulk read runs, both on the one parser wrapper:
    every ack is checked, every payload read, and the acks keep their lane afterwards."""
    await _stream(js)
    publisher = Publisher(nc)
    await publisher.store_all(_records(0, 3000))
    assert publisher.fast_acks
    routes_beside_the_tap: list[int] = []
    tap_direct = nats_internals.tap_direct

    def spy(*args: Any) -> nats_internals.DirectTap | None:
        tap = tap_direct(*args)
        router = nc._ps
        routes_beside_the_tap.append(len(router._routes) if isinstance(router, nats_internals._Router) else 0)
        return tap

    monkeypatch.setattr(nats_internals, "tap_direct", spy)

    async def keep_storing() -> list[Ack]:
        acks: list[Ack] = []
        for first in range(3000, 9000, 500):
            acks += await publisher.store_all(_records(first, 500))
        return acks

    storing = asyncio.create_task(keep_storing())
    payloads = await read_payloads(nc, js, STREAM, "fence.>", batch=100)
    acks = await storing
    assert [a.seq for a in acks] == list(range(3001, 9001))
    assert routes_beside_the_tap and set(routes_beside_the_tap) == {2}  # beside the ack lane, on one wrapper
    stored = [m.data for m in await read_all(nc, js, STREAM, "fence.>")]
    assert payloads == stored[:len(payloads)] and len(payloads) >= 3000
    assert publisher.fast_acks and isinstance(nc._ps, nats_internals._Router)
    assert len(nc._ps._routes) == 1  # the read's route is gone, the acks' stays


async def test_an_untested_nats_py_takes_the_public_path_and_says_so_once(
        nc: NATS, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 16.4: a nats-py outside the tested set gets no fast path: one warning, the
    gauge at 0, and the same results at nats-py's speed."""
    monkeypatch.setattr(nats_internals, "TESTED_NATS_PY", ("1.0",))
    await _stream(js)
    publisher = Publisher(nc)
    with capture_logs() as logged:
        acks = await publisher.store_all(_records(0, 200))
        await publisher.store_all(_records(200, 10))
        payloads = await read_payloads(nc, js, STREAM, "fence.>")
    assert [a.seq for a in acks] == list(range(1, 201)) and len(payloads) == 210
    assert not publisher.fast_acks and type(nc._ps) is Parser
    assert nats_internals.fast_paths(nc) == nats_internals.FastPaths(frames=False, parser=False)
    assert _gauge("frames") == 0 and _gauge("parser") == 0
    [warning] = [entry for entry in logged if entry["log_level"] == "warning"]
    assert "not a tested release" in warning["disabled"]["frames"]
    assert warning["nats_py"] == nats_internals.installed_version()


async def test_a_fast_path_that_fails_its_self_test_is_not_taken(
        nc: NATS, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 16.4: the names are there but a frame written through them never reaches the
    server (a release that changed what they mean): the frame writer stays off, the
    parser path is judged on its own, and nothing is lost."""
    async def frames_go_nowhere(*_: Any) -> None:
        return None

    monkeypatch.setattr(nats_internals, "write_frames", frames_go_nowhere)
    monkeypatch.setattr(nats_internals, "SELF_TEST_TIMEOUT_S", 1)
    await _stream(js)
    publisher = Publisher(nc)
    with capture_logs() as logged:
        acks = await publisher.store_all(_records(0, 100))
    assert [a.seq for a in acks] == list(range(1, 101))
    assert nats_internals.fast_paths(nc) == nats_internals.FastPaths(frames=False, parser=True)
    assert _gauge("frames") == 0 and _gauge("parser") == 1
    [warning] = [entry for entry in logged if entry["log_level"] == "warning"]
    assert list(warning["disabled"]) == ["frames"] and "did not come back" in warning["disabled"]["frames"]


async def test_a_parser_wrapper_that_sees_nothing_is_not_taken(
        nc: NATS, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 16.4: routed messages that never reach their route (the parser hook no longer
    sees the socket's bytes) turn the parser path off; reads and acks take nats-py's path."""
    monkeypatch.setattr(nats_internals._Router, "add", lambda self, sid, route: None)
    monkeypatch.setattr(nats_internals, "SELF_TEST_TIMEOUT_S", 1)
    await _stream(js)
    publisher = Publisher(nc)
    with capture_logs() as logged:
        await publisher.store_all(_records(0, 100))
        payloads = await read_payloads(nc, js, STREAM, "fence.>")
    assert len(payloads) == 100 and not publisher.fast_acks and type(nc._ps) is Parser
    assert nats_internals.fast_paths(nc) == nats_internals.FastPaths(frames=True, parser=False)
    [warning] = [entry for entry in logged if entry["log_level"] == "warning"]
    assert "parser wrapper read 0 of 3" in warning["disabled"]["parser"]


async def test_concurrent_callers_share_one_self_test(nats_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 16.4: the publisher, a read and a pull loop starting together test once."""
    runs: list[str] = []
    test_frames = nats_internals._test_frames

    async def counted(nc: NATS) -> str:
        runs.append("frames")
        return await test_frames(nc)

    monkeypatch.setattr(nats_internals, "_test_frames", counted)
    nc = await connect(nats_server.url, name="t", give_up_after=5)
    try:
        assert not nats_internals.writes_frames(nc)  # undecided yet: the self-test starts
        results = await asyncio.gather(*(nats_internals.engage(nc) for _ in range(5)))
        assert set(results) == {nats_internals.FastPaths(frames=True, parser=True)}
        assert runs == ["frames"] and nats_internals.writes_frames(nc)
    finally:
        await nc.close()


# ---------------------------------------------------------------------------- one wrapper, two routes

_HEADER = b"NATS/1.0\r\nNats-Msg-Id: a\r\n\r\n"
_NO_STREAM = b"NATS/1.0 503\r\n\r\n"


def _msg(subject: bytes, sid: int, body: bytes) -> bytes:
    return b"MSG %s %d %d\r\n%s\r\n" % (subject, sid, len(body), body)


def _stored(seq: int, body: bytes) -> bytes:
    """A direct get's answer: the record with its stream headers, on the read's inbox (sid 7)."""
    header = b"NATS/1.0\r\nNats-Stream: HP_NODES\r\nNats-Subject: hp.node.c.n%d\r\nNats-Sequence: %d\r\n\r\n" % (seq, seq)
    return b"HMSG _INBOX.r 7 %d %d\r\n%s%s\r\n" % (len(header), len(header) + len(body), header, body)


_WIRE = b"".join([
    _msg(b"_INBOX.p.b0_0", 5, b'{"stream":"S","seq":1}'),  # an ack
    _stored(1, b"first-1"),  # an answer to the read
    b"HMSG _INBOX.p.b0_1 5 %d %d\r\n%s\r\n" % (len(_NO_STREAM), len(_NO_STREAM), _NO_STREAM),  # ack with headers
    b"PING\r\n",
    _msg(b"_INBOX.p.b0_2", 5, b'{"seq":3}\r\n'),  # an ack whose body holds CRLF
    _stored(2, b"headed"),
    b"MSG other 9 12\r\nnot\r\nours!!!\r\n",
])


async def test_acks_and_payloads_are_routed_by_subscription_at_every_split() -> None:
    """issue 16.4: on one wrapper the acks (sid 5) go to the publisher's handler, the read's
    deliveries (sid 7) to its list, and everything else, the ack with headers included, to
    nats-py's parser in order, wherever the socket reads split the bytes."""
    for split in range(len(_WIRE) + 1):
        connection = _Connection()
        inner = connection._ps
        router = nats_internals._Router.install(connection)  # type: ignore[arg-type]
        assert router is not None
        acks: list[tuple[bytes, bytes]] = []
        payloads: list[bytes] = []
        ack_route = nats_internals._AckRoute(lambda token, body, seen=acks: seen.append((token, body)),
                                             len(b"_INBOX.p."))
        router.add(5, ack_route)
        tap = nats_internals.DirectTap(router, 7, lambda seq, subject, body, out=payloads: out.append(body), print)
        router.add(7, tap)
        await connection._ps.parse(_WIRE[:split])
        await connection._ps.parse(_WIRE[split:])
        assert acks == [(b"b0_0", b'{"stream":"S","seq":1}'), (b"b0_2", b'{"seq":3}\r\n')], split
        assert payloads == [b"first-1", b"headed"], split
        assert connection.calls == [("msg", 5, b"_INBOX.p.b0_1", b"", b"", _NO_STREAM), ("ping",),
                                    ("msg", 9, b"other", b"", b"not\r\nours!!!", None)], split
        tap.remove()  # the acks' route keeps the wrapper in place
        assert connection._ps is router
        router.discard(5, ack_route)
        assert connection._ps is inner and not inner.buf


async def test_a_route_removed_while_its_message_waits_leaves_it_to_nats_py() -> None:
    """issue 16.4: the wrapper hands the operations before a routed message to nats-py's
    parser first; a route removed meanwhile does not take the message after all."""
    connection = _Connection()
    router = nats_internals._Router.install(connection)  # type: ignore[arg-type]
    assert router is not None
    payloads: list[bytes] = []
    tap = nats_internals.DirectTap(router, 7, lambda seq, subject, body: payloads.append(body), print)
    keep = nats_internals.DirectTap(router, 8, lambda seq, subject, body: None, print)
    router.add(7, tap)
    router.add(8, keep)

    async def on_ping() -> None:
        tap.remove()
        connection.calls.append(("ping",))

    connection._process_ping = on_ping  # type: ignore[method-assign]
    answer = _stored(1, b"hi")
    await connection._ps.parse(b"PING\r\n" + answer)
    header = answer.split(b"\r\n", 1)[1][:-len(b"hi\r\n")]
    assert payloads == [] and connection.calls == [("ping",), ("msg", 7, b"_INBOX.r", b"", b"hi", header)]


async def _pulled(nc: NATS, js: JetStreamContext, durable: str, count: int) -> tuple[list[tuple[Any, ...]], bool]:
    """Every record of the stream through a PullLoop: (subject, stream seq, data, headers) each,
    and whether its deliveries came straight from the parser."""
    from nats.js.api import AckPolicy, ConsumerConfig

    from healthplane.runtime.pull import Delivery, PullLoop
    await js.add_consumer(STREAM, ConsumerConfig(durable_name=durable, ack_policy=AckPolicy.EXPLICIT))
    seen: list[tuple[Any, ...]] = []
    done = asyncio.Event()

    async def handler(batch: list[Delivery]) -> None:
        seen.extend((d.msg.subject, d.stream_seq, d.msg.data, d.msg.headers) for d in batch)
        if len(seen) >= count:
            done.set()

    loop = PullLoop(nc, STREAM, durable, handler, batch=64, idle_heartbeat_s=0.2)
    running = asyncio.create_task(loop.run())
    await asyncio.wait_for(done.wait(), 20)
    tapped = loop._tap is not None
    loop.stop()
    await running
    return seen, tapped


async def test_a_pull_consumers_deliveries_from_the_parser_are_what_nats_py_builds(
        nc: NATS, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 46.5: the PullLoop's deliveries cut out of the socket buffer (``PullTap``) carry the
    subject, sequence, payload and headers nats-py's own path gives, headers of every form a
    peer may send included, and empty payloads; idle heartbeats (status messages) still reach
    the loop through nats-py."""
    await _stream(js)
    odd = [None, {"Nats-Msg-Id": "id"}, {"K": "v with: colon", "Two": "x"}, {"Empty": ""}, {"Plain": "üñï", "Spaced": " padded "}]
    for i in range(400):
        headers = {k: f"{v}-{i}" if k == "Nats-Msg-Id" else v for k, v in (odd[i % len(odd)] or {}).items()} or None
        await js.publish(f"fence.n{i % 7}.x", b"" if i % 9 == 0 else b"payload %d" % i, headers=headers)
    tapped, on_tap = await _pulled(nc, js, "tapped", 400)
    monkeypatch.setattr(nats_internals, "tap_pull", lambda *args: None)
    plain, off_tap = await _pulled(nc, js, "plain", 400)
    assert on_tap and not off_tap
    assert len(tapped) == 400 and tapped == plain
    assert [seq for _, seq, _, _ in tapped] == list(range(1, 401))


async def test_a_pull_loop_on_a_busy_connection_is_tapped_before_its_first_request(
        nc: NATS, js: JetStreamContext) -> None:
    """issue 46.5: the tap goes in before the loop's first pull request (a tap put in place while
    deliveries flow would overtake those nats-py still queues), on a connection busy with other
    traffic too; the deliveries keep the stream's order."""
    await _stream(js)
    for i in range(300):
        await js.publish(f"fence.n{i % 7}.x", b"payload %d" % i)
    received = 0

    async def count(_msg: Any) -> None:
        nonlocal received
        received += 1

    await nc.subscribe("chatter", cb=count)
    busy = True

    async def chatter() -> None:
        while busy:
            for _ in range(20):
                await nc.publish("chatter", b"x" * 200)
            await asyncio.sleep(0.002)

    talking = asyncio.create_task(chatter())
    try:
        pulled, tapped = await _pulled(nc, js, "busy", 300)
    finally:
        busy = False
        await talking
    assert tapped and received > 0
    assert [seq for _, seq, _, _ in pulled] == list(range(1, 301))
