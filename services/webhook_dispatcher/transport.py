"""An httpx transport that speaks HTTP/1.1 over asyncio connections (docs/webhooks.md,
"The HTTP transport").

It takes ``httpx.Request`` and gives ``httpx.Response`` (the dispatcher's sender hands it
requests directly, send.py; under an ``httpx.AsyncClient`` it works as any transport does)
in place of httpcore + h11 + anyio, which cost ~1.2 ms of CPU per request on the 2-core
development machine. Measured there per
request and answer: a bare h11 client over asyncio ~260 us, this whole module ~140 us,
socket calls included (docs/webhooks.md has the figures).

- HTTP/1.1 with keep-alive over ``loop.create_connection``; TLS with an ``ssl.SSLContext``
  (httpx's default verification unless one is given) for ``https`` URLs.
- One pool per transport (``httpx.Limits``): at most ``max_connections`` open, idle ones
  kept up to ``max_keepalive_connections`` for ``keepalive_expiry`` seconds, reused last in
  first out. An idle connection that the server closed, or on which unexpected bytes
  arrived, is never reused.
- The connect, read, write and pool timeouts of ``httpx.Timeout`` (read: between two
  arrivals of bytes; write: while the kernel's send buffer stays full; pool: waiting for a
  free connection), raised as httpx's own exceptions.
- Response framing by RFC 9112 section 6.3: no body for HEAD, 204 and 304; chunked
  transfer-coding; Content-Length (conflicting values are an error); otherwise the body ends
  when the server closes. 1xx interim answers are skipped. A connection is reused only when
  its response was read to the end and neither side asked to close it.
- A request sent on a kept-alive connection that the server closed before answering a byte
  (the race every HTTP/1.1 client has with a server's idle timeout) is sent once more on a
  new connection, when its body is in memory. Webhook receivers deduplicate on the event id.

The wire format (request head, response head, framing, body decoding) is a handful of pure
functions and one sans-I/O decoder, tested against h11 as the reference; the I/O around them
is thin.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import httpx

MAX_HEAD_BYTES: Final = 64 * 1024      # status line + headers of one answer; also chunk lines, trailers
READ_PAUSE_BYTES: Final = 256 * 1024   # unread bytes at which the socket stops being read
SEND_TOGETHER_BYTES: Final = 64 * 1024  # a body up to this size goes out in one write with the head
DEFAULT_PORTS: Final = {"http": 80, "https": 443}
DEFAULT_LIMITS: Final = httpx.Limits(max_connections=16, max_keepalive_connections=16, keepalive_expiry=5.0)


# ---------------------------------------------------------------------------- wire format (pure)


class ProtocolViolation(ValueError):
    """Bytes that are not HTTP/1.1 as RFC 9112 allows."""


_TCHAR: Final = rb"!#$%&'*+\-.^_`|~0-9A-Za-z"
_TOKEN = re.compile(rb"[" + _TCHAR + rb"]+")
_FIELD_VALUE = re.compile(rb"[^\x00-\x08\x0a-\x1f\x7f]*")  # no CR, LF, NUL, other controls
_REQUEST_HEAD = re.compile(rb"[" + _TCHAR + rb"]+ /[^\x00-\x20\x7f]* HTTP/1\.1\r\n"
                           rb"(?:[" + _TCHAR + rb"]+: [^\x00-\x08\x0a-\x1f\x7f]*\r\n)*\r\n")
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-9][0-9]{2})(?: ([^\x00-\x08\x0a-\x1f\x7f]*))?")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,15}")


def request_head(method: bytes, target: bytes, headers: Sequence[tuple[bytes, bytes]]) -> bytes:
    """The request line and header block. Refuses what would let a value end its line early
    and smuggle a header or a second request: CR, LF or NUL in a value, a name that is not a
    token, a target with spaces or controls."""
    head = b"".join([method, b" ", target, b" HTTP/1.1\r\n",
                     *(b"%b: %b\r\n" % (name, value) for name, value in headers), b"\r\n"])
    # Names one by one (a colon inside a name would move where its value starts); values in
    # one match over the whole head, where a CR or LF inside one shows up as an extra line.
    if not all(_TOKEN.fullmatch(name) for name, _ in headers) or not _REQUEST_HEAD.fullmatch(head) \
            or head.count(b"\n") != len(headers) + 2:
        raise ProtocolViolation("invalid request line or header")
    return head


@dataclass(frozen=True, slots=True)
class ResponseHead:
    minor_version: int                       # HTTP/1.<minor>
    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]       # as received, in order


def head_end(buffer: bytes | bytearray) -> int:
    """Index just past the empty line that ends a head at the start of ``buffer``, or -1
    while it is incomplete. Lines end in CRLF; a bare LF is accepted too (RFC 9112 section
    2.2, as h11 does)."""
    crlf = buffer.find(b"\n\r\n")
    lf = buffer.find(b"\n\n")
    if lf < 0 or 0 <= crlf < lf:
        return -1 if crlf < 0 else crlf + 3
    return lf + 2


def parse_head(raw: bytes) -> ResponseHead:
    """A response's status line and headers (``raw`` up to and including the empty line).
    Obsolete line folding and whitespace before a colon are refused (RFC 9112 section 5)."""
    lines = raw.split(b"\n")
    status = _STATUS_LINE.fullmatch(lines[0].removesuffix(b"\r"))
    if status is None:
        raise ProtocolViolation(f"invalid status line {lines[0][:60]!r}")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        line = line.removesuffix(b"\r")
        if not line:
            break
        name, colon, value = line.partition(b":")
        value = value.strip(b" \t")
        if not colon or not _TOKEN.fullmatch(name) or not _FIELD_VALUE.fullmatch(value):
            raise ProtocolViolation(f"invalid header line {line[:60]!r}")
        headers.append((name, value))
    return ResponseHead(int(status[1]), int(status[2]), status[3] or b"", headers)


def _tokens(headers: Sequence[tuple[bytes, bytes]], wanted: bytes) -> list[bytes]:
    """The comma-separated, lower-cased elements of every header named ``wanted``."""
    out: list[bytes] = []
    for name, value in headers:
        if name.lower() == wanted:
            out += (t.strip(b" \t").lower() for t in value.split(b",") if t.strip(b" \t"))
    return out


def wants_close(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    return b"close" in _tokens(headers, b"connection")


BodyKind = Literal["none", "length", "chunked", "until_close"]


@dataclass(frozen=True, slots=True)
class Framing:
    kind: BodyKind
    length: int          # bytes, for "length"
    keep_alive: bool     # may the connection carry another request after this answer?


def response_framing(method: bytes, head: ResponseHead, *, request_close: bool) -> Framing:
    """Where the body of a final (2xx..5xx) answer ends, and whether the connection may be
    reused after it (RFC 9112 sections 6.3 and 9.3)."""
    connection = _tokens(head.headers, b"connection")
    keep_alive = not request_close and b"close" not in connection and (
        head.minor_version >= 1 or b"keep-alive" in connection)
    if method == b"HEAD" or head.status in (204, 304) or head.status < 200:
        return Framing("none", 0, keep_alive)
    codings = _tokens(head.headers, b"transfer-encoding")
    lengths = [v.strip(b" \t") for name, value in head.headers if name.lower() == b"content-length"
               for v in value.split(b",")]
    if codings:
        if codings[-1] != b"chunked":
            return Framing("until_close", 0, False)
        # Both framings at once is how messages are smuggled: chunked wins (RFC 9112
        # section 6.3), and the connection is not trusted with another request.
        return Framing("chunked", 0, keep_alive and not lengths)
    if lengths:
        if len(set(lengths)) != 1:
            raise ProtocolViolation("conflicting Content-Length values")
        if not lengths[0].isdigit() or len(lengths[0]) > 18:
            raise ProtocolViolation(f"invalid Content-Length {lengths[0][:20]!r}")
        return Framing("length", int(lengths[0]), keep_alive)
    return Framing("until_close", 0, False)


def chunk_size(line: bytes) -> int:
    """The size on a chunk-size line (``1a3f;name=value``); extensions are ignored."""
    size = line.split(b";", 1)[0].strip(b" \t\r\n")
    if not _CHUNK_SIZE.fullmatch(size):
        raise ProtocolViolation(f"invalid chunk size line {line[:40]!r}")
    return int(size, 16)


class BodyDecoder:
    """Sans-I/O: the body of one answer out of the bytes that arrive after its head.

    ``feed`` takes what it can from the front of ``buffer`` (removing it) and returns the
    body bytes in it; ``done`` tells when the body has ended, and whatever is left in the
    buffer then belongs to no answer. ``eof`` says the server has closed: a body framed by
    length or chunks that is not complete by then is a ``ProtocolViolation``.
    """

    __slots__ = ("_kind", "_left", "_state", "_trailer_bytes", "done")

    def __init__(self, framing: Framing) -> None:
        self._kind = framing.kind
        self._left = framing.length
        self._state: Literal["size", "data", "data_end", "trailer"] = "size"
        self._trailer_bytes = 0
        self.done = framing.kind == "none" or (framing.kind == "length" and framing.length == 0)

    def feed(self, buffer: bytearray, eof: bool) -> bytes:
        if self.done:
            return b""
        if self._kind == "until_close":
            out = bytes(buffer)
            del buffer[:]
            self.done = eof
            return out
        out = self._take(buffer) if self._kind == "length" else self._chunks(buffer)
        if self._kind == "length":
            self.done = self._left == 0
        if eof and not self.done:
            raise ProtocolViolation("peer closed connection without sending complete message body")
        return out

    def _take(self, buffer: bytearray) -> bytes:
        n = min(self._left, len(buffer))
        out = bytes(buffer[:n])
        del buffer[:n]
        self._left -= n
        return out

    def _chunks(self, buffer: bytearray) -> bytes:
        parts: list[bytes] = []
        while not self.done:
            if self._state == "data":
                parts.append(self._take(buffer))
                if self._left:
                    break
                self._state = "data_end"
                continue
            end = buffer.find(b"\n")
            if end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    raise ProtocolViolation("chunk line or trailer too long")
                break
            line = bytes(buffer[:end + 1])
            del buffer[:end + 1]
            if self._state == "size":
                self._left = chunk_size(line)
                self._state = "data" if self._left else "trailer"
            elif self._state == "data_end":
                if line.strip(b"\r\n"):
                    raise ProtocolViolation("chunk data not followed by CRLF")
                self._state = "size"
            else:  # trailer fields, ignored, up to the empty line
                self._trailer_bytes += len(line)
                if self._trailer_bytes > MAX_HEAD_BYTES:
                    raise ProtocolViolation("trailer too large")
                self.done = not line.strip(b"\r\n")
        return b"".join(parts)


# ---------------------------------------------------------------------------- one connection


Origin = tuple[str, str, int]  # scheme, host, port


class _Connection(asyncio.Protocol):
    """The bytes of one TCP or TLS connection: what arrived and is not parsed yet, whether the
    server has closed, and write flow control."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.closed = False               # by the server (EOF, reset) or by us
        self.lost: Exception | None = None
        self.idle_since = 0.0
        self.answered = 0                 # responses read on this connection
        self.counted = False              # holds one of the pool's max_connections
        self._data: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._reading_paused = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > READ_PAUSE_BYTES and not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake_reader()
        return False  # asyncio closes our side too: nothing more can be asked on it

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost = exc
        self._wake_reader()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        if self._drained is None or self._drained.done():
            self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _wake_reader(self) -> None:
        if self._data is not None and not self._data.done():
            self._data.set_result(None)

    # used by the transport

    def reusable(self, now: float, expiry: float | None) -> bool:
        """May this idle connection carry the next request: open on both sides, nothing
        unexpected received while idle, idle no longer than ``expiry``."""
        return not self.closed and not self.buffer and self.transport is not None \
            and not self.transport.is_closing() and (expiry is None or now - self.idle_since <= expiry)

    def write(self, data: bytes) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("connection closed by the server")
        self.transport.write(data)

    async def drain(self, within_s: float | None) -> None:
        if self._drained is not None and not self._drained.done():
            async with asyncio.timeout(within_s):
                await self._drained
        if self.closed:
            raise ConnectionResetError("connection closed by the server")

    async def receive(self, within_s: float | None) -> bool:
        """Wait for more bytes: False once the server has closed (nothing more will come),
        ``TimeoutError`` after ``within_s`` seconds without any. A plain timer on the future:
        a third of the CPU of ``asyncio.timeout``, paid on every answer."""
        if self.closed:
            return False
        loop = asyncio.get_running_loop()
        self._data = waiter = loop.create_future()
        timer = None if within_s is None else loop.call_later(within_s, _expire, waiter)
        try:
            await waiter
        finally:
            self._data = None
            if timer is not None:
                timer.cancel()
        return True

    def consumed(self) -> None:
        """The reader took bytes from ``buffer``: read the socket again once there is room."""
        if self._reading_paused and len(self.buffer) < READ_PAUSE_BYTES // 2 and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class _StaleConnection(Exception):
    """A kept-alive connection turned out closed before any byte of the answer arrived."""


