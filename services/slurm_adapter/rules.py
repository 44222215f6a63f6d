"""The Slurm adapter's state and rules, as pure functions (SLU-1..5).

What the adapter folds (node views, config, directives, its own allocation records) is the
state; what it reads from Slurm each pass is an :class:`Observation`. The rules compare the
two: which nodes must be drained and why, which of our drains to lift, what a job's state in
Slurm means for its allocations, and how a validation run is submitted and read (VAL-1).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

import msgspec

from healthplane.contracts import gating, wire
from healthplane_slurm_adapter.records import Accounted, SlurmJob, SlurmNode

# Slurm job states (squeue's job_state) and what an allocation makes of them.
RUNNING: Final = frozenset({"RUNNING", "SUSPENDED"})
ENDED: Final[dict[str, wire.AllocationState]] = {
    "COMPLETED": "finished",
    "FAILED": "failed", "NODE_FAIL": "failed", "TIMEOUT": "failed", "CANCELLED": "failed",
    "PREEMPTED": "failed", "OUT_OF_MEMORY": "failed", "BOOT_FAIL": "failed", "DEADLINE": "failed",
}
# JOB-1: a run's end as a job outcome. BOOT_FAIL is the node's (it never booted the job);
# DEADLINE is the job's time running out, as TIMEOUT.
OUTCOMES: Final[dict[str, wire.JobOutcomeKind]] = {
    "COMPLETED": "completed", "FAILED": "failed", "NODE_FAIL": "node_fail", "BOOT_FAIL": "node_fail",
    "TIMEOUT": "timeout", "DEADLINE": "timeout", "CANCELLED": "cancelled", "PREEMPTED": "preempted",
    "OUT_OF_MEMORY": "out_of_memory",
}
SCHEDULER: Final = "slurm"  # how JOB-1's and JOB-4's records name this scheduler
# The gate is a cause of a drain like a hold is, under this name (holds are ids).
SCORE_CAUSE: Final = "score"
MAX_REASON_CHARS: Final = 200
# A validation run's reservation is this prefix and the run's id: a restarted adapter knows its
# own, and deletes those no run in flight needs.
RESERVATION_PREFIX: Final = "healthplane-"
VALIDATION_PREFIX: Final = "val-"  # eviction's validation job ids
_OUR_ALLOCATION: Final = re.compile(r"^slurm-(\d+)-\d+-")


class NodeWant(msgspec.Struct, kw_only=True):
    """What the scorer's node view says about a node: its holds, score and definition."""

    holds: list[wire.Hold] = []
    score: int | None = None
    definition: str | None = None


class Open(msgspec.Struct, kw_only=True):
    """An allocation this adapter recorded as started and not yet ended."""

    job_id: str
    node_id: str
    attempt: int  # the job's restart count in Slurm when it started


class OurDrain(msgspec.Struct, array_like=True):
    """Our drain as last seen in Slurm: when Slurm says its reason was set, and when we saw it."""

    set_at: int  # Slurm's reason_changed_at, unix seconds
    seen_at: float  # unix seconds of the observation


class Validation(msgspec.Struct, kw_only=True):
    """A validation job eviction asked for (VAL-1): its suite on ``nodes`` (node ids, in its
    steps' order), as one Slurm job; what this adapter recorded of it so far."""

    id: str
    nodes: list[str]
    suite: wire.ValidationSuite
    slurm_job: int | None = None  # the Slurm job that runs it, once a record named it
    steps: dict[str, wire.AllocationState] = {}  # node id -> the last state recorded for its step
    ended_at: datetime | None = None  # every step recorded ended

    def recorded(self, node_id: str, record_state: wire.AllocationState) -> bool:
        """Whether the step's records already say ``record_state`` or a later one."""
        return _ORDER[self.steps.get(node_id, "")] >= _ORDER[record_state]


_ORDER: Final = {"": 0, "placed": 1, "started": 2, "finished": 3, "failed": 3, "requeued": 3}


class ForeignDrain(msgspec.Struct, kw_only=True):
    """JOB-4: a drain, DOWN or FAIL someone other than Healthplane set on a Slurm node, as the
    adapter last recorded it (SCHEDULER_DRAINED): folded back from its own events."""

    node_id: str
    state: wire.SchedulerNodeState
    reason: str | None = None
    set_by: str | None = None
    set_at: int = 0  # Slurm's reason_changed_at, unix seconds


