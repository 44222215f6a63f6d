"""JOB-1: each node's recent job outcomes, folded from ``hp.jobend`` records, bounded.

The record model (``wire.JobOutcome``, one per job run and node, written once by the scheduler
integration when the run ends) is what crosses the bus; this module is the one fold of it that
every reader shares: ``healthplane jobs impact`` folds what it reads with it, and a service that
keeps job histories (JOB-2's statistics) hosts it on the Processor like any fold (below), so its
state is snapshotted and replayed with the rest. Pure: no I/O, no clock, no logging.

Bounds (SEC-11, and a statistic's window): per node at most ``HISTORY_MAX`` outcomes, none older
than ``WINDOW`` before the newest one folded for that node; the oldest go first. The history is
kept in ``endedAt`` order, so records that arrive out of order (two schedulers' passes, a job
that left the queue read later from accounting) land where they belong. A run folded twice (a
record read again after a snapshot) is one entry: its key is (job, attempt).

What a statistic reads from it, per node: :meth:`NodeJobs.counts` (outcomes in a window) and the
entries themselves, each with the job's size (a multi-node failure's blame is split over its
nodes), user and partition (peers, and a user whose jobs fail everywhere), runtime (a "black
hole" node kills jobs within seconds of their start).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Final

import msgspec

from healthplane.contracts import subjects, wire

STREAM: Final = "HP_JOB_OUTCOMES"
HISTORY_MAX: Final = 256  # outcomes kept per node
WINDOW: Final = timedelta(days=7)  # none older than this before the node's newest outcome
# The ends that count against a node's record of failures: the job did not complete, and neither
# a person nor a preemption ended it.
FAILURES: Final = frozenset({"failed", "node_fail", "timeout", "out_of_memory"})


class JobEntry(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One outcome as a history keeps it: the record less its node and cluster (the history's)."""

    job_id: str
    attempt: int
    outcome: wire.JobOutcomeKind
    ended_at: datetime
    started_at: datetime | None = None
    runtime_seconds: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    size: int = 1
    nodes: tuple[str, ...] = ()
    partition: str | None = None
    user: str | None = None
    account: str | None = None
    reason: str | None = None
    scheduler: str = ""
    source: wire.OutcomeSource = "observed"

    @property
    def key(self) -> tuple[str, int]:
        return self.job_id, self.attempt

    @property
    def failed(self) -> bool:
        return self.outcome in FAILURES

    @classmethod
    def of(cls, record: wire.JobOutcome) -> JobEntry:
        return cls(job_id=record.job_id, attempt=record.attempt, outcome=record.outcome, ended_at=record.ended_at,
                   started_at=record.started_at, runtime_seconds=record.runtime_seconds,
                   exit_code=record.exit_code, signal=record.signal, size=max(1, record.size),
                   nodes=tuple(record.nodes or ()), partition=record.partition, user=record.user,
                   account=record.account, reason=record.reason, scheduler=record.scheduler, source=record.source)


class NodeJobs(msgspec.Struct, kw_only=True):
    """One node's recent outcomes, oldest first, within the bounds."""

    cluster: str
    node_id: str
    entries: list[JobEntry] = []

    def counts(self, since: datetime | None = None) -> dict[str, int]:
        """Outcomes by kind, of the runs that ended at or after ``since`` (all kept: None)."""
        found: dict[str, int] = {}
        for entry in self.entries:
            if since is None or entry.ended_at >= since:
                found[entry.outcome] = found.get(entry.outcome, 0) + 1
        return found


class JobOutcomesState(msgspec.Struct, kw_only=True):
    nodes: dict[str, NodeJobs] = {}  # node_key -> its history


def record(history: NodeJobs, entry: JobEntry, *, limit: int = HISTORY_MAX, window: timedelta = WINDOW) -> bool:
    """Folds ``entry`` into ``history`` in end order; False when it was there already (same
    job and attempt) or falls outside the bounds at once. Then trims to the bounds."""
    if any(kept.key == entry.key for kept in history.entries):
        return False
    ends = [kept.ended_at for kept in history.entries]
    history.entries.insert(bisect.bisect_right(ends, entry.ended_at), entry)
    newest = history.entries[-1].ended_at
    history.entries = [kept for kept in history.entries if newest - kept.ended_at <= window][-limit:]
    return entry in history.entries


def fold(records: Iterable[wire.JobOutcome], state: JobOutcomesState | None = None) -> JobOutcomesState:
    """Every record into ``state`` (a new one: None), as the core would."""
    state = state if state is not None else JobOutcomesState()
    for outcome in records:
        key = subjects.node_key(outcome.cluster, outcome.node_id)
        history = state.nodes.get(key)
        if history is None:
            history = state.nodes[key] = NodeJobs(cluster=outcome.cluster, node_id=outcome.node_id)
        record(history, JobEntry.of(outcome))
    return state
