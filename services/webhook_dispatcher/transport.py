"""An httpx transport that speaks HTTP/1.1 over asyncio connections, with h11 as the protocol
(docs/webhooks.md, "The HTTP transport").

It takes ``httpx.Request`` and gives ``httpx.Response`` (the dispatcher's sender hands it
requests directly, send.py; under an ``httpx.AsyncClient`` it works as any transport does).
The bytes on the wire are h11's, both ways: h11 writes the request (and refuses a header or
target that would smuggle another) and parses the answer, its framing and whether the
connection may carry another request. What is ours is the I/O around it, in place of
httpcore + anyio, which cost several times the CPU per request (docs/benchmarks.md):

- HTTP/1.1 with keep-alive over ``loop.create_connection``; TLS with an ``ssl.SSLContext``
  (httpx's default verification unless one is given) for ``https`` URLs.
- One pool per transport (``httpx.Limits``): at most ``max_connections`` open, idle ones
  kept up to ``max_keepalive_connections`` for ``keepalive_expiry`` seconds, reused last in
  first out. An idle connection that the server closed, or on which unexpected bytes
  arrived, is never reused.
- The connect, read, write and pool timeouts of ``httpx.Timeout`` (read: between two
  arrivals of bytes; write: while the kernel's send buffer stays full; pool: waiting for a
  free connection), raised as httpx's own exceptions. The bound on a whole attempt is the
  caller's (send.py wraps each attempt in one ``asyncio.timeout``).
- Bounds against a receiver that does not play fair: an answer's head (status line and
  headers) is at most ``MAX_HEAD_BYTES``, complete or not; at most
  ``MAX_INTERIM_ANSWERS`` 1xx answers before the final one; at most ``READ_PAUSE_BYTES``
  unread before the socket stops being read. A connection goes back to the pool only when
  h11 says both sides are done, nothing arrived beyond the answer, and the answer did not
  carry both Content-Length and Transfer-Encoding (how messages are smuggled).
- A request sent on a kept-alive connection that the server closed before answering a byte
  (the race every HTTP/1.1 client has with a server's idle timeout) is sent once more on a
  new connection, when its body is in memory. Webhook receivers deduplicate on the event id.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Final

import h11
import httpx

MAX_HEAD_BYTES: Final = 64 * 1024      # status line + headers of one answer; h11: chunk lines, trailers too
MAX_INTERIM_ANSWERS: Final = 8         # 1xx (100 Continue, 103 Early Hints) before the final answer
READ_PAUSE_BYTES: Final = 256 * 1024   # unread bytes at which the socket stops being read
SEND_TOGETHER_BYTES: Final = 64 * 1024  # a body up to this size goes out in one write with the head
DEFAULT_PORTS: Final = {"http": 80, "https": 443}
DEFAULT_LIMITS: Final = httpx.Limits(max_connections=16, max_keepalive_connections=16, keepalive_expiry=5.0)


# ---------------------------------------------------------------------------- the wire (h11)


def request_event(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> h11.Request:
    """The request as h11 will write it. h11 refuses (``h11.LocalProtocolError``) what would
    let a value end its line early and smuggle a header or a second request: CR, LF or NUL
    in a value, a name that is not a token, a target with spaces or controls."""
    return h11.Request(method=method, target=target, headers=headers)


def client_connection() -> h11.Connection:
    """h11's client side of one connection, refusing a head that grows past
    ``MAX_HEAD_BYTES`` while incomplete (the transport checks complete ones)."""
    return h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)


def both_framings(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    """Content-Length and Transfer-Encoding together: h11 reads the body as chunked, as RFC
    9112 section 6.3 says; the connection is not trusted with another request."""
    names = {name for name, _ in headers}
    return b"content-length" in names and b"transfer-encoding" in names


# ---------------------------------------------------------------------------- one connection


Origin = tuple[str, str, int]  # scheme, host, port


class _Connection(asyncio.Protocol):
    """The bytes of one TCP or TLS connection: what arrived and is not yet handed to h11,
    whether the server has closed, write flow control, and h11's state of the exchange."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.h11 = client_connection()
        self.fed = 0                      # bytes handed to h11 on this connection
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

    def feed_h11(self) -> None:
        """Hand h11 what arrived and is not yet parsed."""
        data = bytes(self.buffer)
        del self.buffer[:]
        self.consumed()
        self.h11.receive_data(data)
        self.fed += len(data)

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
    """``httpx.AsyncClient(transport=StreamTransport(...))``: HTTP/1.1 (h11) with keep-alive
    over asyncio, pooled, with httpx's timeouts and exceptions."""

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
        try:  # before a connection is taken: a refused request sends nothing
            event = request_event(request.method.encode("ascii"), request.url.raw_path, request.headers.raw)
        except h11.LocalProtocolError as exc:
            raise httpx.LocalProtocolError(str(exc), request=request) from None
        try:
            body: bytes | None = request.content
        except httpx.RequestNotRead:
            body = None  # a streamed body: sent as it comes, so never sent twice

        reuse = True
        while True:
            conn = await self._acquire(origin, request, timeouts, reuse=reuse)
            try:
                return await self._exchange(conn, request, event, body, timeouts)
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

    async def _exchange(self, conn: _Connection, request: httpx.Request, event: h11.Request,
                        body: bytes | None, timeouts: dict[str, float | None]) -> httpx.Response:
        reused = conn.answered > 0
        await _send(conn, request, event, body, timeouts.get("write"), reused)
        read_s = timeouts.get("read")
        head = await _read_head(conn, request, read_s, stale=reused)
        interim = 0
        while isinstance(head, h11.InformationalResponse):
            interim += 1
            if interim > MAX_INTERIM_ANSWERS:
                raise httpx.RemoteProtocolError(f"more than {MAX_INTERIM_ANSWERS} interim (1xx) answers",
                                                request=request)
            head = await _read_head(conn, request, read_s, stale=False, buffered=len(conn.h11.trailing_data[0]))
        conn.answered += 1
        keep_alive = not both_framings(head.headers)
        # What of the body came with the head (all of it, for the usual short answer).
        parts: list[bytes] = []
        while type(following := _parsed(conn, request)) is h11.Data:
            parts.append(bytes(following.data))
        stream: httpx.AsyncByteStream
        if type(following) is h11.EndOfMessage:
            # The connection goes back to the pool before the caller even reads the body.
            _finish(self._pool, conn, keep_alive)
            stream = httpx.ByteStream(b"".join(parts))
        else:
            stream = _ResponseBody(self._pool, conn, request, parts, keep_alive, read_s)
        return httpx.Response(head.status_code, headers=head.headers.raw_items(), stream=stream,
                              extensions={"http_version": b"HTTP/" + head.http_version,
                                          "reason_phrase": head.reason})


