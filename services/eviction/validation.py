"""Validation runs in eviction's state, and their sentences (VAL-1..4), as pure rules.

Eviction owns validation because validation decides what eviction already owns: whether a
node's holds may be released (VAL-2) and which node a job's failure is attributed to (VAL-3).
A run is a job eviction appends to ``hp.job`` with its steps pinned to the nodes under test;
the scheduler (the reference one, or Slurm through the adapter) runs it like any job and
reports each step's exit status and output tail in its ``hp.alloc`` records; eviction reads
them with :func:`healthplane_eviction.run_verdict.judge`.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Final, Literal

import msgspec

from healthplane_eviction import isolation
from healthplane_eviction.run_verdict import Rule, Verdict

# Run ids are derived from the input that started the run, so a replay starts the same run.
RUN_NAMESPACE: Final = uuid.UUID("0b9f3a4e-5c61-4d2a-8e7f-6a1d2c3b4e5f")
# Failed multi-node jobs kept for `isolate JOB` (the newest ones): bounded, whatever the fleet runs.
KEPT_FAILED_JOBS: Final = 1024

Purpose = Literal["validate", "gate", "isolate"]


class Policy(msgspec.Struct, frozen=True, kw_only=True):
    """The cluster config's ``validation`` as eviction folds it."""

    rules: dict[str, Rule] = {}
    default_suite: str | None = None
    before_return: bool = False
    before_return_by_definition: dict[str, bool] = {}
    isolate_auto: bool = False
    isolate_max_concurrent: int = isolation.DEFAULT_MAX_CONCURRENT
    isolate_timeout_s: int = 3600
    isolate_together: tuple[str, ...] = ("nvlink",)  # DOM-4: domain kinds validated as one

    def before_return_for(self, definition: str | None) -> bool:
        if definition is not None and definition in self.before_return_by_definition:
            return self.before_return_by_definition[definition]
        return self.before_return


class Result(msgspec.Struct, frozen=True, array_like=True):
    passed: bool
    reason: str
    seconds: float


class Run(msgspec.Struct, kw_only=True):
    """One validation job in flight."""

    id: str
    cluster: str
    rule: Rule
    nodes: list[str]
    purpose: Purpose
    actor: str
    command_id: str | None = None  # validate: the command answered at the end; gate: the release
    isolating: str | None = None  # isolate: the key of the isolation (the failed job's)
    round: int | None = None
    started: dict[str, datetime] = {}  # node -> when its step started running (VAL-4: not queued)
    results: dict[str, Result] = {}
    domain: str | None = None  # DOM-4: "kind=value" whose members the run covers (acrossDomain)

    @property
    def done(self) -> bool:
        return len(self.results) == len(self.nodes)

    def verdict(self) -> Verdict:
        """The run's verdict: every node's step passed; else the first failure, named."""
        failed = [(node, self.results[node]) for node in self.nodes if not self.results[node].passed]
        if not failed:
            return Verdict(True, "passed")
        result = failed[0][1]
        if len(failed) == len(self.nodes):
            return Verdict(False, result.reason)  # the run failed as a whole: it names no one node
        return Verdict(False, f"{', '.join(n for n, _ in failed)}: {result.reason}")

    def seconds(self) -> float:
        return max((r.seconds for r in self.results.values()), default=0.0)


class Gate(msgspec.Struct, frozen=True, kw_only=True):
    """VAL-2: a release waiting for its node to pass validation."""

    run: str
    command_id: str
    verb: str
    actor: str
    hold_ids: list[str]


class SeenJob(msgspec.Struct, kw_only=True):
    """A job's allocations as eviction saw them: the suspects of its failure (VAL-3)."""

    cluster: str
    job_id: str
    nodes: dict[str, str] = {}  # node -> its (latest) allocation id
    open: list[str] = []  # allocation ids not yet ended
    failed: bool = False
    at: datetime | None = None  # the last record's time
    isolated: bool = False  # an isolation ran (or runs) for it: not started again automatically
    attributed: list[str] = []  # nodes its failure was attributed to already (EVI-7: a fault they carried)


class Step(msgspec.Struct, frozen=True, array_like=True):
    nodes: list[str]
    round: int


