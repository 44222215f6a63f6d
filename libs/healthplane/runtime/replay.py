"""Reading a stream without a consumer: JetStream's batched direct get (SEC-8).

Every read that is not a service's own work (``node list``, ``node events``, the api's read
model, a restart's scan of what a service already emitted, the simulator's allocations) goes
through here. A direct get is answered by the stream itself from its store: no consumer is
made, so a reader needs no right over consumers at all, and the permissions can give each
service's durable consumers to that service alone (``contracts.permissions``): a viewer, the
api or another service can neither create, delete, pull from, ack nor re-filter them.

One request asks for up to ``batch`` records matching a filter from a sequence on
(``{"seq", "next_by_subj", "batch", "max_bytes"}``); the stream answers with the records, each
with ``Nats-Sequence``/``Nats-Subject``/``Nats-Time-Stamp``/``Nats-Num-Pending`` headers, then
a ``204 EOB`` status (or ``404`` when nothing matches). A read takes the stream's last
sequence first and stops there: records stored meanwhile are the next read's.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from healthplane.contracts import streams, subjects
from healthplane.runtime import nats_internals

# Records per request: each is a round trip, so the count decides a large read's time (100,000
# views: 1.55 s at 1,000 a batch, 0.77 s at 4,096, 0.57 s at 10,000, 0.43 s at 30,000;
# docs/benchmarks.md, "node list"). The payloads-only read takes the most.
BATCH: Final = 10_000
PAYLOADS_BATCH: Final = 50_000
# Bytes per answer: the stream stops a batch there, well under the 64 MiB a server lets a
# client fall behind by before it calls it slow.
MAX_BYTES: Final = 16 * 1024 * 1024
# A follower's (follow, Tail) one round, answered or given up: the next round asks again.
FOLLOW_TIMEOUT_S: Final = 10.0
EMPTY: Final = "404"
END_OF_BATCH: Final = "204"
TOO_MANY: Final = "413"
NO_RESPONDERS: Final = "503"
# Records nats-server sends for one multi-subject direct get at most: past it the answer is a
# 413 and no record (nats-server 2.11 to 2.15).
MULTI_LAST_MAX: Final = 1024


# What nats-server adds to a direct get's answer: not the record's own headers.
SERVER_HEADERS: Final = frozenset({"Nats-Stream", "Nats-Sequence", "Nats-Subject", "Nats-Time-Stamp",
                                   "Nats-Num-Pending", "Nats-Last-Sequence"})


@dataclass(frozen=True, slots=True)
class StoredMsg:
    """One stored record, as a direct get returns it. Its time and its own headers are worked
    out when asked: a follower of 100,000 nodes' views (the api) takes 3,000 a second and reads
    neither, where parsing both for each cost 5 µs of its ~25."""

    stream: str
    seq: int
    subject: str
    stamp: str  # Nats-Time-Stamp as the server wrote it ("" if it did not)
    answer_headers: dict[str, str]  # the answer's, the server's own among them
    data: bytes

    @property
    def time(self) -> datetime:
        """When the record was stored."""
        return _time(self.stamp) if self.stamp else datetime.now(UTC)

    @property
    def headers(self) -> dict[str, str]:
        """The record's own headers, as its writer set them."""
        return {name: value for name, value in self.answer_headers.items() if name not in SERVER_HEADERS}


class ReadError(Exception):
    """The stream answered a read with an error (not 'nothing here')."""


class TooManyResults(ReadError):
    """A multi-subject direct get matched more records than one answer may carry (413)."""


def _time(text: str) -> datetime:
    # RFC 3339 with nanoseconds: Python keeps microseconds.
    head, _, fraction = text.rstrip("Z").partition(".")
    micros = (fraction + "000000")[:6] if fraction else "000000"
    return datetime.fromisoformat(f"{head}.{micros}").replace(tzinfo=UTC)


def _request(seq: int | None, subject: str, batch: int, start_time: datetime | None = None) -> bytes:
    body: dict[str, object] = {"next_by_subj": subject, "batch": batch, "max_bytes": MAX_BYTES}
    if start_time is not None:
        body["start_time"] = start_time.astimezone(UTC).isoformat().replace("+00:00", "Z")
    else:
        body["seq"] = max(1, seq or 1)
    return msgspec.json.encode(body)


class _Answers:
    """The answers to one request, as they reach an inbox: records, then the end."""

    def __init__(self) -> None:
        self.records: list[Msg] = []
        self.done: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def on_msg(self, msg: Msg) -> None:
        headers = msg.headers or {}
        if "Nats-Sequence" in headers:
            self.records.append(msg)
        elif not self.done.done():
            self.done.set_result(headers.get("Status", ""))


