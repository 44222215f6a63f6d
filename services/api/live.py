"""The live feed: ``HP_NODES`` folded into the index as it is written, and every open page
told what changed (server-sent events), never a poll of the whole table.

The views are followed by direct gets from the last one seen (every view first, then each
new one), the only reader; each open page holds a bounded queue of change notices. A page that falls behind
loses notices, not memory: one "changed" is as good as many, it re-reads its part.
Whether the data can be read is a fact kept here too (reference 000: a cluster that cannot
be read reports no health): the connection's state. So is the config in force, followed from
``HP_CONFIG`` like the views, so that a node page or ``GET /api/v1/nodes/{id}`` does not read it.

The dashboard (UI-2) has three more inputs, each read here and folded by a pure core:
``Recent`` follows the node events of the last 24 hours into ``timeline``, ``Plane`` asks
JetStream about the control plane's own health and the config in force (at most every
READ_EVERY_S, cached), and ``Dashboards`` computes the page's figures from counts kept as
the index changes (``dashboard.Counts``) at most once per change and per second, however many
ask.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from healthplane.client import reads
from healthplane.contracts import breakfix, streams, subjects, wire
from healthplane.contracts.config import ClusterConfig
from healthplane.runtime import configstore
from healthplane.runtime.replay import StoredMsg, Tail, follow, read_all
from healthplane_api import dashboard, plane, timeline
from healthplane_api.fold import ViewIndex, key_of

QUEUE_NOTICES: Final = 64
FOLLOW_EVERY_S: Final = 0.25  # how stale a page may be: a quarter second behind the views
DECOMMISSIONED: Final = ("NODE_DEPROVISIONED", "NODE_REPLACED")
ALL: Final = "*"  # a notice every page wants: the fleet changed shape, or readability did
DASHBOARD: Final = "#dashboard"  # a notice for the dashboard (and the table): an event it counts
EVENTS_EVERY_S: Final = 2.0  # how soon the timeline asks again where its 24 h begin, the bus away
TRIM_EVERY_S: Final = 60.0
READ_EVERY_S: Final = 5.0  # consumer, stream and config info: at most this often, whoever asks
READ_TIMEOUT_S: Final = 5.0
CONFIG_EVERY_S: Final = 1.0  # how far behind `config apply` the node page's automation line may be
CONFIG_RECORDS: Final = streams.STREAMS_BY_NAME[configstore.STREAM].max_msgs  # what HP_CONFIG keeps (100)
BREAKER_RESET_CLUSTERS: Final = 100  # clusters whose breaker reset is looked up, at most
BOARD_EVERY_S: Final = 1.0  # the figures are computed at most this often, however much changes
BOARD_SHARE: Final = 0.2  # and at most this share of the loop's time
BOARD_MAX_AGE_S: Final = 5.0  # and at least this often while asked for: time passing makes views stale


class Feed:
    def __init__(self, log: Any) -> None:
        self.index = ViewIndex()
        self._log = log
        self._pages: set[asyncio.Queue[str]] = set()
        self.loaded = asyncio.Event()  # the first full pass over HP_NODES is in the index
        self.unreadable_since: datetime | None = datetime.now(UTC)
        self.unreadable_reason = "not read yet"
        self._subscriptions: list[Any] = []
        self.generation = 0  # moves on every notice: what the dashboard's figures were computed from
        # The config in force as ``configstore.read`` says it, kept from HP_CONFIG as it is written
        # (at most CONFIG_EVERY_S behind); ``None`` until read to the end: then ask the stream.
        self.config: configstore.ConfigRead | None = None

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

    async def run(self, nc: NATS, js: JetStreamContext, stopping: asyncio.Event, events: Tail) -> None:
        """Fold views until ``stopping``; watch the connection. The views are followed by
        direct gets from the last one seen (``runtime.replay.Tail``): the api holds no
        consumer, so its identity needs no right over any (SEC-8). The removals come from
        ``events``, the api's one tail of the node events."""
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

        followed = configstore.ConfigRead(None)

        def on_config(batch: list[StoredMsg], caught_up: bool) -> None:
            nonlocal followed
            for stored in batch:
                followed = _config_after(followed, stored.seq, stored.data)
            if caught_up:  # never a config that was in force only part way through the stream
                self.config = followed

        def on_error(exc: Exception) -> None:
            self._log.debug("following the views, their removals or the config failed; trying again", error=str(exc) or type(exc).__name__)

        # From now on: the views already purged were never loaded.
        stored = await js.stream_info("HP_NODE_EVENTS")
        events.add(subjects.event_type_filters(DECOMMISSIONED), on_gone, start_seq=stored.state.last_seq + 1)
        views = Tail(nc, "HP_NODES", every_s=FOLLOW_EVERY_S, on_error=on_error)
        views.add(subjects.node_views(), on_views, start_seq=1)
        tails = [asyncio.create_task(views.run(stopping))]
        tails.append(asyncio.create_task(follow(nc, configstore.STREAM, subjects.CONFIG, on_config, start_seq=1,
                                                stopping=stopping, every_s=CONFIG_EVERY_S, on_error=on_error)))
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

    def notify(self, key: str) -> None:
        self._notify(key)

    def _notify(self, key: str) -> None:
        self.generation += 1
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


