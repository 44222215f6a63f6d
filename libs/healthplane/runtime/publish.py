"""``publish_async`` with a bounded window, every acknowledgement checked."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import PubAck


class PublishError(RuntimeError):
    """JetStream did not store a record (no ack in time, or an error such as a full stream)."""


@dataclass(frozen=True, slots=True)
class Stored:
    subject: str
    ack: PubAck


class Publisher:
    """Publishes without waiting per message; ``flush()`` returns once every ack is in.

    ``window`` bounds the records in flight: the caller is paused when it is full, so a slow
    server applies back-pressure instead of growing memory.
    """

    def __init__(self, js: JetStreamContext, window: int = 1024, ack_timeout_s: float = 10.0) -> None:
        self._js = js
        self._window = window
        self._timeout = ack_timeout_s
        self._in_flight: deque[tuple[str, asyncio.Future[PubAck]]] = deque()
        self._stored: list[Stored] = []

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str] | None = None) -> None:
        if len(self._in_flight) >= self._window:
            await self._settle(len(self._in_flight) // 2 or 1)
        future = await self._js.publish_async(subject, payload, headers=headers)
        self._in_flight.append((subject, future))

    async def flush(self) -> list[Stored]:
        """Wait for every outstanding ack; raise :class:`PublishError` naming the first failure."""
        await self._settle(len(self._in_flight))
        stored, self._stored = self._stored, []
        return stored

    async def _settle(self, count: int) -> None:
        for _ in range(count):
            subject, future = self._in_flight.popleft()
            try:
                ack = await asyncio.wait_for(future, self._timeout)
            except TimeoutError as exc:
                self._abandon()
                raise PublishError(f"no ack for {subject} within {self._timeout:g}s") from exc
            except Exception as exc:
                self._abandon()
                raise PublishError(f"{subject}: {exc}") from exc
            self._stored.append(Stored(subject, ack))

    def _abandon(self) -> None:
        for _, future in self._in_flight:
            future.cancel()
        self._in_flight.clear()
        self._stored.clear()