async def _send(conn: _Connection, request: httpx.Request, event: h11.Request, body: bytes | None,
                write_s: float | None, reused: bool) -> None:
    writer = conn.h11
    try:
        head = writer.send(event)
        if body is not None:
            data = (writer.send_with_data_passthrough(h11.Data(data=body)) or []) if body else []
            data.append(writer.send(h11.EndOfMessage()))
            if len(body) <= SEND_TOGETHER_BYTES:
                conn.write(b"".join([head, *data]))
            else:
                conn.write(head)
                for piece in data:
                    conn.write(piece)
            await conn.drain(write_s)
            return
        conn.write(head)
        assert isinstance(request.stream, httpx.AsyncByteStream)
        async for chunk in request.stream:
            if chunk:
                for piece in writer.send_with_data_passthrough(h11.Data(data=chunk)) or []:
                    conn.write(piece)
                await conn.drain(write_s)
        conn.write(writer.send(h11.EndOfMessage()))
        await conn.drain(write_s)
    except h11.LocalProtocolError as exc:  # a body longer or shorter than its Content-Length
        raise httpx.LocalProtocolError(str(exc), request=request) from None
    except TimeoutError:
        raise httpx.WriteTimeout(f"write timed out after {write_s} s", request=request) from None
    except OSError as exc:
        if reused and not conn.buffer:
            raise _StaleConnection from exc
        raise httpx.WriteError(str(exc) or type(exc).__name__, request=request) from exc