async def _ask(nc: NATS, stream: str, body: bytes, timeout_s: float) -> list[Msg]:
    """One batch: the records the stream sent for ``body`` (empty when none match)."""
    answers = _Answers()
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=answers.on_msg, pending_msgs_limit=-1, pending_bytes_limit=-1)
    try:
        await nc.publish(f"$JS.API.DIRECT.GET.{stream}", body, reply=inbox)
        try:
            status = await asyncio.wait_for(answers.done, timeout_s)
        except TimeoutError:
            raise TimeoutError(f"reading {stream}: no answer within {timeout_s:g} s") from None
    finally:
        await sub.unsubscribe()
    if status == NO_RESPONDERS:
        raise ReadError(f"reading {stream}: the stream does not answer direct gets (allow_direct)")
    if status == TOO_MANY:
        raise TooManyResults(f"reading {stream}: more records match than one answer carries")
    if status not in (END_OF_BATCH, EMPTY, ""):
        raise ReadError(f"reading {stream}: the stream answered {status}")
    return answers.records


async def _extent(js: JetStreamContext, stream: str) -> tuple[int, bool]:
    """The stream's last sequence (0 when empty or missing), and whether it keeps one record
    per subject (a read of it is last-per-subject already)."""
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        return 0, False
    return (info.state.last_seq if info.state.messages else 0), info.config.max_msgs_per_subject == 1


def _stored(stream: str, msg: Msg) -> StoredMsg:
    headers = msg.headers or {}
    return StoredMsg(stream, int(headers["Nats-Sequence"]), headers.get("Nats-Subject", ""),
                     headers.get("Nats-Time-Stamp", ""), headers, msg.data)


async def _scan(nc: NATS, stream: str, subject: str, *, start_seq: int, end: int, start_time: datetime | None,
                limit: int | None, batch: int, timeout_s: float) -> AsyncIterator[StoredMsg]:
    """The records of ``stream`` matching ``subject`` from ``start_seq`` (or ``start_time``) to
    ``end``, in order."""
    seq, taken = start_seq, 0
    first_time = start_time
    while seq <= end:
        want = batch if limit is None else min(batch, limit - taken)
        if want <= 0:
            return
        records = await _ask(nc, stream, _request(seq, subject, want, first_time), timeout_s)
        first_time = None
        if not records:
            return
        for msg in records:
            stored = _stored(stream, msg)
            if stored.seq > end:
                return
            yield stored
            taken += 1
            seq = stored.seq + 1
        if limit is not None and taken >= limit:
            return


async def read_all(nc: NATS, js: JetStreamContext, stream: str, subject: str | list[str], *,
                   last_per_subject: bool = False, start_seq: int | None = None, start_time: datetime | None = None,
                   limit: int | None = None, sink: Callable[[StoredMsg], None] | None = None,
                   batch: int = BATCH, idle_timeout_s: float = 10.0) -> list[StoredMsg]:
    """Every matching record now in ``stream``, in stream order (the first ``limit``).

    ``last_per_subject`` keeps the latest record of each subject; a stream that keeps one per
    subject holds only those, and is always read so. With ``sink`` each record is handed over
    as it is read and nothing is kept (not with ``last_per_subject``). A direct get has no
    headers-only form: a scan for headers (a restart's look at its own outputs) reads the
    payloads too."""
    end, one_per_subject = await _extent(js, stream)
    if not end:
        return []
    # A record of a one-per-subject stream replaced while the read runs is gone from below
    # ``end``: read as its latest, or a view rewritten meanwhile drops out (seen: every node
    # view of a scorer under load, in a full run).
    last_per_subject = last_per_subject or one_per_subject
    if last_per_subject:
        # To the stream's end as the read reaches it, not as it began: a subject's record
        # replaced meanwhile has a sequence past ``end``, and its old one is gone (REL: a node
        # would drop out of the read). The duplicates that gives are folded below.
        end = sys.maxsize
    filters = list(streams.stored_filters(stream, [subject] if isinstance(subject, str) else subject))
    first = max(1, start_seq or 1)
    found: list[StoredMsg] = []
    for filter_ in filters:
        async for stored in _scan(nc, stream, filter_, start_seq=first, end=end,
                                  start_time=start_time if not start_seq else None,
                                  limit=None if last_per_subject else limit, batch=batch, timeout_s=idle_timeout_s):
            if sink is not None and not last_per_subject and len(filters) == 1:
                sink(stored)
            else:
                found.append(stored)
    if len(filters) > 1:
        found.sort(key=lambda m: m.seq)
    if last_per_subject:
        latest = {m.subject: m for m in found}
        found = sorted(latest.values(), key=lambda m: m.seq)
    if limit is not None:
        del found[limit:]
    if sink is not None and found:
        for stored in found:
            sink(stored)
        return []
    return found


