"""Reading node health: what ``node list | show | events | summary`` and the HTTP API share.

One implementation of each read, so the API's JSON is the CLI's JSON (API-1): the listing
reads the latest view per node from ``HP_NODES`` (one record per node, never the history),
an event page replays the node's own subjects in ``HP_NODE_EVENTS``; the summary and the
staleness rule are pure functions of the rows.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from healthplane.client.connection import decoded
from healthplane.client.errors import EXIT_USAGE, CommandFailed
from healthplane.client.nodes import find_node, is_view
from healthplane.contracts import automation, streams, subjects, wire
from healthplane.contracts.config import NodeHealth
from healthplane.contracts.views import (
    STALE_AFTER_INTERVALS,
    ListRow,
    cluster_label,
    decode_row,
    share_digits,
)
from healthplane.runtime import configstore
from healthplane.runtime.replay import read_all, read_payloads, start_of_last

DEFAULT_PAGE_SIZE = 50


@dataclass(frozen=True, slots=True)
class Listing:
    """Every node's latest view: the stored JSON (already the ``node list -o json`` element)
    and its decoded row, position for position."""

    payloads: list[bytes]
    rows: list[ListRow]

    def json(self, order: Iterable[int]) -> bytes:
        """The views at ``order`` as a JSON array, without decoding or re-encoding them."""
        return b"[" + b",".join([self.payloads[i] for i in order]) + b"]"


async def read_listing(nc: NATS, js: JetStreamContext, cluster: str | None = None,
                       stream: str = "HP_NODES") -> Listing:
    # Payloads only, no per-message Msg: at 100,000 nodes the read is most of the command.
    payloads = await read_payloads(nc, js, stream, subjects.node_views(cluster), last_per_subject=True)
    try:
        rows = list(map(decode_row, payloads))
    except msgspec.DecodeError:  # rare: only then pay for knowing which records are bad
        payloads = [p for p in payloads if is_view(p)]
        rows = list(map(decode_row, payloads))
    return Listing(payloads, rows)


async def latest_views(js: JetStreamContext, nodes: Sequence[tuple[str, str]], in_flight: int = 64) -> list[bytes]:
    """The stored views of ``(cluster, node)``s, in that order, by direct gets (a page of a
    listing whose order is already known); a node without a view is left out."""
    gate = asyncio.Semaphore(in_flight)

    async def one(cluster: str, node_id: str) -> bytes | None:
        async with gate:
            try:
                return (await js.get_last_msg("HP_NODES", subjects.node_view(cluster, node_id))).data
            except NotFoundError:
                return None

    found = await asyncio.gather(*(one(cluster, node_id) for cluster, node_id in nodes))
    return [payload for payload in found if payload]


# ---------------------------------------------------------------------------- staleness


class Reported(Protocol):
    @property
    def status(self) -> str: ...
    @property
    def last_reported_at(self) -> datetime | None: ...
    @property
    def report_interval_seconds(self) -> int | None: ...


def stale_for(view: Reported, now: datetime) -> float | None:
    """Seconds since the view's last folded report when that is too long to trust it, else ``None``."""
    if view.last_reported_at is None or view.status == "OFFLINE":
        return None
    age = (now - view.last_reported_at).total_seconds()
    interval = view.report_interval_seconds or 30
    return age if age > max(15, STALE_AFTER_INTERVALS * interval) else None


def span(seconds: float) -> str:
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours < 48 else f"{hours // 24}d {hours % 24}h"


def staleness(view: Reported, now: datetime) -> str | None:
    """Why this view may no longer be true, or ``None``: a stale view must not look healthy."""
    age = stale_for(view, now)
    if age is None:
        return None
    return (f"this view is {span(age)} old ({view.report_interval_seconds or 30}s report interval): health-ingest "
            "or the scorer is not folding reports; check that they run and their consumer lag")


def shown_health(row: ListRow, now: datetime) -> str:
    """The health a summary counts, as the metric's ``state`` label (``healthy|degraded|unknown``):
    a stale view's last answer is no longer known to be true, so it counts as unknown."""
    return "unknown" if stale_for(row, now) is not None else row.health.lower()


# ---------------------------------------------------------------------------- summary


