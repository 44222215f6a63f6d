"""The api's fold of node events (UI-2): the last 24 hours of actions, counted per hour, and
what is in progress or open that only the events say (a validation or a remediation running,
a policy halt, a failure domain degraded, the breaker tripped, automation's recent cordons
and replacements).

Pure: no I/O, no clock, no logging; ``apply`` takes one stored event and its stream sequence,
``trim`` forgets what fell out of the window ending at the ``now`` it is given. Bounded: 25
hours of counters per cluster and action, and per node at most one mark per open kind.

The events arrive by several tails (one per event type, ``live.Recent``), so a node's
VALIDATION_PASSED can be folded before its VALIDATION_STARTED. The fold is therefore
order-free: each open kind keeps, per node (or domain), the mark of the newest event by
stream sequence, open or closed, and an older event changes nothing; a closed mark stays as
long as an older event could still arrive (``trim`` with ``caught_up``). Counters add up.
So folding the same events in any order gives the same state (tests/unit/test_dashboard.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final

from healthplane.contracts import automation, wire

WINDOW_HOURS: Final = 24
HOUR_S: Final = 3600
# An action, as the timeline names it: the event that records it having happened (a drain is
# NODE_DRAINED, a remediation its REMEDIATION_STARTED per step, a validation its run's start).
ACTIONS: Final[dict[str, str]] = {
    "NODE_CORDONED": "cordon",
    "NODE_DRAINED": "drain",
    "NODE_EVICTED": "evict",
    "REMEDIATION_STARTED": "remediation",
    "VALIDATION_STARTED": "validation",
    "NODE_REPLACED": "replace",
    "NODE_DEPROVISIONED": "deprovision",
    "NODE_UNCORDONED": "uncordon",
    "POLICY_HALTED": "halted",
    "NODE_NEEDS_ATTENTION": "needs attention",
}
ACTION_ORDER: Final = tuple(dict.fromkeys(ACTIONS.values()))
GONE: Final = frozenset({"NODE_REPLACED", "NODE_DEPROVISIONED"})  # the node's last events: all it had closes
# Per open kind: the events that open it and those that close it, for one node (a domain's
# events are on the domain's reserved node id, subjects.domain_node_id).
OPENS: Final[dict[str, frozenset[str]]] = {
    "validating": frozenset({"VALIDATION_STARTED"}),
    "remediating": frozenset({"REMEDIATION_STARTED"}),
    "halted": frozenset({"POLICY_HALTED"}),
    "degraded": frozenset({"DOMAIN_DEGRADED"}),
}
CLOSES: Final[dict[str, frozenset[str]]] = {
    "validating": frozenset({"VALIDATION_PASSED", "VALIDATION_FAILED"}) | GONE,
    # A failed step is followed by a retry, the next rung or NODE_NEEDS_ATTENTION: it closes nothing.
    "remediating": frozenset({"REMEDIATION_SUCCEEDED", "NODE_NEEDS_ATTENTION", "NODE_SERVICED"}) | GONE,
    # The policy's next conclusion on the node ends the halt (POL-2: one event per episode).
    "halted": frozenset({"POLICY_ACTED", "POLICY_RECOMMENDED"}) | GONE,
    "degraded": frozenset({"DOMAIN_RECOVERED"}),
}
# Automation's take-out-of-service, as the breaker counts it (services/policy/breaker.py:
# one entry per node, its latest): the policy's own holds.
AUTOMATED_HOLD_ACTOR: Final = automation.POLICY
BREAKER_MARK: Final = "circuit breaker"  # how the policy's halt names the breaker (rules._guardrail)
# Every type the fold reads: the tails ask the stream for these and nothing else.
WANTED: Final = tuple(sorted(set(ACTIONS) | {t for group in (*OPENS.values(), *CLOSES.values()) for t in group}
                             | {"HOLD_CREATED"}))
# A closed mark is kept this long past its event once the tails have caught up: long enough
# for any older event of another type still on its way (the tails poll every second).
TOMBSTONE_S: Final = 3600


@dataclass(frozen=True, slots=True)
class Mark:
    """The newest event of one open kind on one node: open (``message``) or closed."""

    seq: int
    at: datetime
    cluster: str
    node_id: str
    is_open: bool
    message: str = ""


@dataclass
class Timeline:
    # hour (unix seconds // 3600) -> cluster -> action -> count
    hours: dict[int, dict[str, dict[str, int]]] = field(default_factory=dict)
    marks: dict[str, dict[tuple[str, str], Mark]] = field(default_factory=lambda: {kind: {} for kind in OPENS})
    # cluster -> the newest halt by the breaker (tripped until a reset after it, live.Plane reads those)
    breaker_halts: dict[str, datetime] = field(default_factory=dict)
    # cluster -> node -> its latest automated cordon (the breaker's window)
    automated: dict[str, dict[str, datetime]] = field(default_factory=dict)
    # (cluster, definition) -> node -> when it was replaced (maxReplacementsPerHour)
    replaced: dict[tuple[str, str | None], dict[str, datetime]] = field(default_factory=dict)
    generation: int = 0  # moves whenever anything the dashboard shows changed
    skipped: int = 0


def hour_of(at: datetime) -> int:
    return int(at.timestamp()) // HOUR_S


def apply(state: Timeline, event: wire.NodeEvent, seq: int) -> bool:
    """Fold one stored event; True when anything the dashboard shows changed."""
    kind = event.type
    changed = False
    action = ACTIONS.get(kind)
    if action is not None:
        per_cluster = state.hours.setdefault(hour_of(event.occurred_at), {}).setdefault(event.cluster, {})
        per_cluster[action] = per_cluster.get(action, 0) + 1
        changed = True
    for group, opening in OPENS.items():
        if kind in opening or kind in CLOSES[group]:
            changed = _mark(state.marks[group], event, seq, is_open=kind in opening) or changed
    if kind == "POLICY_HALTED" and BREAKER_MARK in event.message:
        latest = state.breaker_halts.get(event.cluster)
        if latest is None or event.occurred_at > latest:
            state.breaker_halts[event.cluster] = event.occurred_at
            changed = True
    if kind == "HOLD_CREATED" and event.actor == AUTOMATED_HOLD_ACTOR:
        changed = _latest(state.automated.setdefault(event.cluster, {}), event.node_id, event.occurred_at) or changed
    if kind == "NODE_REPLACED":
        pool = state.replaced.setdefault((event.cluster, event.definition), {})
        changed = _latest(pool, event.node_id, event.occurred_at) or changed
    if changed:
        state.generation += 1
    return changed


def _mark(marks: dict[tuple[str, str], Mark], event: wire.NodeEvent, seq: int, *, is_open: bool) -> bool:
    key = (event.cluster, event.node_id)
    before = marks.get(key)
    if before is not None and before.seq >= seq:
        return False  # an older event, folded after a newer one (another type's tail was ahead)
    marks[key] = Mark(seq, event.occurred_at, event.cluster, event.node_id, is_open,
                      event.message if is_open else "")
    return before is None or before.is_open or is_open


def _latest(times: dict[str, datetime], node_id: str, at: datetime) -> bool:
    before = times.get(node_id)
    if before is not None and before >= at:
        return False
    times[node_id] = at
    return True


def trim(state: Timeline, now: datetime, *, caught_up: bool) -> None:
    """Forget the hours, cordons and replacements older than the window, and (once every tail
    has caught up) closed marks older than TOMBSTONE_S. Open marks stay: a halt or a degraded
    domain is open until its closing event, however old."""
    first = hour_of(now) - WINDOW_HOURS
    for hour in [h for h in state.hours if h <= first]:
        del state.hours[hour]
    horizon = now - timedelta(hours=WINDOW_HOURS)
    for times in (*state.automated.values(), *state.replaced.values()):
        for node_id in [n for n, at in times.items() if at < horizon]:
            del times[node_id]
    if caught_up:
        closed_before = now - timedelta(seconds=TOMBSTONE_S)
        for marks in state.marks.values():
            for key in [k for k, m in marks.items() if not m.is_open and m.at < closed_before]:
                del marks[key]


# ---------------------------------------------------------------------------- reading it


@dataclass(frozen=True, slots=True)
class Hourly:
    hours: list[datetime]  # the start of each of the last WINDOW_HOURS hours, oldest first; the last is now's
    counts: dict[str, list[int]]  # action -> a count per hour, ACTION_ORDER


def hourly(state: Timeline, now: datetime, cluster: str | None = None) -> Hourly:
    """Actions per hour over the last 24 hours (the current hour last), of one cluster or all."""
    last = hour_of(now)
    hours = list(range(last - WINDOW_HOURS + 1, last + 1))
    counts = {action: [0] * WINDOW_HOURS for action in ACTION_ORDER}
    for position, hour in enumerate(hours):
        clusters = state.hours.get(hour)
        if not clusters:
            continue
        for name, actions in clusters.items():
            if cluster is not None and name != cluster:
                continue
            for action, count in actions.items():
                counts.setdefault(action, [0] * WINDOW_HOURS)[position] += count
    return Hourly([datetime.fromtimestamp(h * HOUR_S, UTC) for h in hours], counts)


def open_marks(state: Timeline, group: str) -> list[Mark]:
    return [m for m in state.marks[group].values() if m.is_open]


def automated_since(state: Timeline, cluster: str, since: datetime) -> int:
    """Nodes automation took out of service since ``since`` (each once, as the breaker counts)."""
    return sum(1 for at in state.automated.get(cluster, {}).values() if at > since)


def replaced_since(state: Timeline, cluster: str, definition: str | None, since: datetime) -> int:
    return sum(1 for at in state.replaced.get((cluster, definition), {}).values() if at > since)