# ---------------------------------------------------------------------------- the dashboard's inputs (UI-2)


class Recent:
    """The node events of the last 24 hours, folded into ``timeline.Timeline``: replayed from 24
    hours ago at start, then followed, from the api's one tail of the node events (no
    consumer: the api's identity reads every stream, SEC-8)."""

    def __init__(self, log: Any, feed: Feed) -> None:
        self.state = timeline.Timeline()
        self._log = log
        self._feed = feed
        self.complete = False  # what was stored when the tail began is read: the 24 h are all counted

    async def run(self, nc: NATS, js: JetStreamContext, stopping: asyncio.Event, events: Tail) -> None:
        start = None
        while start is None:
            try:
                start = await _first_since(nc, js, datetime.now(UTC) - timedelta(hours=timeline.WINDOW_HOURS))
            except Exception as exc:  # the bus is away at start: the timeline waits for it, the rest goes on
                self._log.debug("node events not read yet; trying again", error=str(exc) or type(exc).__name__)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), EVENTS_EVERY_S)
                if stopping.is_set():
                    return

        def on_batch(batch: list[StoredMsg], caught_up: bool) -> None:
            changed = False
            for stored in batch:
                kind = subjects.published(stored.subject).rpartition(".")[2]
                try:
                    event = wire.decode(wire.NodeEvent, stored.data)
                except wire.WireError:
                    self.state.skipped += 1
                    continue
                if event.type == kind:  # the subject's type is its writer's permission: trust no other
                    changed = timeline.apply(self.state, event, stored.seq) or changed
            self.complete = self.complete or caught_up
            if changed:
                self._feed.notify(DASHBOARD)

        # The tail's filters send only the types the fold reads: scores and conditions, the
        # frequent ones, are never decoded here.
        events.add(subjects.event_type_filters(timeline.WANTED), on_batch, start_seq=start)
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), TRIM_EVERY_S)
            timeline.trim(self.state, datetime.now(UTC), caught_up=self.complete)


class Breakfix:
    """Breakfix figures (issue 41.5) for the api's Prometheus series: every stored node event
    folded into ``contracts.breakfix.Breakfix`` (the one fold, which ``healthplane breakfix`` and
    ``GET /api/v1/breakfix`` use too) from the first one the stream keeps, then followed. One tail
    over ``hp.event.>``: the fold needs the order across event types, so not a tail per type; the
    types it reads are picked by the subject's type token before any decode. Every api replica
    folds the same stored events in the same order, so each serves the same values."""

    def __init__(self, log: Any) -> None:
        self.state = breakfix.Breakfix()
        self.caught_up = False  # every event stored when the tail began is folded
        self.skipped = 0  # records of a wanted type that did not decode
        self._log = log

    def fold(self, batch: list[StoredMsg], caught_up: bool) -> None:
        for stored in batch:
            tokens = stored.subject.split(".")  # hp.event.{cluster}.{node}.{TYPE}[.{slot}]
            if len(tokens) < 5 or tokens[4] not in breakfix.WANTED:
                continue
            try:
                event = wire.decode(wire.NodeEvent, stored.data)
            except wire.WireError:
                self.skipped += 1
                continue
            if event.type == tokens[4]:  # the subject's type is its writer's permission: trust no other
                self.state.fold(event)
        if caught_up:
            self.caught_up = True

    def follow(self, events: Tail) -> None:
        """Fold from the first event the stream keeps, on the api's one tail of the node events."""
        events.add(f"{subjects.PREFIX}.event.>", self.fold, start_seq=1)