class AdapterState(msgspec.Struct, kw_only=True):
    nodes: dict[str, NodeWant] = {}  # node id -> its view (the adapter's cluster only)
    open: dict[str, Open] = {}  # allocation id -> started, not ended
    validations: dict[str, Validation] = {}  # validation job id -> the run (ended ones kept a while)
    ended: dict[str, datetime] = {}  # allocation id -> when it ended: never recorded twice
    pending: list[wire.Directive] = []  # folded, not yet settled
    answered: dict[str, bool] = {}  # terminate directive id -> accepted
    drain_below: int = 45
    drain_below_by_definition: dict[str, int] = {}
    config_version: int = 0
    # What the adapter saw in Slurm and did there. Not folded from records: a cache of Slurm's
    # own state that the snapshot keeps; lost, it is read again from Slurm at the next pass.
    our_drains: dict[str, OurDrain] = {}  # Slurm node -> our drain, as last seen
    overridden: dict[str, list[str]] = {}  # Slurm node -> causes an administrator's RESUME overrode
    job_reasons: dict[str, str] = {}  # Slurm job id -> why we requeued or cancelled it
    in_flight: dict[str, float] = {}  # directive id -> when its command went to Slurm (unix s)
    # JOB-4: Slurm node -> the drain someone else set there, as recorded (SCHEDULER_DRAINED);
    # folded from the adapter's own events, so a restart neither repeats nor loses one.
    foreign: dict[str, ForeignDrain] = {}


@dataclass(frozen=True, slots=True)
class Observation:
    """One pass's read of Slurm: every node, every job it still knows, and how the jobs we
    saw run and that left the queue since ended (``sacct``; absent when the site keeps no
    accounting)."""

    nodes: list[SlurmNode]
    jobs: list[SlurmJob]
    ended: dict[int, str]
    at: datetime
    exits: dict[int, int] = field(default_factory=dict)  # job that left the queue -> its wait status (sacct)
    reservations: frozenset[str] = frozenset()  # every reservation's name
    outputs: dict[str, str] = field(default_factory=dict)  # validation id -> its output's tail, once it ended
    # JOB-1: what accounting says of the jobs in ``ended`` (times, account), where it says it.
    accounted: dict[int, Accounted] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeNames:
    """How Slurm node names map to Healthplane node ids: ``template`` with one ``{name}``
    (identity by default; ``{name}.cluster.example`` when the agents report FQDNs)."""

    template: str = "{name}"
    # What stands before and after {name}: split once, since every pass maps every node.
    prefix: str = field(init=False)
    suffix: str = field(init=False)

    def __post_init__(self) -> None:
        if self.template.count("{name}") != 1 or "{" in self.template.replace("{name}", ""):
            raise ValueError(f"node id template must hold {{name}} exactly once (got {self.template!r})")
        prefix, _, suffix = self.template.partition("{name}")
        object.__setattr__(self, "prefix", prefix)
        object.__setattr__(self, "suffix", suffix)

    def node_id(self, name: str) -> str:
        return f"{self.prefix}{name}{self.suffix}"

    def slurm_name(self, node_id: str) -> str | None:
        """The Slurm node of ``node_id``, or ``None`` when the template cannot produce it."""
        prefix, suffix = self.prefix, self.suffix
        if len(node_id) <= len(prefix) + len(suffix) or not (node_id.startswith(prefix) and node_id.endswith(suffix)):
            return None
        return node_id[len(prefix):len(node_id) - len(suffix)]


def allocation_id(job_id: str, attempt: int, slurm_node: str) -> str:
    """One node of one run of a Slurm job; the same run on the same node is the same id."""
    return f"slurm-{job_id}-{attempt}-{slurm_node}"


def is_ours(allocation: str) -> bool:
    return allocation.startswith("slurm-")


