"""The circuit breaker on automated cordons (POL-6, reference 004). Pure: ``now`` and the fleet
size are arguments, the state is a plain record that snapshots as JSON.

Two kinds of bound, each a pair where the lower one binds:

* **window** (``percentage`` of the fleet, ``maxNodes``): unique nodes automation cordoned
  inside the sliding ``duration``; above the fleet size a window bound is clamped to it
  (``bound="fleetSize"``) rather than left unreachable;
* **standing** (``maxCordonedNodes``, ``maxCordonedPercentage``): nodes automation holds out of
  service at once; never clamped, because the count it is compared with is not a subset of
  the fleet total (reference 004).

Percentages round up: 1 % of 288 nodes is 3. The window keeps one entry per node (its latest
automated cordon), oldest first, so advancing it pops only what expired: the cost follows the
cordons, not the length of ``duration`` (a one-bucket-per-second ring costs 86,400 buckets for
24 h). A trip is persisted in the state and holds until an operator resets it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

import msgspec

Bound = Literal["percentage", "maxNodes", "maxCordonedNodes", "maxCordonedPercentage", "fleetSize"]


class BreakerSettings(msgspec.Struct, frozen=True):
    enabled: bool = True
    percentage: int = 50
    max_nodes: int = 0
    max_cordoned_nodes: int = 0
    max_cordoned_percentage: int = 0
    duration_s: float = 300.0


class Threshold(msgspec.Struct, frozen=True):
    nodes: int
    bound: Bound


class BreakerState(msgspec.Struct):
    # node id -> its latest automated cordon inside the window, oldest first (dicts keep
    # insertion order, and so does their JSON in a snapshot).
    recent: dict[str, datetime] = {}
    tripped: bool = False
    tripped_at: datetime | None = None
    tripped_by: Threshold | None = None
    tripped_count: int = 0
    reset_at: datetime | None = None  # the operator's last reset: a trip read back from before it stays reset


class Verdict(msgspec.Struct, frozen=True):
    allowed: bool
    threshold: Threshold | None = None  # what blocked it
    count: int = 0  # the count it was compared with
    newly_tripped: bool = False


def share_of(percent: int, fleet: int) -> int:
    """``percent`` of ``fleet`` nodes, rounded up: 1 % of 288 is 3, 25 % of 12 is 3."""
    return -(-percent * fleet // 100)


def window_threshold(settings: BreakerSettings, fleet: int) -> Threshold | None:
    candidates: list[Threshold] = []
    if settings.percentage > 0:
        candidates.append(Threshold(share_of(settings.percentage, fleet), "percentage"))
    if settings.max_nodes > 0:
        candidates.append(Threshold(settings.max_nodes, "maxNodes"))
    if not candidates:
        return None
    binding = min(candidates, key=lambda t: t.nodes)  # the lower one binds
    if binding.nodes > fleet:
        return Threshold(fleet, "fleetSize")
    return binding


def standing_threshold(settings: BreakerSettings, fleet: int) -> Threshold | None:
    candidates: list[Threshold] = []
    if settings.max_cordoned_nodes > 0:
        candidates.append(Threshold(settings.max_cordoned_nodes, "maxCordonedNodes"))
    if settings.max_cordoned_percentage > 0:
        candidates.append(Threshold(share_of(settings.max_cordoned_percentage, fleet), "maxCordonedPercentage"))
    return min(candidates, key=lambda t: t.nodes) if candidates else None


def advance(state: BreakerState, now: datetime, settings: BreakerSettings) -> None:
    """Drop the cordons that slid out of the window (only those: the oldest come first)."""
    horizon = now - timedelta(seconds=settings.duration_s)
    expired = []
    for node_id, at in state.recent.items():
        if at > horizon:
            break
        expired.append(node_id)
    for node_id in expired:
        del state.recent[node_id]


def admit(state: BreakerState, settings: BreakerSettings, *, node_id: str, fleet: int, standing: int,
          now: datetime) -> Verdict:
    """May automation cordon ``node_id`` now? ``standing`` is how many nodes automation already
    holds out of service. A refusal because a bound is full trips the breaker; a tripped breaker
    refuses everything until :func:`reset`."""
    if not settings.enabled:
        return Verdict(allowed=True)
    advance(state, now, settings)
    if state.tripped:
        return Verdict(allowed=False, threshold=state.tripped_by, count=state.tripped_count)
    window = window_threshold(settings, fleet)
    in_window = len(state.recent) + (node_id not in state.recent)
    if window is not None and in_window > window.nodes:
        return _trip(state, window, len(state.recent), now)
    # Evaluated only when the window has room: it can add a reason to trip, never remove one.
    held = standing_threshold(settings, fleet)
    if held is not None and standing + 1 > held.nodes:
        return _trip(state, held, standing, now)
    return Verdict(allowed=True)


def record(state: BreakerState, node_id: str, now: datetime) -> None:
    """An automated cordon was issued: the node moves to the young end of the window."""
    state.recent.pop(node_id, None)
    state.recent[node_id] = now


def reset(state: BreakerState, at: datetime | None = None) -> None:
    """``healthplane policy breaker reset``: closed again, and the cordons that filled the window
    are forgotten (an operator has judged them; otherwise the next cordon would trip it again)."""
    state.tripped, state.tripped_at, state.tripped_by, state.tripped_count = False, None, None, 0
    state.recent = {}
    state.reset_at = at if at is not None else state.reset_at


def restore_trip(state: BreakerState, threshold: Threshold | None, count: int, at: datetime) -> None:
    """A trip read back from the policy's own event after a crash with no snapshot of it: the
    breaker is tripped as it was (a trip holds until an operator resets it, and the cordons that
    tripped it may have slid out of the window since), unless a reset came after it."""
    if state.tripped or (state.reset_at is not None and at <= state.reset_at):
        return
    state.tripped, state.tripped_at, state.tripped_by, state.tripped_count = True, at, threshold, count


def _trip(state: BreakerState, threshold: Threshold, count: int, now: datetime) -> Verdict:
    state.tripped, state.tripped_at, state.tripped_by, state.tripped_count = True, now, threshold, count
    return Verdict(allowed=False, threshold=threshold, count=count, newly_tripped=True)


def reported_threshold(state: BreakerState, settings: BreakerSettings, fleet: int) -> Threshold | None:
    """The ``healthplane_policy_breaker_threshold_nodes{bound}`` series: the standing bound when
    that is what tripped the breaker, else the window bound in force (``fleetSize`` when a
    configured one was clamped)."""
    if state.tripped and state.tripped_by is not None and state.tripped_by.bound in (
            "maxCordonedNodes", "maxCordonedPercentage"):
        return state.tripped_by
    return window_threshold(settings, fleet) or standing_threshold(settings, fleet)


def utilization(state: BreakerState, settings: BreakerSettings, fleet: int, now: datetime) -> float:
    """Recent automated cordons as a fraction of the fleet (reference 004's meaning)."""
    if fleet <= 0:
        return 0.0
    horizon = now - timedelta(seconds=settings.duration_s)
    # A copy: the scrape runs on another thread while the event loop folds.
    return sum(1 for at in list(state.recent.values()) if at > horizon) / fleet
