"""A real HTTP receiver on 127.0.0.1 for webhook tests: stdlib asyncio, HTTP/1.1 keep-alive.

Each request is parsed the way a site's receiver would: the CloudEvent with the SDK's
``from_http`` and the signature with ``healthplane.contracts.webhooks.verify``. ``answer`` decides the
response (a status, or a status and headers, and how long to take); ``connections`` counts
the connections accepted (keep-alive shows as fewer connections than requests). Run as a
process it is the benchmark's receiver that answers at once:
``python -m tests.support.webhook_receiver PORT`` (counts only).

``Hostile`` is a receiver that reads each request and then misbehaves in one of the ways of
``HOSTILE`` (issue 16.1, "Webhook receivers are untrusted"): it trickles, floods, never
answers, answers garbage, breaks off, redirects.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Self

from cloudevents.v1.http import from_http

from healthplane.contracts.webhooks import verify


@dataclass
class Received:
    headers: dict[str, str]  # names lower-cased
    body: bytes
    at: float
    event: Any = None        # the parsed CloudEvent (cloudevents SDK)
    verified: bool = False

    @property
    def event_id(self) -> str:
        return self.headers["x-healthplane-event-id"]


Reply = int | tuple[int, dict[str, str]]  # a status, or a status and response headers
Answer = Callable[[Received], "Reply | Awaitable[Reply]"]


def _ok(_: Received) -> int:
    return 204


class _LocalServer:
    """A server on 127.0.0.1, any free port; closing it ends the connections parked in a
    slow answer. Subclasses serve ``_serve`` at ``PATH``."""

    PATH: ClassVar[str] = "/"
    _server: asyncio.Server | None
    _handlers: set[asyncio.Task[None]]

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}{self.PATH}"

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for handler in list(self._handlers):
                handler.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


@dataclass
class Receiver(_LocalServer):
    secret: str
    answer: Answer = _ok
    received: list[Received] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    connections: int = 0
    _server: asyncio.Server | None = None
    _handlers: set[asyncio.Task[None]] = field(default_factory=set)
    PATH: ClassVar[str] = "/hooks/healthplane"

    def ids(self) -> list[str]:
        return [r.event_id for r in self.received]

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[Received]:
        async with asyncio.timeout(timeout):
            while len(self.received) < count:
                self.arrived.clear()
                await self.arrived.wait()
        return self.received

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        self.connections += 1
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    return
                headers, body = request
                received = Received(headers, body, time.monotonic())
                received.event = from_http(headers, body)
                received.verified = verify(self.secret, headers, body)
                self.received.append(received)
                self.arrived.set()
                reply = self.answer(received)
                if inspect.isawaitable(reply):
                    reply = await reply
                status, headers = reply if isinstance(reply, tuple) else (reply, {})
                extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
                writer.write(f"HTTP/1.1 {status} X\r\ncontent-length: 0\r\n{extra}\r\n".encode())
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._handlers.discard(handler)
            writer.close()


async def _read_request(reader: asyncio.StreamReader) -> tuple[dict[str, str], bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return headers, body


Misbehaviour = Literal["trickle", "huge_body", "endless_continue", "silent", "garbage", "endless_head",
                      "cut_mid_chunk", "redirect"]
HOSTILE: tuple[Misbehaviour, ...] = ("trickle", "huge_body", "endless_continue", "silent", "garbage",
                                     "endless_head", "cut_mid_chunk", "redirect")
GIB = 1 << 30


@dataclass
class Hostile(_LocalServer):
    """A receiver on 127.0.0.1 that reads each request whole (a delivery did arrive) and
    answers it ``misbehaving``:

    - ``trickle``: a 200 answer one byte each 0.2 s (within any per-read timeout, never done);
    - ``huge_body``: 503 with a 1 GiB body, streamed lazily while the client reads;
    - ``endless_continue``: 10,000 ``100 Continue``, then a 204;
    - ``silent``: nothing, ever;
    - ``garbage``: bytes that are not HTTP, the connection left open;
    - ``endless_head``: a status line, then header lines without end;
    - ``cut_mid_chunk``: a chunked 200 that closes inside its first chunk;
    - ``redirect``: 307 to ``location`` (a redirect is not followed: a failed attempt).

    ``requests`` counts requests read, ``sent`` the bytes written, ``open_now`` the
    connections still open."""

    misbehaving: Misbehaviour
    location: str = "http://127.0.0.1:9/elsewhere"
    requests: int = 0
    connections: int = 0
    open_now: int = 0
    sent: int = 0
    _server: asyncio.Server | None = None
    _handlers: set[asyncio.Task[None]] = field(default_factory=set)
    PATH: ClassVar[str] = "/hooks/hostile"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        self.connections += 1
        self.open_now += 1

        async def send(data: bytes) -> None:
            writer.write(data)
            await writer.drain()
            self.sent += len(data)

        try:
            while await _read_request(reader) is not None:
                self.requests += 1
                await self._misbehave(send, reader)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self.open_now -= 1
            self._handlers.discard(handler)
            writer.close()

    async def _misbehave(self, send: Callable[[bytes], Awaitable[None]], reader: asyncio.StreamReader) -> None:
        match self.misbehaving:
            case "trickle":
                for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 1000:
                    await send(bytes([byte]))
                    await asyncio.sleep(0.2)
            case "huge_body":
                await send(b"HTTP/1.1 503 Busy\r\nContent-Length: %d\r\n\r\n" % GIB)
                piece = b"x" * 65536
                for _ in range(GIB // len(piece)):
                    await send(piece)
            case "endless_continue":
                for _ in range(100):
                    await send(b"HTTP/1.1 100 Continue\r\n\r\n" * 100)
                await send(b"HTTP/1.1 204 No Content\r\n\r\n")
            case "silent":
                await reader.read()  # until the client gives up and closes
                raise ConnectionResetError
            case "garbage":
                await send(b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03 not http\r\n\r\n")
                await reader.read()
                raise ConnectionResetError
            case "endless_head":
                await send(b"HTTP/1.1 200 OK\r\n")
                while True:
                    await send(b"X-Pad: " + b"a" * 1000 + b"\r\n")
            case "cut_mid_chunk":
                await send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n" + b"x" * 100)
                raise ConnectionResetError  # the connection ends inside the chunk
            case "redirect":
                await send(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: %b\r\nContent-Length: 0\r\n\r\n"
                           % self.location.encode())


class _Counting(asyncio.Protocol):
    """The benchmark's receiver: parses framing only and answers 204 at once."""

    served = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            length = 0
            for line in self.buffer[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length:]
            _Counting.served += 1
            self.transport.write(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")


async def _serve_counting(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_Counting, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_serve_counting(int(sys.argv[1])))
