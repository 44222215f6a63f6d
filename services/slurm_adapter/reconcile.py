"""``healthplane service slurm-adapter``: Healthplane's decisions on a real Slurm (SLU-1..5).

Settings come from the environment, as everything a container is given (docs/slurm.md):
``HEALTHPLANE_SLURM_CLUSTER`` (the Healthplane cluster this Slurm cluster is, default
``default``), ``HEALTHPLANE_SLURM_NODE_ID`` (how a Slurm node name maps to a node id, a
template with ``{name}``, default ``{name}``), ``HEALTHPLANE_SLURM_BIN_DIR`` (where scontrol,
sinfo, squeue, scancel and sacct are, default: PATH), ``HEALTHPLANE_SLURM_INTERVAL_SECONDS``
(reconcile interval, default 10), ``HEALTHPLANE_SLURM_REASON_PREFIX`` (the drain reason
prefix that marks a drain as ours, default ``healthplane:``),
``HEALTHPLANE_SLURM_COMMAND_TIMEOUT_SECONDS`` (default 15), ``HEALTHPLANE_SLURM_MAX_REQUEUE``
(the retry budget of a requeueable job, default 5, Slurm's MaxBatchRequeue) and
``HEALTHPLANE_SLURM_CONFIRM_SECONDS`` (how long our drain must have stood before its
disappearance counts as an administrator's RESUME, default 10),
``HEALTHPLANE_SLURM_OUTPUT_DIR`` (where validation runs write their output and the adapter
reads it: on a real site a filesystem the nodes and the adapter both see, default
``/var/lib/healthplane/slurm-adapter/validation``) and
``HEALTHPLANE_SLURM_VALIDATION_PARTITION`` (the partition validation runs are submitted to,
default Slurm's default partition). ``SLURM_CONF`` reaches the commands like any Slurm client's.
"""
from __future__ import annotations

import asyncio
import os
import pwd
import time
from datetime import UTC, datetime
from typing import Any

import pydantic
from prometheus_client import Counter, Gauge, Histogram

from healthplane.contracts import wire
from healthplane.runtime.backoff import Backoff
from healthplane.runtime.fold import Step
from healthplane.runtime.processor import Processor, tell
from healthplane.runtime.settings import EnvSettings
from healthplane_slurm_adapter.fold import (
    SERVICE,
    Action,
    AdapterCore,
    Cancel,
    CancelRun,
    Drain,
    Outcome,
    Pass,
    PowerDown,
    Requeue,
    Reserve,
    Resume,
    Submit,
    Unreserve,
)
from healthplane_slurm_adapter.records import SlurmError
from healthplane_slurm_adapter.rules import ENDED, AdapterState, NodeNames, Observation, output_path
from healthplane_slurm_adapter.slurm import Slurm, read_tail

COMMANDS = Counter("healthplane_slurm_commands_total",
                   "Slurm commands the adapter ran, by command and result (ok, retry: Slurm unreachable or "
                   "slow, refused: Slurm said no)", ["command", "result"])
PASSES = Counter("healthplane_slurm_reconcile_passes_total",
                 "Reconcile passes, by result (ok, or failed: Slurm could not be read)", ["result"])
