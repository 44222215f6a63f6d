"""Signing and verifying Healthplane webhook deliveries (WEB-3).

Every delivery carries three headers:

- ``X-Healthplane-Event-Id``: the node event's id (= the CloudEvent ``id``); the same on
  every retry, so receivers deduplicate on it;
- ``X-Healthplane-Timestamp``: unix seconds when this attempt was signed;
- ``X-Healthplane-Signature``: lower-case hex HMAC-SHA256 keyed with the endpoint's secret
  over ``timestamp + "." + raw body``, no prefix.

The timestamp is inside the signed material, so a captured delivery cannot be replayed
once it is older than the receiver's tolerance. A receiver checks a request with
:func:`verify` before it trusts a byte of the body (docs/webhooks.md)::

    from healthplane.contracts.webhooks import verify

    if not verify(SECRET, request.headers, raw_body):
        return 401
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Final

import msgspec

EVENT_ID_HEADER: Final = "X-Healthplane-Event-Id"
TIMESTAMP_HEADER: Final = "X-Healthplane-Timestamp"
SIGNATURE_HEADER: Final = "X-Healthplane-Signature"
DEFAULT_TOLERANCE_S: Final = 300


def sign(secret: str, timestamp: int | str, body: bytes) -> str:
    """Lower-case hex HMAC-SHA256(secret, f"{timestamp}." + body)."""
    signed = f"{timestamp}.".encode("ascii") + body
    return hmac.new(secret.encode("utf-8"), signed, hashlib.sha256).hexdigest()


def signature_headers(secret: str, event_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers of one attempt (a retry calls this again with a fresh timestamp)."""
    return {
        EVENT_ID_HEADER: event_id,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, timestamp, body),
    }


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """Case-insensitive lookup: frameworks hand headers over as plain dicts in any case."""
    wanted = name.lower()
    for key, value in headers.items():
        if key.lower() == wanted:
            return value
    return None


def verify(secret: str, headers: Mapping[str, str], body: bytes, tolerance: float = DEFAULT_TOLERANCE_S,
           *, now: float | None = None) -> bool:
    """True when ``body`` was signed with ``secret`` no more than ``tolerance`` seconds from
    ``now`` (default: the clock). ``headers`` is any mapping (a dict in any case, httpx/
    Starlette/aiohttp headers); ``body`` is the raw request body, exactly as received.

    Never raises on hostile input: a missing, malformed or non-ASCII header is simply not
    verified. The digest comparison is constant-time.
    """
    timestamp = _header(headers, TIMESTAMP_HEADER)
    signature = _header(headers, SIGNATURE_HEADER)
    if timestamp is None or signature is None:
        return False
    # The signed text is the header exactly as sent; it must be plain decimal digits.
    if not (timestamp.isascii() and timestamp.isdigit()) or len(timestamp) > 20:
        return False
    current = time.time() if now is None else now
    if abs(current - int(timestamp)) > tolerance:
        return False
    expected = sign(secret, timestamp, body).encode("ascii")
    return hmac.compare_digest(expected, signature.strip().encode("utf-8", "replace"))


# ---------------------------------------------------------------------------- replay (INT-2)


class ReplayRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``healthplane webhooks replay``, on ``hp.webhook.replay.{actor}``: send the dead-lettered
    deliveries of ``endpoint`` (its label) recorded since ``since`` again."""

    endpoint: str
    since: datetime


class ReplayAnswer(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The dispatcher's answer: how many dead letters it queued again, or why none."""

    endpoint: str
    queued: int = 0
    error: str | None = None
