"""Remediation steps the node agent runs from its own subject (REM-2).

Eviction publishes a :class:`wire.RemediationRequest` on ``hp.remediate.{cluster}.{node}``,
a subject only that node's identity may read. The agent runs a fixed vocabulary
(``wire.AGENT_ACTIONS``) and nothing else:

* ``gpu-reset``: ``nvidia-smi -r -i N`` for each requested GPU, in turn (every NVIDIA GPU of
  the node when the request names none); the first that fails ends the step ``failed``.
  nvidia-ml-py (13.615) has no call that resets a GPU (only clocks and NVLink counters), so
  the reset is nvidia-smi's alone.
* ``reboot``: the request and the current boot id are saved in the state dir
  (:data:`PENDING_FILE`, written aside, synced and renamed), then ``systemctl reboot``. The
  outcome comes from the next boot: a new boot id proves the reboot (:func:`settle`).

Anything else is ``refused`` with one line naming what was wrong (another node's or cluster's
request, an action outside the vocabulary, a request past its time, GPUs the node does not
have); a payload without even a request id is malformed: counted and logged, never answered.
One request runs at a time (another meanwhile is refused as busy); a request id already
handled is ignored, across restarts and reboots too (:data:`HANDLED_FILE`).

The outcome (:class:`wire.RemediationOutcome`) goes in the agent's next resource report,
sent at once. Every command is found on ``PATH``, bounded by the request's timeout (its
process group killed at the end of it) and its output read bounded; its failure is a
``failed`` outcome with one clear line, never a traceback.

The first half of this module is pure (what a request means, what it runs, what an outcome
says); the second carries it out (:class:`Remediator`, :class:`HostActions`). The simulator
plugs its own :class:`Actions` into the same :class:`Remediator`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import msgspec

from healthplane.contracts import wire
from healthplane_collector import probe

Result = Literal["succeeded", "failed", "refused"]

PENDING_FILE: Final = "remediation.pending"
HANDLED_FILE: Final = "remediation.handled"
HANDLED_KEPT: Final = 64  # request ids remembered: far more than one node's ladder ever sends at once
REASON_MAX_CHARS: Final = 300
ACTION_MAX_CHARS: Final = 64
NVIDIA_SMI: Final = "nvidia-smi"
SYSTEMCTL: Final = "systemctl"


# ---------------------------------------------------------------------------- pure


@dataclass(frozen=True, slots=True)
class Malformed:
    """A payload with no request id to answer: counted and logged only."""

    reason: str


@dataclass(frozen=True, slots=True)
class Refusal:
    """A payload that names a request id but is not a request this agent runs."""

    request_id: str
    action: str
    reason: str


class _Loose(msgspec.Struct, rename="camel"):
    """What can still be read of a request that does not decode: enough to answer it."""

    id: Any = None
    action: Any = None


class PendingReboot(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``PENDING_FILE``: a reboot asked of ``systemctl``, settled at the next start."""

    request: wire.RemediationRequest
    boot_id_before: str


def one_line(text: str, limit: int = REASON_MAX_CHARS) -> str:
    """``text`` as one line of at most ``limit`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def read_request(payload: bytes) -> wire.RemediationRequest | Refusal | Malformed:
    """The request in ``payload``; a :class:`Refusal` when it has an id but is not a request
    in this agent's vocabulary; :class:`Malformed` when it has no id to answer."""
    try:
        return wire.decode(wire.RemediationRequest, payload)
    except wire.WireError as exc:
        why = one_line(str(exc))
    try:
        loose = msgspec.json.decode(payload, type=_Loose)
    except msgspec.DecodeError:
        return Malformed(why)
    if not isinstance(loose.id, str) or not loose.id:
        return Malformed(why)
    action = one_line(loose.action, ACTION_MAX_CHARS) if isinstance(loose.action, str) else ""
    if action not in wire.AGENT_ACTIONS:
        shown = repr(action) if action else "none"
        return Refusal(loose.id, action, f"unknown action {shown}: this agent runs only {', '.join(wire.AGENT_ACTIONS)}")
    return Refusal(loose.id, action, why)


