"""Asynchronous JetStream publishing with a bounded window, every acknowledgement checked.

We do not use nats-py's ``publish_async``: when JetStream answers a publish with an error
(``maximum bytes exceeded``, a wrong expected sequence…) it raises inside its reply handler,
so the error reaches the connection's error callback and the future never completes. Here
one reply subscription resolves every future with the ack or with a :class:`PublishError`
carrying the server's description.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg


class PublishError(RuntimeError):
    """JetStream did not store a record; ``code``/``err_code`` are the server's when it said why."""

    def __init__(self, message: str, code: int | None = None, err_code: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.err_code = err_code


@dataclass(frozen=True, slots=True)
class Ack:
    stream: str
    seq: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class Stored:
    subject: str
    ack: Ack


class _AckBody(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    error: dict[str, object] | None = None


_decode_ack = msgspec.json.Decoder(_AckBody).decode


class Publisher:
    """``submit()`` returns a future per record; ``publish()`` + ``flush()`` handle a batch.

    ``window`` bounds the records in flight: the caller is paused when it is full, so a slow
    server applies back-pressure instead of growing memory.
    """

    def __init__(self, nc: NATS, window: int = 2048, ack_timeout_s: float = 10.0) -> None:
        self._nc = nc
        self._timeout = ack_timeout_s
        self._slots = asyncio.Semaphore(window)
        self._prefix = ""
        self._next_token = 0
        self._futures: dict[str, asyncio.Future[Ack]] = {}
        self._batch: deque[tuple[str, asyncio.Future[Ack]]] = deque()

    async def _ensure_subscribed(self) -> None:
        if not self._prefix:
            self._prefix = self._nc.new_inbox() + "."
            await self._nc.subscribe(self._prefix + "*", cb=self._on_reply)

    async def _on_reply(self, msg: Msg) -> None:
        future = self._futures.pop(msg.subject[len(self._prefix):], None)
        if future is None or future.done():
            return
        headers = msg.headers or {}
        if headers.get("Status") == "503":
            future.set_exception(PublishError("no stream stores this subject", code=503))
            return
        try:
            body = _decode_ack(msg.data)
        except msgspec.DecodeError as exc:
            future.set_exception(PublishError(f"unreadable ack: {exc}"))
            return
        if body.error is not None:
            description = str(body.error.get("description", "error"))
            code, err_code = body.error.get("code"), body.error.get("err_code")
            future.set_exception(PublishError(
                description,
                code=code if isinstance(code, int) else None,
                err_code=err_code if isinstance(err_code, int) else None,
            ))
            return
        future.set_result(Ack(body.stream, body.seq, body.duplicate))

    async def submit(self, subject: str, payload: bytes, headers: dict[str, str] | None = None) -> asyncio.Future[Ack]:
        await self._ensure_subscribed()
        await self._slots.acquire()
        token = str(self._next_token)
        self._next_token += 1
        future: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda _: self._slots.release())
        self._futures[token] = future
        try:
            await self._nc.publish(subject, payload, reply=self._prefix + token, headers=headers)
        except Exception as exc:
            self._futures.pop(token, None)
            future.set_exception(PublishError(f"{subject}: {exc or type(exc).__name__}"))
        return future

    async def wait(self, subject: str, future: asyncio.Future[Ack]) -> Ack:
        """The ack of one submitted record, or :class:`PublishError` (timeout included)."""
        try:
            async with asyncio.timeout(self._timeout):
                return await asyncio.shield(future)
        except TimeoutError as exc:
            self._forget(future)
            raise PublishError(f"no ack for {subject} within {self._timeout:g}s") from exc

    def _forget(self, future: asyncio.Future[Ack]) -> None:
        for token, pending in list(self._futures.items()):
            if pending is future:
                del self._futures[token]
        if not future.done():
            future.cancel()

    async def outcomes(self, futures: list[asyncio.Future[Ack]]) -> list[Ack | PublishError]:
        """The ack or the error of each submitted record, in order, under one timer."""
        if not futures:
            return []
        _, pending = await asyncio.wait(futures, timeout=self._timeout)
        results: list[Ack | PublishError] = []
        for future in futures:
            if future in pending:
                self._forget(future)
                results.append(PublishError(f"no ack within {self._timeout:g}s"))
                continue
            exc = future.exception()
            if exc is None:
                results.append(future.result())
            else:
                results.append(exc if isinstance(exc, PublishError) else PublishError(str(exc)))
        return results

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str] | None = None) -> None:
        self._batch.append((subject, await self.submit(subject, payload, headers)))

    async def flush(self) -> list[Stored]:
        """Wait for every ack of the batch; raise :class:`PublishError` naming the first failure."""
        batch, self._batch = list(self._batch), deque()
        if not batch:
            return []
        futures = [future for _, future in batch]
        _, pending = await asyncio.wait(futures, timeout=self._timeout)  # one timer for the batch
        stored = []
        for subject, future in batch:
            if future in pending:
                for late in pending:
                    self._forget(late)
                raise PublishError(f"{subject}: no ack within {self._timeout:g}s")
            exc = future.exception()
            if exc is not None:
                for _, rest in batch:
                    self._forget(rest)
                code = exc.code if isinstance(exc, PublishError) else None
                err_code = exc.err_code if isinstance(exc, PublishError) else None
                raise PublishError(f"{subject}: {exc}", code, err_code) from exc
            stored.append(Stored(subject, future.result()))
        return stored
