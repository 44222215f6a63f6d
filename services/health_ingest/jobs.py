"""JOB-2: a node whose jobs fail improbably often against its peers' (pure: no I/O, no clock).

health-ingest folds every job outcome (``hp.jobend``, JOB-1) into two things:

- each node's recent history (``joboutcomes.NodeJobs``: at most 256 runs, 7 days), and
- each cluster's **pool**: weighted runs, failures and quick failures per hour, partition and
  user, over the last ``windowHours`` whole hours (the window ends at the hour of the newest
  outcome folded for the cluster, so every node is compared with its peers over the same period).

At each outcome of a node (a *look*), its runs in the window are tested against its peers' —
the pool less the node's own runs — by two one-sided binomial tests (docs/jobs.md has the
arithmetic):

- **rate**: its failures ``k`` of ``n`` runs against the peers' failure rate ``p`` (``n`` at
  least ``minRuns``);
- **black hole**: its failures that came within ``blackHoleSeconds`` of the run's start against
  the peers' rate of such quick failures (at least ``blackHoleMinFailures`` of them, so a node
  that kills every job at once is found after a few runs, long before ``minRuns``).

A test rejects when ``P(X >= k) < falseAlarmRate / (2 tests x N nodes x 256 looks)`` (Bonferroni
over the tests, the cluster's nodes with a history, and the looks a node gets in a window).

Weights: a run on ``size`` nodes counts ``1/size`` run (and, failed, ``1/size`` failure) on each;
an isolation (VAL-3) narrows it: a node it named carries the whole failed run, one it cleared
none of the failure. Users whose jobs fail on the *other* nodes at ``userFailureRate`` or more
(over at least ``userMinRuns`` runs) are left out of the node's runs and of the peers': their
failures are the job's, not the node's. A user with fewer runs elsewhere cannot be told apart
yet: their runs on the node do not count either (a run with no user always does).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from typing import Final, Literal

import msgspec

from healthplane.contracts import joboutcomes, wire
from healthplane.contracts.joboutcomes import JobEntry, NodeJobs
from healthplane.contracts.subjects import node_key

HOUR_S: Final = 3600
LOOKS: Final = joboutcomes.HISTORY_MAX  # looks a node gets in a window, for the Bonferroni bound
TESTS: Final = 2  # rate and black hole
# SEC-11: what one cluster's pool may name. Past a cap a new user is counted as nobody (never
# excluded), a new partition as the unnamed one; isolation verdicts are kept for the newest jobs.
USERS_MAX: Final = 4096
PARTITIONS_MAX: Final = 256
VERDICTS_MAX: Final = 4096
NOBODY: Final = ""
_SEP: Final = "\x1f"


class JobTestConfig(msgspec.Struct, frozen=True):
    """``nodeHealth.jobOutcomes`` (cluster-wide), as the fold keeps it."""

    enabled: bool = True
    false_alarm_rate: float = 0.01
    window_hours: int = 24
    min_runs: float = 10.0
    min_peer_runs: float = 20.0
    black_hole_seconds: float = 60.0
    black_hole_min_failures: float = 3.0
    user_failure_rate: float = 0.5
    user_min_runs: float = 5.0

    def threshold(self, nodes: int) -> float:
        return self.false_alarm_rate / (TESTS * max(1, nodes) * LOOKS)


class Tally(msgspec.Struct, array_like=True, gc=False):
    """Weighted runs, failures, and failures within ``blackHoleSeconds`` of the start."""

    runs: float = 0.0
    failures: float = 0.0
    quick: float = 0.0

    def add(self, runs: float, failures: float, quick: float) -> None:
        self.runs += runs
        self.failures += failures
        self.quick += quick


class Pool(msgspec.Struct):
    """One cluster's outcomes in the window, by partition and user (the window's totals are
    the sum of its hours, rebuilt when an hour leaves the window)."""

    newest_hour: int = 0
    hours: dict[int, dict[str, dict[str, Tally]]] = {}  # hour -> partition -> user -> tally
    partitions: dict[str, dict[str, Tally]] = {}  # the window's: partition -> user -> tally
    users: dict[str, Tally] = {}  # the window's, by user
    nodes: int = 0  # nodes with a history in the cluster: the N of the bound

    def start_hour(self, config: JobTestConfig) -> int:
        return self.newest_hour - config.window_hours + 1


class Verdict(msgspec.Struct, frozen=True):
    """A test that rejected: the numbers the condition's message gives."""

    test: Literal["rate", "black_hole"]
    failures: float
    runs: float
    peer_rate: float
    peer_runs: float
    p_value: float
    threshold: float
    nodes: int
    excluded_users: tuple[str, ...] = ()

    def message(self, config: JobTestConfig) -> str:
        what = (f"{_num(self.failures)} of {_num(self.runs)} runs failed within {_num(config.black_hole_seconds)}s "
                f"of their start (black hole)" if self.test == "black_hole"
                else f"{_num(self.failures)} of {_num(self.runs)} runs failed")
        text = (f"{what} in {config.window_hours}h vs a peer rate of {self.peer_rate:.4f} "
                f"({_num(self.peer_runs)} peer runs); p = {self.p_value:.2e} < threshold {self.threshold:.2e} "
                f"(falseAlarmRate {config.false_alarm_rate:g} / ({TESTS} tests x {self.nodes} nodes x {LOOKS} looks))")
        if self.excluded_users:
            text += f"; left out as failing everywhere: {', '.join(self.excluded_users)}"
        return text


