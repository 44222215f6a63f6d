"""The fleet dashboard (UI-2), pure: every node's listing row counted once (``Counts``, kept
as the rows change: each row's mark out and in), then the page's figures for the fleet or one
cluster (``board``), each count with the link to the nodes table filtered to exactly (or,
where the table has no such filter, nearest to) the nodes it counts.

What comes from where (docs/api.md, "The dashboard"):

* counts by health and status, the score histogram, the top conditions, draining and
  replacing, out of service, the domain heatmap, blind nodes and nodes needing attention: the
  rows (``views.ListRow``, the scorer's views);
* validating, remediating, policy halts, degraded domains, the breaker's trips, its recent
  automated cordons and the replacements of the last hour: the node events of the last 24 h
  (``timeline``);
* the guardrails' limits: the config in force. The policy publishes no current state of its
  guardrails or breaker (only its Prometheus series, which no service reads, and its private
  snapshot), so their headroom is computed here, as the policy computes it
  (services/policy/rules.py ``_guardrail``, breaker.py, domains.py), from the config in force
  and what the rows and the events say now; a test holds the two arithmetics together;
* the control plane's own problems: ``plane.judge`` over JetStream's consumer and stream info.

Pure: no I/O, no clock; ``now`` and everything read come as arguments.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final
from urllib.parse import urlencode

from healthplane.client import reads
from healthplane.contracts import automation, subjects, views, wire
from healthplane.contracts.config import ClusterConfig, NodeHealth
from healthplane.contracts.views import STALE_AFTER_INTERVALS, ListRow, cluster_label
from healthplane_api import plane, timeline
from healthplane_api.fold import key_of
from healthplane_api.pages import node_path

HEALTHS: Final = ("HEALTHY", "DEGRADED", "UNKNOWN")
STATUSES: Final = ("READY", "CORDONED", "NOT_READY", "OFFLINE")
BINS: Final = tuple((low, low + 9 if low < 90 else 100) for low in range(0, 100, 10))  # 90-100: the top bin
AUTOMATION_KINDS: Final = ("draining", "remediating", "validating", "replacing")
TOP_CONDITIONS: Final = 10
CELLS_PER_KIND: Final = 200  # a heatmap of 100,000 nodes in racks of 32 is 3,125 cells: the worst are shown
QUEUE_SHOWN: Final = 50
DOMAINS_PER_LIMIT: Final = 10  # per limited domain kind: the domains with the least headroom
# A member's state in the heatmap, worst first: a cell takes its worst member's.
MEMBER_STATES: Final = ("unknown", "degraded", "out", "healthy")
_UNKNOWN, _DEGRADED, _OUT, _HEALTHY = range(4)
NODES: Final = "/nodes"


# ---------------------------------------------------------------------------- percentages


def percent(part: int, whole: int) -> str | None:
    """``part`` of ``whole`` as the dashboard shows it: "99.997 %", never "100.0 %" while a
    node is short (``views.share_digits``). ``None`` of nothing."""
    digits = views.share_digits(part, whole)
    return None if digits is None else f"{digits} %"


# ---------------------------------------------------------------------------- the counts, kept as rows change


@dataclass(frozen=True, slots=True)
class Flagged:
    """A node the queue may list: blind (or unknown), or stopped at NODE_NEEDS_ATTENTION."""

    since: datetime | None
    row: ListRow
    why: str


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs 3x, once per row of the fleet
class Mark:
    """What one row adds to the counts, kept so that exactly that is taken out again when the
    row changes (or goes stale by time alone). Never changed once made."""

    cluster: str
    definition: str | None
    health: str  # the health shown: a stale view counts UNKNOWN
    stale: bool
    status: str
    score: int | None
    conditions: tuple[str, ...]  # distinct types
    held: bool  # any hold, whoever placed it
    automated: bool  # held by automation (the breaker's standing count)
    draining: bool  # held, with work still running on it
    replacing: bool  # a deprovision hold: to be torn down (and replaced)
    replacing_by_automation: bool
    domains: tuple[tuple[str, str], ...]
    member_state: int  # its state in its domains' cells (MEMBER_STATES)
    blind: Flagged | None
    attention: Flagged | None
    # When its view goes stale unless rewritten (None: never by time): not a count, so two marks
    # that differ only here count the same.
    fresh_until: datetime | None = field(compare=False)


@dataclass(slots=True)
class ScopeTally:
    """One cluster's counts (the fleet's are their sum)."""

    nodes: int = 0
    health: dict[str, int] = field(default_factory=dict)
    stale: int = 0
    status: dict[str, int] = field(default_factory=dict)
    bins: list[int] = field(default_factory=lambda: [0] * len(BINS))
    unscored: int = 0
    degraded_scores: list[int] = field(default_factory=lambda: [0] * 101)  # score -> degraded nodes
    conditions: dict[str, int] = field(default_factory=dict)  # type -> nodes carrying it
    out_of_service: int = 0
    automated: int = 0
    draining: int = 0
    replacing: int = 0
    # domain kind -> value -> [members by MEMBER_STATES..., out of service]
    cells: dict[str, dict[str, list[int]]] = field(default_factory=dict)

    @property
    def worst(self) -> int | None:
        """The lowest score among the degraded (the summary's label)."""
        return next((score for score, count in enumerate(self.degraded_scores) if count), None)

    def count(self, mark: Mark, sign: int) -> None:
        """``mark`` in (``sign`` 1) or out (-1); a count back at zero leaves no key behind."""
        self.nodes += sign
        health, status = self.health, self.status
        if (left := health.get(mark.health, 0) + sign) and sign > 0:  # the common case, inline
            health[mark.health] = left
        else:
            _bump(health, mark.health, sign)
        if (left := status.get(mark.status, 0) + sign) and sign > 0:
            status[mark.status] = left
        else:
            _bump(status, mark.status, sign)
        if mark.stale:
            self.stale += sign
        score = mark.score
        if score is None:
            self.unscored += sign
        else:
            score = min(max(score, 0), 100)
            self.bins[min(score // 10, 9)] += sign
            if mark.health == "DEGRADED":
                self.degraded_scores[score] += sign
        for kind in mark.conditions:
            _bump(self.conditions, kind, sign)
        if mark.held:
            self.out_of_service += sign
            self.automated += sign if mark.automated else 0
            self.replacing += sign if mark.replacing else 0
            self.draining += sign if mark.draining else 0
        for kind, value in mark.domains:
            of_kind = self.cells.setdefault(kind, {})
            cell = of_kind.get(value)
            if cell is None:
                cell = of_kind[value] = [0, 0, 0, 0, 0]
            cell[mark.member_state] += sign
            if mark.held:
                cell[4] += sign
            if not any(cell[:4]):
                del of_kind[value]
                if not of_kind:
                    del self.cells[kind]

    def add(self, other: ScopeTally) -> None:
        self.nodes += other.nodes
        self.stale += other.stale
        self.unscored += other.unscored
        self.out_of_service += other.out_of_service
        self.automated += other.automated
        self.draining += other.draining
        self.replacing += other.replacing
        for mine, theirs in ((self.health, other.health), (self.status, other.status),
                             (self.conditions, other.conditions)):
            for key, count in theirs.items():
                mine[key] = mine.get(key, 0) + count
        self.bins = [a + b for a, b in zip(self.bins, other.bins, strict=True)]
        self.degraded_scores = [a + b for a, b in zip(self.degraded_scores, other.degraded_scores, strict=True)]


def _bump(counts: dict[str, int], key: str, sign: int) -> None:
    left = counts.get(key, 0) + sign
    if left:
        counts[key] = left
    else:
        counts.pop(key, None)


@dataclass(slots=True)
class Pool:
    """A provisioner definition's nodes in one cluster (maxUnavailablePercent and
    maxReplacementsPerHour are per definition, as the policy keeps them)."""

    members: int = 0
    unavailable: int = 0
    replacing: int = 0  # automation's deprovision holds: replacements in flight


@functools.cache
def stale_after(interval_s: int | None) -> timedelta:
    """How long a view stays fresh unrewritten: ``reads.stale_for``'s bound."""
    return timedelta(seconds=max(15, STALE_AFTER_INTERVALS * (interval_s or 30)))


def fresh_until_of(row: ListRow) -> datetime | None:
    """When ``row``'s view goes stale unless rewritten; None for a node never reported or
    OFFLINE (its health says so already)."""
    last = row.last_reported_at
    return last + stale_after(row.report_interval_seconds) if last is not None and row.status != "OFFLINE" else None


def mark_of(row: ListRow, now: datetime) -> Mark:
    """What ``row`` adds to the counts at ``now``."""
    health, status, last = row.health, row.status, row.last_reported_at
    fresh_until = fresh_until_of(row)
    stale = fresh_until is not None and fresh_until < now
    if stale:
        health = "UNKNOWN"
    blind_by = None
    kinds: tuple[str, ...] = ()
    if row.conditions:
        kinds = tuple(dict.fromkeys(c.type for c in row.conditions))
        for condition in row.conditions:  # automation.blinding, without a list per row
            kind = condition.type
            if kind in automation.BLIND and condition.reason != automation.EXPLAINED and (
                    blind_by is None or kind < blind_by):
                blind_by = kind
    holds = row.holds
    automated = bool(holds) and any(h.actor in automation.AUTOMATION for h in holds)
    teardown = [h for h in holds if h.effect == "deprovision"] if holds else []
    blind = None
    if blind_by is not None or health == "UNKNOWN" or status == "OFFLINE":
        why = (f"blind: {wire.condition_title(blind_by)}" if blind_by is not None
               else "view stale: nothing has folded its reports for several intervals" if stale
               else "offline: its heartbeat is missed" if status == "OFFLINE"
               else "unknown health: it has not reported yet" if last is None else "unknown health")
        blind = Flagged(last, row, why)
    attention = (Flagged(row.needs_attention.since, row, row.needs_attention.reason)
                 if row.needs_attention is not None else None)
    member_state = (_UNKNOWN if health == "UNKNOWN" or status == "OFFLINE" or blind_by is not None
                    else _DEGRADED if health == "DEGRADED" else _OUT if holds else _HEALTHY)
    return Mark(row.cluster, row.definition, health, stale, status, row.score, kinds, bool(holds), automated,
                bool(holds) and not teardown and bool(row.jobs), bool(teardown),
                any(h.actor in automation.AUTOMATION for h in teardown),
                tuple(row.domains.items()) if row.domains else (), member_state, blind, attention, fresh_until)


@dataclass(slots=True)
class Tally:
    """Everything the dashboard counts, per cluster and definition, with each row's ``Mark``:
    ``put`` takes a row's old contribution out and its new one in, so the counts follow the
    index at the cost of what changed, not of the fleet."""

    clusters: dict[str, ScopeTally] = field(default_factory=dict)
    pools: dict[tuple[str, str | None], Pool] = field(default_factory=dict)
    blind: dict[str, Flagged] = field(default_factory=dict)
    attention: dict[str, Flagged] = field(default_factory=dict)
    marks: dict[str, Mark] = field(default_factory=dict)

    def put(self, key: str, row: ListRow | None, now: datetime) -> tuple[Mark | None, bool]:
        """``key``'s row is now ``row`` (None: gone): its mark, and whether any count changed."""
        old = self.marks.pop(key, None)
        mark = mark_of(row, now) if row is not None else None
        if mark is not None:
            self.marks[key] = mark
        if old == mark:
            return mark, False
        if old is not None:
            self._count(key, old, -1)
        if mark is not None:
            self._count(key, mark, 1)
        return mark, True

    def _count(self, key: str, mark: Mark, sign: int) -> None:
        scope = self.clusters.get(mark.cluster)
        if scope is None:
            scope = self.clusters[mark.cluster] = ScopeTally()
        scope.count(mark, sign)
        if not scope.nodes:
            del self.clusters[mark.cluster]
        pool_key = (mark.cluster, mark.definition)
        pool = self.pools.get(pool_key)
        if pool is None:
            pool = self.pools[pool_key] = Pool()
        pool.members += sign
        if mark.held:
            pool.unavailable += sign
            pool.replacing += sign if mark.replacing_by_automation else 0
        if not pool.members:
            del self.pools[pool_key]
        for flagged, found in ((mark.blind, self.blind), (mark.attention, self.attention)):
            if flagged is not None:
                if sign > 0:
                    found[key] = flagged
                else:
                    found.pop(key, None)


def summary(counted: Tally) -> dict[str, Any]:
    """``GET /api/v1/summary`` from the counts: what ``reads.summarize`` says of the same rows."""
    return reads.summary_of((name, {h.lower(): n for h, n in scope.health.items()}, scope.worst)
                            for name, scope in counted.clusters.items())


def tally(rows: Iterable[ListRow], now: datetime) -> Tally:
    """Everything the dashboard counts, from scratch."""
    out = Tally()
    for row in rows:
        out.put(key_of(row.cluster, row.node_id), row, now)
    return out


class Counts:
    """The tally kept as the index changes (UI-2: the api's CPU with a dashboard open). Each
    ``refresh`` re-marks the rows whose shown parts changed; the flagged rows rewritten (a
    stale view is flagged blind: its health, and a flagged row's "since", move with no shown
    change); a row rewritten to go stale sooner than its mark said (or at all); and the rows whose view
    went stale by time since — each mark is due at its ``fresh_until`` (a bucket per second),
    where it is re-marked: stale, or due again later if rewritten meanwhile."""

    def __init__(self, rows: Mapping[str, ListRow], now: datetime) -> None:
        self.tally = Tally()
        self.version = 0  # moves when any count or flagged row changed
        self._due: dict[int, set[str]] = {}  # second of a mark's fresh_until -> keys
        self._seconds: list[int] = []  # the heap of _due's keys
        for key, row in rows.items():
            self._remark(key, row, now)

    def refresh(self, rows: Mapping[str, ListRow], changed: Iterable[str], rewritten: Iterable[str],
                now: datetime) -> bool:
        """Follow the index since the last call; True when any count or flagged row changed."""
        before = self.version
        marks = self.tally.marks
        for key in changed:
            self._remark(key, rows.get(key), now)
        for key in rewritten:
            mark, row = marks.get(key), rows.get(key)
            if mark is None or row is None:
                continue
            flagged = mark.blind or mark.attention
            if flagged is not None:
                if row is not flagged.row:
                    self._remark(key, row, now)
            else:
                fresh_until = fresh_until_of(row)
                if fresh_until is not None and (mark.fresh_until is None or fresh_until < mark.fresh_until):
                    self._remark(key, row, now)
        second = int(now.timestamp())
        while self._seconds and self._seconds[0] < second:
            due = heapq.heappop(self._seconds)
            for key in self._due.pop(due):
                mark = marks.get(key)
                if mark is not None and mark.fresh_until is not None and int(mark.fresh_until.timestamp()) == due:
                    self._remark(key, rows.get(key), now)
        return self.version != before

    def _remark(self, key: str, row: ListRow | None, now: datetime) -> None:
        mark, changed = self.tally.put(key, row, now)
        if changed:
            self.version += 1
        if mark is not None and mark.fresh_until is not None and not mark.stale:
            second = int(mark.fresh_until.timestamp())
            keys = self._due.get(second)
            if keys is None:
                keys = self._due[second] = set()
                heapq.heappush(self._seconds, second)
            keys.add(key)


# ---------------------------------------------------------------------------- links


def link(cluster: str | None, **filters: str | int) -> str:
    """The nodes table with these filters (the names the table takes: ``health``, ``status``,
    ``condition``, ``hold``, ``domain``, ``scoreMin``, ``scoreMax``, ``sort``)."""
    pairs = ([("cluster", cluster)] if cluster else []) + [(k, str(v)) for k, v in filters.items()]
    return f"{NODES}?{urlencode(pairs)}" if pairs else NODES


def node_link(cluster: str, node_id: str) -> str:
    return f"{node_path(node_id)}?{urlencode([('cluster', cluster)])}"


# ---------------------------------------------------------------------------- the page's figures


@dataclass(frozen=True, slots=True)
class Inputs:
    """What the dashboard shows besides the rows: the events' fold, the control plane's
    problems (each with when it was first seen), the config in force, the breaker's resets."""

    timeline: timeline.Timeline
    timeline_complete: bool = False  # the 24 h replay has caught up
    # The row of a node now (the index), for what the events say of nodes: gone ones are left out.
    row_of: Callable[[str, str], ListRow | None] = field(default=lambda cluster, node_id: None)
    problems: Sequence[tuple[plane.Problem, datetime]] = ()
    config: ClusterConfig | None = None
    breaker_resets: Mapping[str, datetime] = field(default_factory=dict)


def board(counted: Tally, inputs: Inputs, now: datetime, cluster: str | None = None) -> dict[str, Any]:
    """The dashboard of the fleet (``cluster`` None) or of one cluster: the JSON of
    ``GET /api/v1/dashboard`` and what the page renders."""
    names = sorted(counted.clusters)
    chosen = [cluster] if cluster is not None else names
    scope = ScopeTally()
    for name in chosen:
        found = counted.clusters.get(name)
        if found is not None:
            scope.add(found)
    health = inputs.config.node_health if inputs.config is not None else NodeHealth()
    return {
        "scope": cluster,
        "nodes": scope.nodes,
        "link": link(cluster),
        "healthyPercent": percent(scope.health.get("HEALTHY", 0), scope.nodes),
        "health": [{"health": h, "count": scope.health.get(h, 0), "percent": percent(scope.health.get(h, 0),
                                                                                    scope.nodes),
                    "link": link(cluster, health=h)} for h in HEALTHS],
        "stale": scope.stale,
        "status": [{"status": s, "count": scope.status.get(s, 0), "percent": percent(scope.status.get(s, 0),
                                                                                    scope.nodes),
                    "link": link(cluster, status=s)} for s in STATUSES],
        "outOfService": {"count": scope.out_of_service, "percent": percent(scope.out_of_service, scope.nodes),
                         "link": link(cluster, hold="any")},
        "scores": _histogram(scope, cluster),
        "conditions": _conditions(scope, cluster),
        "automation": _automation(scope, inputs, cluster),
        "mode": {"mode": health.mode, "cordonBelow": health.cordon_below, "drainBelow": health.drain_below},
        "guardrails": [g for name in chosen for g in guardrails(name, counted, inputs, now)],
        "needsAttention": needs_attention(counted, inputs, now, cluster),
        "timeline": _timeline(inputs, now, cluster),
        "domains": heatmap(counted, cluster),
        "clusters": [_cluster_row(name, counted.clusters[name]) for name in names],
    }


def _cluster_row(name: str, scope: ScopeTally) -> dict[str, Any]:
    counts = {h.lower(): scope.health.get(h, 0) for h in HEALTHS}
    return {"cluster": name, "nodes": scope.nodes, "health": counts,
            "healthyPercent": percent(counts["healthy"], scope.nodes),
            "label": cluster_label(counts, scope.worst), "outOfService": scope.out_of_service,
            "link": link(name), "dashboard": f"/?{urlencode([('cluster', name)])}"}


def _histogram(scope: ScopeTally, cluster: str | None) -> list[dict[str, Any]]:
    bins: list[dict[str, Any]] = [
        {"bin": f"{low}-{high}", "min": low, "max": high, "count": count,
         "link": link(cluster, scoreMin=low, scoreMax=high, sort="score")}
        for (low, high), count in zip(BINS, scope.bins, strict=True)]
    # No score filter selects "no score": the table sorted highest first lists the unscored first.
    bins.append({"bin": "unscored", "min": None, "max": None, "count": scope.unscored,
                 "link": link(cluster, sort="-score")})
    return bins


def _conditions(scope: ScopeTally, cluster: str | None) -> dict[str, Any]:
    ranked = sorted(scope.conditions.items(), key=lambda item: (-item[1], item[0]))
    return {"top": [{"type": kind, "title": wire.condition_title(kind), "nodes": count,
                     "link": link(cluster, condition=kind)} for kind, count in ranked[:TOP_CONDITIONS]],
            "more": max(0, len(ranked) - TOP_CONDITIONS)}


def _in_scope(cluster: str | None, inputs: Inputs) -> Callable[[str, str], bool]:
    return lambda c, n: (cluster is None or c == cluster) and inputs.row_of(c, n) is not None


def _automation(scope: ScopeTally, inputs: Inputs, cluster: str | None) -> list[dict[str, Any]]:
    wanted = _in_scope(cluster, inputs)
    running = {group: sum(1 for m in timeline.open_marks(inputs.timeline, group) if wanted(m.cluster, m.node_id))
               for group in ("validating", "remediating")}
    # Validation and remediation hold the node with a cordon: the table's nearest filter is that
    # hold; a drain is a held node with work on it, so held nodes with the most jobs first.
    return [
        {"kind": "draining", "count": scope.draining, "link": link(cluster, hold="cordon", sort="-jobs"),
         "words": "held, with work still running on it"},
        {"kind": "remediating", "count": running["remediating"], "link": link(cluster, hold="cordon"),
         "words": "a remediation ladder running (REM)"},
        {"kind": "validating", "count": running["validating"], "link": link(cluster, hold="cordon"),
         "words": "a validation run in progress (VAL)"},
        {"kind": "replacing", "count": scope.replacing, "link": link(cluster, hold="deprovision"),
         "words": "a deprovision hold: torn down once empty, then replaced"},
    ]


# ---------------------------------------------------------------------------- guardrails and the breaker


def share_of(percent_: int, fleet: int) -> int:
    """``percent_`` of ``fleet`` rounded up (the breaker's rounding, reference 004)."""
    return -(-percent_ * fleet // 100)


def window_bound(percentage: int, max_nodes: int, fleet: int) -> tuple[int, str] | None:
    """The breaker's window threshold (services/policy/breaker.py ``window_threshold``): the
    lower of ``percentage`` (rounded up) and ``maxNodes``, clamped to the fleet."""
    candidates = ([(share_of(percentage, fleet), f"percentage {percentage} % of {fleet}")] if percentage > 0 else []) \
        + ([(max_nodes, f"maxNodes {max_nodes}")] if max_nodes > 0 else [])
    if not candidates:
        return None
    nodes, words = min(candidates, key=lambda c: c[0])
    return (fleet, f"fleetSize {fleet}") if nodes > fleet else (nodes, words)


def standing_bound(max_cordoned_nodes: int, max_cordoned_percentage: int, fleet: int) -> tuple[int, str] | None:
    """The breaker's standing threshold (``standing_threshold``): never clamped."""
    candidates = ([(max_cordoned_nodes, f"maxCordonedNodes {max_cordoned_nodes}")] if max_cordoned_nodes > 0
                  else []) + ([(share_of(max_cordoned_percentage, fleet),
                                f"maxCordonedPercentage {max_cordoned_percentage} % of {fleet}")]
                              if max_cordoned_percentage > 0 else [])
    return min(candidates, key=lambda c: c[0]) if candidates else None


def ceiling(percent_: int, members: int) -> int:
    """Nodes of a pool that may be out of service at once under maxUnavailablePercent: the
    policy halts when ``(unavailable + 1) * 100 > percent * members``."""
    return percent_ * members // 100


def domain_budget(max_unavailable: int | None, max_unavailable_percent: int | None,
                  members: int) -> tuple[int, str] | None:
    """A domain's budget (services/policy/domains.py ``budget``): the lower of the two, the
    percentage rounded down."""
    candidates = ([(max_unavailable, f"maxUnavailable {max_unavailable}")] if max_unavailable is not None else []) \
        + ([(max_unavailable_percent * members // 100, f"maxUnavailablePercent {max_unavailable_percent} % of "
             f"{members}")] if max_unavailable_percent is not None else [])
    return min(candidates, key=lambda c: c[0]) if candidates else None


def _guard(cluster: str, name: str, scope: str, limit: int, used: int, words: str,
           state: str | None = None) -> dict[str, Any]:
    headroom = limit - used
    return {"cluster": cluster, "name": name, "scope": scope, "limit": limit, "used": used,
            "headroom": max(0, headroom), "state": state or ("full" if headroom <= 0 else "ok"),
            "words": words + (f"; room for {headroom} more" if headroom > 0 else "; no room: automation halts")}


def guardrails(cluster: str, counted: Tally, inputs: Inputs, now: datetime) -> list[dict[str, Any]]:
    """Each guardrail of ``cluster`` with its numbers and headroom: the breaker (tripped or not;
    its window and standing bounds), maxUnavailablePercent and maxReplacementsPerHour per
    definition, and each limited domain kind's tightest domains (DOM-2)."""
    config = inputs.config
    health = config.node_health if config is not None else NodeHealth()
    scope = counted.clusters.get(cluster, ScopeTally())
    fleet = scope.nodes
    out: list[dict[str, Any]] = []
    breaker = health.circuit_breaker
    if not breaker.enabled:
        out.append({"cluster": cluster, "name": "circuit breaker", "scope": f"cluster {cluster}", "limit": None,
                    "used": None, "headroom": None, "state": "off", "words": "disabled (circuitBreaker.enabled: false)"})
    else:
        tripped = inputs.timeline.breaker_halts.get(cluster)
        reset = inputs.breaker_resets.get(cluster)
        if tripped is not None and (reset is None or reset < tripped):
            out.append({"cluster": cluster, "name": "circuit breaker", "scope": f"cluster {cluster}", "limit": None,
                        "used": None, "headroom": 0, "state": "tripped",
                        "words": f"TRIPPED (a halt at {wire.rfc3339(tripped)}): automation cordons nothing until "
                                 f"`healthplane policy breaker reset --cluster {cluster}`"})
        window = window_bound(breaker.percentage, breaker.max_nodes, fleet)
        if window is not None:
            duration = timedelta(seconds=breaker.duration_seconds)
            used = timeline.automated_since(inputs.timeline, cluster, now - duration)
            out.append(_guard(cluster, "circuit breaker window", f"cluster {cluster}", window[0], used,
                              f"{used} automated cordon(s) in the last {breaker.duration} against {window[1]} = "
                              f"{window[0]}"))
        standing = standing_bound(breaker.max_cordoned_nodes, breaker.max_cordoned_percentage, fleet)
        if standing is not None:
            out.append(_guard(cluster, "circuit breaker standing", f"cluster {cluster}", standing[0], scope.automated,
                              f"{scope.automated} node(s) held by automation against {standing[1]} = {standing[0]}"))
    hour_ago = now - timedelta(hours=1)
    for (name, definition), pool in sorted(counted.pools.items(), key=lambda item: (item[0][0], item[0][1] or "")):
        if name != cluster:
            continue
        settings = config.node_health_for(definition) if config is not None else health
        where = f"definition {definition}" if definition else f"cluster {cluster} (no definition)"
        allowed = ceiling(settings.max_unavailable_percent, pool.members)
        out.append(_guard(cluster, "maxUnavailablePercent", where, allowed, pool.unavailable,
                          f"{pool.unavailable} of {pool.members} out of service; {settings.max_unavailable_percent} % "
                          f"allows {allowed}"))
        if settings.mode == "replace" or pool.replacing:
            used = timeline.replaced_since(inputs.timeline, cluster, definition, hour_ago) + pool.replacing
            out.append(_guard(cluster, "maxReplacementsPerHour", where, settings.max_replacements_per_hour, used,
                              f"{used} replacement(s) in the last hour or in flight"))
    for limit in health.domain_limits:
        budgets = []
        for value, cell in scope.cells.get(limit.kind, {}).items():
            members, unavailable = sum(cell[:4]), cell[4]
            found = domain_budget(limit.max_unavailable, limit.max_unavailable_percent, members)
            if found is not None:
                budgets.append((found[0] - unavailable, value, found, members, unavailable))
        budgets.sort(key=lambda b: (b[0], b[1]))
        for _, value, (allowed, words), members, unavailable in budgets[:DOMAINS_PER_LIMIT]:
            guard = _guard(cluster, f"domainLimits {limit.kind}", f"{limit.kind}={value}", allowed, unavailable,
                           f"{unavailable} of {members} out of service; {words} = {allowed}")
            guard["link"] = link(cluster, domain=f"{limit.kind}={value}", hold="any")
            out.append(guard)
        full = sum(1 for b in budgets if b[0] <= 0)
        if len(budgets) > DOMAINS_PER_LIMIT:
            out.append({"cluster": cluster, "name": f"domainLimits {limit.kind}", "scope": f"{limit.kind}=…",
                        "limit": None, "used": None, "headroom": None, "state": "full" if full else "ok",
                        "words": f"{len(budgets) - DOMAINS_PER_LIMIT} more {limit.kind} domain(s) not shown; "
                                 f"{full} of all {len(budgets)} have no room"})
    return out


# ---------------------------------------------------------------------------- needs attention


def needs_attention(counted: Tally, inputs: Inputs, now: datetime, cluster: str | None) -> dict[str, Any]:
    """The queue, oldest first (an item of unknown age first): nodes stopped at
    NODE_NEEDS_ATTENTION, blind nodes, policy halts still in force, degraded domains and the
    control plane's own problems, each with its fix. The QUEUE_SHOWN oldest; counts of all."""
    config = inputs.config
    wanted = _in_scope(cluster, inputs)
    # (since, order, kind, the item or the flagged row it is made of): a whole rack gone blind
    # is thousands of candidates, and only the QUEUE_SHOWN oldest become items.
    items: list[tuple[datetime | None, int, str, dict[str, Any] | Flagged]] = []
    by_kind: dict[str, int] = {}

    def add(kind: str, since: datetime | None, item: dict[str, Any] | Flagged) -> None:
        by_kind[kind] = by_kind.get(kind, 0) + 1
        items.append((since, len(items), kind, item))

    # A degraded domain is one item (DOM-3: one fault), its blind members counted in it, not each
    # an item of its own ahead of it: a silent rack is one line, not a page of its nodes.
    degraded: dict[tuple[str, str, str], tuple[timeline.Mark, list[datetime | None]]] = {}
    for mark in timeline.open_marks(inputs.timeline, "degraded"):
        domain = subjects.domain_of_node_id(mark.node_id)
        if (cluster is None or mark.cluster == cluster) and domain is not None:
            degraded[(mark.cluster, *domain)] = (mark, [])
    for kind, flagged_rows in (("needs-attention", counted.attention), ("blind", counted.blind)):
        for flagged in flagged_rows.values():
            row = flagged.row
            if cluster is not None and row.cluster != cluster:
                continue
            member_of = next((degraded[found] for found in ((row.cluster, k, v) for k, v in row.domains.items())
                              if found in degraded), None) if kind == "blind" and degraded and row.domains else None
            if member_of is not None:
                member_of[1].append(flagged.since)
            else:
                add(kind, flagged.since, flagged)
    for mark in timeline.open_marks(inputs.timeline, "halted"):
        if not wanted(mark.cluster, mark.node_id) or not _still_halted(inputs, config, mark):
            continue
        breaker = timeline.BREAKER_MARK in mark.message
        add("policy-halted", mark.at, {
            "cluster": mark.cluster, "nodeId": mark.node_id, "message": f"POLICY_HALTED: {mark.message}",
            "fix": (f"find why automation cordoned so many, then `healthplane policy breaker reset --cluster "
                    f"{mark.cluster}`" if breaker else
                    "bring nodes back into service, or raise the guardrail it names in the cluster config"),
            "link": node_link(mark.cluster, mark.node_id)})
    for (name, kind, value), (mark, members) in degraded.items():
        where = f"{kind}={value}"
        known = [since for since in members if since is not None]
        since = min([mark.at, *known]) if len(known) == len(members) else None
        blind = f" ({len(members)} of its nodes blind, counted here)" if members else ""
        add("domain-degraded", since, {
            "cluster": name, "nodeId": None, "domain": where, "blindMembers": len(members),
            "message": f"DOMAIN_DEGRADED: {mark.message}{blind}",
            "fix": "its members fail as one: check what they share (power, switch, fabric); per-node automation "
                   "on them waits for DOMAIN_RECOVERED (DOM-3)",
            "link": link(name, domain=where)})
    for problem, since in inputs.problems:
        add(problem.kind, since, {"cluster": None, "nodeId": None, "message": problem.message, "fix": problem.fix,
                                  "link": None})
    # Oldest first; an item whose age is unknown (a node that never reported) ahead of all.
    shown = heapq.nsmallest(QUEUE_SHOWN, items, key=lambda i: (i[0] is not None, i[0] or now, i[1]))
    return {"items": [{"kind": kind, "since": wire.rfc3339(since) if since else None,
                       **(_node_item(kind, item) if isinstance(item, Flagged) else item)}
                      for since, _, kind, item in shown],
            "total": len(items), "byKind": by_kind}


def _node_item(kind: str, flagged: Flagged) -> dict[str, Any]:
    row = flagged.row
    if kind == "needs-attention":
        return {"cluster": row.cluster, "nodeId": row.node_id, "message": f"needs attention: {flagged.why}",
                "fix": f"repair it, then `healthplane node service {row.node_id} --reason …`: automation leaves it "
                       "alone until then (REM-1)", "link": node_link(row.cluster, row.node_id)}
    return {"cluster": row.cluster, "nodeId": row.node_id, "message": flagged.why,
            "fix": "check the node's agent (the collector) and its network; automation takes no action on a node "
                   "it cannot fully see (POL-3)", "link": node_link(row.cluster, row.node_id)}


def _still_halted(inputs: Inputs, config: ClusterConfig | None, mark: timeline.Mark) -> bool:
    """A halt stands until the policy's next conclusion on the node (the timeline closes it), or
    until the node no longer scores below any cordonBelow in force: a recovered node ends its
    episode without an event (POL-2)."""
    row = inputs.row_of(mark.cluster, mark.node_id)
    score = row.score if row is not None else None
    if score is None:
        return True
    bars = [config.node_health.cordon_below, *(config.node_health_for(d).cordon_below
                                               for d in config.provisioner_definitions)] if config else [60]
    return score < max(bars)


# ---------------------------------------------------------------------------- the timeline and the heatmap


def _timeline(inputs: Inputs, now: datetime, cluster: str | None) -> dict[str, Any]:
    found = timeline.hourly(inputs.timeline, now, cluster)
    totals = {action: sum(counts) for action, counts in found.counts.items()}
    return {"hours": [wire.rfc3339(h) for h in found.hours], "actions": found.counts, "totals": totals,
            "active": [action for action, total in totals.items() if total],
            "peak": max((c for counts in found.counts.values() for c in counts), default=0),
            "complete": inputs.timeline_complete}


def heatmap(counted: Tally, cluster: str | None) -> list[dict[str, Any]]:
    """Per domain kind, its domains coloured by their worst member (unknown, degraded, out of
    service, healthy), the worst CELLS_PER_KIND of them with a count of the rest: the page
    stays small at any fleet size."""
    by_kind: dict[str, list[tuple[int, int, str, str]]] = {}
    for name, scope in counted.clusters.items():
        if cluster is not None and name != cluster:
            continue
        for kind, values in scope.cells.items():
            ranked = by_kind.setdefault(kind, [])
            for value, cell in values.items():
                worst = (_UNKNOWN if cell[_UNKNOWN] else _DEGRADED if cell[_DEGRADED] else _OUT if cell[_OUT]
                         else _HEALTHY)
                ranked.append((worst, cell[_HEALTHY] - sum(cell[:4]), name, value))
    out = []
    for kind in sorted(by_kind):
        ranked = by_kind[kind]
        shown = heapq.nsmallest(CELLS_PER_KIND, ranked)
        cells = []
        for worst, _, name, value in shown:
            cell = counted.clusters[name].cells[kind][value]
            cells.append({"cluster": name, "value": value, "nodes": sum(cell[:4]), "worst": MEMBER_STATES[worst],
                          **{state: cell[i] for i, state in enumerate(MEMBER_STATES)}, "outOfService": cell[4],
                          "link": link(name, domain=f"{kind}={value}")})
        out.append({"kind": kind, "cells": cells, "total": len(ranked), "more": len(ranked) - len(shown)})
    return out