def summarize(rows: Iterable[ListRow], now: datetime) -> dict[str, Any]:
    """``node summary -o json`` = ``GET /api/v1/summary``: per cluster the nodes by health
    (a stale view counted unknown), the worst score among the degraded, the label; and the
    fleet's totals."""
    clusters: dict[str, tuple[dict[str, int], list[int | None]]] = {}
    for row in rows:
        entry = clusters.get(row.cluster)
        if entry is None:
            entry = clusters[row.cluster] = ({"healthy": 0, "degraded": 0, "unknown": 0}, [None])
        health = shown_health(row, now)
        entry[0][health] = entry[0].get(health, 0) + 1
        worst = entry[1][0]
        if health == "degraded" and row.score is not None and (worst is None or row.score < worst):
            entry[1][0] = row.score
    return summary_of((name, health, worst[0]) for name, (health, worst) in clusters.items())


def summary_of(clusters: Iterable[tuple[str, dict[str, int], int | None]]) -> dict[str, Any]:
    """The summary of per-cluster counts by shown health (lower case) and worst degraded
    score: the one shape whoever counted (``summarize``, the api's kept counts)."""
    out: list[dict[str, Any]] = []
    nodes = healthy = 0
    for name, health, worst in sorted(clusters, key=lambda c: c[0]):
        counts = {"healthy": health.get("healthy", 0), "degraded": health.get("degraded", 0),
                  "unknown": health.get("unknown", 0)}
        out.append({"cluster": name, "readable": True, "nodes": sum(counts.values()), "health": counts,
                    "worstScore": worst, "label": cluster_label(counts, worst)})
        nodes, healthy = nodes + sum(counts.values()), healthy + counts["healthy"]
    return {"clusters": out, "fleet": {"nodes": nodes, "healthy": healthy,
                                       "healthyPercent": _as_number(share_digits(healthy, nodes))}}


def _as_number(digits: str | None) -> float | int | None:
    """A share's digits as a JSON number: 100 and 0 whole, the rest with their decimals."""
    if digits is None:
        return None
    return float(digits) if "." in digits else int(digits)


def unreadable(summary_clusters: Iterable[str], reason: str, since: datetime) -> dict[str, Any]:
    """A summary for clusters whose data cannot be read now: no health at all, never the
    last answer (reference 000), with why and since when."""
    when = since.astimezone(UTC).isoformat().replace("+00:00", "Z")
    out = [{"cluster": name, "readable": False, "nodes": None, "health": None, "worstScore": None,
            "label": f"No health: cannot read its data since {when} ({reason})"} for name in sorted(summary_clusters)]
    return {"clusters": out, "fleet": {"nodes": None, "healthy": None, "healthyPercent": None}}


# ---------------------------------------------------------------------------- events


_DURATION = re.compile(r"^(\d+)([smhd])$")


def parse_since(text: str, now: datetime) -> datetime:
    match = _DURATION.match(text)
    if match:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[match.group(2)]
        return now - timedelta(**{unit: int(match.group(1))})
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise CommandFailed(f"--since {text!r} is neither a duration (24h, 30m, 7d) nor an RFC 3339 time",
                            EXIT_USAGE) from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def page_token(seq: int) -> str:
    return base64.urlsafe_b64encode(f"seq:{seq}".encode()).decode().rstrip("=")


def from_page_token(token: str) -> int:
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        kind, _, seq = text.partition(":")
        if kind != "seq" or not seq.isdigit():
            raise ValueError(text)
        return int(seq)
    except ValueError as exc:
        raise CommandFailed(f"--page-token {token!r} is not a token this command gave", EXIT_USAGE) from exc


async def history_cluster(nc: NATS, js: JetStreamContext, node_id: str, cluster: str | None) -> str | None:
    """The node's cluster from its view; a node decommissioned since (its view removed) still
    has its history: read it in the named cluster, or in any."""
    try:
        return (await find_node(nc, js, node_id, cluster)).cluster
    except CommandFailed as exc:
        if exc.code == EXIT_USAGE:
            raise
        if await read_all(nc, js, "HP_NODE_EVENTS", subjects.node_events(cluster, node_id), limit=1):
            return cluster
        raise


@dataclass(frozen=True, slots=True)
class EventPage:
    events: list[wire.NodeEvent]
    next_page_token: str | None

    def to_builtins(self) -> dict[str, Any]:
        """``node events -o json``."""
        return {"events": [wire.to_builtins(e) for e in self.events], "nextPageToken": self.next_page_token}


