"""The webhook transport's HTTP/1.1 (services/webhook_dispatcher/transport.py): h11 writes
the request and parses the answer; what is the transport's own is feeding h11 the bytes as
the network hands them over, the pool's decision to reuse a connection, and the bounds on a
receiver that does not play fair (issue 16.1). Each exchange here runs over one connection
whose socket is a stand-in: the test is the network, handing over the answer in pieces."""

from __future__ import annotations

import asyncio

import h11
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthplane_webhook_dispatcher.transport import (
    MAX_HEAD_BYTES,
    MAX_INTERIM_ANSWERS,
    StreamTransport,
    _Connection,
    request_event,
)

TCHARS = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
names = st.text(alphabet=TCHARS, min_size=1, max_size=20).map(str.encode).filter(
    lambda n: n.lower() not in (b"content-length", b"transfer-encoding", b"connection", b"host"))
# Field values as h11 accepts them: visible ASCII and inner spaces/tabs, no edge whitespace.
values = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=40) \
    .map(lambda v: v.strip(" \t").encode())
header_lists = st.lists(st.tuples(names, values), max_size=8)
URL = "http://127.0.0.1:9/hooks"


class _Socket(asyncio.Transport):
    """What the connection writes, kept; nothing is read from it (the test hands bytes over)."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Exchange:
    """One request on one connection of a fresh transport, its answer handed over in pieces."""

    def __init__(self, method: str = "POST", headers: list[tuple[bytes, bytes]] | None = None,
                 body: bytes = b"x", target: str = "/hooks") -> None:
        self.transport = StreamTransport()
        self.conn = _Connection(("http", "127.0.0.1", 9))
        self.socket = _Socket()
        self.conn.connection_made(self.socket)
        assert self.transport._pool.reserve()
        self.transport._pool.adopt(self.conn)
        self.request = httpx.Request(method, "http://127.0.0.1:9" + target, headers=headers, content=body)
        self.handed_over = 0

    async def run(self, pieces: list[bytes], *, close: bool = False) -> tuple[httpx.Response, bytes]:
        """The answer and its body; ``close``: the server closes after the last piece."""
        async def network() -> None:
            for piece in pieces:
                await asyncio.sleep(0)  # the reader takes each piece before the next comes
                self.conn.data_received(piece)
                self.handed_over += len(piece)
            if close:
                await asyncio.sleep(0)
                self.conn.eof_received()

        feeding = asyncio.create_task(network())
        try:
            event = request_event(self.request.method.encode(), self.request.url.raw_path, self.request.headers.raw)
            response = await self.transport._exchange(self.conn, self.request, event, self.request.content,
                                                      {"read": 5.0, "write": 5.0})
            assert isinstance(response.stream, httpx.AsyncByteStream)
            body = b"".join([part async for part in response.stream])
        finally:
            feeding.cancel()
        return response, body

    @property
    def reused(self) -> bool:
        """Back in the pool, open, for the next request."""
        return self.transport._pool.take_idle(self.conn.origin) is self.conn


def exchange(pieces: list[bytes], *, close: bool = False, **request: object) -> tuple[httpx.Response, bytes, bool]:
    one = Exchange(**request)  # type: ignore[arg-type]
    response, body = asyncio.run(one.run(pieces, close=close))
    return response, body, one.reused


def refused(pieces: list[bytes], *, close: bool = False, **request: object) -> tuple[str, Exchange]:
    """The message of the ``httpx.RemoteProtocolError`` the answer gets; the connection is
    never reused after one."""
    one = Exchange(**request)  # type: ignore[arg-type]

    async def attempt() -> str:
        with pytest.raises(httpx.RemoteProtocolError) as error:
            await one.run(pieces, close=close)
        return str(error.value)

    message = asyncio.run(attempt())
    one.transport._pool.discard(one.conn)  # as handle_async_request does on any error
    assert one.conn.closed and one.transport.open_connections == 0
    return message, one


def _h11_answer(request: bytes, status: int, reason: bytes, headers: list[tuple[bytes, bytes]],
                pieces: list[bytes]) -> bytes:
    """What an h11 server writes for this answer to ``request``, the body sent in ``pieces``."""
    server = h11.Connection(h11.SERVER)
    server.receive_data(request)
    while type(server.next_event()) is not h11.EndOfMessage:
        pass
    out = server.send(h11.Response(status_code=status, reason=reason, headers=headers))
    for piece in pieces:
        if piece:
            out += server.send(h11.Data(data=piece))
    return out + server.send(h11.EndOfMessage())


def _cut(wire: bytes, cuts: list[int]) -> list[bytes]:
    return [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]


HTTP11_REQUEST = b"POST /hooks HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
HTTP10_REQUEST = b"POST /hooks HTTP/1.0\r\nContent-Length: 0\r\n\r\n"


# ---------------------------------------------------------------------------- reading answers


@settings(max_examples=300, deadline=None)
@given(status=st.integers(200, 599).filter(lambda s: s not in (204, 304)),
       reason=st.sampled_from([b"OK", b"Not Found", b"Whatever You Like", b""]),
       headers=header_lists, body=st.binary(max_size=600) | st.binary(min_size=2000, max_size=6000),
       framing=st.sampled_from(["length", "chunked", "until_close"]),
       sizes=st.lists(st.integers(1, 3000), max_size=6), data=st.data())
def test_reads_what_h11_writes(status: int, reason: bytes, headers: list[tuple[bytes, bytes]], body: bytes,
                               framing: str, sizes: list[int], data: st.DataObject) -> None:
    """Any answer an h11 server writes (Content-Length, chunked in pieces of any size, or
    ended by close), cut anywhere by the network, reads back as the server was given it, and
    the connection is reused exactly when the framing allows it."""
    request = HTTP10_REQUEST if framing == "until_close" else HTTP11_REQUEST
    framing_headers = [(b"Content-Length", b"%d" % len(body))] if framing == "length" else []
    pieces, rest = [], body
    for size in sizes:
        pieces.append(rest[:size])
        rest = rest[size:]
    pieces.append(rest)
    wire = _h11_answer(request, status, reason, framing_headers + headers, pieces)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(wire) - 1)), max_size=8))))
    response, read_body, reused = exchange(_cut(wire, [c for c in cuts if c < len(wire)]),
                                           close=framing == "until_close")
    assert (response.status_code, response.extensions["reason_phrase"], response.http_version) == \
        (status, reason, "HTTP/1.1")
    sent = [(n.lower(), v) for n, v in headers]
    assert [(n.lower(), v) for n, v in response.headers.raw if n.lower() in {n for n, _ in sent}] == sent
    assert read_body == body
    assert reused == (framing != "until_close")


@pytest.mark.parametrize(("answer", "request_headers", "method", "reused"), [
    (b"HTTP/1.1 204 No Content\r\n\r\n", [], "POST", True),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", [], "POST", True),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok", [], "POST", True),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", [], "POST", True),
    (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n", [], "POST", True),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", [], "HEAD", True),
    # Both framings: chunked wins (RFC 9112 6.3), and the connection is not trusted again.
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n", [], "POST", False),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", [], "POST", False),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: Keep-Alive, Close\r\n\r\n", [], "POST", False),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", [(b"Connection", b"close")], "POST", False),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", [], "POST", False),
    # RFC 9112 would let an HTTP/1.0 keep-alive be reused; h11 does not, and nor do we.
    (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n", [], "POST", False),
    # Bytes after the answer belong to no request: the connection is closed, not reused.
    (b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", [], "POST", False),
])
def test_reuse_follows_rfc9112(answer: bytes, request_headers: list[tuple[bytes, bytes]], method: str,
                               reused: bool) -> None:
    assert exchange([answer], method=method, headers=request_headers)[2] == reused


@pytest.mark.parametrize(("answer", "close"), [
    (b"HTTP/2 200 OK\r\n\r\n", False),
    (b"HTTP/1.1 20 OK\r\n\r\n", False),
    (b"HTTP/1.1 2OO OK\r\n\r\n", False),
    (b"HTTP/1.1 099 Odd\r\n\r\n", False),
    (b"ICY 200 OK\r\n\r\n", False),
    (b"\x16\x03\x01\x02\x00garbage\r\n\r\n", False),
    (b"HTTP/1.1 200 OK\r\nContent-Length : 3\r\n\r\n", False),   # whitespace before the colon
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", False),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10, 11\r\n\r\n", False),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nContent-Length: 11\r\n\r\n", False),
    *((b"HTTP/1.1 200 OK\r\nContent-Length: %b\r\n\r\n" % v, False) for v in (b"abc", b"-1", b"+5", b"1" * 21)),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", False),  # only chunked is spoken
    *((b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%b\r\n" % size, False)
      for size in (b"0x10", b"-1", b"g", b"1" * 21)),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY\r\n0\r\n\r\n", False),  # no CRLF after data
    (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", False),  # nothing was asked to switch
    # Cut short by the server closing:
    (b"", True),
    (b"HTTP/1.1 200 OK\r\n", True),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc", True),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabc", True),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", True),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Trailer: 1\r\n", True),
])
def test_malformed_or_truncated_answers_are_refused(answer: bytes, close: bool) -> None:
    refused([answer] if answer else [], close=close)


def test_lenient_where_rfc9112_lets_a_client_be() -> None:
    """Bare LF line ends and obsolete line folding (a client may replace it with a space,
    RFC 9112 sections 2.2 and 5.2); chunk extensions and trailers ignored."""
    response, body, reused = exchange([b"HTTP/1.1 429 Too Many Requests\nRetry-After: 7\nX-Trace: a,\n  b\n"
                                       b"Content-Length: 4\n\nbody"])
    assert (response.status_code, response.headers["retry-after"], response.headers["x-trace"], body) == \
        (429, "7", "a, b", b"body")
    assert response.headers.raw[0] == (b"Retry-After", b"7")  # the case as sent
    response, body, reused = exchange([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\nWiki\r\n",
                                       b"5\r\npedia\r\n0\r\nX-Checksum: 1\r\n\r\n"])
    assert body == b"Wikipedia" and reused


# ---------------------------------------------------------------------------- writing requests


@settings(deadline=None)
@given(headers=header_lists, target=st.text(alphabet=TCHARS + "/?=&%", max_size=40).map(lambda t: "/" + t),
       body=st.binary(max_size=500) | st.binary(min_size=70_000, max_size=70_100))
def test_h11_reads_the_request_as_written(headers: list[tuple[bytes, bytes]], target: str, body: bytes) -> None:
    """The request goes out as httpx built it, header case and order kept (a body past 64
    KiB in writes of its own)."""
    one = Exchange(headers=headers, body=body, target=target)
    asyncio.run(one.run([b"HTTP/1.1 204 No Content\r\n\r\n"]))
    server = h11.Connection(h11.SERVER)
    server.receive_data(bytes(one.socket.written))
    request = server.next_event()
    assert isinstance(request, h11.Request)
    assert (request.method, request.target) == (b"POST", one.request.url.raw_path)
    assert request.headers.raw_items() == one.request.headers.raw
    received = b""
    while type(event := server.next_event()) is h11.Data:
        received += event.data
    assert type(event) is h11.EndOfMessage and received == body


@pytest.mark.parametrize(("method", "target", "headers"), [
    (b"POST", b"/x", [(b"X-Event", b"a\r\nX-Injected: 1")]),     # CRLF in a value: a smuggled header
    (b"POST", b"/x", [(b"X-Event", b"a\nb")]),
    (b"POST", b"/x", [(b"X-Event", b"a\rb")]),
    (b"POST", b"/x", [(b"X-Event", b"a\x00b")]),
    (b"POST", b"/x", [(b"X-Event: y", b"a")]),                    # a colon in the name
    (b"POST", b"/x", [(b"X Event", b"a")]),
    (b"POST", b"/x", [(b"", b"a")]),
    (b"POST", b"/x y", []),                                        # a space in the target
    (b"POST", b"/x\r\nHost: evil", []),
    (b"PO ST", b"/x", []),
])
def test_request_refuses_what_would_smuggle(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    with pytest.raises(h11.LocalProtocolError):
        request_event(method, target, [(b"Host", b"127.0.0.1:9"), *headers])


# ---------------------------------------------------------------------------- bounds (issue 16.1)


def test_issue16_1_head_growing_past_the_cap_is_refused_as_it_comes() -> None:
    """WEB-4, issue 16.1: header lines that never end are refused once the head passes 64 KiB,
    not after the receiver has sent as much as it likes."""
    line = b"X-Pad: " + b"a" * 4000 + b"\r\n"
    message, one = refused([b"HTTP/1.1 200 OK\r\n", *[line] * 100])
    assert "too long" in message
    assert one.handed_over <= MAX_HEAD_BYTES + 2 * len(line)


@pytest.mark.parametrize("interim", [0, 1])
def test_issue16_1_head_past_the_cap_is_refused_even_when_it_came_whole(interim: int) -> None:
    """WEB-4, issue 16.1: h11 bounds only an incomplete head; one that arrives complete in a
    single read (here padded with spaces h11 strips, after a 1xx or not) is measured too."""
    continues = b"HTTP/1.1 100 Continue\r\n\r\n" * interim
    padded = b"HTTP/1.1 200 OK\r\nX-Pad: " + b" " * MAX_HEAD_BYTES + b"a\r\nContent-Length: 0\r\n\r\n"
    message, _ = refused([continues + padded])
    assert "larger than" in message
    at_cap = b"HTTP/1.1 200 OK\r\nX-Pad: " + b" " * (MAX_HEAD_BYTES - 100) + b"a\r\nContent-Length: 0\r\n\r\n"
    assert exchange([continues + at_cap])[0].status_code == 200


def test_issue16_1_interim_answers_are_bounded() -> None:
    """WEB-4, issue 16.1: up to 8 interim (1xx) answers are skipped; a receiver sending them
    without end fails the attempt at the ninth, however many more it has queued."""
    continue_ = b"HTTP/1.1 100 Continue\r\n\r\n"
    hints = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
    final = b"HTTP/1.1 204 No Content\r\n\r\n"
    response, _, reused = exchange([continue_, hints * (MAX_INTERIM_ANSWERS - 1) + final])
    assert response.status_code == 204 and reused
    message, one = refused([continue_ * 10_000])
    assert "interim" in message and one.handed_over == len(continue_) * 10_000
    message, one = refused([continue_] * 10_000)
    assert one.handed_over <= len(continue_) * (MAX_INTERIM_ANSWERS + 2)
