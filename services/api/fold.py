"""The api service's fold: every node's latest listing row, kept live from ``HP_NODES``.

The web UI's nodes table and dashboard are served from here, so that a page of 100,000
nodes costs one pass over rows in memory, not a read of every view (``GET /api/v1/nodes``
reads the stream exactly as ``node list`` does). Pure: ``apply`` takes a stored view and
says whether anything a page shows has changed; ``page`` filters, sorts and pages.

Paging is by key (UI-3): a page token holds the sort key of the last (or first) row shown,
and the next page is the rows whose key comes after it. Every sort key ends in (cluster,
node id), so keys are unique and a row inserted or removed between two reads moves no other
row across the boundary: a row present throughout is on exactly one page. A row whose own
sort key changed between two reads (its score moved, under the score sort) may be shown
again or skipped: the key it was judged by is gone, as in any keyset paging.
"""

from __future__ import annotations

import base64
import heapq
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

import msgspec

from healthplane.contracts import domains as failure_domains
from healthplane.contracts import subjects, views, wire

SORTS: Final = ("node", "cluster", "status", "health", "score", "jobs")
_HEALTH_ORDER: Final = {"DEGRADED": 0, "UNKNOWN": 1, "HEALTHY": 2}
STATUSES: Final[tuple[str, ...]] = typing.get_args(wire.NodeStatus)
HEALTHS: Final[tuple[str, ...]] = typing.get_args(wire.Health)
CONDITIONS: Final = wire.CONDITION_TYPES
# ``hold=``: a hold's effect (a drain is a cordon hold), ``any``: held at all, ``none``: not held.
HOLDS: Final[tuple[str, ...]] = (*typing.get_args(wire.HoldEffect), "any", "none")
TOKEN_VERSION: Final = 1

Direction = Literal["after", "before"]


class PageError(ValueError):
    """A query the table cannot answer: one line naming the parameter."""


def _visible(row: views.ListRow) -> tuple[Any, ...]:
    """What a page shows of a row: a view that only moved ``lastReportedAt`` changes nothing."""
    return (row.hostname, row.status, row.health, row.score, row.jobs,
            tuple((c.type, c.severity) for c in row.conditions), tuple((h.effect, h.actor) for h in row.holds),
            tuple(sorted(row.domains.items())), row.definition,
            row.needs_attention.since if row.needs_attention is not None else None)


def key_of(cluster: str, node_id: str) -> str:
    return f"{cluster}\0{node_id}"


