"""The server's own fence on a lease holder's writes (HA-3).

The lease (:mod:`healthplane.runtime.lease`) says who should write; only the server can make
sure nobody else does. A holder that stalls past its TTL (SIGSTOP, a GC pause, a partition)
and wakes after a standby took over can still have a write queued between its last fence
check and the socket. So each holder, on taking over, appends a *mark* to every stream it
writes (``streams.fence_subject``: ``hp.fence.<stream>.<service>.<partition>``), and each of
its records carries ``Nats-Expected-Last-Subject-Sequence-Subject`` = that subject and
``Nats-Expected-Last-Subject-Sequence`` = its mark's sequence: nats-server stores the record
only while the holder's mark is still the last one there (err 10071 otherwise). On a cluster
the server serialises writes that carry an expectation on the same subject, so a holder's
records go as atomic batches (``Publisher.store_runs``, streams with ``allow_atomic``), one
per output stream and write, the streams' batches in flight together, the expectation on
each batch's first record: checked once, stored whole or not at all (HA-6). A single server
checks expectations in order without serialising, and stages each atomic batch of a file
stream on disk (milliseconds a batch): there every record carries the expectation and goes
plain (``Processor._store``).

Marks are ordered by lease revision (the KV bucket's sequence, higher for every new holder):
a claim reads the last mark and appends its own only when that mark's revision is not
higher than its own, with the expected sequence of the mark it read, so a stale holder can
neither supersede a newer one nor race it. A mark is renewed the same way well within the
stream's ``max_age`` (``REMARK_EVERY_S``), so a holder that leads for weeks is not fenced
off by its own mark ageing out.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Final

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from healthplane.contracts import streams

EXPECT_SEQ: Final = "Nats-Expected-Last-Subject-Sequence"
EXPECT_SUBJECT: Final = "Nats-Expected-Last-Subject-Sequence-Subject"
WRONG_LAST_SEQUENCE: Final = 10071
# Another write with an expectation on the same subject is still being stored (a cluster
# serialises them): not a verdict, try again.
EXPECTATION_IN_PROCESS: Final = 10164
REMARK_EVERY_S: Final = 6 * 3600.0  # the shortest max_age of a fenced stream is 7 days
_CLAIM_TRIES: Final = 8


class Superseded(Exception):
    """A holder with a higher lease revision has marked the stream: this one may not write."""


class Mark(msgspec.Struct, kw_only=True):
    revision: int
    holder: str


_decode_mark = msgspec.json.Decoder(Mark).decode


class Marks:
    """One holder's marks on the streams it writes, and the headers that bind its records
    to them."""

    def __init__(self, js: JetStreamContext, service: str, partition: int | str, holder: str,
                 stream_names: Iterable[str]) -> None:
        self._js, self._holder = js, holder
        self._subjects = {name: subject for name in dict.fromkeys(stream_names)
                          if (subject := streams.fence_subject(name, service, partition)) is not None}
        # Which stream stores a record: by the fixed prefix of each stream's channels.
        self._prefixes = [(subject.removesuffix(">"), name) for name in self._subjects
                          for subject in streams.STREAMS_BY_NAME[name].subjects if subject.endswith(">")]
        self._headers: dict[str, dict[str, str]] = {}
        self._marked_at = 0.0
        self._revision = 0

    async def claim(self, revision: int) -> None:
        """Mark every stream for lease ``revision``; :class:`Superseded` when a newer holder
        has marked one already."""
        for name, subject in self._subjects.items():
            seq = await self._claim_one(name, subject, revision)
            self._headers[name] = {EXPECT_SUBJECT: subject, EXPECT_SEQ: str(seq)}
        self._revision, self._marked_at = revision, time.monotonic()

    async def renew_if_due(self) -> None:
        if self._headers and time.monotonic() - self._marked_at > REMARK_EVERY_S:
            await self.claim(self._revision)

    async def _claim_one(self, stream: str, subject: str, revision: int) -> int:
        for _ in range(_CLAIM_TRIES):
            try:
                last = await self._js.get_last_msg(stream, subject)
                last_seq, theirs = last.seq or 0, _revision_of(last.data)
            except NotFoundError:
                last_seq, theirs = 0, 0
            if theirs > revision:
                raise Superseded(f"{stream}: a holder with lease revision {theirs} writes it now (ours {revision})")
            try:
                ack = await self._js.publish(subject, msgspec.json.encode(Mark(revision=revision, holder=self._holder)),
                                             stream=stream, headers={EXPECT_SEQ: str(last_seq)})
            except APIError as exc:
                if exc.err_code in (WRONG_LAST_SEQUENCE, EXPECTATION_IN_PROCESS):
                    continue  # another claim landed (or is landing) in between: read again
                raise
            return int(ack.seq)
        raise Superseded(f"{stream}: the mark kept changing under {_CLAIM_TRIES} claims")

    def stream_of(self, subject: str) -> str | None:
        for prefix, name in self._prefixes:
            if subject.startswith(prefix):
                return name
        return None

    def headers(self, stream: str) -> dict[str, str] | None:
        """The headers that bind a record of ``stream`` to this holder's mark."""
        return self._headers.get(stream)


def _revision_of(data: bytes | None) -> int:
    try:
        return _decode_mark(data or b"").revision
    except msgspec.DecodeError:
        return 0  # not a mark we wrote: anyone's to supersede
