"""Asynchronous JetStream publishing with a bounded window, every acknowledgement checked.

We do not use nats-py's ``publish_async``: when JetStream answers a publish with an error
(``maximum bytes exceeded``, a wrong expected sequence…) it raises inside its reply handler,
so the error reaches the connection's error callback and the future never completes. Here
one reply subscription resolves every future with the ack or with a :class:`PublishError`
carrying the server's description.

:meth:`Publisher.store_all` is the hot path of the service loop: a whole batch of records
goes out as one write (the protocol frames built here, not one ``nc.publish`` per record)
and their acks are counted into one list, with one future and one timer for the batch.
Every ack is still checked. Both the frame writer and the acks' fast lane reach into nats-py
internals, which only :mod:`healthplane.runtime.nats_internals` touches: it self-tests them
on the connection first, and where they fail this module takes nats-py's public path.
The upstream report for ``publish_async`` is docs/upstream.md.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from healthplane.runtime import nats_internals
from healthplane.runtime.nats_internals import pub_frame as pub_frame
from healthplane.runtime.nats_internals import write_frames as write_frames

# JetStream's answers that the same record will never be stored, however often it is sent
# (nats-server's jetstream_errors_generated.go): retrying them wedges the writer.
PERMANENT_ERR_CODES: Final = frozenset({
    10054,  # message size exceeds maximum allowed
    10056,  # stream name in subject does not match request
    10060,  # expected stream does not match
    10071,  # wrong last sequence (an expected-sequence header that no longer holds)
})


# JetStream atomic batch publish (nats-server 2.12+, a stream with allow_atomic).
BATCH_ID: Final = "Nats-Batch-Id"
BATCH_SEQUENCE: Final = "Nats-Batch-Sequence"
BATCH_COMMIT: Final = "Nats-Batch-Commit"
MAX_ATOMIC: Final = 1000  # the server's largest batch by default
ATOMIC_DUPLICATE: Final = 10201  # "atomic publish batch contains duplicate message id": stored before
RECONNECT_CHECK_S: Final = 0.25  # how often a write waiting for its acks looks for a reconnect


class PublishError(RuntimeError):
    """JetStream did not store a record; ``code``/``err_code`` are the server's when it said why.

    ``permanent``: sending the same record again cannot succeed (the server's error code says
    so, or the record itself is unsendable: not a subject, larger than the server takes);
    ``index``: which record of a batch, when the batch was refused for one of them."""

    def __init__(self, message: str, code: int | None = None, err_code: int | None = None, *,
                 permanent: bool = False, index: int | None = None, stream: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.err_code = err_code
        self.stream = stream  # the stream that answered, when one did
        self.permanent = permanent or err_code in PERMANENT_ERR_CODES
        self.index = index


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

# One record to store: subject, payload, headers (None for none).
Outbound = tuple[str, bytes, Mapping[str, str] | None]
# Records stored together (``Publisher.store_runs``): plain (``None``) or an atomic batch with
# these headers on its first record, and the stream they go to.
Run = tuple[Sequence[Outbound], Mapping[str, str] | None, str | None]

_UNSAFE_IN_SUBJECT = frozenset(" \t\r\n")


def _outcome(msg: Msg) -> Ack | PublishError:
    """What JetStream said about one published record."""
    headers = msg.headers or {}
    if headers.get("Status") == "503":
        return PublishError("no stream stores this subject", code=503)
    return _outcome_of(msg.data)


def _outcome_of(data: bytes) -> Ack | PublishError:
    try:
        body = _decode_ack(data)
    except msgspec.DecodeError as exc:
        return PublishError(f"unreadable ack: {exc}")
    if body.error is not None:
        description = str(body.error.get("description", "error"))
        code, err_code = body.error.get("code"), body.error.get("err_code")
        return PublishError(
            description,
            code=code if isinstance(code, int) else None,
            err_code=err_code if isinstance(err_code, int) else None,
            stream=body.stream,
        )
    return Ack(body.stream, body.seq, body.duplicate)


def writes_frames(nc: NATS) -> bool:
    """Whether this connection takes ready-made protocol frames (:func:`write_frames`): the
    fast path passed its self-test on it (:mod:`healthplane.runtime.nats_internals`)."""
    return nats_internals.writes_frames(nc)


def header_block(headers: Mapping[str, str]) -> bytes:
    """The NATS header section of a message (``NATS/1.0`` line, one line per header, blank
    line), as nats-py writes it: a value's line breaks become spaces (they would smuggle in
    another header), a key that is not a header token is refused."""
    text = "NATS/1.0\r\n" + "".join([f"{key}: {value}\r\n" for key, value in headers.items()]) + "\r\n"
    if text.count("\n") != len(headers) + 2 or text.count("\r") != len(headers) + 2 or ":" in "".join(headers):
        lines = ["NATS/1.0\r\n"]
        for key, value in headers.items():
            if not _HEADER_KEY.fullmatch(key):
                raise ValueError(f"{key!r} is not a header name")
            lines.append(f"{key}: {value.translate(_NO_LINE_BREAKS).strip()}\r\n")
        text = "".join(lines) + "\r\n"
    return text.encode()


_HEADER_KEY = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_NO_LINE_BREAKS = str.maketrans({"\r": " ", "\n": " "})


class _Batch:
    """The acks of one :meth:`Publisher.store_all` call, by position."""

    __slots__ = ("done", "missing", "outcomes")

    def __init__(self, size: int, done: asyncio.Future[None]) -> None:
        self.outcomes: list[Ack | PublishError | None] = [None] * size
        self.missing = size
        self.done = done


class Publisher:
    """``submit()`` returns a future per record; ``publish()`` + ``flush()`` handle a batch.

    ``window`` bounds the records in flight: the caller is paused when it is full, so a slow
    server applies back-pressure instead of growing memory.
    """

    def __init__(self, nc: NATS, window: int = 2048, ack_timeout_s: float = 10.0) -> None:
        self._nc = nc
        self.ack_timeout_s = ack_timeout_s
        self._slots = asyncio.Semaphore(window)
        self._prefix = ""
        self._next_token = 0
        self._futures: dict[str, asyncio.Future[Ack]] = {}
        self._batch: deque[tuple[str, asyncio.Future[Ack]]] = deque()
        self._batches: dict[str, _Batch] = {}
        self._next_batch = 0

    async def _ensure_subscribed(self) -> None:
        if not self._prefix:
            self._prefix = self._nc.new_inbox() + "."
            self._reply_sub = await self._nc.subscribe(self._prefix + "*", cb=self._on_reply)

    def _attach_ack_lane(self) -> None:
        """Take the parser's fast lane for acks where the connection allows it (else they come
        through the subscription's callback, as before). Tried again at each batch until it
        holds; a reconnect keeps it."""
        if not nats_internals.routes_acks(self._nc, self._reply_sub):
            nats_internals.route_acks(self._nc, self._reply_sub, len(self._prefix), self._on_fast_reply)

    @property
    def fast_acks(self) -> bool:
        """Whether this publisher's acks take the parser's fast lane (``nats_internals``)."""
        return bool(self._prefix) and nats_internals.routes_acks(self._nc, self._reply_sub)

    def _on_fast_reply(self, token: bytes, body: bytes) -> None:
        self._resolve(token.decode(), _outcome_of(body))

    async def _on_reply(self, msg: Msg) -> None:
        self._resolve(msg.subject[len(self._prefix):], _outcome(msg))

    def _resolve(self, token: str, outcome: Ack | PublishError) -> None:
        if token.startswith("b"):  # a record of a store_all batch: "b<batch>_<index>"
            batch_id, _, index = token[1:].partition("_")
            batch = self._batches.get(batch_id)
            if batch is None or not index.isdigit() or int(index) >= len(batch.outcomes):
                return  # a batch that already timed out
            position = int(index)
            if batch.outcomes[position] is None:
                batch.outcomes[position] = outcome
                batch.missing -= 1
                if batch.missing == 0 and not batch.done.done():
                    batch.done.set_result(None)
            return
        future = self._futures.pop(token, None)
        if future is None or future.done():
            return
        if isinstance(outcome, PublishError):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    async def store_all(self, records: Sequence[Outbound]) -> list[Ack]:
        """Store every record, in order, and return their acks; raise :class:`PublishError`
        naming the first record JetStream did not store (or did not ack in time)."""
        acks: list[Ack] = []
        for index, ((subject, _, _), outcome) in enumerate(zip(records, await self.store_each(records), strict=True)):
            if isinstance(outcome, PublishError):
                raise PublishError(f"{subject}: {outcome}", outcome.code, outcome.err_code,
                                   permanent=outcome.permanent, index=index) from outcome
            acks.append(outcome)
        return acks

    async def store_runs(self, runs: Sequence[Run], *, one_per_stream: bool) -> list[Ack]:
        """Store runs of records and return their acks, in the order of the flattened runs;
        each run either plain (every record acked) or, with ``first`` headers, a JetStream
        atomic batch of one stream (``allow_atomic``): stored whole or not at all, ``first``
        (an expectation: a lease holder's fence) on its first record, so the server checks it
        once for the batch (runtime.fencing). A run longer than the server's largest batch
        (``MAX_ATOMIC``) is cut into several, in order.

        Without ``one_per_stream`` everything goes out pipelined, in order, in one write:
        whatever a crash leaves stored is a prefix of the records.

        ``one_per_stream`` (a cluster): a cluster refuses a batch whose expectation is checked
        while another on the same subject is still being stored (10164), so a stream's batches
        go one at a time: its k-th in the k-th write, beside the k-th of every other stream
        (the plain runs in the first), each write's acks awaited before the next. The batches
        of different streams are in flight together; what a crash leaves stored is, per
        stream, a prefix of that stream's records, not of all of them (a caller that gives
        each stream one run writes once, whatever the number of streams).

        A batch sent again after its ack was lost is answered "duplicate message id" (10201):
        atomic, so it was stored whole, and its records count as duplicates. A PublishError's
        index is the failing record's, or its batch's first, in the flattened runs."""
        chunks: list[tuple[Run, int]] = []  # each with the place of its first record in the flattened runs
        position = 0
        for run in runs:
            records, first, stream = run
            if first is None or len(records) <= MAX_ATOMIC:
                chunks.append((run, position))
            else:
                chunks += [((records[i:i + MAX_ATOMIC], first, stream), position + i)
                           for i in range(0, len(records), MAX_ATOMIC)]
            position += len(records)
        segments: list[list[tuple[Run, int]]] = [[]]
        batches_of: dict[str, int] = {}
        for chunk in chunks:
            _, first, stream = chunk[0]
            place = 0
            if one_per_stream and first is not None and stream is not None:
                place = batches_of.get(stream, 0)
                batches_of[stream] = place + 1
            while len(segments) <= place:
                segments.append([])
            segments[place].append(chunk)
        if len(segments) == 1:
            return await self._store_segment(segments[0]) if segments[0] else []
        placed: list[Ack | None] = [None] * position
        for segment in segments:
            stored = iter(await self._store_segment(segment))
            for (records, _, _), start in segment:
                for index in range(start, start + len(records)):
                    placed[index] = next(stored)
        return [ack for ack in placed if ack is not None]  # every place is filled: a write stored all or raised

    async def _store_segment(self, runs: Sequence[tuple[Run, int]]) -> list[Ack]:
        """One write of ``runs`` (each with the place of its first record in the caller's
        flattened runs, which a PublishError's index names), its acks awaited together; the
        acks in the order of the runs given."""
        if self._nc.is_closed:
            raise PublishError("connection closed")
        await self._ensure_subscribed()
        await nats_internals.engage(self._nc)
        if writes_frames(self._nc):
            self._attach_ack_lane()
        batch_id = str(self._next_batch)
        self._next_batch += 1
        reply_stem = f"{self._prefix}b{batch_id}_"
        framed: list[tuple[str, bytes, Mapping[str, str] | None, str]] = []  # + the reply, "" for none
        places: list[int] = []  # per framed record, its place in the caller's runs
        slots: list[tuple[int, int, bool]] = []  # per ack slot: first framed index, record count, atomic
        for (records, first, _), start in runs:
            places += range(start, start + len(records))
            if first is None:
                for subject, payload, headers in records:
                    framed.append((subject, payload, headers, f"{reply_stem}{len(slots)}"))
                    slots.append((len(framed) - 1, 1, False))
                continue
            atomic_id = f"{self._prefix.rstrip('.').rpartition('.')[2]}-{batch_id}-{len(slots)}"
            last = len(records) - 1
            for index, (subject, payload, headers) in enumerate(records):
                marked = {**(headers or {}), **(first if index == 0 else {}),
                          BATCH_ID: atomic_id, BATCH_SEQUENCE: str(index + 1)}
                if index == last:
                    marked[BATCH_COMMIT] = "1"
                framed.append((subject, payload, marked, f"{reply_stem}{len(slots)}" if index == last else ""))
            slots.append((len(framed) - len(records), len(records), True))
        batch = _Batch(len(slots), asyncio.get_running_loop().create_future())
        self._batches[batch_id] = batch
        reconnects = self._nc.stats.get("reconnects", 0)
        try:
            if writes_frames(self._nc):
                await self._write_framed(framed)
            else:
                for subject, payload, headers, reply in framed:
                    await self._nc.publish(subject, payload, reply=reply, headers=dict(headers) if headers else None)
            await self._answered(batch.done, reconnects)  # the slots without an ack are reported below
        except PublishError as exc:
            exc.index = places[exc.index or 0]
            raise
        except Exception as exc:
            raise PublishError(f"{framed[0][0]}: {exc or type(exc).__name__}", index=places[0]) from exc
        finally:
            self._batches.pop(batch_id, None)
        acks: list[Ack] = []
        for (start, count, atomic), outcome in zip(slots, batch.outcomes, strict=True):
            subject = framed[start][0]
            if outcome is None:
                raise PublishError(f"{subject}: no ack within {self.ack_timeout_s:g}s", index=places[start])
            if isinstance(outcome, PublishError):
                if atomic and outcome.err_code == ATOMIC_DUPLICATE:
                    acks += [Ack(outcome.stream, 0, True)] * count
                    continue
                what = f" (atomic batch of {count})" if atomic else ""
                raise PublishError(f"{subject}: {outcome}{what}", outcome.code, outcome.err_code,
                                   permanent=outcome.permanent, index=places[start]) from outcome
            if atomic:
                acks += [Ack(outcome.stream, outcome.seq - count + 1 + i, False) for i in range(count)]
            else:
                acks.append(outcome)
        return acks

    async def _answered(self, done: asyncio.Future[None], reconnects: int) -> None:
        """Until every ack of a write is in, the ack timeout, or a reconnect since the write:
        a record written to a server that died with it (kill -9 of a cluster member) is never
        answered, so the caller retries it at once, by its id, instead of at the timeout. A
        connection closed meanwhile (a service stopping, its link cut) answers nothing more
        either: that raises at once, instead of holding the stop for the ack timeout."""
        deadline = asyncio.get_running_loop().time() + self.ack_timeout_s
        while not done.done():
            if self._nc.is_closed:
                raise PublishError("connection closed before every ack came")
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0 or self._nc.stats.get("reconnects", 0) != reconnects:
                return
            await asyncio.wait([done], timeout=min(remaining, RECONNECT_CHECK_S))

    async def _write_framed(self, framed: Sequence[tuple[str, bytes, Mapping[str, str] | None, str]]) -> None:
        """``HPUB``/``PUB`` frames, each with its reply ("" for none), handed to the connection as
        one command: what ``nc.publish`` does per record, without its per-call cost."""
        max_payload = self._nc.max_payload
        frames: list[bytes] = []
        payload_bytes = 0
        for index, (subject, payload, headers, reply) in enumerate(framed):
            if not subject or not _UNSAFE_IN_SUBJECT.isdisjoint(subject):
                raise PublishError(f"{subject!r} is not a subject", permanent=True, index=index)
            if len(payload) > max_payload:
                raise PublishError(f"{subject}: payload of {len(payload)} bytes exceeds the server's "
                                   f"{max_payload}", permanent=True, index=index)
            payload_bytes += len(payload)
            frames.append(pub_frame(subject, payload, reply, header_block(headers) if headers else b""))
        await write_frames(self._nc, b"".join(frames), len(framed), payload_bytes)

    async def store_each(self, records: Sequence[Outbound]) -> list[Ack | PublishError]:
        """Publish every record and return what JetStream said about each, in order: its ack,
        or the :class:`PublishError` it was refused with (or that no ack came in time).

        The batch goes out as one write and its acks are awaited together, under one timer:
        per record this costs building its frame and reading its ack, nothing else. A batch
        the connection refuses as a whole (closed, a bad subject) raises instead.
        """
        if not records:
            return []
        if self._nc.is_closed:
            raise PublishError("connection closed")
        await self._ensure_subscribed()
        await nats_internals.engage(self._nc)  # the self-test, once per connection
        if writes_frames(self._nc):
            self._attach_ack_lane()
        batch_id = str(self._next_batch)
        self._next_batch += 1
        batch = _Batch(len(records), asyncio.get_running_loop().create_future())
        self._batches[batch_id] = batch
        reconnects = self._nc.stats.get("reconnects", 0)
        try:
            reply_stem = f"{self._prefix}b{batch_id}_"
            if writes_frames(self._nc):
                await self._write_frames(records, reply_stem)
            else:
                for index, (subject, payload, headers) in enumerate(records):
                    await self._nc.publish(subject, payload, reply=f"{reply_stem}{index}",
                                           headers=dict(headers) if headers else None)
            await self._answered(batch.done, reconnects)  # the records without an ack are reported below
        except PublishError:
            raise
        except Exception as exc:  # the connection refused the write (closed, draining)
            raise PublishError(f"{records[0][0]}: {exc or type(exc).__name__}") from exc
        finally:
            self._batches.pop(batch_id, None)
        late = PublishError(f"no ack within {self.ack_timeout_s:g}s")
        return [late if outcome is None else outcome for outcome in batch.outcomes]

    async def _write_frames(self, records: Sequence[Outbound], reply_stem: str) -> None:
        """``HPUB``/``PUB`` frames for every record, handed to the connection as one command:
        what ``nc.publish`` does per record, without its per-call cost."""
        await self._write_framed([(subject, payload, headers, f"{reply_stem}{index}")
                                  for index, (subject, payload, headers) in enumerate(records)])

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
            async with asyncio.timeout(self.ack_timeout_s):
                return await asyncio.shield(future)
        except TimeoutError as exc:
            self._forget(future)
            raise PublishError(f"no ack for {subject} within {self.ack_timeout_s:g}s") from exc

    def abandon(self, future: asyncio.Future[Ack]) -> None:
        """Stop waiting for a submitted record's ack (it came, or never will): its slot in the
        window is free again."""
        self._forget(future)

    def _forget(self, future: asyncio.Future[Ack]) -> None:
        for token, pending in list(self._futures.items()):
            if pending is future:
                del self._futures[token]
        if not future.done():
            future.cancel()

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str] | None = None) -> None:
        self._batch.append((subject, await self.submit(subject, payload, headers)))

    async def flush(self) -> list[Stored]:
        """Wait for every ack of the batch; raise :class:`PublishError` naming the first failure."""
        batch, self._batch = list(self._batch), deque()
        if not batch:
            return []
        futures = [future for _, future in batch]
        _, pending = await asyncio.wait(futures, timeout=self.ack_timeout_s)  # one timer for the batch
        stored = []
        for subject, future in batch:
            if future in pending:
                for late in pending:
                    self._forget(late)
                raise PublishError(f"{subject}: no ack within {self.ack_timeout_s:g}s")
            exc = future.exception()
            if exc is not None:
                for _, rest in batch:
                    self._forget(rest)
                code = exc.code if isinstance(exc, PublishError) else None
                err_code = exc.err_code if isinstance(exc, PublishError) else None
                raise PublishError(f"{subject}: {exc}", code, err_code) from exc
            stored.append(Stored(subject, future.result()))
        return stored
