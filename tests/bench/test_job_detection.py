"""JOB-2's figures (issue 43): how many of its own jobs a node failing 50 % or 90 % of them runs
before ``job_failures_anomalous`` is raised (median over seeded fleets), and the false-alarm
rate measured on healthy fleets of 200 nodes x 10,000 jobs against the configured one.

It runs the detector's pure core (``healthplane_health_ingest.jobs``: fold, look, judged) on
seeded fleets, as health-ingest folds each ``hp.jobend`` outcome — no bus, no clock: the figures
are the statistics', not a deployment's speed.

The fleet: 200 nodes of one partition, 20 users, one single-node job every 6 s (10,000 jobs in
16.7 h: one 24 h window), each placed on a node at random. A healthy node's job fails with
probability 5 %, a fifth of those within seconds of the start (runtime 5 s; the others after
600 s). The bad node's job fails with probability 50 % or 90 %: "slow" failures after 600 s
(only the rate test can see them), or a "black hole"'s within 5 s.

The false-alarm rate: an alarm is a look whose smaller p-value is below ``falseAlarmRate / (2 x
N x 256)``; the p-values do not depend on the configured rate, so each healthy fleet's smallest
p-value over all its looks tells whether it would have raised an alarm at any configured rate.
Measured over 100 healthy fleets, with the 95 % upper bound of the share (Clopper-Pearson)."""

from __future__ import annotations

import random
import statistics
from datetime import UTC, datetime, timedelta
from typing import Final

from healthplane.contracts import wire
from healthplane_health_ingest import jobs
from tests.bench import harness

NODES: Final = 200
JOBS: Final = 10_000
MAX_JOBS: Final = 40_000  # a detection fleet runs until the bad node is flagged, at most this many jobs
SEEDS: Final = range(1, 26)
HEALTHY_FLEETS: Final = 100
BASE: Final = 0.05
QUICK_SHARE: Final = 0.2
USERS: Final = 20
T0: Final = datetime(2026, 12, 7, 0, 0, tzinfo=UTC)
CONFIG: Final = jobs.JobTestConfig()  # the defaults: falseAlarmRate 0.01, minRuns 10, 24 h window


class Fleet:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.nodes = [f"n{i:03d}" for i in range(NODES)]
        self.state = jobs.JobsState()
        self.runs: dict[str, int] = {}
        self.flagged: dict[str, int] = {}  # node -> its own runs when first flagged
        self.min_p = 1.0
        self.count = 0

    def job(self, bad: str | None = None, bad_rate: float = 0.0, black_hole: bool = False) -> None:
        self.count += 1
        node = self.rng.choice(self.nodes)
        if node == bad:
            failed = self.rng.random() < bad_rate
            runtime = (5.0 if black_hole else 600.0) if failed else 600.0
        else:
            failed = self.rng.random() < BASE
            runtime = 5.0 if failed and self.rng.random() < QUICK_SHARE else 600.0
        ended = T0 + timedelta(seconds=6 * self.count)
        record = wire.JobOutcome(job_id=f"j{self.count}", node_id=node, cluster="bench",
                                 outcome="failed" if failed else "completed", ended_at=ended, scheduler="sim",
                                 started_at=ended - timedelta(seconds=runtime), runtime_seconds=runtime,
                                 user=f"u{self.rng.randrange(USERS)}", partition="gpu")
        found = jobs.fold(self.state, record, CONFIG)
        if found is None:
            return
        self.runs[node] = self.runs.get(node, 0) + 1
        seen = jobs.look(self.state, "bench", node, CONFIG)
        self.min_p = min(self.min_p, seen.p_value)
        jobs.judged(found, seen, CONFIG)
        if found.verdict is not None and node not in self.flagged:
            self.flagged[node] = self.runs[node]


