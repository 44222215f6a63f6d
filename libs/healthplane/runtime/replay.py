"""Reading a stream from a position to its current end with an ordered consumer.

This is how the CLI reads (per-node subject filters, last-per-subject for listings) and how
a service finds what it already emitted after a restart (headers only).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import datetime

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.errors import NotFoundError

from healthplane.contracts import streams
from healthplane.runtime import nats_internals
from healthplane.runtime.pull import stream_seq_of


async def replay(
    js: JetStreamContext,
    stream: str,
    subject: str | None = None,
    *,
    start_seq: int = 1,
    last_per_subject: bool = False,
    headers_only: bool = False,
    idle_timeout_s: float = 5.0,
) -> AsyncIterator[Msg]:
    """Yield every message of ``stream`` (matching ``subject``) from ``start_seq`` to the end
    as it was when the replay started, in order."""
    try:
        info = await js.stream_info(stream, subjects_filter=subject if subject and "*" not in subject and ">" not in subject else None)
    except NotFoundError:
        return
    end = info.state.last_seq
    if end < start_seq or info.state.messages == 0:
        return
    if last_per_subject:
        policy, opt_start = DeliverPolicy.LAST_PER_SUBJECT, None
    elif start_seq <= max(1, info.state.first_seq):
        policy, opt_start = DeliverPolicy.ALL, None
    else:
        policy, opt_start = DeliverPolicy.BY_START_SEQUENCE, start_seq
    sub = await js.subscribe(
        subject or _only_subject(stream, info.config.subjects or []),
        stream=stream,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=policy, opt_start_seq=opt_start,
                              headers_only=headers_only or None),
        pending_msgs_limit=-1,
        pending_bytes_limit=-1,
    )
    try:
        consumer = await sub.consumer_info()
        # num_pending counts what is not yet pushed: the server may already have sent
        # everything, so "nothing to read" also needs nothing delivered.
        if consumer.num_pending == 0 and not (consumer.delivered and consumer.delivered.consumer_seq):
            return
        while True:
            msg = await sub.next_msg(timeout=idle_timeout_s)
            yield msg
            meta = msg.metadata
            if meta.num_pending == 0 or meta.sequence.stream >= end:
                return
    finally:
        await sub.unsubscribe()


def _only_subject(stream: str, subjects: list[str]) -> str:
    if len(subjects) != 1:
        raise ValueError(f"stream {stream} has several subject trees; name the one to replay")
    return subjects[0]


async def read_all(nc: NATS, js: JetStreamContext, stream: str, subject: str | list[str], *,
                   last_per_subject: bool = False, start_seq: int | None = None, start_time: datetime | None = None,
                   limit: int | None = None, headers_only: bool = False, sink: Callable[[Msg], None] | None = None,
                   batch: int = 1000, idle_timeout_s: float = 10.0) -> list[Msg]:
    """Every matching message now in ``stream``, in order, in large pull batches.

    For reads that must be fast over many records (``node list`` over 100,000 nodes, a
    restart's scan of its own outputs): an ephemeral consumer without acks, drained with batch
    requests all in flight at once, instead of a push subscription delivering one message at
    a time. With ``sink`` each message is handed over as it arrives and nothing is kept.
    """
    if last_per_subject:
        policy, opt_start = DeliverPolicy.LAST_PER_SUBJECT, None
    elif start_seq and start_seq > 1:
        policy, opt_start = DeliverPolicy.BY_START_SEQUENCE, start_seq
    elif start_time is not None:
        policy, opt_start = DeliverPolicy.BY_START_TIME, None
    else:
        policy, opt_start = DeliverPolicy.ALL, None
    info = await _reader(js, stream, subject, policy, opt_start=opt_start,
                         start_time=start_time if start_time and not opt_start else None, headers_only=headers_only)
    if info is None:
        return []
    total = info.num_pending or 0
    if limit is not None:
        total = min(total, limit)
    out: list[Msg] = []
    if total == 0:
        await _delete_quietly(js, stream, info.name)
        return out
    done = asyncio.get_running_loop().create_future()
    inbox = nc.new_inbox()

    received = 0

    async def on_msg(msg: Msg) -> None:
        nonlocal received
        if not msg.reply:
            return  # status messages: the count below decides when we are done
        if received < total:
            received += 1
            if sink is None:
                out.append(msg)
            else:
                sink(msg)
        if received >= total and not done.done():
            done.set_result(None)

    sub = await nc.subscribe(inbox, cb=on_msg, pending_msgs_limit=-1, pending_bytes_limit=-1)
    try:
        await _pull_all(nc, stream, info.name, total, inbox, lambda: received, done, batch, idle_timeout_s)
    finally:
        await sub.unsubscribe()
        await _delete_quietly(js, stream, info.name)
    out.sort(key=lambda m: stream_seq_of(m.reply))
    return out


async def _reader(js: JetStreamContext, stream: str, subject: str | list[str], policy: DeliverPolicy, *,
                  opt_start: int | None = None, start_time: datetime | None = None,
                  headers_only: bool = False) -> ConsumerInfo | None:
    """An ephemeral consumer without acks for one read; ``None`` when the stream is missing.
    The filters are the contract's subjects, read whatever the install's partitions (HA-4)."""
    subjects_ = list(streams.stored_filters(stream, [subject] if isinstance(subject, str) else subject))
    try:
        return await js.add_consumer(stream, ConsumerConfig(
            ack_policy=AckPolicy.NONE, deliver_policy=policy, opt_start_seq=opt_start, opt_start_time=start_time,
            filter_subject=subjects_[0] if len(subjects_) == 1 else None,
            filter_subjects=subjects_ if len(subjects_) > 1 else None,
            headers_only=headers_only or None, inactive_threshold=30.0, mem_storage=True))
    except NotFoundError:
        return None


async def _pull_all(nc: NATS, stream: str, consumer: str, total: int, inbox: str, received: Callable[[], int],
                    done: asyncio.Future[None], batch: int, idle_timeout_s: float) -> None:
    """Ask for all ``total`` messages at once, in batches the server fills in turn, and wait
    until ``done``; a read that stops progressing for ``idle_timeout_s`` fails (a long read is
    fine while it progresses)."""
    batch = max(batch, -(-total // 64))  # at most 64 requests waiting on the server
    request = msgspec.json.encode({"batch": batch, "expires": int(3600 * 1e9)})

    async def ask() -> None:
        for _ in range(-(-total // batch)):
            await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}", request, reply=inbox)

    await ask()
    # On a cluster the consumer lives on one server, set up there after the create's answer
    # came back: requests that reach it first are lost. Ask again while nothing has come
    # (extra requests ask for nothing more than the count; they go with the consumer).
    wait_s = 0.1
    while received() == 0 and not done.done() and wait_s < idle_timeout_s:
        await asyncio.wait([done], timeout=wait_s)
        if received() == 0 and not done.done():
            await ask()
        wait_s *= 2
    seen = -1
    while not done.done():
        if received() == seen:
            raise TimeoutError(f"reading {stream} stalled after {received()} of {total} messages")
        seen = received()
        await asyncio.wait([done], timeout=idle_timeout_s)


async def _delete_quietly(js: JetStreamContext, stream: str, consumer: str) -> None:
    try:
        await js.delete_consumer(stream, consumer)
    except Exception:
        pass  # it expires on its own (inactive threshold)


async def count_from(js: JetStreamContext, stream: str, subjects_: list[str], start_seq: int) -> int:
    """How many messages matching ``subjects_`` lie at or after ``start_seq`` (a consumer's
    pending count: no message is read)."""
    subjects_ = list(streams.stored_filters(stream, subjects_))
    info = await js.add_consumer(stream, ConsumerConfig(
        ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, start_seq),
        filter_subject=subjects_[0] if len(subjects_) == 1 else None,
        filter_subjects=subjects_ if len(subjects_) > 1 else None, inactive_threshold=5.0, mem_storage=True))
    await _delete_quietly(js, stream, info.name)
    return info.num_pending or 0


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


# ---------------------------------------------------------------------------- payloads only


async def read_payloads(nc: NATS, js: JetStreamContext, stream: str, subject: str | list[str], *,
                        last_per_subject: bool = False, batch: int = 1000,
                        idle_timeout_s: float = 10.0) -> list[bytes]:
    """The payload of every matching message now in ``stream``, in the order the server sent
    them (stream order), and nothing else: no headers, no metadata.

    :func:`read_all` for reads whose cost is the record count (``node list`` over 100,000
    nodes): nats-py matches each delivery with regular expressions, parses its headers and
    builds a ``Msg`` that goes through a queue and a task for every record; here the
    connection's protocol parser gets a fast lane for this one subscription for the length of
    the read (``nats_internals.tap_payloads``) that only slices payloads out of the socket
    buffer (figures: docs/benchmarks.md, "node list"). Where the parser cannot be tapped (a nats-py whose
    internals failed their self-test, or a parser caught mid-operation) the read still works,
    at nats-py's speed.
    """
    info = await _reader(js, stream, subject, DeliverPolicy.LAST_PER_SUBJECT if last_per_subject else DeliverPolicy.ALL)
    if info is None:
        return []
    total = info.num_pending or 0
    out: list[bytes] = []
    if total == 0:
        await _delete_quietly(js, stream, info.name)
        return out
    done = asyncio.get_running_loop().create_future()

    def progress() -> None:
        if len(out) >= total and not done.done():
            done.set_result(None)

    async def on_msg(msg: Msg) -> None:  # the ordinary path: only when the tap is not in place
        if msg.reply:  # status messages carry no reply subject
            out.append(msg.data)
            progress()

    await nats_internals.engage(nc)  # the self-test, once per connection
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=on_msg, pending_msgs_limit=-1, pending_bytes_limit=-1)
    tap: nats_internals.PayloadTap | None = None
    try:
        await nc.flush()  # a PONG round trip: the parser is idle between operations now
        tap = nats_internals.tap_payloads(nc, sub, out, progress)
        await _pull_all(nc, stream, info.name, total, inbox, lambda: len(out), done, batch, idle_timeout_s)
    finally:
        if tap is not None:
            tap.remove()
        await sub.unsubscribe()
        await _delete_quietly(js, stream, info.name)
    del out[total:]  # nodes added while reading: the batches asked for may hold a few more
    return out