def causes(state: AdapterState, want: NodeWant | None) -> list[str]:
    """Why a node must not take work: its hold ids, and ``score`` when POL-5 gates it."""
    if want is None:
        return []
    found = [hold.id for hold in sorted(want.holds, key=lambda h: (h.created_at, h.id))]
    threshold = gating.drain_below_for(state.drain_below, state.drain_below_by_definition, want.definition)
    if gating.gated(want.score, threshold):
        found.append(SCORE_CAUSE)
    return found


def drain_reason(prefix: str, state: AdapterState, want: NodeWant, live: list[str]) -> str:
    """Slurm's reason for our drain: our prefix, then the first cause (the hold id with its
    effect and reason, or the score and threshold), and how many more there are."""
    holds = {hold.id: hold for hold in want.holds}
    first = live[0]
    if first == SCORE_CAUSE:
        threshold = gating.drain_below_for(state.drain_below, state.drain_below_by_definition, want.definition)
        text = f"score {want.score} below drainBelow {threshold}"
    else:
        hold = holds[first]
        text = f"hold {hold.id} ({hold.effect}{': ' + hold.reason if hold.reason else ''})"
    more = f" (+{len(live) - 1} more)" if len(live) > 1 else ""
    reason = f"{prefix} {text}{more}"
    # One line, bounded: Slurm shows it in sinfo -R and scontrol show node.
    return " ".join(reason.split())[:MAX_REASON_CHARS]


def confirmed(drain: OurDrain, confirm_s: float) -> bool:
    """Whether our drain had stood in Slurm long enough to be in its saved state: slurmctld
    writes its state a few seconds after a change, so a drain younger than that can vanish
    with a controller killed -9 and is not an administrator's RESUME when it does."""
    return drain.seen_at - drain.set_at >= confirm_s


def end_reason(job: SlurmJob, slurm_state: str, down: set[str], own_reason: str | None) -> str | None:
    """What an ended allocation's record says: our own reason when we ended it, the failed
    node for NODE_FAIL, else Slurm's state and reason."""
    if own_reason is not None:
        return own_reason
    if slurm_state == "COMPLETED":
        return None
    if slurm_state == "NODE_FAIL":
        failed = sorted(set(job.node_names) & down)
        return f"NODE_FAIL: node {', '.join(failed)} failed" if failed else "NODE_FAIL: Slurm lost a node of the job"
    if slurm_state == "FAILED":
        return f"FAILED: {exit_status(job.exit_code)}"
    return f"{slurm_state}: {job.state_reason}" if job.state_reason and job.state_reason != "None" else slurm_state


def exit_status(status: int) -> str:
    """squeue's ``exit_code`` is the batch script's wait status: exit code in the high byte,
    the signal that killed it in the low bits."""
    if status & 0x7F:
        return f"killed by signal {status & 0x7F}"
    return f"exit code {status >> 8}"


# ---------------------------------------------------------------------------- Slurm's own word (JOB-4)


def foreign_drain(node: SlurmNode, prefix: str) -> ForeignDrain | None:
    """The drain, DOWN or FAIL on ``node`` that someone else set (an administrator, Slurm itself
    for a node not responding), or None: not out of service, or drained by us (our prefix).
    FAIL wins over DOWN over DRAIN: the strongest word is the one shown. A DOWN without a reason
    (a node Slurm has not heard from yet, our own resume just lifted) is nobody's word."""
    if node.reason.startswith(prefix):
        return None
    flags = {flag.upper() for flag in node.state_flags}
    base = node.state.lower()
    kind: wire.SchedulerNodeState
    if "FAIL" in flags or base in ("fail", "failing"):
        kind = "FAIL"
    elif base == "down" and node.reason:  # as the drain logic reads it: a DOWN is someone's by its reason
        kind = "DOWN"
    elif node.drained:
        kind = "DRAIN"
    else:
        return None
    return ForeignDrain(node_id="", state=kind, reason=node.reason or None,
                        set_by=node.reason_set_by_user or None, set_at=node.reason_changed_at)


def drain_message(drain: ForeignDrain, *, lifted: bool = False) -> str:
    """How a SCHEDULER_DRAINED / _UNDRAINED event and the condition read."""
    what = {"DRAIN": "drained", "DOWN": "set DOWN", "FAIL": "set FAIL"}[drain.state]
    by = f" by {drain.set_by}" if drain.set_by else ""
    if lifted:
        return f"no longer {what} in Slurm (was{by}: {drain.reason or 'no reason given'})"
    return f"{what} in Slurm{by}: {drain.reason or 'no reason given'}"