# ---------------------------------------------------------------------------- the pool


class _Pool:
    """Connections of one transport: at most ``max_connections`` open (idle ones included),
    idle ones kept per origin, the last released reused first."""

    def __init__(self, limits: httpx.Limits) -> None:
        self._max_open = limits.max_connections
        self._max_idle = limits.max_keepalive_connections
        self._expiry = limits.keepalive_expiry
        self._idle: dict[Origin, list[_Connection]] = {}
        self._idle_count = 0
        self.open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.closed = False

    def take_idle(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            self._idle_count -= 1
            if conn.reusable(now, self._expiry):
                return conn
            self._close(conn)
        return None

    def reserve(self) -> bool:
        """Take one of ``max_connections`` for a new connection, closing the longest-idle
        connection (of any origin) when that makes room."""
        if self._max_open is not None and self.open >= self._max_open and not self._evict_one_idle():
            return False
        self.open += 1
        return True

    def unreserve(self) -> None:
        """A reserved connection that never opened."""
        self.open -= 1
        self._wake()

    def adopt(self, conn: _Connection) -> None:
        conn.counted = True

    async def wait_for_room(self, within_s: float | None) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(within_s):
                await waiter
        except BaseException:
            # Woken and timed out or cancelled at once: pass the turn on rather than lose it.
            if waiter.done() and not waiter.cancelled():
                self._wake()
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def release(self, conn: _Connection) -> None:
        """A connection whose exchange ended cleanly and that may carry another request."""
        if self.closed or conn.closed or conn.buffer \
                or (self._max_idle is not None and self._idle_count >= self._max_idle):
            self.discard(conn)
            return
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.origin, []).append(conn)
        self._idle_count += 1
        self._wake()

    def discard(self, conn: _Connection) -> None:
        self._close(conn)
        self._wake()

    def close_all(self) -> None:
        self.closed = True
        for idle in self._idle.values():
            for conn in idle:
                self._close(conn)
            idle.clear()
        self._idle_count = 0
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def _evict_one_idle(self) -> bool:
        oldest: list[_Connection] | None = None
        for idle in self._idle.values():
            if idle and (oldest is None or idle[0].idle_since < oldest[0].idle_since):
                oldest = idle
        if oldest is None:
            return False
        self._idle_count -= 1
        self._close(oldest.pop(0))
        return True

    def _close(self, conn: _Connection) -> None:
        conn.close()
        if conn.counted:  # idempotent: a connection leaves the count once
            conn.counted = False
            self.open -= 1

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