class Isolating(msgspec.Struct, kw_only=True):
    """VAL-3 in progress: the pure state machine's state, with what the fold needs around it."""

    key: str
    cluster: str
    job_id: str
    rule: Rule
    actor: str
    waiting: list[Step] = []  # not yet started
    running: list[Step] = []
    faulty: list[str] = []
    cleared: list[str] = []
    max_concurrent: int = isolation.DEFAULT_MAX_CONCURRENT
    validations: int = 0
    rounds: int = 0
    command_id: str | None = None
    command_node: str | None = None
    excluded: dict[str, str] = {}
    first_started: datetime | None = None  # the first run's start (queued time does not count)
    timeout_s: int = 3600
    together: list[list[str]] = []  # DOM-4: suspects validated as one

    def machine(self) -> isolation.Isolation:
        return isolation.Isolation(
            self.job_id, tuple(isolation.Step(tuple(s.nodes), s.round) for s in self.waiting),
            tuple(isolation.Step(tuple(s.nodes), s.round) for s in self.running), frozenset(self.faulty),
            frozenset(self.cleared), self.max_concurrent, self.validations, self.rounds,
            tuple(tuple(group) for group in self.together))

    def keep(self, machine: isolation.Isolation) -> None:
        self.waiting = [Step(list(s.nodes), s.round) for s in machine.waiting]
        self.running = [Step(list(s.nodes), s.round) for s in machine.running]
        self.faulty, self.cleared = sorted(machine.faulty), sorted(machine.cleared)
        self.validations, self.rounds = machine.validations, machine.rounds
        self.together = [list(group) for group in machine.together]



RUN_PREFIX: Final = "val-"


def run_id(stem: str, index: int = 0) -> str:
    return RUN_PREFIX + uuid.uuid5(RUN_NAMESPACE, f"{stem}:{index}").hex[:16]


def excluded_reason(*, known: bool, gone: bool, offline: bool, gpus: int | None, needs: int, suite: str,
                    cordoned: bool = False) -> str | None:
    """VAL-4: why a node cannot take part in a run (reported excluded, never failed), or None."""
    if not known or gone:
        return "not a known node"
    if offline:
        return "offline: it cannot run anything"
    if cordoned:
        return "cordoned: it is already out of service"
    if gpus is not None and gpus < needs:
        return f"has {gpus} GPU(s); suite {suite} needs {needs}"
    return None


def step_reason(verdict: Verdict, output: str | None) -> str:
    """A failed step's reason, with the last line its run printed (what an operator reads first)."""
    if verdict.passed or not output:
        return verdict.reason
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return f"{verdict.reason}: {lines[-1][:200]}" if lines else verdict.reason


def started_message(run: Run) -> str:
    head = f"validation started: suite {run.rule.suite.name} (job {run.id})"
    if run.domain is not None:
        head += f" across domain {run.domain}, {len(run.nodes)} node(s)"
    if run.purpose == "gate":
        return head + "; the node returns to service if it passes"
    if run.purpose == "isolate":
        return head + f"; isolating the failure of job {_job_of(run)}, round {run.round}, group of {len(run.nodes)}"
    return head


def ended_message(run: Run, verdict: Verdict) -> str:
    seconds = f"{run.seconds():.1f}s"
    if verdict.passed:
        head = f"validation passed: suite {run.rule.suite.name} in {seconds}"
        if run.domain is not None:
            return head + f" (across domain {run.domain}, {len(run.nodes)} node(s))"
        return head + (f" (group of {len(run.nodes)})" if len(run.nodes) > 1 else "")
    head = f"validation failed: suite {run.rule.suite.name} after {seconds}: {verdict.reason}"
    if run.domain is not None:
        return head + f" (across domain {run.domain}, {len(run.nodes)} node(s): its members share the verdict)"
    if len(run.nodes) > 1:
        return head + f" (group of {len(run.nodes)}: the group is split and validated again)"
    return head


def _job_of(run: Run) -> str:
    return run.isolating.split("\x00", 1)[-1] if run.isolating else "?"


def no_suite(name: str | None, policy: Policy) -> str | None:
    """Why a run of suite ``name`` (None: the default) cannot start, or None."""
    if not policy.rules:
        return "no validation suite is configured (validation.suites in the cluster config)"
    if name is None and policy.default_suite is None:
        return f"name a suite with --suite ({', '.join(sorted(policy.rules))}); no defaultSuite is configured"
    if name is not None and name not in policy.rules:
        return f"no suite named {name!r} (configured: {', '.join(sorted(policy.rules))})"
    return None


def isolation_summary(job_id: str, faulty: list[str], cleared: list[str], rounds: int, validations: int) -> str:
    named = ", ".join(faulty) if faulty else "no node (every suspect passed)"
    return (f"isolated job {job_id} in {rounds} round(s), {validations} validation(s): faulty: {named}; "
            f"cleared: {len(cleared)} node(s)")
