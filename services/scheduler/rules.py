"""The reference scheduler's state and rules, as pure functions (EVI-8, POL-5).

The state is what the scheduler's own records say: a step's status, attempt and node come
from the ``hp.alloc`` records it wrote, so folding those records rebuilds exactly the state
the ticks that wrote them reached (REL-1).
"""

from __future__ import annotations

import hashlib
import math
import re
from datetime import datetime
from typing import Any, Final, Literal

import msgspec

from healthplane.contracts import gating, wire
from healthplane.contracts.gating import gated
from healthplane.contracts.subjects import node_key

StepStatus = Literal["queued", "placed", "started", "finished", "failed"]

ACTIVE: Final = frozenset({"placed", "started"})
TERMINAL: Final = frozenset({"finished", "failed"})
# How far along one attempt a record is: a record applies only when it moves its step forward
# in (attempt, rank) order, so a record folded again after a snapshot changes nothing.
RANK: Final[dict[str, int]] = {"queued": 0, "placed": 1, "started": 2, "finished": 3, "failed": 3,
                               "requeued": 3}
# A job is one record folded into memory per step: a bound keeps one bad submission from
# exhausting the scheduler.
MAX_STEPS: Final = 10_000


class StepState(msgspec.Struct, kw_only=True):
    status: StepStatus
    since: datetime  # when it entered this status: queued (its place in the queue), placed, started…
    attempt: int = 0  # requeues by directive so far: the allocation id's last part
    node_id: str | None = None
    avoid: list[str] = []  # nodes a directive took this step off: it is not placed there again


class JobState(msgspec.Struct, kw_only=True):
    job: wire.Job
    steps: list[StepState]
    open_steps: int  # steps not yet finished or failed
    failed: bool = False


class NodeState(msgspec.Struct, kw_only=True):
    cluster: str
    node_id: str
    known: bool = False  # a node view arrived (the scorer's hp.node record)
    status: wire.NodeStatus = "READY"
    held: bool = False
    score: int | None = None
    definition: str | None = None
    terminated: bool = False  # the simulated provider terminated the instance: never placed on again
    reject_terminations: bool = False  # `sim provider reject NODE`
    reject_message: str | None = None


class SchedulerState(msgspec.Struct, kw_only=True, dict=True):
    # dict=True: room for the placement index the fold derives from the state and keeps with
    # it (fold.py), never encoded: a snapshot is the fields alone.
    jobs: dict[str, JobState] = {}  # job_key -> job with steps still to run
    done: dict[str, str] = {}  # job_key -> "finished" | "failed": completed jobs, kept small
    nodes: dict[str, NodeState] = {}  # node_key -> what placement needs to know
    pending: list[wire.Directive] = []  # folded, not yet obeyed (the next tick obeys them)
    answered: dict[str, bool] = {}  # terminate directive id -> accepted
    drain_below: int = 45
    drain_below_by_definition: dict[str, int] = {}
    config_version: int = 0
    hardware: dict[str, list[int]] = {}  # node_key -> GPUs a silent fault planted (sim inject silent-gpu)
    killers: dict[str, wire.SimJobFailures] = {}  # node_key -> how it kills jobs (sim inject job-killer | slow-death)



_ALLOCATION_ID: Final = re.compile(r"(.+)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)")


def allocation_id(job_id: str, step: int, attempt: int) -> str:
    """Deterministic: the same step and attempt always get the same id, so a repeat after a
    restart is the same record."""
    return f"{job_id}.{step}.{attempt}"


def parse_allocation_id(alloc_id: str) -> tuple[str, int, int] | None:
    """``(job_id, step, attempt)``, or ``None`` for an id this scheduler did not make."""
    found = _ALLOCATION_ID.fullmatch(alloc_id)
    if found is None:
        return None
    return found[1], int(found[2]), int(found[3])


def check_job(job: wire.Job) -> str | None:
    """Why a submitted job cannot run, or ``None``."""
    if not 1 <= job.steps <= MAX_STEPS:
        return f"job {job.id}: steps must be between 1 and {MAX_STEPS} (got {job.steps})"
    if not math.isfinite(job.duration_seconds) or job.duration_seconds < 0:
        return f"job {job.id}: durationSeconds must be a finite number >= 0 (got {job.duration_seconds})"
    if job.retry_attempts < 0:
        return f"job {job.id}: retryAttempts must be >= 0 (got {job.retry_attempts})"
    if job.nodes is not None and len(job.nodes) != job.steps:
        return f"job {job.id}: pinned to {len(job.nodes)} node(s) but has {job.steps} step(s)"
    return None


def advances(step: StepState, attempt: int, record_state: str) -> bool:
    """Whether an allocation record of ``attempt`` moves ``step`` forward (else it is a record
    the state already reflects)."""
    if step.status in TERMINAL:
        return False
    return (attempt, RANK[record_state]) > (step.attempt, RANK[step.status])


def drain_below_for(state: SchedulerState, definition: str | None) -> int:
    """POL-5: the threshold is resolved per provisioner definition."""
    return gating.drain_below_for(state.drain_below, state.drain_below_by_definition, definition)


def schedulable(state: SchedulerState, node: NodeState) -> bool:
    """Whether new work may land on ``node``: known, READY with no holds, not gated, still there."""
    return (node.known and not node.terminated and node.status == "READY" and not node.held
            and not gated(node.score, drain_below_for(state, node.definition)))


