"""``read_payloads``: the bulk read behind ``node list`` (issue 5's 100,000-node listing).

It reads by direct gets (SEC-8: no consumer) and cuts the answers' payloads and sequences
straight out of the connection's buffer instead of letting nats-py build a ``Msg`` per
record (``nats_internals.tap_direct``, a route of the connection's one parser wrapper), so
these tests hold it to what ``read_all`` returns, on a real server, with other traffic on the
same connection, and to nats-py's own parser for every byte split.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.protocol.parser import Parser

from healthplane.runtime import nats_internals, replay
from healthplane.runtime.connect import connect
from healthplane.runtime.replay import read_all, read_payloads
from healthplane.stack.natsserver import NatsServer

# Unrelated traffic on a subject of the test's own ("chatter"), outside the product's table:
# no product identity may use it (SEC-1), so this module's servers run open.
pytestmark = [pytest.mark.nats, pytest.mark.insecure]


@pytest.mark.parametrize("tapped", [True, False], ids=["tapped", "ordinary-path"])
async def test_payloads_equal_read_all_with_other_traffic_on_the_connection(
        nats_server: NatsServer, nc: NATS, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch, tapped: bool) -> None:
    """Every node's latest view, headers or not, across hundreds of socket reads, while another
    subscription on the same connection gets all of its own messages."""
    for i in range(3000):
        payload = b'{"nodeId":"n%05d","pad":"%s"}' % (i, b"x" * (i % 700))
        headers = {"Nats-Msg-Id": f"view-{i}"} if i % 3 == 0 else None  # HMSG deliveries too
        await js.publish(f"hp.node.c{i % 2}.n{i:05d}", payload, headers=headers)
    await js.publish("hp.node.c0.n00000", b'{"nodeId":"n00000","latest":true}')  # last per subject wins

    installed: list[object] = []
    install = nats_internals.tap_direct

    def spy(*args: Any) -> nats_internals.DirectTap | None:
        tap = install(*args) if tapped else None
        installed.append(tap)
        return tap

    monkeypatch.setattr(nats_internals, "tap_direct", spy)
    chatter: list[bytes] = []

    async def heard(msg: Any) -> None:
        chatter.append(msg.data)

    await nc.subscribe("chatter", cb=heard)
    other = await connect(nats_server.url, name="chatter", give_up_after=5)
    try:
        async def talk() -> None:
            for i in range(2000):
                await other.publish("chatter", b"%d" % i)
                if i % 100 == 0:
                    await asyncio.sleep(0)
            await other.flush()

        talking = asyncio.create_task(talk())
        payloads = await read_payloads(nc, js, "HP_NODES", "hp.node.>", last_per_subject=True)
        await talking
    finally:
        await other.close()

    expected = [m.data for m in await read_all(nc, js, "HP_NODES", "hp.node.>", last_per_subject=True)]
    assert payloads == expected and len(payloads) == 3000
    assert b'{"nodeId":"n00000","latest":true}' in payloads
    assert (installed[0] is not None) is tapped
    await nc.flush()
    assert chatter == [b"%d" % i for i in range(2000)]  # passed through whole and in order
    assert nc._ps.__class__ is Parser  # the connection has its own parser back
    assert await read_payloads(nc, js, "HP_NODES", "hp.node.nowhere.>") == []


class _Connection:
    """What nats-py's parser calls on its connection, recorded."""

    def __init__(self) -> None:
        self._ps = Parser(self)
        self.calls: list[tuple[Any, ...]] = []

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, payload: bytes, header: bytes | None) -> None:
        self.calls.append(("msg", sid, subject, reply, payload, header))

    async def _process_ping(self) -> None:
        self.calls.append(("ping",))

    async def _process_pong(self) -> None:
        self.calls.append(("pong",))

    async def _process_info(self, info: dict[str, Any]) -> None:
        self.calls.append(("info", info))

    async def _process_err(self, message: str) -> None:
        self.calls.append(("err", message))


def _stored(seq: int, body: bytes) -> bytes:
    """A direct get's answer on the read's inbox (sid 7): the record with its stream headers."""
    header = b"NATS/1.0\r\nNats-Stream: HP_NODES\r\nNats-Subject: hp.node.c.n%d\r\nNats-Sequence: %d\r\n\r\n" % (seq, seq)
    return b"HMSG _INBOX.r 7 %d %d\r\n%s%s\r\n" % (len(header), len(header) + len(body), header, body)