async def replay(js: JetStreamContext, stream: str, subject: str | None = None, *, start_seq: int = 1,
                 last_per_subject: bool = False,
                 idle_timeout_s: float = 5.0) -> AsyncIterator[StoredMsg]:
    """Yield every record of ``stream`` (matching ``subject``) from ``start_seq`` to the end as
    it was when the replay started, in order."""
    nc = nats_internals.connection_of(js)
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        return
    wanted = subject or _only_subject(stream, info.config.subjects or [])
    for stored in await read_all(nc, js, stream, wanted, start_seq=start_seq, last_per_subject=last_per_subject,
                                 idle_timeout_s=idle_timeout_s):
        yield stored


def _only_subject(stream: str, subjects_: list[str]) -> str:
    if len(subjects_) != 1:
        raise ValueError(f"stream {stream} has several subject trees; name the one to replay")
    return subjects_[0]


async def count_from(js: JetStreamContext, stream: str, subjects_: list[str], start_seq: int) -> int:
    """How many records matching ``subjects_`` lie at or after ``start_seq``: one record per
    filter is read, the stream counts the rest (``Nats-Num-Pending``)."""
    nc = nats_internals.connection_of(js)
    count = 0
    for filter_ in streams.stored_filters(stream, subjects_):
        records = await _ask(nc, stream, _request(start_seq, filter_, 1), 10.0)
        if records:
            count += 1 + int((records[0].headers or {}).get("Nats-Num-Pending", "0"))
    return count


async def start_of_last(js: JetStreamContext, stream: str, subjects_: list[str], count: int) -> int:
    """The sequence from which exactly the last ``count`` matching messages follow: a binary
    search over pending counts, so the newest page of a long history costs a few requests."""
    info = await js.stream_info(stream)
    low, high = info.state.first_seq or 1, (info.state.last_seq or 0) + 1
    if await count_from(js, stream, subjects_, low) <= count:
        return low
    while high - low > 1:  # invariant: count_from(low) > count >= count_from(high)
        middle = (low + high) // 2
        if await count_from(js, stream, subjects_, middle) > count:
            low = middle
        else:
            high = middle
    return high


