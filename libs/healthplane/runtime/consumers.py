"""The one way a service makes its durable consumer: explicit acks, a bounded number in
flight, pull requests bounded too. Every service's consumer is read by the shared pull loop
(``runtime.pull``)."""

from __future__ import annotations

from collections.abc import Sequence

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

MAX_WAITING = 64  # pull requests the server holds for one consumer
CREATE_TIMEOUT_S = 20.0


def durable(name: str, *, start_seq: int | None = None, deliver: DeliverPolicy = DeliverPolicy.ALL,
            filter_subjects: Sequence[str] = (), ack_wait_s: float, max_ack_pending: int,
            inactive_threshold_s: float | None = None) -> ConsumerConfig:
    """``start_seq`` (from a snapshot's position) wins over ``deliver``."""
    by_seq = start_seq is not None and start_seq > 1
    subjects = list(filter_subjects)
    return ConsumerConfig(
        durable_name=name,
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE if by_seq else deliver,
        opt_start_seq=start_seq if by_seq else None,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait_s,
        max_ack_pending=max_ack_pending,
        max_waiting=MAX_WAITING,
        filter_subject=subjects[0] if len(subjects) == 1 else None,
        filter_subjects=subjects if len(subjects) > 1 else None,
        inactive_threshold=inactive_threshold_s,
    )


async def ensure(js: JetStreamContext, stream: str, config: ConsumerConfig, *, reset: bool = False) -> None:
    """Create the durable, or converge it on ``config``; ``reset`` replaces it (a restored
    snapshot moves where it starts, which JetStream cannot change in place)."""
    if reset:
        try:
            await js.delete_consumer(stream, config.durable_name or "")
        except NotFoundError:
            pass
    # On a cluster that just lost a member the server places a new consumer's raft group
    # before it answers, which can take longer than nats-py's 5 s: a caller that gave up and
    # tried again would delete the consumer it was still placing, again and again.
    await js.add_consumer(stream, config, timeout=CREATE_TIMEOUT_S)
