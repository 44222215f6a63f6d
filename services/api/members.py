"""UI-5: a federation hub's history of its members: when each became reachable or
unreachable, and how far behind its copy ran, not only how it stands now.

The hub's api looks at its members every ``server.MEMBERS_EVERY_S`` (the same look that sets
the reachability series), and so does every reader of the members page or API; each look is
folded here. Pure: no I/O, no clock, no logging; the
state is frozen and bounded (:data:`TRANSITIONS_KEPT` changes and :data:`LAG_SAMPLES_KEPT`
lag samples per member), so a member that flaps for a month costs the same as one that never
did. The history is the api process's own: it starts when the api does (``watched_since``),
and what came before is only what the server still knows (a member unreachable since T).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from healthplane.client.federation import Member
from healthplane.contracts import wire

TRANSITIONS_KEPT: Final = 20
LAG_SAMPLE_EVERY: Final = timedelta(seconds=20)
LAG_SAMPLES_KEPT: Final = 180  # an hour at one sample every 20 s


@dataclass(frozen=True, slots=True)
class Transition:
    """A member became reachable (``at``: when the hub saw it back) or unreachable (``at``: when
    it was last heard from, the server's own figure, so "unreachable since" is exact)."""

    reachable: bool
    at: datetime | None  # None: unreachable and never heard from
    reason: str | None = None  # unreachable: FED-2's words
    first: bool = False  # the state found when the watch began, not a change seen


@dataclass(frozen=True, slots=True)
class LagSample:
    at: datetime
    lag: int
    data_age_s: float | None


@dataclass(frozen=True, slots=True)
class MemberHistory:
    name: str
    transitions: tuple[Transition, ...] = ()  # oldest first
    lag: tuple[LagSample, ...] = ()  # oldest first

    @property
    def reachable(self) -> bool | None:
        return self.transitions[-1].reachable if self.transitions else None


@dataclass(frozen=True, slots=True)
class History:
    watched_since: datetime | None = None
    members: Mapping[str, MemberHistory] = field(default_factory=dict)


def observe(history: History, found: Iterable[Member], now: datetime, unreachable_after_s: float) -> History:
    """One look at the members: a transition where a member's reachability changed (or was
    first seen), a lag sample where the last is :data:`LAG_SAMPLE_EVERY` old; a member no longer
    attached leaves the history."""
    members: dict[str, MemberHistory] = {}
    for member in found:
        kept = history.members.get(member.name, MemberHistory(member.name))
        reachable = member.reachable(now, unreachable_after_s)
        if kept.reachable is not reachable:
            change = Transition(reachable, now if reachable else member.last_heard_at,
                                None if reachable else member.why_no_health(), first=not kept.transitions)
            kept = dataclasses.replace(kept, transitions=(*kept.transitions, change)[-TRANSITIONS_KEPT:])
        if not kept.lag or now - kept.lag[-1].at >= LAG_SAMPLE_EVERY:
            sample = LagSample(now, member.lag, member.data_age_s(now))
            kept = dataclasses.replace(kept, lag=(*kept.lag, sample)[-LAG_SAMPLES_KEPT:])
        members[member.name] = kept
    return History(history.watched_since or now, members)


def to_builtins(history: History, member: Member, now: datetime, unreachable_after_s: float) -> dict[str, Any]:
    """One member as ``GET /api/v1/federation/members`` has it: ``federation list``'s row, then
    ``since`` (the time its current state began, when known), its transitions (newest first)
    and its lag trend (oldest first)."""
    kept = history.members.get(member.name, MemberHistory(member.name))
    reachable = member.reachable(now, unreachable_after_s)
    latest = next((t for t in reversed(kept.transitions) if t.reachable is reachable), None)
    since = member.last_heard_at if not reachable else (latest.at if latest and not latest.first else None)
    return {**member.to_builtins(now, unreachable_after_s),
            "since": _time(since),
            "history": [{"reachable": t.reachable, "at": _time(t.at), "reason": t.reason, "first": t.first}
                        for t in reversed(kept.transitions)],
            "lagTrend": [{"at": _time(s.at), "lag": s.lag, "dataAgeSeconds": s.data_age_s} for s in kept.lag]}


def _time(value: datetime | None) -> str | None:
    return wire.rfc3339(value) if value is not None else None


def sparkline(samples: Iterable[LagSample], width: int = 240, height: int = 40) -> dict[str, Any]:
    """A member's lag trend as SVG points (oldest at the left), scaled to its largest lag."""
    found = list(samples)
    if not found:
        return {"points": "", "width": width, "height": height, "top": 0, "first": None, "last": None}
    top = max(max(s.lag for s in found), 1)
    start, end = found[0].at, found[-1].at
    span_s = max((end - start).total_seconds(), 1.0)
    points = " ".join(f"{round(2 + (width - 4) * (s.at - start).total_seconds() / span_s, 1)},"
                      f"{round(height - 2 - (height - 4) * s.lag / top, 1)}" for s in found)
    return {"points": points, "width": width, "height": height, "top": top, "first": start, "last": end}
