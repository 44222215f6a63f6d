"""The live feed: ``HP_NODES`` folded into the index as it is written, and every open page
told what changed (server-sent events), never a poll of the whole table.

The views are followed by direct gets from the last one seen (every view first, then each
new one), the only reader; each open page holds a bounded queue of change notices. A page that falls behind
loses notices, not memory: one "changed" is as good as many, it re-reads its part.
Whether the data can be read is a fact kept here too (reference 000: a cluster that cannot
be read reports no health): the connection's state.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Final

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.runtime.replay import StoredMsg, follow
from healthplane_api.fold import ViewIndex, key_of

QUEUE_NOTICES: Final = 64
FOLLOW_EVERY_S: Final = 0.25  # how stale a page may be: a quarter second behind the views
DECOMMISSIONED: Final = ("NODE_DEPROVISIONED", "NODE_REPLACED")
ALL: Final = "*"  # a notice every page wants: the fleet changed shape, or readability did


class Feed:
    def __init__(self, log: Any) -> None:
        self.index = ViewIndex()
        self._log = log
        self._pages: set[asyncio.Queue[str]] = set()
        self.loaded = asyncio.Event()  # the first full pass over HP_NODES is in the index
        self.unreadable_since: datetime | None = datetime.now(UTC)
        self.unreadable_reason = "not read yet"
        self._subscriptions: list[Any] = []

    # -- readability

    @property
    def readable(self) -> bool:
        return self.unreadable_since is None

    def _set_readable(self, readable: bool, reason: str = "") -> None:
        if readable == self.readable:
            return
        if readable:
            self.unreadable_since = None
            self._log.info("node views readable again")
        else:
            self.unreadable_since, self.unreadable_reason = datetime.now(UTC), reason
            self._log.warning("node views cannot be read", reason=reason)
        self._notify(ALL)

    # -- the fold

    async def run(self, nc: NATS, js: JetStreamContext, stopping: asyncio.Event) -> None:
        """Fold views until ``stopping``; watch the connection. The views are followed by
        direct gets from the last one seen (``runtime.replay.follow``): the api holds no
        consumer, so its identity needs no right over any (SEC-8)."""
        def on_views(batch: list[StoredMsg], caught_up: bool) -> None:
            for stored in batch:
                row = self.index.apply(stored.data, stored.subject)
                if row is not None:
                    self._notify(key_of(row.cluster, row.node_id))
            if caught_up and not self.loaded.is_set():
                self.loaded.set()
                self._set_readable(True)

        def on_gone(batch: list[StoredMsg], caught_up: bool) -> None:
            for stored in batch:
                try:
                    event = wire.decode(wire.NodeEvent, stored.data)
                except wire.WireError:
                    continue
                if self.index.remove(event.cluster, event.node_id, event.occurred_at):
                    self._notify(ALL)

        def on_error(exc: Exception) -> None:
            self._log.debug("following the views failed; trying again", error=str(exc) or type(exc).__name__)

        # From now on: the views already purged were never loaded.
        events = await js.stream_info("HP_NODE_EVENTS")
        tails = [asyncio.create_task(follow(nc, "HP_NODES", subjects.node_views(), on_views, start_seq=1,
                                            stopping=stopping, every_s=FOLLOW_EVERY_S, on_error=on_error))]
        tails += [asyncio.create_task(follow(nc, "HP_NODE_EVENTS", f"{subjects.PREFIX}.event.*.*.{kind}", on_gone,
                                             start_seq=events.state.last_seq + 1, stopping=stopping,
                                             every_s=FOLLOW_EVERY_S, on_error=on_error))
                  for kind in DECOMMISSIONED]
        try:
            while not stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), 1.0)
                if not nc.is_connected:
                    self._set_readable(False, "the connection to NATS is down")
                elif self.loaded.is_set():
                    self._set_readable(True)
        finally:
            for tail in tails:
                tail.cancel()
            await asyncio.gather(*tails, return_exceptions=True)

    # -- pages

    def _notify(self, key: str) -> None:
        for queue in list(self._pages):
            if queue.full():
                continue  # it has notices enough to re-read: one more adds nothing
            queue.put_nowait(key)

    @contextlib.asynccontextmanager
    async def watch(self) -> AsyncIterator[asyncio.Queue[str]]:
        queue: asyncio.Queue[str] = asyncio.Queue(QUEUE_NOTICES)
        self._pages.add(queue)
        try:
            yield queue
        finally:
            self._pages.discard(queue)