# ---------------------------------------------------------------------------- job outcomes (JOB-1)


def wait_status(status: int) -> tuple[int | None, int | None]:
    """(exit code, signal) of a wait status: a run killed by a signal has no exit code."""
    if status & 0x7F:
        return None, status & 0x7F
    return status >> 8, None


def unix(seconds: int) -> datetime | None:
    return datetime.fromtimestamp(seconds, UTC) if seconds > 0 else None


# ---------------------------------------------------------------------------- validation runs (VAL-1)


def reservation_name(run_id: str) -> str:
    return f"{RESERVATION_PREFIX}{run_id}"


def run_of_reservation(name: str) -> str | None:
    """The validation run a reservation of ours is for; None for anyone else's."""
    run_id = name.removeprefix(RESERVATION_PREFIX)
    return run_id if run_id != name and run_id.startswith(VALIDATION_PREFIX) else None


def slurm_job_of(allocation: str) -> int | None:
    """The Slurm job an allocation id of ours names (``slurm-<job>-<attempt>-<node>``)."""
    found = _OUR_ALLOCATION.match(allocation)
    return int(found[1]) if found else None


def output_path(output_dir: str, run_id: str) -> str:
    return posixpath.join(output_dir, f"{run_id}.out")


def time_limit_minutes(timeout_seconds: int) -> int:
    """Slurm's ``--time`` is whole minutes: the suite's timeout, rounded up."""
    return max(1, -(-timeout_seconds // 60))


def batch_script(command: Sequence[str], nodes: int) -> str:
    """The ``--wrap`` script: the suite's argv quoted word by word (no shell reading of its
    own), on one node as the job itself, on several once per node as one job step (a
    collective test needs every node at once; a rank that fails ends the step)."""
    launch = "srun --ntasks-per-node=1 --kill-on-bad-exit=1 " if nodes > 1 else ""
    return f"exec {launch}{shlex.join(command)}"


def sbatch_argv(run: Validation, slurm_nodes: Sequence[str], output_dir: str, partition: str | None) -> list[str]:
    """One job over the run's nodes, named after the run (how a restarted adapter finds it),
    inside the run's reservation, for the suite's timeout, its output where we read it."""
    argv = ["sbatch", "--parsable", f"--job-name={run.id}", f"--nodes={len(slurm_nodes)}",
            f"--nodelist={','.join(slurm_nodes)}", f"--reservation={reservation_name(run.id)}",
            f"--time={time_limit_minutes(run.suite.timeout_seconds)}", "--exclusive", "--no-requeue",
            f"--output={output_path(output_dir, run.id)}", f"--chdir={output_dir}"]
    if partition:
        argv.append(f"--partition={partition}")
    if run.suite.gpus:
        argv.append(f"--gres=gpu:{run.suite.gpus}")
    return [*argv, "--wrap", batch_script(run.suite.command, len(slurm_nodes))]


@dataclass(frozen=True, slots=True)
class RunEnd:
    """What an ended validation job's records say."""

    state: wire.AllocationState
    exit_code: int | None
    timed_out: bool
    reason: str | None


def run_end(slurm_state: str, status: int, state_reason: str = "") -> RunEnd:
    """A validation job's end, read from Slurm's state and the batch script's wait status. Only
    COMPLETED and FAILED carry the suite's exit status; any other end (TIMEOUT, CANCELLED,
    NODE_FAIL, …) has none, so that it is never judged as the command's own result."""
    exit_code = None if status & 0x7F else status >> 8
    said = f"{slurm_state}: {state_reason}" if state_reason and state_reason != "None" else slurm_state
    if slurm_state == "COMPLETED":
        return RunEnd("finished", 0, False, None)
    if slurm_state == "FAILED":
        # A FAILED job with exit status 0 failed to launch: no status of the command's own.
        code = exit_code if exit_code else None
        return RunEnd("failed", code, False, f"FAILED: {exit_status(status)}")
    return RunEnd("failed", None, slurm_state == "TIMEOUT", said)