PASS_SECONDS = Histogram("healthplane_slurm_reconcile_seconds",
                         "One reconcile pass: read Slurm, decide, run the commands",
                         buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
REACHABLE = Gauge("healthplane_slurm_up", "1 when the last pass could read Slurm, else 0")
OUR_DRAINS = Gauge("healthplane_slurm_drained_nodes", "Slurm nodes drained by Healthplane (reason with our prefix)")


class Settings(EnvSettings):
    PREFIX = "HEALTHPLANE_SLURM_"
    cluster: str = pydantic.Field("default", min_length=1, alias="CLUSTER")
    node_id: str = pydantic.Field("{name}", alias="NODE_ID")
    bin_dir: str | None = pydantic.Field(None, alias="BIN_DIR")
    interval_seconds: float = pydantic.Field(10.0, ge=0.2, le=3600, alias="INTERVAL_SECONDS")
    reason_prefix: str = pydantic.Field("healthplane:", min_length=1, max_length=40, alias="REASON_PREFIX")
    command_timeout_seconds: float = pydantic.Field(15.0, ge=1, le=300, alias="COMMAND_TIMEOUT_SECONDS")
    max_requeue: int = pydantic.Field(5, ge=0, le=1000, alias="MAX_REQUEUE")
    confirm_seconds: float = pydantic.Field(10.0, ge=0, le=3600, alias="CONFIRM_SECONDS")
    output_dir: str = pydantic.Field("/var/lib/healthplane/slurm-adapter/validation", min_length=1,
                                     alias="OUTPUT_DIR")
    validation_partition: str | None = pydantic.Field(None, min_length=1, alias="VALIDATION_PARTITION")

    @pydantic.field_validator("node_id")
    @classmethod
    def _template(cls, value: str) -> str:
        NodeNames(value)  # raises naming what is wrong
        return value

    @pydantic.field_validator("output_dir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not os.path.isabs(value):  # the job's working directory on the node, and ours: one path for both
            raise ValueError(f"must be an absolute path (got {value!r})")
        return os.path.normpath(value)


def core_from(settings: Settings) -> AdapterCore:
    return AdapterCore(settings.cluster, NodeNames(settings.node_id), reason_prefix=settings.reason_prefix,
                       max_requeue=settings.max_requeue, confirm_s=settings.confirm_seconds,
                       output_dir=settings.output_dir, partition=settings.validation_partition, user=_user())


def _user() -> str:
    """Who this process is, by name: validation runs are submitted as this user and their
    reservations are for it. A uid with no passwd entry (a container's) goes by its number."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return "root" if os.getuid() == 0 else str(os.getuid())


async def obey(slurm: Slurm, action: Action) -> int | None:
    """Runs the action's Slurm command; a submission returns its Slurm job id."""
    match action:
        case Drain(node, reason):
            await slurm.drain(node, reason)
        case Resume(node):
            await slurm.resume(node)
        case Requeue(job_id, _):
            await slurm.requeue(job_id)
        case Cancel(job_id, _):
            await slurm.cancel(job_id)
        case PowerDown(node, _):
            await slurm.power_down(node)
        case Reserve(name, nodes, user):
            await slurm.reserve(name, nodes, user)
        case Unreserve(name):
            await slurm.unreserve(name)
        case Submit(_, argv, output_dir):
            try:  # a shared filesystem that hangs holds up a thread, never the pass
                await asyncio.wait_for(asyncio.to_thread(os.makedirs, output_dir, exist_ok=True), slurm.timeout_s)
            except TimeoutError:
                raise SlurmError("sbatch", f"cannot create the output directory {output_dir}: no answer within "
                                 f"{slurm.timeout_s:g} s", transient=True) from None
            except OSError as exc:
                raise SlurmError("sbatch", f"cannot create the output directory {output_dir}: "
                                 f"{exc.strerror or exc}", transient=False) from None
            return await slurm.submit(argv)
        case CancelRun(job_id, _):
            await slurm.cancel(job_id)
    return None


class Reconciler:
    """Every interval, once the fold is caught up: read Slurm, let the core decide, run its
    commands, fold their results back. A pass that cannot read Slurm, or whose commands could
    not reach it, is tried again with backoff; nothing it decided is lost, since the next pass
    decides it again from the state (level-based)."""

    def __init__(self, proc: Processor[AdapterState], core: AdapterCore, slurm: Slurm, settings: Settings,
                 log: Any) -> None:
        self.proc, self.core, self.slurm, self.settings, self.log = proc, core, slurm, settings, log
        self._stopping = asyncio.Event()
        self._backoff = Backoff(min(1.0, settings.interval_seconds), max(60.0, settings.interval_seconds), jitter=0.2)
        self._last_error: str | None = None

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        delay = 0.0
        while not self._stopping.is_set():
            try:
                await asyncio.wait_for(self._stopping.wait(), delay)
                return
            except TimeoutError:
                pass
            if not self.proc.caught_up:
                delay = 0.2
                continue
            started = time.perf_counter()
            healthy = await self.once()
            PASS_SECONDS.observe(time.perf_counter() - started)
            delay = self.settings.interval_seconds if healthy else self._backoff.next()
            if healthy:
                self._backoff.reset()

    async def once(self) -> bool:
        """One pass; False when Slurm could not be read or a command could not reach it."""
        try:
            seen = await self._observe()
        except SlurmError as exc:
            PASSES.labels("failed").inc()
            REACHABLE.set(0)
            self._say_error(f"cannot read Slurm: {exc}", exc)
            return False
        REACHABLE.set(1)
        decided: list[Pass] = []

        def decide(state: AdapterState, now: datetime) -> Step[AdapterState]:
            state, found = self.core.reconcile(state, seen, now)
            decided.append(found)
            return Step(state, found.emits)

        if not await self.proc.act(decide):
            return True  # rebuilding: the next pass decides
        [found] = decided
        tell(SERVICE, self.log, found.notes)
        outcomes: list[Outcome] = []
        for action in found.actions:
            outcomes.append((action, await self._run(action)))
        if outcomes:
            await self.proc.act(lambda state, now: self.core.settle(state, outcomes, now))
        OUR_DRAINS.set(sum(1 for node in seen.nodes if node.drained and node.reason.startswith(self.core.prefix)))
        PASSES.labels("ok").inc()
        if not any(error is not None and error.transient for _, error in outcomes):
            self._last_error = None
            return True
        return False

    async def _observe(self) -> Observation:
        nodes = await self.slurm.nodes()
        jobs = await self.slurm.jobs()
        reservations = await self.slurm.reservations()
        state = self.proc.state
        listed = {str(job.job_id) for job in jobs}
        runs = [run for run in state.validations.values() if run.ended_at is None]
        gone = sorted({int(a.job_id) for a in state.open.values() if a.job_id not in listed and a.job_id.isdigit()}
                      | {run.slurm_job for run in runs if run.slurm_job is not None and str(run.slurm_job) not in listed})
        accounted = await self.slurm.accounted(gone) if gone else {}
        # A run's output once its job has ended (or left the queue), read after squeue said so.
        over = {job.name for job in jobs if job.job_state.upper() in ENDED}
        outputs: dict[str, str] = {}
        for run in runs:
            if run.id in over or (run.slurm_job is not None and str(run.slurm_job) not in listed):
                tail = await self._output(output_path(self.settings.output_dir, run.id))
                if tail is not None:
                    outputs[run.id] = tail
        return Observation(nodes, jobs, {job: found.state for job, found in accounted.items()}, datetime.now(UTC),
                           exits={job: found.status for job, found in accounted.items()},
                           reservations=reservations, outputs=outputs, accounted=accounted)

    async def _output(self, path: str) -> str | None:
        """The tail of a run's output file, bounded in bytes and in time (a shared filesystem
        that hangs holds up a thread, never the pass): None when it cannot be read."""
        try:
            async with asyncio.timeout(self.settings.command_timeout_seconds):
                return await asyncio.to_thread(read_tail, path, wire.OUTPUT_TAIL_BYTES)
        except (TimeoutError, OSError) as exc:
            self.log.warning("cannot read validation output", path=path, error=str(exc) or "timed out")
            return None

    async def _run(self, action: Action) -> SlurmError | None:
        command = type(action).__name__.lower()
        try:
            job_id = await obey(self.slurm, action)
        except SlurmError as exc:
            COMMANDS.labels(command, "retry" if exc.transient else "refused").inc()
            self._say_error(f"slurm {command} failed", exc, action=repr(action))
            return exc
        COMMANDS.labels(command, "ok").inc()
        self.log.info("slurm command", command=command, action=repr(action),
                      **({"slurm_job": job_id} if job_id is not None else {}))
        return None

    def _say_error(self, event: str, exc: SlurmError, **fields: object) -> None:
        """Each distinct failure once: Slurm down for an hour is one line, not one a pass."""
        if str(exc) != self._last_error:
            self._last_error = str(exc)
            self.log.warning(event, error=str(exc), transient=exc.transient, **fields)