def node_events(nc: NATS, log: Any) -> Tail:
    """The api's one tail of HP_NODE_EVENTS, which the removals (``Feed``), the timeline
    (``Recent``) and the breakfix figures (``Breakfix``) each take their part of: one read of
    what is stored, whatever the readers (``runtime.replay.Tail``)."""
    def on_error(exc: Exception) -> None:
        log.debug("following node events failed; trying again", error=str(exc) or type(exc).__name__)

    return Tail(nc, "HP_NODE_EVENTS", every_s=FOLLOW_EVERY_S, on_error=on_error)


def _config_after(held: configstore.ConfigRead, seq: int, data: bytes) -> configstore.ConfigRead:
    """``configstore.read``'s answer once record ``seq`` follows the records it said ``held``
    of: a valid record is in force; a bad one is passed over (REL-3) and named, newest first,
    as many as the stream keeps."""
    try:
        envelope, config = configstore.validated(data)
    except ValueError as exc:
        skipped = [configstore.SkippedRecord(seq, str(exc)), *held.skipped][:CONFIG_RECORDS]
        return configstore.ConfigRead(held.in_force, skipped, seq)
    return configstore.ConfigRead(configstore.InForce(envelope, config, seq), [], seq)


async def _first_since(nc: NATS, js: JetStreamContext, since: datetime) -> int:
    """The sequence of the first node event stored at or after ``since`` (the next one to be
    stored when there is none): where the 24 h replay begins."""
    first = await read_all(nc, js, "HP_NODE_EVENTS", f"{subjects.PREFIX}.event.>", start_time=since, limit=1)
    if first:
        return first[0].seq
    try:
        return (await js.stream_info("HP_NODE_EVENTS")).state.last_seq + 1
    except NotFoundError:
        return 1


@dataclass(frozen=True, slots=True)
class PlaneRead:
    """What JetStream said last: the control plane's problems (each with when it was first
    seen), the config in force, each cluster's latest breaker reset."""

    problems: list[tuple[plane.Problem, datetime]] = field(default_factory=list)
    config: ClusterConfig | None = None
    breaker_resets: dict[str, datetime] = field(default_factory=dict)
    version: int = 0


class Plane:
    """Consumer and stream info, the config in force and the breaker's resets, read at most
    every READ_EVERY_S however many pages ask (bounded reads of a peer we do not pace), each
    read bounded by READ_TIMEOUT_S; a read that fails keeps the last answer and says so."""

    def __init__(self, log: Any) -> None:
        self._log = log
        self._lock = asyncio.Lock()
        self._last = PlaneRead()
        self._read_at: float | None = None
        self._first_seen: dict[str, datetime] = {}

    async def read(self, js: JetStreamContext, clusters: Sequence[str], fleet: int) -> PlaneRead:
        loop = asyncio.get_running_loop()
        if self._read_at is not None and loop.time() - self._read_at < READ_EVERY_S:
            return self._last
        async with self._lock:
            if self._read_at is not None and loop.time() - self._read_at < READ_EVERY_S:
                return self._last
            try:
                found, config, resets = await asyncio.wait_for(self._ask(js, clusters, fleet), READ_TIMEOUT_S)
            except Exception as exc:  # the bus is away, a permission is missing: say so, keep the rest
                self._log.debug("control plane state not read", error=str(exc) or type(exc).__name__)
                found = [plane.Problem("plane-unreadable", "plane-unreadable",
                                       f"the control plane's own state cannot be read: {exc or type(exc).__name__}",
                                       "check the api's connection to NATS and its permissions (docs/permissions.md)")]
                config, resets = self._last.config, self._last.breaker_resets
            now = datetime.now(UTC)
            self._first_seen = {p.key: self._first_seen.get(p.key, now) for p in found}
            self._last = PlaneRead([(p, self._first_seen[p.key]) for p in found], config, resets,
                                   self._last.version + 1)
            self._read_at = loop.time()
            return self._last

    async def _ask(self, js: JetStreamContext, clusters: Sequence[str],
                   fleet: int) -> tuple[list[plane.Problem], ClusterConfig | None, dict[str, datetime]]:
        consumers: list[plane.Consumer] = []
        for stream in streams.STREAMS:
            if not stream.durable:
                continue
            try:
                # One page (256 consumers): the most a stream has is 64 webhook slots and a few services.
                infos = await js.consumers_info(stream.name)
            except NotFoundError:
                continue
            consumers += [plane.Consumer(stream.name, info.name or "?", info.num_pending or 0) for info in infos]
        bucket = None
        with contextlib.suppress(NotFoundError):
            info = await js.stream_info(plane.NODES_BUCKET_STREAM)
            bucket = plane.Bucket(info.state.bytes or 0, info.config.max_bytes or 0)
        dead = 0
        with contextlib.suppress(NotFoundError):
            dead = (await js.stream_info(plane.DEAD_LETTERS)).state.messages or 0
        applied = (await configstore.read(js)).in_force
        resets: dict[str, datetime] = {}
        for cluster in list(clusters)[:BREAKER_RESET_CLUSTERS]:
            try:
                # Any actor's: the last token is the sender (subjects.policy_command).
                raw = await js.get_last_msg("HP_COMMANDS", f"{subjects.PREFIX}.policy.{subjects.encode_token(cluster)}"
                                                           ".breaker-reset.*")
                resets[cluster] = wire.decode(wire.PolicyCommand, raw.data or b"").issued_at
            except (NotFoundError, wire.WireError):
                continue
        return plane.judge(consumers, bucket, dead, fleet), applied.config if applied else None, resets


