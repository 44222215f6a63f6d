"""The live feed: ``HP_NODES`` folded into the index as it is written, and every open page
told what changed (server-sent events), never a poll of the whole table.

One ordered push consumer, last view per node first and then every new one, is the only
reader; each open page holds a bounded queue of change notices. A page that falls behind
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
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from healthplane.contracts import streams, subjects, wire
from healthplane_api.fold import ViewIndex, key_of

QUEUE_NOTICES: Final = 64
HEARTBEAT_S: Final = 2.0
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
        """Fold views until ``stopping``; watch the connection (nats-py's ordered consumer
        recreates itself after a gap or a reconnect, from the last sequence it saw)."""
        async def on_view(msg: Msg) -> None:
            row = self.index.apply(msg.data)
            if row is not None:
                self._notify(key_of(row.cluster, row.node_id))
            pending = msg.metadata.num_pending if msg.metadata else 0
            if pending == 0 and not self.loaded.is_set():
                self.loaded.set()
                self._set_readable(True)

        # One filter: a ">" filter selects the stored form of every install (HA-4).
        (view_filter,) = streams.stored_filters("HP_NODES", [subjects.node_views()])
        info = await js.stream_info("HP_NODES")
        if not info.state.messages:
            self.loaded.set()
            self._set_readable(True)
        async def on_gone(msg: Msg) -> None:
            try:
                event = wire.decode(wire.NodeEvent, msg.data)
            except wire.WireError:
                return
            if self.index.remove(event.cluster, event.node_id, event.occurred_at):
                self._notify(ALL)

        self._subscriptions = [await js.subscribe(
            view_filter, stream="HP_NODES", ordered_consumer=True, idle_heartbeat=HEARTBEAT_S, cb=on_view,
            pending_msgs_limit=-1, pending_bytes_limit=-1,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.LAST_PER_SUBJECT))]
        for kind in DECOMMISSIONED:  # from now on: the views already purged were never loaded
            for stored in streams.stored_filters("HP_NODE_EVENTS", [f"{subjects.PREFIX}.event.*.*.{kind}"]):
                self._subscriptions.append(await js.subscribe(
                    stored, stream="HP_NODE_EVENTS", ordered_consumer=True, idle_heartbeat=HEARTBEAT_S, cb=on_gone,
                    config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW)))
        try:
            while not stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), 1.0)
                if not nc.is_connected:
                    self._set_readable(False, "the connection to NATS is down")
                elif self.loaded.is_set():
                    self._set_readable(True)
        finally:
            for subscription in self._subscriptions:
                with contextlib.suppress(Exception):
                    await subscription.unsubscribe()

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
