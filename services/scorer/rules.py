"""The reliability score (SCO-1..SCO-5). Pure: ``now`` and the penalty table are arguments.

Score = 100 - the penalty of every active condition - the attributed-failure deduction,
clamped to 0..100, recomputed from scratch each time. The failure deduction is
``failureTallyPenalty`` x count, halved every ``failureTallyHalfLifeHours`` since the most
recent failure and rounded half down, so the reference's 15 points read 7 a week later, 4
the week after, 0 after five weeks; a new failure restores the whole tally to full weight.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Final

import msgspec

from healthplane.contracts import wire
from healthplane.runtime import heap

# Points deducted per active condition, by reason; ``Reason:critical`` when one reason comes
# in two severities. The whole table is in docs/scoring.md.
DEFAULT_PENALTIES: Final[Mapping[str, int]] = {
    "SmartFailing": 40,
    "SmartAttributeFailing": 10,
    "IoErrors": 5,
    "ReadOnlyMount": 40,
    "CorrectableMemoryErrors": 5,
    "UncorrectableMemoryErrors": 45,
    "MachineCheckCorrected": 5,
    "MachineCheckFatal": 45,
    "HardwareErrorRecord": 10,
    "HardwareErrorRecord:critical": 45,
    "GpuEccCorrectable": 10,
    "GpuEccUncorrectable": 45,
    "GpuRowRemapFailure": 45,
    "GpuXidApplication": 10,
    "GpuXidHardware": 45,
    "GpuThermalThrottle": 10,
    "GpuPowerBrake": 10,
    # Absence of evidence is not evidence of a fault: these never move the score.
    "CollectorFailed": 0,
    "CollectorFailedExplained": 0,  # XID-2: the fault that explains it carries the points
    "HeartbeatMissed": 0,
    "TelemetryStale": 0,
    # JOB-4: the scheduler's word (an administrator's drain) is shown, never scored: a score it
    # moved would let policy act on a drain Healthplane did not see the cause of.
    "SchedulerDrain": 0,
    "SchedulerDown": 0,
    "SchedulerFail": 0,
    # JOB-3: a node whose jobs fail improbably often (JOB-2) scores 40 alone: below the default
    # drainBelow (45), so no scheduler places new work on it (POL-5), in every policy mode.
    "JobFailuresAnomalous": 60,
    "JobFailuresAfterValidation": 60,
}
TALLY_REASON: Final = "attributed job failures"
# A reason the table does not name — a custom detector's (POL-8), whose reason is its name —
# costs what the built-in reasons of its severity mostly cost, until the penalties table names it.
SEVERITY_FALLBACK: Final[Mapping[str, int]] = {"info": 0, "warning": 10, "critical": 45}


class PenaltyTable(msgspec.Struct, frozen=True):
    """Built-in defaults merged with overrides; ``source`` is "cluster" or the definition."""

    points: dict[str, int]
    source: str = "cluster"

    @classmethod
    def build(cls, overrides: Mapping[str, int] | None = None, source: str = "cluster") -> PenaltyTable:
        return cls({**DEFAULT_PENALTIES, **(overrides or {})}, source)

    def for_condition(self, condition: wire.Condition) -> int:
        qualified = self.points.get(f"{condition.reason}:{condition.severity}")
        if qualified is not None:
            return qualified
        return self.points.get(condition.reason, SEVERITY_FALLBACK[condition.severity])


class Tally(msgspec.Struct):
    count: int = 0
    last_failure_at: datetime | None = None
    by_fault: dict[str, int] = msgspec.field(default_factory=heap.empty)  # replaced, never changed in place


def tally_deduction(tally: Tally, now: datetime, penalty: int, half_life_hours: float) -> int:
    if tally.count == 0 or tally.last_failure_at is None:
        return 0
    elapsed_h = max(0.0, (now - tally.last_failure_at).total_seconds() / 3600)
    exact: float = penalty * tally.count * 0.5 ** (elapsed_h / half_life_hours)
    return max(0, math.ceil(exact - 0.5))  # round half down: 7.5 -> 7, 3.75 -> 4


def score(conditions: Iterable[wire.Condition], tally: Tally, now: datetime, table: PenaltyTable,
          tally_penalty: int, half_life_hours: float) -> tuple[int, list[wire.Contribution]]:
    """The score and every contribution behind it (points negative; zero ones left out)."""
    contributions = [
        wire.Contribution(reason=c.reason, condition=c.type, points=-points)
        for c in sorted(conditions, key=lambda c: c.type)
        if (points := table.for_condition(c)) > 0
    ]
    deduction = tally_deduction(tally, now, tally_penalty, half_life_hours)
    if deduction:
        contributions.append(wire.Contribution(reason=TALLY_REASON, condition="", points=-deduction))
    return max(0, min(100, 100 + sum(c.points for c in contributions))), contributions