def default_rejection(node_id: str) -> str:
    """What a cloud API says when it refuses to terminate an instance."""
    return (f"TerminateInstances failed for {node_id}: OperationNotPermitted: the instance is "
            "protected from termination (simulated provider)")


def pinnable(node: NodeState) -> bool:
    """Whether a step pinned to ``node`` (a validation run) may start there: the node is there
    and can run something. Holds and gating do not stop it: validating a held node is the point."""
    return node.known and not node.terminated and node.status != "OFFLINE"


def run_seconds(job: wire.Job, validation_s: float, doomed: Doom | None = None) -> float:
    """How long a step runs: what the job declared, cut to ``KILLED_AFTER_S`` when it dies at
    once; a validation run, the simulated diagnostic's time, cut at the suite's timeout."""
    if job.validation is not None:
        return min(validation_s, float(job.validation.timeout_seconds))
    if doomed is not None and doomed.quick:
        return min(job.duration_seconds, KILLED_AFTER_S)
    return job.duration_seconds


# ---------------------------------------------------------------------------- JOB-2's failure models

KILLED_AFTER_S: Final = 1.0  # a black hole's or a bad application's step dies this soon after its start


class Doom(msgspec.Struct, frozen=True):
    """How a user step ends against its will: ``quick`` within seconds of its start."""

    reason: str
    quick: bool


def draw(alloc_id: str) -> float:
    """A uniform number in [0, 1) fixed by the allocation's id: the same step decides the same
    way in every tick and every rebuilt index, with no random state to keep."""
    digest = hashlib.blake2b(alloc_id.encode(), digest_size=8, person=b"hp-sim-jobs").digest()
    return int.from_bytes(digest, "big") / 2.0**64


def failure_chance(model: wire.SimJobFailures, started_at: datetime) -> float:
    """The chance a step started at ``started_at`` dies: a job-killer's rate; a slow death's,
    rising linearly from 0 at the injection to the rate over the ramp, then level."""
    if model.model == "job-killer":
        return model.rate
    elapsed = (started_at - model.since).total_seconds()
    if elapsed <= 0.0:
        return 0.0
    return model.rate * min(1.0, elapsed / model.ramp_seconds) if model.ramp_seconds > 0 else model.rate


def doom(state: SchedulerState, job: JobState, i: int) -> Doom | None:
    """Whether step ``i`` of a user job, started, dies: a bad application's wherever it runs; on
    a node that kills jobs, by the model's chance at its start (drawn from its allocation id)."""
    if job.job.validation is not None:
        return None  # a diagnostic checks the hardware: a node that kills jobs may well pass it
    step = job.steps[i]
    if job.job.fails_everywhere:
        return Doom("exit status 1: the application failed at start (simulated bad application)", quick=True)
    model = state.killers.get(node_key(job.job.cluster, step.node_id or ""))
    if model is None or step.status != "started":
        return None
    if draw(allocation_id(job.job.id, i, step.attempt)) >= failure_chance(model, step.since):
        return None
    if model.model == "job-killer":
        return Doom(f"killed {KILLED_AFTER_S:g}s after its start on {step.node_id} (simulated job-killer node)",
                    quick=True)
    return Doom(f"failed on {step.node_id} (simulated slow death)", quick=False)


def simulated_end(state: SchedulerState, job: JobState, node_id: str, validation_s: float,
                  doomed: Doom | None = None) -> tuple[Literal["finished", "failed"], dict[str, Any]]:
    """How a step of ``job`` on ``node_id`` ends in the simulation: a job that runs on a node
    with a silent bad GPU fails on every node it runs on (a collective hangs for all ranks,
    and says nothing of which one), also a step that ends after the bad node's did; a step
    ``doomed`` (a bad application, a node that kills jobs) fails alone; a validation run
    reports its exit status and output."""
    bad = sorted(n for n in {s.node_id for s in job.steps if s.status in ACTIVE and s.node_id}
                 if node_key(job.job.cluster, n or "") in state.hardware)
    suite = job.job.validation
    if suite is None:
        if bad:
            return "failed", {"reason": "NCCL watchdog: a collective operation timed out (simulated silent GPU fault)"}
        if any(s.status == "failed" and node_key(job.job.cluster, s.node_id or "") in state.hardware
               for s in job.steps):  # a rank died on a bad GPU before: the job ends on every node
            return "failed", {"reason": "NCCL: a peer rank failed (simulated silent GPU fault)"}
        if doomed is not None:
            return "failed", {"reason": doomed.reason}
        return "finished", {}
    if validation_s > suite.timeout_seconds:
        return "failed", {"timed_out": True, "exit_code": None,
                          "output": f"killed after {suite.timeout_seconds}s (suite timeout)"}
    if not bad:
        return "finished", {"exit_code": 0, "output": f"simulated {suite.name}: PASS on {node_id}"}
    if len(job.steps) == 1:
        gpus = state.hardware[node_key(job.job.cluster, node_id)]
        said = f"simulated {suite.name}: FAIL: GPU {', '.join(map(str, gpus))} on {node_id} failed the diagnostic"
    else:
        said = f"simulated {suite.name}: FAIL: a rank timed out in the collective over {len(job.steps)} nodes"
    return "failed", {"exit_code": 1, "output": said}
