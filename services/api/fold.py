"""The api service's fold: every node's latest listing row, kept live from ``HP_NODES``.

The web UI's nodes table and dashboard are served from here, so that a page of 100,000
nodes costs a sort of rows in memory, not a read of every view (``GET /api/v1/nodes`` reads
the stream exactly as ``node list`` does). Pure: ``apply`` takes a stored view and says
whether anything a page shows has changed; ``page`` filters, sorts and pages.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import msgspec

from healthplane.contracts import domains as failure_domains
from healthplane.contracts import subjects, views

SORTS: Final = ("node", "cluster", "status", "health", "score", "jobs")
_HEALTH_ORDER: Final = {"DEGRADED": 0, "UNKNOWN": 1, "HEALTHY": 2}


class PageError(ValueError):
    """A query the table cannot answer: one line naming the parameter."""


def _visible(row: views.ListRow) -> tuple[Any, ...]:
    """What a page shows of a row: a view that only moved ``lastReportedAt`` changes nothing."""
    return (row.hostname, row.status, row.health, row.score, row.jobs,
            tuple((c.type, c.severity) for c in row.conditions), tuple((h.effect, h.actor) for h in row.holds),
            tuple(sorted(row.domains.items())))


def key_of(cluster: str, node_id: str) -> str:
    return f"{cluster}\0{node_id}"


@dataclass
class ViewIndex:
    rows: dict[str, views.ListRow] = field(default_factory=dict)
    skipped: int = 0  # records that were not views (REL-3): counted, never fatal
    mismatched: int = 0  # of those, views on another node's subject (SEC-7)
    # Decommissioned nodes (NODE_DEPROVISIONED / NODE_REPLACED): the scorer purges their view,
    # which no consumer sees; a view reported before then and delivered after stays out.
    gone: dict[str, datetime] = field(default_factory=dict)

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
        return row if before is None or _visible(before) != _visible(row) else None

    def remove(self, cluster: str, node_id: str, at: datetime) -> bool:
        """A decommissioned node leaves the table; True when it was in it."""
        key = key_of(cluster, node_id)
        self.gone[key] = at
        return self.rows.pop(key, None) is not None

    def clusters(self) -> list[str]:
        return sorted({row.cluster for row in self.rows.values()})

    def page(self, *, cluster: str | None = None, status: Iterable[str] = (), health: Iterable[str] = (),
             text: str = "", sort: str = "node", page_size: int | None = 100, token: str | None = None,
             domain: Sequence[str] = ()) -> Page:
        """The rows that match, sorted, from the token's offset; ``page_size=None``: all of them.
        ``domain``: ``KIND=VALUE``s a row must all be in (DOM-1, ``domains.parse_selector``)."""
        descending = sort.startswith("-")
        key_name = sort.removeprefix("-")
        if key_name not in SORTS:
            raise PageError(f"sort {sort!r}: one of {', '.join(SORTS)} (a leading '-' for descending)")
        if page_size is not None and page_size < 1:
            raise PageError(f"pageSize {page_size}: at least 1")
        offset = _offset(token) if token else 0
        try:
            wanted = failure_domains.parse_selectors(domain)
        except failure_domains.DomainError as exc:
            raise PageError(str(exc)) from None
        statuses, healths = set(status), set(health)
        needle = text.casefold()
        chosen = [r for r in self.rows.values()
                  if (cluster is None or r.cluster == cluster) and (not statuses or r.status in statuses)
                  and (not healths or r.health in healths)
                  and (not wanted or failure_domains.selected(r.domains, wanted))
                  and (not needle or needle in r.node_id.casefold() or needle in (r.hostname or "").casefold()
                       or any(needle in c.type for c in r.conditions))]
        chosen.sort(key=_SORT_KEYS[key_name], reverse=descending)
        following = len(chosen) if page_size is None else offset + page_size
        rows = chosen[offset:following]
        return Page(rows, len(chosen), _token(following) if following < len(chosen) else None)


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[views.ListRow]
    total: int
    next_page_token: str | None


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


def _token(offset: int) -> str:
    return base64.urlsafe_b64encode(f"off:{offset}".encode()).decode().rstrip("=")


def _offset(token: str) -> int:
    try:
        kind, _, value = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode().partition(":")
    except (ValueError, UnicodeDecodeError) as exc:
        raise PageError(f"pageToken {token!r} is not a token this API gave") from exc
    if kind != "off" or not value.isdigit():
        raise PageError(f"pageToken {token!r} is not a token this API gave")
    return int(value)