@dataclass(frozen=True, slots=True)
class Filter:
    """What a row must be to be listed: each given field narrows (AND); the values of one
    repeatable field are alternatives (OR), except ``domains``, which a row must all be in."""

    cluster: str | None = None
    statuses: frozenset[str] = frozenset()
    healths: frozenset[str] = frozenset()
    conditions: frozenset[str] = frozenset()  # condition types, any of them active
    holds: frozenset[str] = frozenset()  # HOLDS
    domains: tuple[tuple[str, str], ...] = ()
    text: str = ""  # casefolded: in the node id, the hostname or a condition type
    score_min: int | None = None
    score_max: int | None = None  # both inclusive; a bound leaves unscored nodes out

    @classmethod
    def of(cls, *, cluster: str | None = None, status: Iterable[str] = (), health: Iterable[str] = (),
           condition: Iterable[str] = (), hold: Iterable[str] = (), domain: Sequence[str] = (), text: str = "",
           score_min: int | None = None, score_max: int | None = None) -> Filter:
        """The filter of a query's values, in any case (EVT-1); a value that names nothing is a
        ``PageError`` naming the parameter and what it may be."""
        try:
            wanted = failure_domains.parse_selectors(domain)
        except failure_domains.DomainError as exc:
            raise PageError(str(exc)) from None
        return cls(cluster=cluster or None, statuses=_one_of("status", status, STATUSES, str.upper),
                   healths=_one_of("health", health, HEALTHS, str.upper),
                   conditions=_one_of("condition", condition, CONDITIONS, str.lower),
                   holds=_one_of("hold", hold, HOLDS, str.lower), domains=wanted, text=text.strip().casefold(),
                   score_min=_score("scoreMin", score_min), score_max=_score("scoreMax", score_max))

    def matcher(self) -> Callable[[views.ListRow], bool]:
        """One predicate over a row: only the tests this filter asks for, so an empty filter
        costs nothing per row."""
        tests: list[Callable[[views.ListRow], bool]] = []
        cluster, statuses, healths = self.cluster, self.statuses, self.healths
        if cluster is not None:
            tests.append(lambda r: r.cluster == cluster)
        if statuses:
            tests.append(lambda r: r.status in statuses)
        if healths:
            tests.append(lambda r: r.health in healths)
        if self.conditions:
            conditions = self.conditions
            tests.append(lambda r: any(c.type in conditions for c in r.conditions))
        if self.holds:
            effects, any_hold, no_hold = self.holds - {"any", "none"}, "any" in self.holds, "none" in self.holds
            tests.append(lambda r: (any_hold and bool(r.holds)) or (no_hold and not r.holds)
                         or any(h.effect in effects for h in r.holds))
        if self.domains:
            wanted = self.domains
            tests.append(lambda r: failure_domains.selected(r.domains, wanted))
        if self.score_min is not None or self.score_max is not None:
            low = -1 if self.score_min is None else self.score_min
            high = 101 if self.score_max is None else self.score_max
            tests.append(lambda r: r.score is not None and low <= r.score <= high)
        if self.text:
            needle = self.text
            tests.append(lambda r: needle in r.node_id.casefold() or needle in (r.hostname or "").casefold()
                         or any(needle in c.type for c in r.conditions))
        if not tests:
            return lambda r: True
        if len(tests) == 1:
            return tests[0]
        return lambda r: all(test(r) for test in tests)


def _one_of(name: str, given: Iterable[str], allowed: Sequence[str], canonical: Callable[[str], str]
            ) -> frozenset[str]:
    values = frozenset(canonical(v.strip()) for v in given if v and v.strip())
    unknown = sorted(values - set(allowed))
    if unknown:
        raise PageError(f"{name} {unknown[0]!r}: one of {', '.join(allowed)}")
    return values


def _score(name: str, value: int | None) -> int | None:
    if value is not None and not 0 <= value <= 100:
        raise PageError(f"{name} {value}: a score from 0 to 100")
    return value