_EOB = b"NATS/1.0 204 EOB\r\nNats-Num-Pending: 0\r\nNats-Last-Sequence: 3\r\n\r\n"
_WIRE = b"".join([
    _stored(1, b"first-1"),
    _stored(2, b"headed"),
    b"PING\r\n",
    b"MSG other 9 12\r\nnot\r\nours!!!\r\n",
    _stored(3, b"with\r\ncrlf"),  # binary-safe
    b"HMSG _INBOX.r 7 %d %d\r\n%s\r\n" % (len(_EOB), len(_EOB), _EOB),  # the end of the batch
    b'INFO {"server_id":"s"}\r\n',
])


def _tap(connection: _Connection, out: list[object]) -> nats_internals.DirectTap:
    """The tap on sid 7, as ``tap_direct`` puts it on a connection whose self-test passed."""
    router = nats_internals._Router.install(connection)  # type: ignore[arg-type]
    assert router is not None and connection._ps is router
    tap = nats_internals.DirectTap(router, 7, lambda seq, subject, body: out.append((seq, body)), out.append)
    router.add(7, tap)
    return tap


async def test_the_tap_cuts_every_split_of_the_wire_like_nats_py_would() -> None:
    """Ours become payloads; everything else reaches nats-py's parser whole and in order,
    wherever the socket reads happen to split the bytes."""
    plain = _Connection()  # nats-py alone on the same bytes: the reference
    await plain._ps.parse(_WIRE)
    assert [c[4] for c in plain.calls if c[0] == "msg" and c[1] == 7] == [b"first-1", b"headed",
                                                                         b"with\r\ncrlf", b""]
    for split in range(len(_WIRE) + 1):
        connection = _Connection()
        inner = connection._ps
        out: list[object] = []
        tap = _tap(connection, out)
        await connection._ps.parse(_WIRE[:split])
        await connection._ps.parse(_WIRE[split:])
        assert out == [(1, b"first-1"), (2, b"headed"), (3, b"with\r\ncrlf"), "204"], split
        assert connection.calls == [("ping",), ("msg", 9, b"other", b"", b"not\r\nours!!!", None),
                                    ("info", {"server_id": "s"})], split
        tap.remove()
        assert connection._ps is inner and not inner.buf


async def test_the_tap_hands_a_half_read_operation_back_when_removed() -> None:
    connection = _Connection()
    out: list[object] = []
    tap = _tap(connection, out)
    cut = len(_WIRE) - 10  # inside the INFO line
    await connection._ps.parse(_WIRE[:cut])
    tap.remove()
    assert connection._ps.__class__ is Parser
    await connection._ps.parse(_WIRE[cut:])
    assert connection.calls[-1] == ("info", {"server_id": "s"})


async def test_the_tap_stays_out_of_a_parser_mid_operation() -> None:
    connection = _Connection()
    await connection._ps.parse(b"MSG other 9 12\r\nnot")  # the parser holds half a message
    assert nats_internals._Router.install(connection) is None  # type: ignore[arg-type]
    assert connection._ps.__class__ is Parser


@pytest.mark.parametrize("reader", ["payloads", "all"])
async def test_a_view_replaced_while_the_read_runs_is_read_once_at_its_latest(
        nc: NATS, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch, reader: str) -> None:
    """SEC-8's direct-get read of a one-per-subject stream: a node's view replaced after the
    read took the stream's extent moves past it (its old record is gone); the read still has
    that node, once, at its latest (found red by the eviction scenarios: a node missing)."""
    for i in range(50):
        await js.publish(f"hp.node.c.n{i:02d}", b'{"nodeId":"n%02d","v":1}' % i)
    extent = replay._extent

    async def replaced_meanwhile(js_: JetStreamContext, stream: str) -> tuple[int, bool]:
        found = await extent(js_, stream)
        await js.publish("hp.node.c.n00", b'{"nodeId":"n00","v":2}')  # n00's old record is deleted
        return found

    monkeypatch.setattr(replay, "_extent", replaced_meanwhile)
    if reader == "payloads":
        payloads = await read_payloads(nc, js, "HP_NODES", "hp.node.>", last_per_subject=True)
    else:
        payloads = [m.data for m in await read_all(nc, js, "HP_NODES", "hp.node.>", last_per_subject=True)]
    assert len(payloads) == 50 and payloads.count(b'{"nodeId":"n00","v":2}') == 1
    assert not any(b'"n00","v":1' in p for p in payloads)