# ---------------------------------------------------------------------------- the transport


class StreamTransport(httpx.AsyncBaseTransport):
    """``httpx.AsyncClient(transport=StreamTransport(...))``: HTTP/1.1 with keep-alive over
    asyncio, pooled, with httpx's timeouts and exceptions."""

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None,
                 limits: httpx.Limits = DEFAULT_LIMITS) -> None:
        self._ssl_context = ssl_context
        self._pool = _Pool(limits)

    @property
    def open_connections(self) -> int:
        """Connections open or opening, idle ones included."""
        return self._pool.open

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        scheme = request.url.scheme
        if scheme not in DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {scheme!r}", request=request)
        if self._pool.closed:
            raise RuntimeError("the transport is closed")
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        origin: Origin = (scheme, request.url.raw_host.decode("ascii"), request.url.port or DEFAULT_PORTS[scheme])
        method = request.method.encode("ascii")
        raw_headers = request.headers.raw
        try:
            head = request_head(method, request.url.raw_path, raw_headers)
        except ProtocolViolation as exc:
            raise httpx.LocalProtocolError(str(exc), request=request) from None
        try:
            body: bytes | None = request.content
        except httpx.RequestNotRead:
            body = None  # a streamed body: sent as it comes, so never sent twice
        request_close = wants_close(raw_headers)

        reuse = True
        while True:
            conn = await self._acquire(origin, request, timeouts, reuse=reuse)
            try:
                return await self._exchange(conn, request, method, head, body, timeouts, request_close)
            except _StaleConnection:
                self._pool.discard(conn)
                if body is None or not reuse:
                    raise httpx.RemoteProtocolError("Server disconnected without sending a response.",
                                                    request=request) from None
                reuse = False  # once more, on a connection of its own
            except BaseException:
                self._pool.discard(conn)
                raise

    async def aclose(self) -> None:
        self._pool.close_all()

    # ------------------------------------------------------------------ connections

    async def _acquire(self, origin: Origin, request: httpx.Request, timeouts: dict[str, float | None],
                       *, reuse: bool) -> _Connection:
        pool = self._pool
        timeout = timeouts.get("pool")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if reuse:
                conn = pool.take_idle(origin)
                if conn is not None:
                    return conn
            if pool.reserve():
                try:
                    conn = await self._connect(origin, request, timeouts.get("connect"))
                except BaseException:
                    pool.unreserve()
                    raise
                pool.adopt(conn)
                return conn
            if pool.closed:
                raise RuntimeError("the transport is closed")
            try:
                await pool.wait_for_room(None if deadline is None else max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise httpx.PoolTimeout("no connection free within the pool timeout", request=request) from None

    async def _connect(self, origin: Origin, request: httpx.Request, connect_s: float | None) -> _Connection:
        scheme, host, port = origin
        context = None
        if scheme == "https":
            if self._ssl_context is None:
                self._ssl_context = httpx.create_ssl_context()
            context = self._ssl_context
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_s):  # the TLS handshake included
                _, conn = await loop.create_connection(lambda: _Connection(origin), host, port, ssl=context,
                                                       server_hostname=host if context is not None else None)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connect timed out after {connect_s} s", request=request) from None
        except OSError as exc:  # refused, unreachable, DNS, certificate (ssl.SSLError)
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from exc
        return conn

    # ------------------------------------------------------------------ one exchange

    async def _exchange(self, conn: _Connection, request: httpx.Request, method: bytes, head: bytes,
                        body: bytes | None, timeouts: dict[str, float | None],
                        request_close: bool) -> httpx.Response:
        reused = conn.answered > 0
        await self._send(conn, request, head, body, timeouts.get("write"), reused)
        read_timeout = timeouts.get("read")
        while True:
            response_head = await self._read_head(conn, request, read_timeout, reused)
            if response_head.status >= 200:
                break
            if response_head.status == 101:
                raise httpx.RemoteProtocolError("unexpected 101 Switching Protocols", request=request)
            reused = False  # an interim answer (100, 103): bytes came, the connection is alive
        try:
            framing = response_framing(method, response_head, request_close=request_close)
        except ProtocolViolation as exc:
            raise httpx.RemoteProtocolError(str(exc), request=request) from None
        conn.answered += 1
        extensions = {"http_version": b"HTTP/1.%d" % response_head.minor_version,
                      "reason_phrase": response_head.reason}
        complete = framing.kind == "none" or (framing.kind == "length" and len(conn.buffer) >= framing.length)
        stream: httpx.AsyncByteStream
        if complete:
            content = bytes(conn.buffer[:framing.length]) if framing.kind == "length" else b""
            del conn.buffer[:len(content)]
            conn.consumed()
            stream = httpx.ByteStream(content)
        else:
            stream = _ResponseBody(self._pool, conn, request, BodyDecoder(framing), framing.keep_alive,
                                   read_timeout)
        response = httpx.Response(response_head.status, headers=response_head.headers, stream=stream,
                                  extensions=extensions)
        if complete:
            # The usual short answer is all here already: the connection goes back to the
            # pool before the caller even reads the body.
            _finish(self._pool, conn, framing.keep_alive)
        return response

    async def _send(self, conn: _Connection, request: httpx.Request, head: bytes, body: bytes | None,
                    write_s: float | None, reused: bool) -> None:
        try:
            if body is not None:
                if len(body) <= SEND_TOGETHER_BYTES:
                    conn.write(head + body)
                else:
                    conn.write(head)
                    conn.write(body)
                await conn.drain(write_s)
                return
            chunked = b"chunked" in _tokens(request.headers.raw, b"transfer-encoding")
            conn.write(head)
            assert isinstance(request.stream, httpx.AsyncByteStream)
            async for chunk in request.stream:
                if chunk:
                    conn.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                    await conn.drain(write_s)
            if chunked:
                conn.write(b"0\r\n\r\n")
            await conn.drain(write_s)
        except TimeoutError:
            raise httpx.WriteTimeout(f"write timed out after {write_s} s", request=request) from None
        except OSError as exc:
            if reused and not conn.buffer:
                raise _StaleConnection from exc
            raise httpx.WriteError(str(exc) or type(exc).__name__, request=request) from exc

    async def _read_head(self, conn: _Connection, request: httpx.Request, read_s: float | None,
                         reused: bool) -> ResponseHead:
        while (end := head_end(conn.buffer)) < 0:
            if len(conn.buffer) > MAX_HEAD_BYTES:
                raise httpx.RemoteProtocolError("response head too large", request=request)
            try:
                more = await conn.receive(read_s)
            except TimeoutError:
                raise httpx.ReadTimeout(f"read timed out after {read_s} s", request=request) from None
            if not more:
                if reused and not conn.buffer:
                    raise _StaleConnection
                if conn.lost is not None:
                    raise httpx.ReadError(str(conn.lost) or type(conn.lost).__name__, request=request)
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.",
                                                request=request)
        raw = bytes(conn.buffer[:end])
        del conn.buffer[:end]
        try:
            return parse_head(raw)
        except ProtocolViolation as exc:
            raise httpx.RemoteProtocolError(str(exc), request=request) from None