@dataclass
class ViewIndex:
    rows: dict[str, views.ListRow] = field(default_factory=dict)
    skipped: int = 0  # records that were not views (REL-3): counted, never fatal
    mismatched: int = 0  # of those, views on another node's subject (SEC-7)
    # Decommissioned nodes (NODE_DEPROVISIONED / NODE_REPLACED): the scorer purges their view,
    # which no consumer sees; a view reported before then and delivered after stays out.
    gone: dict[str, datetime] = field(default_factory=dict)
    # The keys applied since the dashboard's counts last looked (``take``), once they follow the
    # index (``follow``): rows whose shown parts changed (or left), and every row rewritten.
    following: bool = False
    changed: set[str] = field(default_factory=set)
    rewritten: set[str] = field(default_factory=set)
    nodes_by_cluster: dict[str, int] = field(default_factory=dict)  # ``clusters`` without a pass over the rows

    def follow(self) -> None:
        """Record the keys applied from now on, for ``take``."""
        self.following = True

    def take(self) -> tuple[set[str], set[str]]:
        """The keys changed and rewritten since the last call (or ``follow``)."""
        found = self.changed, self.rewritten
        self.changed, self.rewritten = set(), set()
        return found

    def apply(self, payload: bytes, subject: str | None = None) -> views.ListRow | None:
        """Fold one stored view; the row when what a page shows of it changed, else ``None``.
        A view whose payload names another node than its ``subject`` is skipped (SEC-7)."""
        try:
            row = views.decode_row(payload)
        except msgspec.DecodeError:
            self.skipped += 1
            return None
        if subject is not None and not subjects.names_node(subject, row.cluster, row.node_id):
            self.skipped += 1
            self.mismatched += 1
            return None
        key = key_of(row.cluster, row.node_id)
        left = self.gone.get(key)
        if left is not None:
            if row.last_reported_at is None or row.last_reported_at <= left:
                return None
            del self.gone[key]  # reported since: a new instance under the same id
        before = self.rows.get(key)
        self.rows[key] = row
        if before is None:
            self.nodes_by_cluster[row.cluster] = self.nodes_by_cluster.get(row.cluster, 0) + 1
        shown = before is None or _visible(before) != _visible(row)
        if self.following:
            self.rewritten.add(key)
            if shown:
                self.changed.add(key)
        return row if shown else None

    def remove(self, cluster: str, node_id: str, at: datetime) -> bool:
        """A decommissioned node leaves the table; True when it was in it."""
        key = key_of(cluster, node_id)
        self.gone[key] = at
        if self.following:
            self.changed.add(key)
        if self.rows.pop(key, None) is None:
            return False
        left = self.nodes_by_cluster[cluster] - 1
        if left:
            self.nodes_by_cluster[cluster] = left
        else:
            del self.nodes_by_cluster[cluster]
        return True

    def clusters(self) -> list[str]:
        return sorted(self.nodes_by_cluster)

    def page(self, *, cluster: str | None = None, status: Iterable[str] = (), health: Iterable[str] = (),
             text: str = "", sort: str = "node", page_size: int | None = 100, token: str | None = None,
             domain: Sequence[str] = (), condition: Iterable[str] = (), hold: Iterable[str] = (),
             score_min: int | None = None, score_max: int | None = None) -> Page:
        """The rows that match, sorted, after (or before) the token's row; ``page_size=None``:
        all of them. ``domain``: ``KIND=VALUE``s a row must all be in (DOM-1). See :class:`Filter`."""
        chosen = Filter.of(cluster=cluster, status=status, health=health, condition=condition, hold=hold,
                           domain=domain, text=text, score_min=score_min, score_max=score_max)
        return select(self.rows.values(), chosen, sort=sort, page_size=page_size, token=token)


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[views.ListRow]
    total: int  # every row that matches, on any page
    next_page_token: str | None
    prev_page_token: str | None = None
    before: int = 0  # matching rows ahead of this page: the first row shown is number before + 1


def select(rows: Iterable[views.ListRow], chosen: Filter, *, sort: str = "node", page_size: int | None = 100,
           token: str | None = None) -> Page:
    """One pass over ``rows``: count what matches and, of what lies past the token's key, keep
    the page's rows (a partial sort: a heap of ``page_size``)."""
    descending = sort.startswith("-")
    key_name = sort.removeprefix("-")
    if key_name not in SORTS:
        raise PageError(f"sort {sort!r}: one of {', '.join(SORTS)} (a leading '-' for descending)")
    if page_size is not None and page_size < 1:
        raise PageError(f"pageSize {page_size}: at least 1")
    sort_key = _SORT_KEYS[key_name]
    direction, anchor = _anchor(token, sort) if token else ("after", None)
    matches = chosen.matcher()
    # Past the anchor in the order shown: ascending "after" and descending "before" are the
    # greater keys.
    greater = (direction == "after") != descending
    counted = [0, 0]  # rows that match; of those, rows past the anchor

    def past() -> Iterator[tuple[Any, views.ListRow]]:
        # A generator, not a list: a (key, row) pair that cannot be on the page is freed at
        # once, so a pass over 100,000 rows leaves nothing for the garbage collector to chase.
        for row in rows:
            if matches(row):
                counted[0] += 1
                key = sort_key(row)
                if anchor is None or (key > anchor if greater else key < anchor):
                    counted[1] += 1
                    yield key, row

    if page_size is None:
        taken = list(past())
    elif greater:
        taken = heapq.nsmallest(page_size, past())  # keys are unique: rows are never compared
    else:
        taken = heapq.nlargest(page_size, past())
    taken.sort(reverse=descending)
    total, beyond = counted
    before = total - beyond if direction == "after" else beyond - len(taken)
    after = total - before - len(taken)
    shown = [row for _, row in taken]
    return Page(shown, total,
                _token("after", sort, taken[-1][0]) if taken and after > 0 else None,
                _token("before", sort, taken[0][0]) if taken and before > 0 else None,
                before)