class Dashboards:
    """UI-2's figures for every page and the API. The counts follow the index from the first
    dashboard asked for on (``dashboard.Counts``: each request re-marks only what changed since
    the last, never a pass over the fleet); the figures are built from them at most once per
    change (the counts', the timeline's and the plane read's versions) and per BOARD_EVERY_S
    (longer where building them takes long: never more than BOARD_SHARE of the event loop),
    and at least every BOARD_MAX_AGE_S while asked for; each scope's figures kept with it."""

    def __init__(self, feed: Feed, recent: Recent, plane_: Plane) -> None:
        self.feed, self.recent, self.plane = feed, recent, plane_
        self._key: tuple[int, int, int] | None = None
        self._at = 0.0
        self._counts: dashboard.Counts | None = None
        self._took = 0.0  # seconds the last figures took to build
        self._boards: dict[str | None, dict[str, Any]] = {}

    def counts(self, now: datetime) -> dashboard.Counts:
        """The counts, followed up to now: made on the first call (one pass), then re-marked
        where the index changed."""
        index = self.feed.index
        if self._counts is None:
            index.follow()
            self._counts = dashboard.Counts(index.rows, now)
        else:
            changed, rewritten = index.take()
            self._counts.refresh(index.rows, changed, rewritten, now)
        return self._counts

    def summary(self, now: datetime) -> dict[str, Any]:
        """``GET /api/v1/summary`` and the dashboard's tiles from the kept counts, not a pass
        over the rows (``reads.summarize`` counts the same, a test holds them together)."""
        return dashboard.summary(self.counts(now).tally)

    async def board(self, js: JetStreamContext, cluster: str | None) -> dict[str, Any]:
        feed = self.feed
        now = datetime.now(UTC)
        if not feed.readable and feed.unreadable_since is not None:
            # Reference 000: a cluster that cannot be read reports no health, never its last answer.
            found = reads.unreadable(feed.index.clusters() or ["default"], feed.unreadable_reason,
                                     feed.unreadable_since)
            return {"asOf": wire.rfc3339(now), "readable": False,
                    "unreadable": {"since": wire.rfc3339(feed.unreadable_since), "reason": feed.unreadable_reason},
                    "scope": cluster, "clusters": found["clusters"]}
        read = await self.plane.read(js, feed.index.clusters(), len(feed.index.rows))
        index = feed.index
        counts = self.counts(now)
        key = (counts.version, self.recent.state.generation, read.version)
        loop_now = asyncio.get_running_loop().time()
        age = loop_now - self._at
        every = max(BOARD_EVERY_S, self._took / BOARD_SHARE)
        if self._key is None or (key != self._key and age >= every) or age >= max(BOARD_MAX_AGE_S, every):
            self._key, self._at, self._boards = key, loop_now, {}
        counted = counts.tally
        found_board = self._boards.get(cluster)
        if found_board is None:
            started = time.perf_counter()
            rows = index.rows
            inputs = dashboard.Inputs(self.recent.state, self.recent.complete,
                                      lambda c, n: rows.get(key_of(c, n)), read.problems, read.config,
                                      read.breaker_resets)
            found_board = {"asOf": wire.rfc3339(now), "readable": True, "unreadable": None,
                           **dashboard.board(counted, inputs, now, cluster)}
            self._took = time.perf_counter() - started
            if cluster is None or cluster in counted.clusters:  # kept only for scopes that exist
                self._boards[cluster] = found_board
        return found_board
