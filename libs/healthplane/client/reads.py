"""Reading node health: what ``node list | show | events | summary`` and the HTTP API share.

One implementation of each read, so the API's JSON is the CLI's JSON (API-1): the listing
reads the latest view per node from ``HP_NODES`` (one record per node, never the history),
an event page replays the node's own subjects in ``HP_NODE_EVENTS``; the summary and the
staleness rule are pure functions of the rows.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.client.connection import decoded
from healthplane.client.errors import EXIT_USAGE, CommandFailed
from healthplane.client.nodes import find_node, is_view
from healthplane.contracts import automation, subjects, wire
from healthplane.contracts.config import NodeHealth
from healthplane.contracts.views import (
    STALE_AFTER_INTERVALS,
    ListRow,
    cluster_label,
    decode_row,
    share_digits,
)
from healthplane.runtime import configstore
from healthplane.runtime.replay import read_all, read_last, read_payloads, start_of_last

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


async def latest_views(js: JetStreamContext, nodes: Sequence[tuple[str, str]]) -> list[bytes]:
    """The stored views of ``(cluster, node)``s, in that order (a page of a listing whose order
    is already known): one multi-subject direct get for up to ``replay.MULTI_LAST_MAX`` of them,
    where a get per view made a page of 1,000 a thousand requests. A node without a view is left
    out."""
    wanted = [subjects.node_view(cluster, node_id) for cluster, node_id in nodes]
    stored = {m.subject: m.data for m in await read_last(js, "HP_NODES", wanted)} if wanted else {}
    return [payload for subject in wanted if (payload := stored.get(subject))]


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
                     page_size: int = DEFAULT_PAGE_SIZE, token: str | None = None,
                     viewed: bool = False) -> EventPage:
    """One page of a node's events, oldest first (EVT-1); usage errors are ``CommandFailed``
    with ``EXIT_USAGE``, an unknown node ``NodeNotFound``. ``viewed``: ``cluster`` is that of
    the node's view the caller has just read, so the view is not looked up again."""
    if page_size < 1:
        raise CommandFailed("--page-size must be at least 1", EXIT_USAGE)
    if latest and token:
        raise CommandFailed("--latest and --page-token cannot be combined", EXIT_USAGE)
    unknown = [t for t in types if t not in wire.EVENT_TYPES]
    if unknown:
        raise CommandFailed(f"--type {unknown[0]!r} is not an event type ({', '.join(wire.EVENT_TYPES)})", EXIT_USAGE)
    start_after = parse_since(since, datetime.now(UTC)) if since else None
    start_seq = from_page_token(token) if token else None
    found_cluster = cluster if viewed else await history_cluster(nc, js, node_id, cluster)
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


def newest(events: Sequence[wire.NodeEvent], types: Iterable[str]) -> wire.NodeEvent | None:
    """The newest of ``events`` (in stream order, oldest first) of any of ``types``: how the
    automation line picks each of its inputs, from events read for it or already read (API-4)."""
    wanted = frozenset(types)
    return next((e for e in reversed(events) if e.type in wanted), None)


async def latest_events(js: JetStreamContext, cluster: str, wanted: Mapping[str, Iterable[str]]
                        ) -> dict[str, list[wire.NodeEvent]]:
    """The latest stored event of each type of ``wanted`` (node id -> types), by node id and in
    stream order, in one request (``replay.read_last``) whatever the install's partitions. A
    record that is not an event of its subject's type is passed over (REL-3: the subject's type
    is its writer's permission), so the one before it answers."""
    filters = [subjects.node_events(cluster, node_id, t) for node_id, types in wanted.items() for t in types]
    if not filters:
        return {}
    found: dict[str, list[wire.NodeEvent]] = {}
    for stored in await read_last(js, "HP_NODE_EVENTS", filters):
        try:
            where = subjects.parse(stored.subject)  # hp.event.{cluster}.{node}.{TYPE}[.{slot}]
            event = wire.decode(wire.NodeEvent, stored.data)
        except (subjects.SubjectError, wire.WireError):
            continue
        # SEC-7: an event whose payload names another node or type than its subject is not believed.
        if (where.node_id in wanted and event.type == where.rest
                and (event.cluster, event.node_id) == (where.cluster, where.node_id)):
            found.setdefault(where.node_id, []).append(event)
    return found


# API-4's inputs from the node's own events: the newest of each of these (``automation.explain``).
POLICY_INPUT: Final = automation.POLICY_EVENTS
UNCORDON_INPUT: Final = ("NODE_UNCORDONED",)
SCORE_INPUT: Final = ("SCORE_CHANGED",)


async def automation_status(js: JetStreamContext, view: wire.NodeView, now: datetime, *,
                            known: Sequence[wire.NodeEvent] = (), complete: bool = False,
                            config: configstore.ConfigRead | None = None) -> str:
    """API-4 for one node: what ``node show``, the API and the node page say.

    ``known``: the node's newest events the caller has already read (stream order), all of its
    events when ``complete``; an input found among them (or, when complete, known to be absent)
    is not read again. The others, and the newest DOMAIN_* event of each of the node's domains,
    are read in one request; ``config``: the config as the caller holds it (else read here)."""
    applied = (config if config is not None else await configstore.read(js)).in_force
    health = applied.config.node_health_for(view.definition) if applied is not None else NodeHealth()
    unread = [] if complete else [t for types in (POLICY_INPUT, UNCORDON_INPUT, SCORE_INPUT)
                                  if newest(known, types) is None for t in types]
    domains = [subjects.domain_node_id(kind, value) for kind, value in sorted(view.domains.items())]
    read = await latest_events(js, view.cluster, {**({view.node_id: unread} if unread else {}),
                                                  **{domain: automation.DOMAIN_EVENTS for domain in domains}})
    events = [*known, *read.get(view.node_id, [])]  # each input's events are all in one or the other
    return automation.explain(
        view, health, now=now, last_policy=newest(events, POLICY_INPUT),
        last_uncordon=newest(events, UNCORDON_INPUT), last_score=newest(events, SCORE_INPUT),
        domain_events=[found for domain in domains
                       if (found := newest(read.get(domain, []), automation.DOMAIN_EVENTS)) is not None])


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
