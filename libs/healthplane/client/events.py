"""A live, filtered tail of node events (INT-1): what ``healthplane events watch`` and the api's
``GET /api/v1/events/stream`` share.

A position is a sequence number of ``HP_NODE_EVENTS``: an event's position is its record's,
and "resume from P" reads the records from P on, so a reader that stops at P and a reader that
starts at P see every event once between them. The tail is ``runtime.replay.follow``: direct
gets from the last record seen, no consumer, so any identity that may read the stream may
tail it (SEC-8). It follows one filter (``subjects.events_of``): several would each be followed
on their own, out of stream order, and no single number could then say how far the tail got.
The types are told apart here, from the subject, before anything is decoded.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from healthplane.client.errors import EXIT_USAGE, CommandFailed
from healthplane.contracts import streams, subjects, wire
from healthplane.runtime.replay import StoredMsg, follow, read_all

STREAM: Final = "HP_NODE_EVENTS"
# Events read and not yet taken, at most: past it reading pauses until the taker has caught up
# with half of them (``Tail``), so a slow taker costs this much memory and lags, nothing else.
BUFFER: Final = 1_000
FOLLOW_EVERY_S: Final = 0.25  # how late a new event may show: a quarter second


@dataclass(frozen=True, slots=True)
class Selection:
    """Which events: of one cluster, one node, some types (``None`` or empty: any)."""

    cluster: str | None = None
    node_id: str | None = None
    types: frozenset[str] = frozenset()

    @property
    def subject(self) -> str:
        return subjects.events_of(self.cluster, self.node_id)

    def wants(self, subject: str) -> bool:
        """Whether a stored record's subject is of one of the types (its last token, once a
        partitioned install's slot is taken off)."""
        return not self.types or subjects.published(subject).rpartition(".")[2] in self.types


def select(cluster: str | None = None, node_id: str | None = None, types: Iterable[str] = ()) -> Selection:
    """A selection from what a person typed: event types in any case (EVT-1); a usage error
    (``CommandFailed``, ``EXIT_USAGE``) names what is wrong."""
    canonical = {name.casefold(): name for name in wire.EVENT_TYPES}
    chosen = set()
    for text in types:
        found = canonical.get(text.casefold())
        if found is None:
            raise CommandFailed(f"type {text!r} is not an event type ({', '.join(wire.EVENT_TYPES)})", EXIT_USAGE)
        chosen.add(found)
    for what, value in (("cluster", cluster), ("node", node_id)):
        if value is not None and not value:
            raise CommandFailed(f"{what} must not be empty", EXIT_USAGE)
    # Event types are plain tokens: the subject's token is the name itself.
    return Selection(cluster, node_id, frozenset(subjects.encode_token(t) for t in chosen))


@dataclass(frozen=True, slots=True)
class Start:
    """Where a tail starts, and what its reader should know about it (events already gone)."""

    position: int
    note: str | None = None


async def start(nc: NATS, js: JetStreamContext, selection: Selection, *, since: datetime | None = None,
                from_position: int | None = None) -> Start:
    """Where to start: exactly ``from_position``; else the first record stored at or after
    ``since`` (the stream finds it by time); else past the last record (only what comes next)."""
    try:
        info = await js.stream_info(STREAM)
    except NotFoundError:
        raise CommandFailed(f"there is no stream {STREAM} on this server (is the control plane installed? "
                            "healthplane up, or healthplane streams converge)") from None
    first, last = info.state.first_seq, info.state.last_seq
    if from_position is not None:
        if from_position < first:
            return Start(from_position, f"position {from_position} is older than the oldest event kept ({first}): "
                                        "the events before that have expired (EVT-1: 90 days) or were purged")
        if from_position > last + 1:
            return Start(from_position, f"position {from_position} is past the last record ({last}): nothing shows "
                                        "until the stream gets there (was it made anew?)")
        return Start(from_position)
    if since is not None:
        found = await read_all(nc, js, STREAM, selection.subject, start_time=since, limit=1)
        return Start(found[0].seq if found else last + 1)
    return Start(last + 1)


@dataclass(frozen=True, slots=True)
class Watched:
    """One event and its position."""

    position: int
    event: wire.NodeEvent

    def to_builtins(self) -> dict[str, Any]:
        """The wire event as it is stored (EVT-2), and its position."""
        return {**wire.to_builtins(self.event), "position": self.position}