def _detect(bad_rate: float, black_hole: bool) -> tuple[list[int], int, int]:
    """Per seed, the bad node's own jobs when it was flagged; the fleets in which it was not
    within MAX_JOBS; the other nodes flagged (false alarms) over all the fleets."""
    found, missed, others = [], 0, 0
    for seed in SEEDS:
        fleet = Fleet(seed)
        bad = fleet.nodes[seed % NODES]
        while bad not in fleet.flagged and fleet.count < MAX_JOBS:
            fleet.job(bad, bad_rate, black_hole)
        if bad in fleet.flagged:
            found.append(fleet.flagged[bad])
        else:
            missed += 1
        others += len([n for n in fleet.flagged if n != bad])
    return found, missed, others


def _upper_95(hits: int, trials: int) -> float:
    """The Clopper-Pearson 95 % upper bound of a share of ``hits`` in ``trials`` (one-sided), by
    bisection on the binomial tail."""
    if hits >= trials:
        return 1.0
    low, high = hits / trials, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if 1.0 - jobs.binomial_tail(hits + 1, trials, mid) > 0.05:
            low = mid
        else:
            high = mid
    return high


def test_job2_jobs_to_detection_for_a_node_failing_50_and_90_percent() -> None:
    """JOB-2: the bad node's own jobs until flagged, 25 seeds per case; no other node flagged."""
    lines = []
    for bad_rate in (0.5, 0.9):
        for black_hole in (False, True):
            found, missed, others = _detect(bad_rate, black_hole)
            kind = "black_hole" if black_hole else "slow"
            median = statistics.median(found) if found else float("inf")
            harness.record(f"jobs.detection_jobs.median.{int(bad_rate * 100)}pct_{kind}.200_nodes", median, "jobs",
                           target="value <= 20")
            harness.record(f"jobs.detection_jobs.max.{int(bad_rate * 100)}pct_{kind}.200_nodes",
                           max(found) if found else float("inf"), "jobs")
            lines.append(f"{int(bad_rate * 100)} % {kind}: median {median:g}, range {min(found)}-{max(found)} of its "
                         f"own jobs over {len(SEEDS)} seeds; missed {missed}; other nodes flagged {others}")
            assert missed == 0 and others == 0
    print("\n" + "\n".join(lines))


def test_job2_false_alarm_rate_on_200_healthy_nodes_over_10000_jobs_against_the_configured_one() -> None:
    """JOB-2: the share of healthy fleets with an alarm at each configured rate, at most that rate."""
    smallest = []
    for seed in range(1000, 1000 + HEALTHY_FLEETS):
        fleet = Fleet(seed)
        for _ in range(JOBS):
            fleet.job()
        smallest.append(fleet.min_p)
    looks = 2 * NODES * jobs.LOOKS
    lines = [f"{HEALTHY_FLEETS} healthy fleets, smallest p-value of any look: median {statistics.median(smallest):.2e}, "
             f"least {min(smallest):.2e}"]
    for alpha in (0.01, 0.1, 0.5):
        alarms = sum(p < alpha / looks for p in smallest)
        share = alarms / HEALTHY_FLEETS
        bound = _upper_95(alarms, HEALTHY_FLEETS)
        harness.record(f"jobs.false_alarm_rate.measured.configured_{alpha:g}.200_nodes_10000_jobs", share * 100,
                       "% of fleets", target=f"value <= {alpha * 100:g}")
        harness.record(f"jobs.false_alarm_rate.upper95.configured_{alpha:g}.200_nodes_10000_jobs", bound * 100,
                       "% of fleets")
        lines.append(f"configured {alpha:g}: {alarms} of {HEALTHY_FLEETS} fleets alarmed ({share:g}; 95 % upper "
                     f"bound {bound:.3f})")
        assert share <= alpha
    # The configured rate at which one healthy fleet in ten would alarm: how conservative the bound is.
    decile = sorted(smallest)[HEALTHY_FLEETS // 10 - 1] * looks
    harness.record("jobs.false_alarm_rate.configured_for_10pct_alarms.200_nodes_10000_jobs", decile, "falseAlarmRate")
    lines.append(f"a configured rate of {decile:.2f} would alarm 10 % of these fleets")
    print("\n" + "\n".join(lines))