async def _read_head(conn: _Connection, request: httpx.Request, read_s: float | None, *, stale: bool,
                     buffered: int = 0) -> h11.Response | h11.InformationalResponse:
    """The next answer head. ``buffered``: bytes h11 holds already, the start of this head.
    ``stale``: a close before any byte is a kept-alive connection the server had given up."""
    fed_before = conn.fed
    while True:
        event = _parsed(conn, request)
        if event is not h11.NEED_DATA:
            break
        if not await _more(conn, request, read_s) and conn.fed == fed_before and not buffered:
            if stale:
                raise _StaleConnection
            if conn.lost is not None:
                raise httpx.ReadError(str(conn.lost) or type(conn.lost).__name__, request=request)
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
    if not isinstance(event, h11.Response | h11.InformationalResponse):
        raise httpx.RemoteProtocolError(f"expected an answer, got {type(event).__name__}", request=request)
    # h11 bounds a head only while it is incomplete; one that came whole in a single read is
    # measured here. Only when it could be too large: the measure copies what h11 holds.
    available = buffered + conn.fed - fed_before
    if available > MAX_HEAD_BYTES and available - len(conn.h11.trailing_data[0]) > MAX_HEAD_BYTES:
        raise httpx.RemoteProtocolError(f"answer head larger than {MAX_HEAD_BYTES} bytes", request=request)
    return event


def _parsed(conn: _Connection, request: httpx.Request) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
    """h11's next event of the answer, its errors as httpx's."""
    try:
        return conn.h11.next_event()
    except h11.RemoteProtocolError as exc:
        if conn.lost is not None:  # reset by the peer: a read error, as httpx names it
            raise httpx.ReadError(str(conn.lost) or type(conn.lost).__name__, request=request) from None
        raise httpx.RemoteProtocolError(str(exc), request=request) from None


async def _more(conn: _Connection, request: httpx.Request, read_s: float | None) -> bool:
    """Give h11 more bytes, waiting up to the read timeout for them; False when the server
    closed instead (h11 is told: it then says whether the answer was complete)."""
    while not conn.buffer:
        if conn.closed:
            conn.h11.receive_data(b"")
            return False
        try:
            await conn.receive(read_s)
        except TimeoutError:
            raise httpx.ReadTimeout(f"read timed out after {read_s} s", request=request) from None
    conn.feed_h11()
    return True


def _finish(pool: _Pool, conn: _Connection, keep_alive: bool) -> None:
    """The answer was read to its end: back to the pool when h11 says both sides may go on
    and nothing came after it, else closed."""
    state = conn.h11
    if keep_alive and state.our_state is h11.DONE and state.their_state is h11.DONE \
            and not state.trailing_data[0]:
        state.start_next_cycle()
        pool.release(conn)
    else:
        pool.discard(conn)


class _ResponseBody(httpx.AsyncByteStream):
    """A body still arriving. Read to its end, it hands the connection back to the pool;
    closed before that, the connection is closed (its unread bytes would otherwise be taken
    for the next answer)."""

    def __init__(self, pool: _Pool, conn: _Connection, request: httpx.Request, first: list[bytes],
                 keep_alive: bool, read_timeout: float | None) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self._request = request
        self._first = first
        self._keep_alive = keep_alive
        self._timeout = read_timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            raise httpx.StreamClosed()
        try:
            first, self._first = self._first, []
            for part in first:
                yield part
            while True:
                event = _parsed(conn, self._request)
                if type(event) is h11.Data:
                    yield bytes(event.data)
                elif type(event) is h11.EndOfMessage:
                    break
                elif event is h11.NEED_DATA:
                    await _more(conn, self._request, self._timeout)  # at EOF h11 settles it next
                else:
                    raise httpx.RemoteProtocolError(f"unexpected {event!r} in a body", request=self._request)
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