class NodeRecord(msgspec.Struct):
    jobs: NodeJobs
    since: datetime | None = None  # runs that ended before (a validation passed, service) do not count
    validated: bool = False  # passed validation while flagged: flagged again is for a human (JOB-3)
    verdict: Verdict | None = None  # while the condition is raised


class JobsState(msgspec.Struct):
    nodes: dict[str, NodeRecord] = {}  # node key -> its record
    pools: dict[str, Pool] = {}  # cluster -> its pool
    # cluster SEP job -> node -> True: the isolation named it; False: cleared it (VAL-3)
    isolations: dict[str, dict[str, bool]] = {}


class Look(msgspec.Struct, frozen=True):
    """One look at a node: the test that rejected, if any, and the smallest p-value found."""

    verdict: Verdict | None
    p_value: float


# ---------------------------------------------------------------------------- the binomial tail


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), a, b > 0."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def binomial_tail(k: float, n: float, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): ``I_p(k, n - k + 1)``, which for whole k and n is the
    sum of the binomial terms from k to n and extends it to the weighted counts of split runs."""
    if k <= 0.0:
        return 1.0
    if k > n:
        return 0.0
    return min(1.0, max(0.0, betainc(k, n - k + 1.0, p)))


# ---------------------------------------------------------------------------- the fold


def _hour(at: datetime) -> int:
    return math.floor(at.timestamp() / HOUR_S)


def _quick(entry: JobEntry, config: JobTestConfig) -> bool:
    runtime = entry.runtime_seconds
    if runtime is None and entry.started_at is not None:
        runtime = (entry.ended_at - entry.started_at).total_seconds()
    return entry.failed and runtime is not None and runtime < config.black_hole_seconds


def _who(entry: JobEntry) -> str:
    return entry.user or entry.account or NOBODY


def _prior(entry: JobEntry, config: JobTestConfig) -> tuple[float, float, float]:
    """The entry's weight in the pool: ``1/size`` of a run, of a failure, of a quick failure."""
    weight = 1.0 / max(1, entry.size)
    return weight, weight if entry.failed else 0.0, weight if _quick(entry, config) else 0.0


def _advance(pool: Pool, hour: int, config: JobTestConfig) -> None:
    """The window moves to end at ``hour``: the hours before it go, the totals are rebuilt."""
    pool.newest_hour = hour
    start = pool.start_hour(config)
    if all(h >= start for h in pool.hours):
        return
    pool.hours = {h: parts for h, parts in pool.hours.items() if h >= start}
    pool.partitions, pool.users = {}, {}
    for parts in pool.hours.values():
        for partition, users in parts.items():
            totals = pool.partitions.setdefault(partition, {})
            for user, tally in users.items():
                totals.setdefault(user, Tally()).add(tally.runs, tally.failures, tally.quick)
                pool.users.setdefault(user, Tally()).add(tally.runs, tally.failures, tally.quick)


