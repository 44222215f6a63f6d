"""Connecting to NATS: reconnect forever with backoff, log every transition."""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import nats
from nats.aio.client import Client as NATS

DEFAULT_URL = "nats://127.0.0.1:4222"


def default_url() -> str:
    return os.environ.get("HEALTHPLANE_NATS_URL") or DEFAULT_URL


def default_creds() -> str | None:
    return os.environ.get("HEALTHPLANE_NATS_CREDS") or None


async def connect(
    url: str | None = None,
    *,
    name: str,
    creds: str | None = None,
    log: Any = None,
    give_up_after: float | None = None,
) -> NATS:
    """Connect, retrying the first connection with growing backoff (capped at 5 s).

    ``give_up_after`` bounds the first connection (the CLI's case); services leave it
    ``None`` and wait for the server. After that the client reconnects forever (REL-2).
    """
    url = url or default_url()
    creds = creds or default_creds()

    async def on_error(exc: Exception) -> None:
        if log is not None:
            log.warning("nats error", error=str(exc) or type(exc).__name__)

    async def on_disconnected() -> None:
        if log is not None:
            log.warning("nats disconnected", url=url)

    async def on_reconnected() -> None:
        if log is not None:
            log.info("nats reconnected", url=url)

    loop = asyncio.get_running_loop()
    deadline = None if give_up_after is None else loop.time() + give_up_after
    delay = 0.1
    while True:
        try:
            return await nats.connect(
                servers=[url],
                name=name,
                user_credentials=creds,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                connect_timeout=2,
                error_cb=on_error,
                disconnected_cb=on_disconnected,
                reconnected_cb=on_reconnected,
                pending_size=64 * 1024 * 1024,
            )
        except Exception as exc:
            if deadline is not None and loop.time() + delay > deadline:
                raise ConnectionError(f"cannot connect to NATS at {url}: {exc or type(exc).__name__}") from exc
            if log is not None:
                log.warning("nats not reachable, retrying", url=url, retry_in_s=round(delay, 2),
                            error=str(exc) or type(exc).__name__)
            await asyncio.sleep(delay * (0.8 + 0.4 * random.random()))
            delay = min(delay * 2, 5.0)
