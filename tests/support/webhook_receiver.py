"""A real HTTP receiver on 127.0.0.1 for webhook tests: stdlib asyncio, HTTP/1.1 keep-alive.

Each request is parsed the way a site's receiver would: the CloudEvent with the SDK's
``from_http`` and the signature with ``healthplane.webhooks.verify``. ``answer`` decides the
response (a status, or a status and headers, and how long to take); ``connections`` counts
the connections accepted (keep-alive shows as fewer connections than requests). Run as a
process it is the benchmark's receiver that answers at once:
``python -m tests.support.webhook_receiver PORT`` (counts only).
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from cloudevents.v1.http import from_http

from healthplane.webhooks import verify


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


@dataclass
class Receiver:
    secret: str
    answer: Answer = _ok
    received: list[Received] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    connections: int = 0
    _server: asyncio.Server | None = None
    _handlers: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/hooks/healthplane"

    async def start(self) -> Receiver:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            # Connections parked in a slow answer end with the receiver.
            for handler in list(self._handlers):
                handler.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()

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