def _pool_add(pool: Pool, entry: JobEntry, config: JobTestConfig) -> None:
    hour = _hour(entry.ended_at)
    if hour > pool.newest_hour:
        _advance(pool, hour, config)
    if hour < pool.start_hour(config):
        return  # ended before the window: neither the node's sample nor its peers'
    partition, user = _keys(pool, entry)
    runs, failures, quick = _prior(entry, config)
    pool.hours.setdefault(hour, {}).setdefault(partition, {}).setdefault(user, Tally()).add(runs, failures, quick)
    pool.partitions.setdefault(partition, {}).setdefault(user, Tally()).add(runs, failures, quick)
    pool.users.setdefault(user, Tally()).add(runs, failures, quick)


def _keys(pool: Pool, entry: JobEntry) -> tuple[str, str]:
    partition = entry.partition or ""
    if partition not in pool.partitions and len(pool.partitions) >= PARTITIONS_MAX:
        partition = ""
    user = _who(entry)
    if user not in pool.users and len(pool.users) >= USERS_MAX:
        user = NOBODY
    return partition, user


def fold(state: JobsState, outcome: wire.JobOutcome, config: JobTestConfig) -> NodeRecord | None:
    """One outcome into the node's history and its cluster's pool; the node's record, or None
    when the run was folded before (or fell outside the history's bounds at once)."""
    key = node_key(outcome.cluster, outcome.node_id)
    pool = state.pools.get(outcome.cluster)
    if pool is None:
        pool = state.pools[outcome.cluster] = Pool()
    record = state.nodes.get(key)
    if record is None:
        record = state.nodes[key] = NodeRecord(NodeJobs(cluster=outcome.cluster, node_id=outcome.node_id))
        pool.nodes += 1
    entry = JobEntry.of(outcome)
    if not joboutcomes.record(record.jobs, entry):
        return None
    _pool_add(pool, entry, config)
    return record


def forget(state: JobsState, cluster: str, node_id: str) -> None:
    """A node that left (deprovisioned, replaced): its history goes; its runs stay in the
    pool until they leave the window."""
    if state.nodes.pop(node_key(cluster, node_id), None) is not None:
        pool = state.pools.get(cluster)
        if pool is not None:
            pool.nodes = max(0, pool.nodes - 1)


def isolated(state: JobsState, cluster: str, job: str, node_id: str, named: bool) -> None:
    """VAL-3: an isolation of ``job`` named ``node_id`` (its single-node run failed) or cleared
    it (a run of a group it was in passed)."""
    key = f"{cluster}{_SEP}{job}"
    verdicts = state.isolations.pop(key, {})
    state.isolations[key] = {**verdicts, node_id: named or verdicts.get(node_id, False)}
    while len(state.isolations) > VERDICTS_MAX:
        del state.isolations[next(iter(state.isolations))]


# ---------------------------------------------------------------------------- the test


def _minus(total: Tally, own: Tally | None) -> Tally:
    if own is None:
        return total
    return Tally(max(0.0, total.runs - own.runs), max(0.0, total.failures - own.failures),
                 max(0.0, total.quick - own.quick))


def look(state: JobsState, cluster: str, node_id: str, config: JobTestConfig) -> Look:
    """Both tests on the node's runs in the window against its peers'."""
    record = state.nodes.get(node_key(cluster, node_id))
    pool = state.pools.get(cluster)
    if record is None or pool is None:
        return Look(None, 1.0)
    start = pool.start_hour(config)
    in_window = [e for e in record.jobs.entries if _hour(e.ended_at) >= start]
    # The node's own part of the pool, as the pool counted it, to take out of its peers'.
    own_pairs: dict[tuple[str, str], Tally] = {}
    own_users: dict[str, Tally] = {}
    for entry in in_window:
        partition, user = _keys(pool, entry)
        prior = _prior(entry, config)
        own_pairs.setdefault((partition, user), Tally()).add(*prior)
        own_users.setdefault(user, Tally()).add(*prior)
    excluded, judged_users = _users(pool, own_users, config)
    rates: dict[str, tuple[float, float, float]] = {}  # partition -> (peer runs, rate, quick rate)
    runs = failures = quick = expected = expected_quick = 0.0
    for entry in in_window:
        if record.since is not None and entry.ended_at < record.since:
            continue
        partition, user = _keys(pool, entry)
        if user != NOBODY and user not in judged_users:
            continue  # failing everywhere, or too few runs elsewhere to tell the job's fault from the node's
        peers = rates.get(partition)
        if peers is None:
            peers = rates[partition] = _peers(pool, partition, own_pairs, excluded)
        if peers[0] < config.min_peer_runs:
            continue  # too few peer runs in this partition to compare with
        verdicts = state.isolations.get(f"{cluster}{_SEP}{entry.job_id}", {}) if entry.size > 1 else {}
        weight, failed, fast = _prior(entry, config)
        named = verdicts.get(node_id)
        if named is True and entry.failed:
            weight, failed, fast = 1.0, 1.0, 1.0 if fast else 0.0
        elif named is False:
            failed = fast = 0.0
        runs += weight
        failures += failed
        quick += fast
        expected += weight * peers[1]
        expected_quick += weight * peers[2]
    if runs <= 0.0:
        return Look(None, 1.0)
    peer_runs = sum(rates[p][0] for p in rates if rates[p][0] >= config.min_peer_runs)
    threshold = config.threshold(pool.nodes)
    found: list[Verdict] = []
    if runs >= config.min_runs and failures > expected:
        rate = expected / runs
        found.append(Verdict("rate", failures, runs, rate, peer_runs, binomial_tail(failures, runs, rate), threshold,
                             pool.nodes, excluded))
    if quick >= config.black_hole_min_failures and quick > expected_quick:
        rate = expected_quick / runs
        found.append(Verdict("black_hole", quick, runs, rate, peer_runs, binomial_tail(quick, runs, rate), threshold,
                             pool.nodes, excluded))
    if not found:
        return Look(None, 1.0)
    best = min(found, key=lambda v: v.p_value)
    return Look(best if best.p_value < threshold else None, best.p_value)