class Tail:
    """The events of ``selection`` from ``position`` on, as they are stored: ``await next()``,
    or ``async for``. :attr:`position` is where to resume at any moment: the first event read
    and not yet taken, else past the last record read (those of other types included).

    Bounded: with ``buffer`` events read and not yet taken, reading stops in the middle of a
    batch (the rest is read again later, from its position) and starts again when half of them
    have been taken. A record that is not an event (any client allowed to append could have
    put one, REL-3) is handed to ``on_skip`` with why, never to the taker."""

    def __init__(self, nc: NATS, selection: Selection, position: int, *, buffer: int = BUFFER,
                 every_s: float = FOLLOW_EVERY_S, on_skip: Callable[[int, str], None] | None = None,
                 on_error: Callable[[Exception], None] | None = None) -> None:
        if len(streams.stored_filters(STREAM, [selection.subject])) != 1:  # one ordered read, one position
            raise ValueError(f"{selection.subject} is not one filter in {STREAM}")
        self._nc, self._selection, self._buffer = nc, selection, max(1, buffer)
        self._every_s, self._on_skip, self._on_error = every_s, on_skip, on_error
        self._pending: deque[Watched] = deque()
        self._next_seq = max(1, position)  # the next record to read
        self._arrived = asyncio.Event()
        self._halt = asyncio.Event()
        self._readers: set[asyncio.Task[None]] = set()  # the one reading, and any stopped one still ending
        self._generation = 0
        self._stopped = False
        self._read()

    @property
    def position(self) -> int:
        return self._pending[0].position if self._pending else self._next_seq

    def _read(self) -> None:
        """(Re)start following from the next record to read."""
        self._generation += 1
        generation = self._generation
        halt = self._halt = asyncio.Event()

        def on_batch(batch: list[StoredMsg], caught_up: bool) -> None:
            if generation != self._generation:  # a reader stopped while its answer was on the way
                return
            for stored in batch:
                if len(self._pending) >= self._buffer:
                    halt.set()  # paused at this record: read again from it when the taker has caught up
                    break
                self._next_seq = stored.seq + 1
                if self._selection.wants(stored.subject):
                    event = self._decoded(stored)
                    if event is not None:
                        self._pending.append(Watched(stored.seq, event))
            self._arrived.set()

        reader = asyncio.create_task(follow(self._nc, STREAM, self._selection.subject, on_batch,
                                            start_seq=self._next_seq, stopping=halt, every_s=self._every_s,
                                            on_error=self._on_error))
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)

    def _decoded(self, stored: StoredMsg) -> wire.NodeEvent | None:
        try:
            return wire.decode(wire.NodeEvent, stored.data)
        except wire.WireError as exc:
            if self._on_skip is not None:
                self._on_skip(stored.seq, f"{STREAM} record {stored.seq} ({stored.subject}) skipped: {exc}")
            return None

    async def next(self, within_s: float | None = None) -> Watched | None:
        """The next event; ``None`` when ``within_s`` seconds passed without one, or once stopped."""
        loop = asyncio.get_running_loop()
        deadline = None if within_s is None else loop.time() + within_s
        while not self._pending:
            if self._stopped:
                return None
            if self._halt.is_set():  # paused, and everything read is taken
                self._read()
            self._arrived.clear()
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return None
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                return None
        taken = self._pending.popleft()
        if self._halt.is_set() and not self._stopped and len(self._pending) <= self._buffer // 2:
            self._read()
        return taken

    def __aiter__(self) -> Tail:
        return self

    async def __anext__(self) -> Watched:
        found = await self.next()
        if found is None:
            raise StopAsyncIteration
        return found

    def stop(self) -> None:
        """Stop reading, at once (from a signal handler too): :meth:`next` answers ``None`` from
        now on and :attr:`position` stays where to resume."""
        self._stopped = True
        self._generation += 1
        self._halt.set()
        for reader in self._readers:
            reader.cancel()
        self._arrived.set()

    async def aclose(self) -> None:
        """:meth:`stop`, and wait for the reader to be gone (before the connection closes)."""
        self.stop()
        await asyncio.gather(*self._readers, return_exceptions=True)
