"""Hearing records live in a test, as a person's identity may (SEC-8: no consumer of its own)."""

from __future__ import annotations

from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from healthplane.runtime import nats_internals


async def live(js: JetStreamContext, subject: str) -> Subscription:
    """Every record published on ``subject`` from now on (a core subscription on the record
    subjects people may hear, SEC-1), read with ``next_msg``."""
    return await nats_internals.connection_of(js).subscribe(subject)