def judged(record: NodeRecord, seen: Look, config: JobTestConfig) -> bool:
    """The look's verdict on the record: raised when a test rejected (its numbers replace the
    last), cleared once the smallest p-value is back at ``falseAlarmRate`` or above (the
    evidence is gone, not merely below the corrected threshold). True when it was raised or
    cleared by this look."""
    if seen.verdict is not None:
        was = record.verdict
        record.verdict = seen.verdict
        return was is None
    if record.verdict is not None and seen.p_value >= config.false_alarm_rate:
        record.verdict = None
        return True
    return False


def passed(record: NodeRecord, at: datetime) -> bool:
    """JOB-3: the node passed a validation: the runs before it no longer count, and a node
    that was flagged is flagged again only by runs after the pass (then for a human). True
    when that cleared the condition."""
    record.since = at
    if record.verdict is None:
        return False
    record.verdict, record.validated = None, True
    return True


def serviced(record: NodeRecord, at: datetime) -> bool:
    """Service recorded (``node service``): counted afresh. True when that cleared it."""
    record.since, record.validated = at, False
    was, record.verdict = record.verdict, None
    return was is not None


def _users(pool: Pool, own_users: dict[str, Tally], config: JobTestConfig) -> tuple[tuple[str, ...], set[str]]:
    """The users whose runs on the other nodes fail at ``userFailureRate`` or more (left out of
    the node's runs and its peers'), and those whose runs there fail less, over at least
    ``userMinRuns`` (the only ones whose runs on this node count: of a user seen too little
    elsewhere, a failure may be the job's as well as the node's)."""
    failing, counted = [], set()
    for user, total in pool.users.items():
        if user == NOBODY:
            continue
        elsewhere = _minus(total, own_users.get(user))
        if elsewhere.runs < config.user_min_runs:
            continue
        if elsewhere.failures >= config.user_failure_rate * elsewhere.runs:
            failing.append(user)
        else:
            counted.add(user)
    return tuple(sorted(failing)), counted


def _peers(pool: Pool, partition: str, own: dict[tuple[str, str], Tally],
           excluded: Iterable[str]) -> tuple[float, float, float]:
    """The peers' runs in ``partition`` and their failure and quick-failure rates, each with
    one failure and one success added (a peer pool with no failure yet is not a rate of 0)."""
    left_out = set(excluded)
    runs = failures = quick = 0.0
    for user, total in pool.partitions.get(partition, {}).items():
        if user in left_out:
            continue
        peer = _minus(total, own.get((partition, user)))
        runs += peer.runs
        failures += peer.failures
        quick += peer.quick
    return runs, (failures + 1.0) / (runs + 2.0), (quick + 1.0) / (runs + 2.0)


def _num(value: float) -> str:
    return f"{value:.0f}" if abs(value - round(value)) < 1e-9 else f"{value:.2f}"