def _finish(pool: _Pool, conn: _Connection, keep_alive: bool) -> None:
    if keep_alive:
        pool.release(conn)
    else:
        pool.discard(conn)


class _ResponseBody(httpx.AsyncByteStream):
    """A body still arriving. Read to its end, it hands the connection back to the pool;
    closed before that, the connection is closed (its unread bytes would otherwise be taken
    for the next answer)."""

    def __init__(self, pool: _Pool, conn: _Connection, request: httpx.Request, decoder: BodyDecoder,
                 keep_alive: bool, read_timeout: float | None) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self._request = request
        self._decoder = decoder
        self._keep_alive = keep_alive
        self._timeout = read_timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            raise httpx.StreamClosed()
        decoder = self._decoder
        try:
            while True:
                try:
                    data = decoder.feed(conn.buffer, conn.closed)
                except ProtocolViolation as exc:
                    if conn.lost is not None:
                        raise httpx.ReadError(str(conn.lost) or type(conn.lost).__name__,
                                              request=self._request) from None
                    raise httpx.RemoteProtocolError(str(exc), request=self._request) from None
                conn.consumed()
                if data:
                    yield data
                if decoder.done:
                    break
                try:
                    await conn.receive(self._timeout)  # False at EOF: the next feed settles it
                except TimeoutError:
                    raise httpx.ReadTimeout(f"read timed out after {self._timeout} s",
                                            request=self._request) from None
        except BaseException:  # an error, a timeout, or the reader gave up (GeneratorExit)
            self._drop()
            raise
        if self._conn is conn:
            self._conn = None
            _finish(self._pool, conn, self._keep_alive)

    async def aclose(self) -> None:
        self._drop()

    def _drop(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            self._pool.discard(conn)
