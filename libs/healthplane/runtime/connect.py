"""Connecting to NATS: reconnect forever with backoff, log every transition.

``url`` is one server or a cluster's list, comma-joined (``--nats-url a,b,c``,
``HEALTHPLANE_NATS_URL``): the client connects to any member and, when it is lost, to
another. A dead server's sockets close at once; a host that vanishes (power, network) says
nothing, so the client pings: a service gives up on a silent server after ``ping_interval_s``
times ``MAX_OUTSTANDING_PINGS`` (2 s times 2, HA-2), where nats-py's defaults (2 minutes times 2) would
leave it there four minutes. A collector pings less often (``COLLECTOR_PING_INTERVAL_S``):
100,000 of them at 2 s would be 50,000 pings a second for the servers.

With credentials the client takes its inbox prefix from them (``creds.inbox_prefix``): the
server lets each identity receive replies only under its own prefix (SEC-1). TLS comes
from ``tls=`` or ``HEALTHPLANE_NATS_TLS_*`` and always verifies the server (SEC-4).
"""

from __future__ import annotations

import asyncio
import os
import re
from typing import Any

from nats.aio.client import Client as NATS

from healthplane.runtime import creds as credentials
from healthplane.runtime.backoff import Backoff
from healthplane.runtime.tls import ClientTls, TlsError

DEFAULT_URL = "nats://127.0.0.1:4222"
PING_INTERVAL_S = 2
COLLECTOR_PING_INTERVAL_S = 15
MAX_OUTSTANDING_PINGS = 2
_REFUSAL = re.compile(r"(?i)authorization|authentication|revoked|expired")


def default_url() -> str:
    return os.environ.get("HEALTHPLANE_NATS_URL") or DEFAULT_URL


def server_urls(url: str) -> list[str]:
    """``a,b,c`` -> the members' URLs, blanks dropped."""
    return [part.strip() for part in url.split(",") if part.strip()]


def default_creds() -> str | None:
    return os.environ.get("HEALTHPLANE_NATS_CREDS") or None


async def connect(
    url: str | None = None,
    *,
    name: str,
    creds: str | None = None,
    log: Any = None,
    give_up_after: float | None = None,
    tls: ClientTls | None = None,
    closed: asyncio.Event | None = None,
    ping_interval_s: int = PING_INTERVAL_S,
    bearer: str | None = None,
) -> NATS:
    """Connect, retrying the first connection with growing backoff (capped at 5 s).

    ``give_up_after`` bounds the first connection (the CLI's case); services leave it
    ``None`` and wait for the server. ``bearer``: a bearer-token user JWT (``creds token``),
    which connects by itself, instead of credentials (the HTTP API acting as its caller). After that the client reconnects forever (REL-2),
    unless the server closes it for good (a revoked identity): then ``closed`` is set.
    """
    url = url or default_url()
    creds = None if bearer else creds or default_creds()
    try:
        inbox = credentials.inbox_prefix(creds) if creds else None
        if bearer:
            inbox = credentials.inbox_of(credentials.decode_jwt(bearer))
        tls = tls or ClientTls.from_env()
        ssl_context = tls.context() if tls else None
    except (credentials.CredsError, TlsError) as exc:
        raise ConnectionError(str(exc)) from exc

    errors: list[str] = []  # what the server said last: why a first connect is not getting through

    async def on_error(exc: Exception) -> None:
        errors[:] = [str(exc) or type(exc).__name__]
        if log is not None:
            log.warning("nats error", error=errors[0])

    async def on_closed() -> None:
        # For good: a revoked identity (SEC-2) is not reconnected by nats-py. Our own close()
        # comes here too, without an error worth a line.
        reason = str(client.last_error or "")
        if closed is not None:
            closed.set()
        if log is not None and _REFUSAL.search(reason):
            log.error("nats connection closed by the server", error=reason)

    async def on_disconnected() -> None:
        # nats-py calls this on our own close() too: a clean stop is not worth a warning.
        if log is not None and not client.is_closed:
            log.warning("nats disconnected", url=url)

    async def on_reconnected() -> None:
        if log is not None:
            log.info("nats reconnected", url=url)

    loop = asyncio.get_running_loop()
    deadline = None if give_up_after is None else loop.time() + give_up_after
    backoff = Backoff(0.1, 5.0, jitter=0.2)
    refusal: str | None = None  # an attempt the server refused (auth), kept over later transport errors
    while True:
        # nats-py retries a first connection forever when reconnects are unbounded, so each
        # attempt is bounded here and the client discarded when it does not get through.
        client = NATS()
        attempt_s = 5.0 if deadline is None else max(0.1, min(5.0, deadline - loop.time()))
        try:
            await asyncio.wait_for(client.connect(
                servers=server_urls(url),
                name=name,
                user_credentials=creds,
                # A bearer JWT needs no signature: the server ignores what this one sends.
                user_jwt_cb=(lambda: bearer.encode()) if bearer else None,
                signature_cb=(lambda _nonce: b"") if bearer else None,
                inbox_prefix=inbox or "_INBOX",
                tls=ssl_context,
                tls_hostname=_host_of(url) if ssl_context else None,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=1,
                connect_timeout=2,
                ping_interval=ping_interval_s,
                max_outstanding_pings=MAX_OUTSTANDING_PINGS,
                error_cb=on_error,
                disconnected_cb=on_disconnected,
                reconnected_cb=on_reconnected,
                closed_cb=on_closed,
                pending_size=64 * 1024 * 1024,
            ), attempt_s)
            return client
        except Exception as exc:
            await _discard(client)
            reason = str(exc) or type(exc).__name__
            if isinstance(exc, TimeoutError):
                reason = errors[0].removeprefix("nats: ") if errors else "no answer"
            errors.clear()
            if _REFUSAL.search(reason):
                refusal = reason
            if deadline is not None and loop.time() + backoff.current_s >= deadline:
                # The server's refusal says why; a reset of the same refused connection does not.
                raise ConnectionError(f"cannot connect to NATS at {url}: {refusal or reason}") from exc
            delay = backoff.next()
            if log is not None:
                log.warning("nats not reachable, retrying", url=url, retry_in_s=round(delay, 2), error=reason)
            await asyncio.sleep(delay)


def _host_of(url: str) -> str | None:
    from urllib.parse import urlsplit

    return urlsplit(server_urls(url)[0]).hostname


async def _discard(client: NATS) -> None:
    try:
        await asyncio.wait_for(client.close(), 1.0)
    except Exception:
        pass