def _utc(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _listed(indices: Iterable[int]) -> str:
    shown = sorted(indices)
    return ", ".join(str(i) for i in shown) if shown else "none"


def refusal(request: wire.RemediationRequest, node_id: str, cluster: str, now: datetime,
            gpus_on_node: Sequence[int], boot_id: str | None) -> str | None:
    """Why this node will not run ``request``, in one line; ``None`` when it will.

    ``gpus_on_node``: the node's NVIDIA GPU indices (NVML's order, ``nvidia-smi -i``'s);
    ``boot_id``: the current boot's, without which a reboot could not be proven."""
    if request.node_id != node_id:
        return f"the request is for node {request.node_id!r}, not this node ({node_id})"
    if request.cluster != cluster:
        return f"the request is for cluster {request.cluster!r}, not this node's ({cluster})"
    if request.timeout_seconds <= 0:
        return f"timeoutSeconds must be positive, not {request.timeout_seconds}"
    requested_at = _utc(request.requested_at)
    if (now - requested_at).total_seconds() > request.timeout_seconds:  # no overflow, whatever the numbers
        return (f"expired: requested at {wire.rfc3339(requested_at)} with {request.timeout_seconds} s to run, "
                f"received at {wire.rfc3339(now)}")
    if request.action == "gpu-reset":
        if request.gpus is None:
            if not gpus_on_node:
                return "no NVIDIA GPU on this node to reset"
        elif not request.gpus:
            return "gpus is empty: name the GPUs to reset, or leave it out for every GPU"
        else:
            missing = set(request.gpus) - set(gpus_on_node)
            if missing:
                return f"no GPU {_listed(missing)} on this node (its NVIDIA GPUs: {_listed(gpus_on_node)})"
    if request.action == "reboot" and boot_id is None:
        return "this node has no boot id (/proc/sys/kernel/random/boot_id): a reboot could not be proven"
    return None


def reset_targets(request: wire.RemediationRequest, gpus_on_node: Sequence[int]) -> list[int]:
    """The GPUs a ``gpu-reset`` resets, in order, each once."""
    if request.gpus is None:
        return sorted(set(gpus_on_node))
    return list(dict.fromkeys(request.gpus))


def gpu_reset_argv(gpu: int) -> list[str]:
    return [NVIDIA_SMI, "-r", "-i", str(gpu)]


def reboot_argv() -> list[str]:
    return [SYSTEMCTL, "reboot"]


def last_line(output: bytes) -> str | None:
    """The last line with something on it, as one bounded line."""
    for line in reversed(output.decode("utf-8", "replace").splitlines()):
        if line.strip():
            return one_line(line)
    return None


def command_failure(argv: Sequence[str], returncode: int, stdout: bytes, stderr: bytes) -> str:
    """A command's failure in one line: how it ended and the last thing it said (stderr first)."""
    said = last_line(stderr) or last_line(stdout)
    ended = f"was killed by signal {-returncode}" if returncode < 0 else f"exited with {returncode}"
    return one_line(f"{' '.join(argv)} {ended}" + (f": {said}" if said else ""))


def gpus_reset(gpus: Sequence[int]) -> str:
    return f"GPU {gpus[0]} reset" if len(gpus) == 1 else f"GPUs {', '.join(map(str, gpus))} reset"


def outcome(request_id: str, action: str, result: Result, reason: str, now: datetime,
            boot_id_before: str | None = None, boot_id: str | None = None) -> wire.RemediationOutcome:
    return wire.RemediationOutcome(request_id=request_id, action=action, result=result, reason=one_line(reason),
                                   finished_at=now, boot_id_before=boot_id_before, boot_id=boot_id)


def settle(pending: PendingReboot, boot_id: str | None, now: datetime) -> wire.RemediationOutcome:
    """A reboot asked for before this start: a new boot id proves it happened."""
    before = pending.boot_id_before
    request = pending.request
    if boot_id is None:
        return outcome(request.id, request.action, "failed",
                       f"no boot id to compare with {before}: the reboot could not be proven", now, before, None)
    if boot_id != before:
        return outcome(request.id, request.action, "succeeded", f"rebooted: boot id {before} → {boot_id}",
                       now, before, boot_id)
    return outcome(request.id, request.action, "failed", "boot id unchanged: the reboot did not happen",
                   now, before, boot_id)


def remember(handled: Sequence[str], request_id: str, kept: int = HANDLED_KEPT) -> tuple[str, ...]:
    """``handled`` with ``request_id`` last, the oldest dropped beyond ``kept``."""
    return (*(i for i in handled if i != request_id), request_id)[-kept:]


def metric_action(action: str) -> str:
    """The ``action`` label: the vocabulary, anything else ``other`` (a label set stays bounded)."""
    return action if action in wire.AGENT_ACTIONS else "other"


# ---------------------------------------------------------------------------- state dir


def write_atomically(path: Path, data: bytes) -> None:
    """Written aside, synced, renamed, the directory synced: what a reboot that follows at
    once finds is the whole file or the one before, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(path.name + ".tmp")
    with open(aside, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(aside, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def save_pending(state_dir: Path, pending: PendingReboot) -> None:
    write_atomically(state_dir / PENDING_FILE, msgspec.json.encode(pending))


def take_pending(state_dir: Path) -> PendingReboot | str | None:
    """The pending reboot, removed from the state dir; ``None`` when there is none, a line
    saying why when the file cannot be read (it is removed all the same: settled once)."""
    path = state_dir / PENDING_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    try:
        path.unlink()
    except OSError as exc:
        return f"cannot remove {path}: {exc.strerror or exc}"  # else every start would settle it again
    try:
        return msgspec.json.decode(data, type=PendingReboot)
    except msgspec.DecodeError as exc:
        return f"{path} is not a pending reboot: {one_line(str(exc))}"


def load_handled(state_dir: Path) -> tuple[str, ...]:
    try:
        ids = msgspec.json.decode((state_dir / HANDLED_FILE).read_bytes(), type=list[str])
    except (OSError, msgspec.DecodeError):
        return ()
    return tuple(ids[-HANDLED_KEPT:])


def save_handled(state_dir: Path, handled: Sequence[str]) -> None:
    write_atomically(state_dir / HANDLED_FILE, msgspec.json.encode(list(handled)))


# ---------------------------------------------------------------------------- carrying it out


class Actions(Protocol):
    """How a node carries out the vocabulary: the machine (:class:`HostActions`) or the simulator."""

    async def gpu_reset(self, gpus: Sequence[int], within_s: float) -> str | None:
        """Reset ``gpus`` in turn; ``None`` when every one was reset, else why not (one line)."""
        ...

    async def reboot(self, pending: PendingReboot, within_s: float) -> str | None:
        """Start a reboot; ``None`` when it is under way (its outcome comes from the next
        boot), else why it could not be started (one line)."""
        ...


async def run_command(argv: Sequence[str], timeout_s: float) -> str | None:
    """Run ``argv`` (its program found on ``PATH``); ``None`` on exit 0, else one line."""
    shown = " ".join(argv)
    binary = shutil.which(argv[0])
    if binary is None:
        return f"{argv[0]} not found on PATH"
    if timeout_s <= 0:
        return f"no time left to run {shown}"
    try:
        done = await probe.run_probe([binary, *argv[1:]], timeout_s, probe.OUTPUT_KEPT_BYTES)
    except probe.TimedOut:
        return f"{shown} timed out after {timeout_s:.3g} s and was killed"
    except OSError as exc:
        return f"cannot run {binary}: {exc.strerror or exc}"
    if done.returncode != 0:
        return command_failure(argv, done.returncode, done.stdout, done.stderr)
    return None


class HostActions:
    """This machine: ``nvidia-smi -r`` and ``systemctl reboot``, under the request's timeout."""

    def __init__(self, state_dir: Path,
                 run: Callable[[Sequence[str], float], Awaitable[str | None]] = run_command) -> None:
        self.state_dir = state_dir
        self._run = run

    async def gpu_reset(self, gpus: Sequence[int], within_s: float) -> str | None:
        deadline = time.monotonic() + within_s
        for done, gpu in enumerate(gpus):
            failure = await self._run(gpu_reset_argv(gpu), deadline - time.monotonic())
            if failure is not None:
                return failure + (f" ({gpus_reset(gpus[:done])} before it)" if done else "")
        return None

    async def reboot(self, pending: PendingReboot, within_s: float) -> str | None:
        try:
            save_pending(self.state_dir, pending)
        except OSError as exc:  # without it the next boot could not say the reboot happened
            return f"cannot save the pending reboot in {self.state_dir}: {exc.strerror or exc}"
        failure = await self._run(reboot_argv(), within_s)
        if failure is not None:
            try:
                (self.state_dir / PENDING_FILE).unlink()
            except OSError:
                pass  # the next start settles it "unchanged": failed, as this one
        return failure


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What judging a request needs of the node now."""

    gpus: tuple[int, ...]  # NVIDIA GPU indices
    boot_id: str | None


class Remediator:
    """One node's side of REM-2: judges each payload of its remediation subject, runs at most
    one request at a time through ``actions``, and hands every outcome to ``report`` (the
    collector, which sends it in a resource report at once).

    ``state_dir`` keeps the handled request ids across restarts (``None``: in memory, the
    simulator). ``count(action, result)`` and ``reject(reason)`` are the metrics."""

    def __init__(self, node_id: str, cluster: str, actions: Actions, facts: Callable[[], NodeFacts],
                 report: Callable[[wire.RemediationOutcome], None], log: Any,
                 count: Callable[[str, str], None], reject: Callable[[], None],
                 state_dir: Path | None = None) -> None:
        self.node_id, self.cluster = node_id, cluster
        self.actions, self.facts, self.log = actions, facts, log
        self._report, self._count, self._reject = report, count, reject
        self.state_dir = state_dir
        self.handled: tuple[str, ...] = load_handled(state_dir) if state_dir is not None else ()
        self.running: wire.RemediationRequest | None = None
        self._task: asyncio.Task[None] | None = None

    def report(self, done: wire.RemediationOutcome) -> None:
        self._count(metric_action(done.action), done.result)
        log = self.log.bind(request_id=done.request_id, action=done.action, result=done.result, reason=done.reason)
        (log.warning if done.result != "succeeded" else log.info)("remediation outcome")
        self._report(done)

    def take(self, payload: bytes, now: datetime) -> None:
        """One payload of the subject: judged at once; a request to run starts a task."""
        read = read_request(payload)
        if isinstance(read, Malformed):
            self._reject()
            self.log.warning("remediation request malformed; ignored", reason=read.reason, bytes=len(payload))
            return
        request_id = read.request_id if isinstance(read, Refusal) else read.id
        if request_id in self.handled:
            self.log.info("remediation request already handled; ignored", request_id=request_id)
            return
        self._remember(request_id)
        if isinstance(read, Refusal):
            self.report(outcome(read.request_id, read.action, "refused", read.reason, now))
            return
        facts = self.facts()
        why = refusal(read, self.node_id, self.cluster, now, facts.gpus, facts.boot_id)
        if why is None and self.running is not None:
            why = f"busy: remediation {self.running.id} ({self.running.action}) is running"
        if why is not None:
            self.report(outcome(read.id, read.action, "refused", why, now))
            return
        self.running = read
        self.log.info("remediation started", request_id=read.id, action=read.action, attempt=read.attempt,
                      gpus=read.gpus, timeout_s=read.timeout_seconds)
        self._task = asyncio.create_task(self._run(read, facts))

    def _remember(self, request_id: str) -> None:
        self.handled = remember(self.handled, request_id)
        if self.state_dir is None:
            return
        try:
            save_handled(self.state_dir, self.handled)
        except OSError as exc:  # the request still runs; a restart could run it again
            self.log.warning("cannot save handled remediation ids", state_dir=str(self.state_dir),
                             error=exc.strerror or str(exc))

    async def _run(self, request: wire.RemediationRequest, facts: NodeFacts) -> None:
        try:
            if request.action == "gpu-reset":
                gpus = reset_targets(request, facts.gpus)
                failure = await self.actions.gpu_reset(gpus, float(request.timeout_seconds))
                self.report(outcome(request.id, request.action, "failed" if failure else "succeeded",
                                    failure or gpus_reset(gpus), datetime.now(UTC)))
            else:
                assert facts.boot_id is not None  # refusal() saw to it
                pending = PendingReboot(request=request, boot_id_before=facts.boot_id)
                failure = await self.actions.reboot(pending, float(request.timeout_seconds))
                if failure is None:
                    self.log.info("reboot under way; its outcome comes from the next boot", request_id=request.id,
                                  boot_id_before=facts.boot_id)
                else:
                    self.report(outcome(request.id, request.action, "failed", failure, datetime.now(UTC),
                                        facts.boot_id, facts.boot_id))
        except Exception as exc:  # a bug of ours is still one failed outcome, never a dead task
            self.report(outcome(request.id, request.action, "failed", f"{type(exc).__name__}: {exc}",
                                datetime.now(UTC)))
        finally:
            self.running = None

    def settle_pending(self, boot_id: str | None, now: datetime) -> None:
        """At start: a reboot asked for before it is settled and reported (and forgotten)."""
        if self.state_dir is None:
            return
        pending = take_pending(self.state_dir)
        if isinstance(pending, str):
            self.log.warning("pending reboot unreadable; not settled", reason=pending)
        elif pending is not None:
            self.report(settle(pending, boot_id, now))

    async def close(self) -> None:
        """Stop a step in hand (its command's process group is killed); no outcome for it."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