async def event_page(nc: NATS, js: JetStreamContext, node_id: str, cluster: str | None, *,
                     types: Sequence[str] = (), since: str | None = None, latest: bool = False,
                     page_size: int = DEFAULT_PAGE_SIZE, token: str | None = None) -> EventPage:
    """One page of a node's events, oldest first (EVT-1); usage errors are ``CommandFailed``
    with ``EXIT_USAGE``, an unknown node ``NodeNotFound``."""
    if page_size < 1:
        raise CommandFailed("--page-size must be at least 1", EXIT_USAGE)
    if latest and token:
        raise CommandFailed("--latest and --page-token cannot be combined", EXIT_USAGE)
    unknown = [t for t in types if t not in wire.EVENT_TYPES]
    if unknown:
        raise CommandFailed(f"--type {unknown[0]!r} is not an event type ({', '.join(wire.EVENT_TYPES)})", EXIT_USAGE)
    start_after = parse_since(since, datetime.now(UTC)) if since else None
    start_seq = from_page_token(token) if token else None
    found_cluster = await history_cluster(nc, js, node_id, cluster)
    filters = ([subjects.node_events(found_cluster, node_id, t) for t in dict.fromkeys(types)]
               or [subjects.node_events(found_cluster, node_id)])
    if latest:
        start_seq = await start_of_last(js, "HP_NODE_EVENTS", filters, page_size)
    # The stream time narrows the read; the event's own time decides (they differ only for
    # records appended late, e.g. a replayed import).
    messages = await read_all(nc, js, "HP_NODE_EVENTS", filters, start_seq=start_seq,
                              start_time=start_after if start_seq is None else None,
                              limit=None if start_after is not None else page_size + 1)
    found = decoded(wire.NodeEvent, messages)
    if start_after is not None:
        found = [(m, e) for m, e in found if e.occurred_at >= start_after]
    page, rest = found[:page_size], found[page_size:]
    next_token = None if latest or not rest else page_token(rest[0][0].seq)
    return EventPage([e for _, e in page], next_token)


# ---------------------------------------------------------------------------- automation


async def latest_event(js: JetStreamContext, cluster: str, node_id: str, types: Iterable[str]) -> wire.NodeEvent | None:
    """The node's newest event of any of ``types``: one direct get per type (the server finds
    the last message of a subject without a scan), whatever the install's partitions."""
    found: list[tuple[int, bytes]] = []
    for event_type in types:
        for stored in streams.stored_filters("HP_NODE_EVENTS", [subjects.node_events(cluster, node_id, event_type)]):
            try:
                msg = await js.get_last_msg("HP_NODE_EVENTS", stored)
            except NotFoundError:
                continue
            if msg.data is not None and msg.seq is not None:
                found.append((msg.seq, msg.data))
    for _, data in sorted(found, reverse=True):
        try:
            return wire.decode(wire.NodeEvent, data)
        except wire.WireError:
            continue  # not an event (REL-3): the one before it answers
    return None


async def automation_status(js: JetStreamContext, view: wire.NodeView, now: datetime) -> str:
    """API-4 for one node: what ``node show``, the API and the node page say."""
    applied = (await configstore.read(js)).in_force
    health = applied.config.node_health_for(view.definition) if applied is not None else NodeHealth()
    return automation.explain(
        view, health, now=now,
        last_policy=await latest_event(js, view.cluster, view.node_id, automation.POLICY_EVENTS),
        last_uncordon=await latest_event(js, view.cluster, view.node_id, ["NODE_UNCORDONED"]),
        last_score=await latest_event(js, view.cluster, view.node_id, ["SCORE_CHANGED"]),
        domain_events=[found for kind, value in sorted(view.domains.items())
                       if (found := await latest_event(js, view.cluster, subjects.domain_node_id(kind, value),
                                                       automation.DOMAIN_EVENTS)) is not None])


def shown(view: wire.NodeView, automation_line: str) -> dict[str, Any]:
    """``node show -o json`` = ``GET /api/v1/nodes/{id}``: the stored view and, beside it,
    ``automation`` (API-4)."""
    return {**wire.to_builtins(view), "automation": automation_line}


def detail(event: wire.NodeEvent) -> str:
    """The DETAIL column, worded as the reference's example: a raised condition by what was
    found ("1 uncorrectable GPU ECC error(s) on GPU 0"), everything else by its message."""
    change = event.condition
    if event.type == "CONDITION_RAISED" and change is not None:
        return change.message + (f" (was {change.previous_severity})" if change.previous_severity else "")
    return event.message