async def read_last(js: JetStreamContext, stream: str, subjects_: Sequence[str], *,
                    timeout_s: float = 10.0) -> list[StoredMsg]:
    """The latest record of every subject matching ``subjects_`` (wildcards allowed), in stream
    order: nats-server's multi-subject direct get (``{"multi_last": [...]}``, ADR-31), one
    request for what ``get_last_msg`` asks one subject at a time. Filters go MULTI_LAST_MAX to a
    request; one whose filters match more subjects than an answer carries is asked in halves."""
    nc = nats_internals.connection_of(js)
    found: dict[int, StoredMsg] = {}

    async def ask(filters: list[str]) -> None:
        try:
            records = await _ask(nc, stream, msgspec.json.encode({"multi_last": filters}), timeout_s)
        except TooManyResults:
            if len(filters) == 1:
                raise
            await ask(filters[: len(filters) // 2])
            await ask(filters[len(filters) // 2:])
            return
        for msg in records:
            stored = _stored(stream, msg)
            found[stored.seq] = stored

    wanted = list(streams.stored_filters(stream, subjects_))
    for start in range(0, len(wanted), MULTI_LAST_MAX):
        await ask(wanted[start:start + MULTI_LAST_MAX])
    return [found[seq] for seq in sorted(found)]


# ---------------------------------------------------------------------------- following


async def follow(nc: NATS, stream: str, subject: str, on_batch: Callable[[list[StoredMsg], bool], None], *,
                 start_seq: int, stopping: asyncio.Event, every_s: float = 0.25,
                 on_error: Callable[[Exception], None] | None = None) -> None:
    """Hand every record of ``stream`` matching ``subject`` from ``start_seq`` on to
    ``on_batch`` as it is stored, until ``stopping``: a direct get for what came since the
    last one seen, every ``every_s`` (a live tail without a consumer; a reconnect or a leader
    moving costs a late answer, never a gap). ``on_batch`` is told whether the batch reached
    the end of what was stored (caught up)."""
    # The stored forms of every install (HA-4), each followed on its own.
    await asyncio.gather(*(_follow_one(nc, stream, stored, on_batch, start_seq, stopping, every_s, on_error)
                           for stored in streams.stored_filters(stream, [subject])))


async def _ask_unless_stopped(nc: NATS, stream: str, request: bytes, stopping: asyncio.Event) -> list[Msg] | None:
    """A follower's round: the answer, or None once ``stopping`` comes first. The question is
    dropped then: a stop must not wait out a request to a bus that may be gone (10 s each)."""
    asking = asyncio.ensure_future(_ask(nc, stream, request, FOLLOW_TIMEOUT_S))
    stop = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait((asking, stop), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if asking.done():
        return asking.result()
    asking.cancel()
    await asyncio.gather(asking, return_exceptions=True)
    return None


async def _follow_one(nc: NATS, stream: str, filter_: str, on_batch: Callable[[list[StoredMsg], bool], None],
                      start_seq: int, stopping: asyncio.Event, every_s: float,
                      on_error: Callable[[Exception], None] | None) -> None:
    seq = start_seq
    while not stopping.is_set():
        try:
            records = await _ask_unless_stopped(nc, stream, _request(seq, filter_, BATCH), stopping)
        except Exception as exc:  # the connection is down, the stream electing: the next round
            if on_error is not None:
                on_error(exc)
            try:
                await asyncio.wait_for(stopping.wait(), every_s)
            except TimeoutError:
                pass
            continue
        if records is None:
            return  # stopped
        batch = [_stored(stream, msg) for msg in records]
        if batch:
            seq = batch[-1].seq + 1
        caught_up = len(records) < BATCH
        if batch or caught_up:
            on_batch(batch, caught_up)
        if caught_up:
            try:
                await asyncio.wait_for(stopping.wait(), every_s)
            except TimeoutError:
                pass


@dataclass(slots=True)
class _Follower:
    selects: Callable[[str], bool]  # its filters as the stream stores them (streams.stored_filters)
    on_batch: Callable[[list[StoredMsg], bool], None]
    next_seq: int


class Tail:
    """Every record of a stream from the earliest position its followers want, read once for
    all of them, each follower handed the records its filter selects, in stream order.

    For a process that follows a fleet-sized stream for as long as it runs (the api): the
    server is asked for *every* record from a sequence (``{"seq", "batch"}``, no subject), and
    the filtering is done here. nats-server answers a direct get filtered on a wildcard by
    matching it against the stream's subjects (one or more per node; ``NumPending`` for the
    batch, and to skip blocks): a filter that selects few records of many walks every subject
    on every request, and :func:`follow`'s position moves only past records its filter
    matched, so the next request asks from there again. The api's 22 filtered node-event tails
    were half of nats-server's CPU with 30,000 nodes reporting (docs/benchmarks.md, "Fleet").
    Unfiltered, the stream answers from its sequence index, and every follower moves past
    what was read. :func:`follow` stays for a narrow follower (one node's events) that should
    not be sent the fleet's."""

    def __init__(self, nc: NATS, stream: str, *, every_s: float = 0.25,
                 on_error: Callable[[Exception], None] | None = None) -> None:
        self._nc, self._stream, self._every_s, self._on_error = nc, stream, every_s, on_error
        self._followers: list[_Follower] = []

    def add(self, subjects_: str | Sequence[str], on_batch: Callable[[list[StoredMsg], bool], None], *,
            start_seq: int) -> None:
        """Hand ``on_batch`` every record matching ``subjects_`` from ``start_seq`` on, and
        whether the read reached the end of what was stored (caught up)."""
        wanted = [subjects_] if isinstance(subjects_, str) else list(subjects_)
        selects = subjects.matcher(streams.stored_filters(self._stream, wanted))
        self._followers.append(_Follower(selects, on_batch, max(1, start_seq)))

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            if self._followers:
                cursor = min(f.next_seq for f in self._followers)
                try:
                    records = await _ask_unless_stopped(self._nc, self._stream, _from(cursor, BATCH), stopping)
                except Exception as exc:  # the connection is down, the stream electing: the next round
                    if self._on_error is not None:
                        self._on_error(exc)
                    records = None
                if records is not None and self._hand_out([_stored(self._stream, m) for m in records],
                                                          cursor, caught_up=len(records) < BATCH):
                    continue  # more is stored: read on at once
            try:
                await asyncio.wait_for(stopping.wait(), self._every_s)
            except TimeoutError:
                pass

    def _hand_out(self, batch: list[StoredMsg], cursor: int, *, caught_up: bool) -> bool:
        """Each follower its part of ``batch`` (read from ``cursor``); whether to read again at once."""
        end = batch[-1].seq + 1 if batch else cursor
        for follower in list(self._followers):
            if follower.next_seq > end and not caught_up:
                continue  # ahead of this read: its records are the next one's
            mine = [stored for stored in batch if stored.seq >= follower.next_seq and follower.selects(stored.subject)]
            follower.next_seq = max(follower.next_seq, end)
            if mine or caught_up:
                follower.on_batch(mine, caught_up)
        return not caught_up


def _from(seq: int, batch: int) -> bytes:
    """Every record from ``seq``, whatever its subject."""
    return msgspec.json.encode({"seq": max(1, seq), "batch": batch, "max_bytes": MAX_BYTES})


# ---------------------------------------------------------------------------- payloads only


async def read_payloads(nc: NATS, js: JetStreamContext, stream: str, subject: str | list[str], *,
                        last_per_subject: bool = False, batch: int = PAYLOADS_BATCH,
                        idle_timeout_s: float = 10.0) -> list[bytes]:
    """The payload of every matching record now in ``stream``, in stream order, and nothing
    else: for reads whose cost is the record count (``node list`` over 100,000 nodes).

    The connection's protocol parser gets a fast lane for the read's inbox
    (``nats_internals.tap_direct``) that slices the payload and the sequence out of the socket
    buffer, instead of nats-py building a ``Msg`` with parsed headers, a queue entry and a task
    for each (figures: docs/benchmarks.md, "node list"). Where the parser cannot be tapped the
    read still works, at nats-py's speed. ``last_per_subject`` is meant for streams that keep
    one record per subject (the views): on others use :func:`read_all`.
    """
    end, one_per_subject = await _extent(js, stream)
    if not end:
        return []
    filters = list(streams.stored_filters(stream, [subject] if isinstance(subject, str) else subject))
    if len(filters) > 1 or (last_per_subject and not one_per_subject):
        return [m.data for m in await read_all(nc, js, stream, filters, last_per_subject=last_per_subject,
                                                 batch=batch, idle_timeout_s=idle_timeout_s)]
    await nats_internals.engage(nc)  # the self-test, once per connection
    # By subject: read on to the end as the read reaches it, since a record replaced meanwhile
    # moves past where the read began (read_all says why); the latest of each subject is kept.
    latest: dict[bytes, bytes] = {}
    out: list[bytes] = []
    seq = 1
    while True:
        page = await _ask_payloads(nc, stream, _request(seq, filters[0], batch), idle_timeout_s)
        if page is None:
            break
        records, last = page
        if last_per_subject:
            for subject_, payload in records:
                latest.pop(subject_, None)  # re-inserted: the dict keeps the latest's stream order
                latest[subject_] = payload
        else:
            out += [payload for _, payload in records]
        if not records or (not last_per_subject and last >= end):
            break
        seq = last + 1
    return list(latest.values()) if last_per_subject else out


async def _ask_payloads(nc: NATS, stream: str, body: bytes,
                        timeout_s: float) -> tuple[list[tuple[bytes, bytes]], int] | None:
    """One batch's (subject, payload)s and the last sequence among them; ``None`` when nothing
    matched."""
    out: list[tuple[bytes, bytes]] = []
    last = 0
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def on_status(status: str) -> None:
        if not done.done():
            done.set_result(status)

    def on_record(seq: int, subject: bytes, payload: bytes) -> None:
        nonlocal last
        out.append((subject, payload))
        last = seq

    async def on_msg(msg: Msg) -> None:  # the ordinary path: only when the tap is not in place
        headers = msg.headers or {}
        if "Nats-Sequence" in headers:
            on_record(int(headers["Nats-Sequence"]), headers.get("Nats-Subject", "").encode(), msg.data)
        else:
            on_status(headers.get("Status", ""))

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=on_msg, pending_msgs_limit=-1, pending_bytes_limit=-1)
    tap: nats_internals.DirectTap | None = None
    try:
        await nc.flush()  # a PONG round trip: the parser is idle between operations now
        tap = nats_internals.tap_direct(nc, sub, on_record, on_status)
        await nc.publish(f"$JS.API.DIRECT.GET.{stream}", body, reply=inbox)
        try:
            status = await asyncio.wait_for(done, timeout_s)
        except TimeoutError:
            raise TimeoutError(f"reading {stream}: no answer within {timeout_s:g} s") from None
    finally:
        if tap is not None:
            tap.remove()
        await sub.unsubscribe()
    if status == EMPTY and not out:
        return None
    if status not in (END_OF_BATCH, EMPTY):
        raise ReadError(f"reading {stream}: the stream answered {status}")
    return out, last
