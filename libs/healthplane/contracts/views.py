"""A node's view as its readers decode it: the listing row (the few keys a listing of 100,000
nodes needs) and how often a view is rewritten. Pure: the scorer, which writes the views, and
the api's read model, which folds them, share it with the client's reads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

import msgspec


class ConditionRow(msgspec.Struct, rename="camel"):
    type: str
    severity: str
    reason: str = ""  # UI-2: a collector failure its GPU's own fault explains is not blindness (XID-2)


class HoldRow(msgspec.Struct, rename="camel"):
    effect: str
    actor: str


class NeedsAttentionRow(msgspec.Struct, rename="camel"):
    since: datetime
    reason: str


class ListRow(msgspec.Struct, rename="camel"):
    """What a listing needs of a view: decoding only these keeps 100,000 nodes fast."""

    node_id: str
    cluster: str
    hostname: str | None
    status: str
    health: str
    score: int | None
    jobs: int = 0
    conditions: list[ConditionRow] = []
    holds: list[HoldRow] = []
    last_reported_at: datetime | None = None
    report_interval_seconds: int | None = None
    domains: dict[str, str] = {}  # DOM-1: what `node list --domain K=V` and ?domain= select on
    # UI-2: the dashboard's guardrails count out-of-service nodes per definition (as the policy's
    # maxUnavailablePercent does), and its queue lists every node stopped at NODE_NEEDS_ATTENTION
    # however long ago (the view keeps it until a service record; no replay window loses it).
    definition: str | None = None
    needs_attention: NeedsAttentionRow | None = None


decode_row = msgspec.json.Decoder(ListRow).decode


def list_order(rows: Sequence[ListRow]) -> list[int]:
    """Positions of ``rows`` by cluster, then node id.

    The server sends the views in the order they were last written, which for a live fleet
    is no order at all; one string per row ("cluster NUL node", NUL sorting below every
    character a name can hold) sorts three to four times faster than (cluster, node) tuples."""
    keys = [f"{row.cluster}\0{row.node_id}" for row in rows]
    return sorted(range(len(keys)), key=keys.__getitem__)


# The scorer rewrites a quiet node's unchanged view (no condition, score 100) every third
# report, at a phase of the node's own, and at the latest when its newest report is this many
# of the node's intervals past the view's. Each view costs a store and a fold in policy, the
# scheduler and the api, and nothing in them changes (docs/benchmarks.md, "Fleet"). A node with
# a condition or a lower score, and any change, is written at once.
VIEW_REFRESH_INTERVALS = 2.5
# A view older than this many of the node's intervals, on a node not OFFLINE, means nothing
# has folded its reports: health-ingest's heartbeat rule (3 intervals) would otherwise have made
# it OFFLINE, and the scorer's refresh (above) would have rewritten it.
STALE_AFTER_INTERVALS = 4


def share_digits(part: int, whole: int) -> str | None:
    """``part`` of ``whole`` as a percentage in digits that never round a node away: as many
    decimals as it takes for anything short of all to read below 100 and anything above none
    to read above 0 (99,997 of 100,000 is "99.997", never "100.0"); one decimal at least,
    none for exactly all or none. ``None`` of nothing. The dashboard shows it with " %", the
    summary (``node summary``, ``/api/v1/summary``) as a number."""
    if whole <= 0:
        return None
    if part >= whole:
        return "100"
    if part <= 0:
        return "0"
    decimals = 1
    while True:
        scale = 10 ** decimals
        rounded = (2 * 100 * part * scale + whole) // (2 * whole)  # half up, in integers
        if 0 < rounded < 100 * scale:
            return f"{rounded // scale}.{rounded % scale:0{decimals}d}"
        decimals += 1


def cluster_label(counts: Mapping[str, int], worst: int | None) -> str:
    """The dashboard's words for one cluster (reference 000): "All healthy", "2 degraded,
    worst 40", "1 unknown"; the worse state first when both are present."""
    parts = []
    if counts.get("unknown"):
        parts.append(f"{counts['unknown']} unknown")
    if counts.get("degraded"):
        parts.append(f"{counts['degraded']} degraded" + (f", worst {worst}" if worst is not None else ""))
    if not parts:
        return "All healthy" if counts.get("healthy") else "No nodes"
    return "; ".join(parts)
