"""Reading a stream from a position to its current end with an ordered consumer.

This is how the CLI reads (per-node subject filters, last-per-subject for listings) and how
a service finds what it already emitted after a restart (headers only).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError


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