def page_changes(shown: Sequence[str], fresh: Sequence[str]) -> int:
    """How many rows a re-read of a page would add, drop or move, ``shown`` and ``fresh``
    being its row keys in order then and now: the rows in only one of them, and of the rows
    in both, those outside a longest run kept in the same order (what a reader would see
    move). The table says "N changed — refresh" instead of moving rows under the reader."""
    now = {key: i for i, key in enumerate(fresh)}
    kept = [now[key] for key in shown if key in now]
    entering = len(fresh) - len(kept)
    leaving = len(shown) - len(kept)
    tails: list[int] = []  # patience sorting: the length of a longest increasing run
    for position in kept:
        at = _bisect(tails, position)
        if at == len(tails):
            tails.append(position)
        else:
            tails[at] = position
    return entering + leaving + len(kept) - len(tails)


def _bisect(values: list[int], value: int) -> int:
    low, high = 0, len(values)
    while low < high:
        middle = (low + high) // 2
        if values[middle] < value:
            low = middle + 1
        else:
            high = middle
    return low


def _by_node(row: views.ListRow) -> tuple[str, str]:
    return row.cluster, row.node_id


_SORT_KEYS: Final[dict[str, Callable[[views.ListRow], Any]]] = {
    "node": _by_node,
    "cluster": _by_node,
    "status": lambda r: (r.status, r.cluster, r.node_id),
    "health": lambda r: (_HEALTH_ORDER.get(r.health, 3), r.cluster, r.node_id),
    # Unscored nodes last, the lowest score first: the node to look at is at the top.
    "score": lambda r: (r.score is None, r.score or 0, r.cluster, r.node_id),
    "jobs": lambda r: (r.jobs, r.cluster, r.node_id),
}
# Each sort key's shape, to take a token's key back only in the form its sort makes.
_KEY_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "node": (str, str), "cluster": (str, str), "status": (str, str, str), "health": (int, str, str),
    "score": (bool, int, str, str), "jobs": (int, str, str),
}


class _Token(msgspec.Struct, array_like=True):
    version: int
    direction: Direction
    sort: str
    key: list[Any]


def _token(direction: Direction, sort: str, key: tuple[Any, ...]) -> str:
    """The row's sort key, the sort it belongs to and which side of it the next page lies."""
    encoded = msgspec.json.encode(_Token(TOKEN_VERSION, direction, sort, list(key)))
    return base64.urlsafe_b64encode(encoded).decode().rstrip("=")


def _anchor(token: str, sort: str) -> tuple[Direction, tuple[Any, ...]]:
    not_ours = PageError(f"pageToken {token!r} is not a token this API gave")
    try:
        found = msgspec.json.decode(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)), type=_Token)
    except (ValueError, msgspec.DecodeError):
        raise not_ours from None
    shape = _KEY_TYPES.get(found.sort.removeprefix("-"))
    if found.version != TOKEN_VERSION or shape is None or len(found.key) != len(shape) or any(
            type(value) is not kind for value, kind in zip(found.key, shape, strict=True)):
        raise not_ours
    if found.sort != sort:
        raise PageError(f"pageToken is for sort {found.sort!r}, not {sort!r}: start again without it")
    return found.direction, tuple(found.key)
