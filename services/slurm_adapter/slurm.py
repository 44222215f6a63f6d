"""Slurm's own interfaces, as the adapter uses them (SLU-1): ``sinfo --json`` for the nodes,
``squeue --json`` for the jobs, ``sacct`` for the end of a job that left the queue,
``scontrol show reservation`` for our reservations, ``scontrol update`` / ``scontrol requeue`` /
``scancel`` for what the control plane decided, and ``scontrol create|delete reservation`` with
``sbatch`` for validation runs (VAL-1), whose output file it reads back, bounded.

Why the commands and not slurmrestd: every Slurm site has the commands, with the site's own
authentication (munge) already working; slurmrestd is an extra daemon with its own JWT or
socket auth that many sites do not run. Slurm 22.05's ``scontrol`` has no ``--json`` (23.02
added it), but ``sinfo --json`` carries every node field the adapter needs (state, flags,
reason, who set it and when), and costs 55 ms for 1,000 nodes (docs/slurm.md, measured).

Slurm is a peer we do not control: every command runs with a timeout and a bound on what it
may print, and its answer is parsed with typed decoders that refuse what does not fit. A
failure is a :class:`SlurmError` whose ``transient`` says whether trying again may help
(the controller is down or slow) or not (Slurm refused the request).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

import msgspec

from healthplane_slurm_adapter.records import (
    Accounted,
    SlurmError,
    SlurmJob,
    SlurmNode,
)

T = TypeVar("T")
MAX_OUTPUT_BYTES: Final = 64 * 1024 * 1024  # sinfo --json is ~1.2 KB per node: 50k nodes fit
# What Slurm's clients print when the controller cannot be reached or is busy: worth a retry.
_TRANSIENT: Final = ("unable to contact slurm controller", "socket timed out", "connection refused",
                     "slurm backup controller in standby", "resource temporarily unavailable",
                     "connect failure", "zero bytes were transmitted", "communication connection failure")


class _Problem(msgspec.Struct):
    description: str = ""
    source: str = ""
    error: str = ""


class _Nodes(msgspec.Struct):
    nodes: list[SlurmNode] = []
    errors: list[_Problem] = []


class _Jobs(msgspec.Struct):
    jobs: list[SlurmJob] = []
    errors: list[_Problem] = []


# ``sacct --json`` (JOB-1): Slurm 22.05's shape (openapi dbv0.0.38: a state and an exit status
# as strings, ``return_code`` and ``signal.signal_id`` as numbers) and 23.02's on (v0.0.39+:
# lists of flags, numbers as ``{"set", "infinite", "number"}``) decode into the same structs.
class _Number(msgspec.Struct):
    set: bool = True
    infinite: bool = False
    number: int = 0


class _Signal(msgspec.Struct):
    signal_id: int | None = None  # 22.05
    id: int | _Number | None = None  # 23.02+
    name: str = ""


class _ExitCode(msgspec.Struct):
    status: str | list[str] = ""
    return_code: int | _Number | None = None
    signal: _Signal | None = None


class _SacctState(msgspec.Struct, frozen=True):
    current: str | list[str] = ""
    reason: str = ""


class _SacctTime(msgspec.Struct, frozen=True):
    start: int = 0
    end: int = 0
    elapsed: int = 0


class _SacctJob(msgspec.Struct):
    job_id: int
    state: _SacctState = _SacctState()
    exit_code: _ExitCode | None = None
    time: _SacctTime = _SacctTime()
    account: str = ""
    user: str = ""
    partition: str = ""
    allocation_nodes: int = 0


class _Sacct(msgspec.Struct):
    jobs: list[_SacctJob] = []
    errors: list[_Problem] = []


_NODES_DECODER: Final = msgspec.json.Decoder(_Nodes)
_JOBS_DECODER: Final = msgspec.json.Decoder(_Jobs)
_SACCT_DECODER: Final = msgspec.json.Decoder(_Sacct)


@dataclass(frozen=True, slots=True)
class Ran:
    returncode: int
    stdout: bytes
    stderr: str


_RESERVATION_NAME: Final = re.compile(r"^ReservationName=(\S+)")
_EXIT_CODE: Final = re.compile(r"^(\d+):(\d+)$")  # sacct's ExitCode: "<exit code>:<signal>"


def _number(value: int | _Number | None) -> int | None:
    if isinstance(value, _Number):
        return value.number if value.set and not value.infinite else None
    return value


def _first(value: str | list[str]) -> str:
    return (value[0] if value else "") if isinstance(value, list) else value


def parse_sacct_json(data: bytes) -> dict[int, Accounted]:
    """``sacct --json -X``'s jobs, each as it ended: its state (CANCELLED for "CANCELLED by 0"),
    its wait status (exit code in the high byte, the killing signal in the low bits, as squeue's
    ``exit_code``), when it ran and whose it was. A job run several times (requeued) is its last
    run. Output that is not that shape is a non-transient :class:`SlurmError` naming the field."""
    found = _decode(_SACCT_DECODER, data, "sacct --json")
    _refuse_errors("sacct --json", found.errors)
    out: dict[int, Accounted] = {}
    for job in found.jobs:
        state = _first(job.state.current).split(" ")[0].upper()
        if not state:
            continue
        code, signal_number = 0, 0
        if job.exit_code is not None:
            code = _number(job.exit_code.return_code) or 0
            if job.exit_code.signal is not None:
                said = job.exit_code.signal
                signal_number = (said.signal_id if said.signal_id is not None else _number(said.id)) or 0
        status = (code & 0xFF) << 8 | (signal_number & 0x7F)
        out[job.job_id] = Accounted(state, status, started_at=job.time.start, ended_at=job.time.end,
                                    account=job.account, user=job.user, partition=job.partition,
                                    size=job.allocation_nodes)
    return out


def transient(message: str) -> bool:
    lowered = message.lower()
    return any(marker in lowered for marker in _TRANSIENT)


class Slurm:
    """Runs Slurm's client commands found in ``bin_dir`` (or on PATH), with ``environ``
    (``SLURM_CONF`` when the site keeps its config elsewhere)."""

    def __init__(self, bin_dir: str | None = None, *, timeout_s: float = 15.0,
                 environ: Mapping[str, str] | None = None,
                 notice: Callable[[str, dict[str, object]], None] | None = None) -> None:
        self.bin_dir = bin_dir
        self.timeout_s = timeout_s
        self.environ = dict(os.environ if environ is None else environ)
        # Where what the site's Slurm lacks is said (no accounting, sacct's JSON not readable):
        # once per kind, a lasting condition is one log line, not one a pass.
        self._notice = notice
        self._noticed: set[str] = set()

    def _say_once(self, kind: str, event: str, **fields: object) -> None:
        if kind not in self._noticed:
            self._noticed.add(kind)
            if self._notice is not None:
                self._notice(event, fields)

    def _path(self, program: str) -> str:
        return os.path.join(self.bin_dir, program) if self.bin_dir else program

    async def run(self, argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Ran:
        """One command, bounded in time and in what it prints; killed (its process group)
        when it overruns. Raises a transient :class:`SlurmError` when it cannot run or
        overran."""
        shown = " ".join(argv[:2])
        try:
            process = await asyncio.create_subprocess_exec(
                self._path(argv[0]), *argv[1:], stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=dict(self.environ if environ is None else environ), start_new_session=True)
        except OSError as exc:
            raise SlurmError(shown, f"cannot run {self._path(argv[0])}: {exc.strerror or exc}",
                             transient=True) from None
        try:
            async with asyncio.timeout(self.timeout_s):
                stdout, stderr = await asyncio.gather(_read_bounded(process.stdout, shown),
                                                      _read_bounded(process.stderr, shown))
                returncode = await process.wait()
        except (TimeoutError, SlurmError) as exc:
            _kill(process)
            await process.wait()
            if isinstance(exc, SlurmError):
                raise
            raise SlurmError(shown, f"no answer within {self.timeout_s:g} s", transient=True) from None
        return Ran(returncode, stdout, stderr.decode("utf-8", "replace").strip())

    async def _checked(self, argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Ran:
        ran = await self.run(argv, environ)
        if ran.returncode != 0:
            said = ran.stderr or ran.stdout.decode("utf-8", "replace").strip() or f"exit status {ran.returncode}"
            raise SlurmError(" ".join(argv[:2]), said.splitlines()[-1], transient=transient(said))
        return ran

    # ------------------------------------------------------------------ reading

    async def nodes(self) -> list[SlurmNode]:
        ran = await self._checked(["sinfo", "--json"])
        found = _decode(_NODES_DECODER, ran.stdout, "sinfo --json")
        _refuse_errors("sinfo --json", found.errors)
        # sinfo lists a node once per partition it is in.
        return list({node.name: node for node in found.nodes}.values())

    async def jobs(self) -> list[SlurmJob]:
        """Every job Slurm still knows, ended ones included (kept for ``MinJobAge``)."""
        ran = await self._checked(["squeue", "--json", "--states", "all"])
        found = _decode(_JOBS_DECODER, ran.stdout, "squeue --json")
        # squeue exits 0 with an error list when the controller cannot be reached.
        _refuse_errors("squeue --json", found.errors)
        return found.jobs

    async def ended(self, job_ids: Sequence[int]) -> dict[int, str]:
        """How jobs that left the queue ended (their state), from accounting; see :meth:`accounted`."""
        return {job: found.state for job, found in (await self.accounted(job_ids)).items()}

    async def accounted(self, job_ids: Sequence[int]) -> dict[int, Accounted]:
        """How jobs that left the queue ended, from accounting (slurmdbd), else from the job
        completion log (``JobCompType=jobcomp/filetxt``, ``sacct -c``); ``{}`` when the
        site keeps neither."""
        if not job_ids:
            return {}
        ids = ",".join(str(j) for j in job_ids)
        # JOB-1: slurmdbd's accounting as JSON first (state, exit status, times, account).
        try:
            ran = await self._checked(["sacct", "--json", "-X", "-j", ids])
            return parse_sacct_json(ran.stdout)
        except SlurmError as exc:
            if exc.transient:
                raise
            self._say_once("sacct_json", "sacct --json unavailable; reading accounting as text", error=str(exc))
        for argv in (["sacct", "-X", "-P", "-n", "-j", ids, "-o", "JobIDRaw,State,ExitCode"],
                     ["sacct", "-c", "-P", "-n", "-j", ids, "-o", "JobID,State,ExitCode"]):
            try:
                ran = await self._checked(argv)
            except SlurmError as exc:
                if exc.transient:
                    raise
                continue
            found: dict[int, Accounted] = {}
            for line in ran.stdout.decode("utf-8", "replace").splitlines():
                job, _, rest = line.partition("|")
                state, _, exit_code = rest.partition("|")
                if job.strip().isdigit() and state.strip():
                    # "CANCELLED by 0" -> CANCELLED; ExitCode "3:0" -> exit 3, no signal
                    code = _EXIT_CODE.match(exit_code.strip())
                    status = (int(code[1]) << 8 | int(code[2])) if code else 0
                    found[int(job)] = Accounted(state.split()[0], status)
            return found
        self._say_once("no_accounting", "no Slurm accounting (neither slurmdbd nor a job completion log): jobs "
                       "that leave the queue unobserved end as the adapter's own records say, end state unknown")
        return {}

    async def reservations(self) -> frozenset[str]:
        """The names of every reservation Slurm holds (22.05's scontrol has no ``--json``: one
        line each with ``-o``, or "No reservations in the system")."""
        ran = await self._checked(["scontrol", "show", "reservation", "--oneliner"])
        lines = ran.stdout.decode("utf-8", "replace").splitlines()
        return frozenset(m[1] for line in lines if (m := _RESERVATION_NAME.match(line.strip())))

    # ------------------------------------------------------------------ acting

    async def drain(self, node: str, reason: str) -> None:
        await self._checked(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"])

    async def resume(self, node: str) -> None:
        await self._checked(["scontrol", "update", f"nodename={node}", "state=resume"])

    async def power_down(self, node: str) -> None:
        """Cloud nodes (Slurm's power saving): the instance is released; Slurm refuses it for a
        node that is not a cloud node, and that refusal is the provisioner's answer."""
        await self._checked(["scontrol", "update", f"nodename={node}", "state=power_down"])

    async def requeue(self, job_id: int) -> None:
        await self._checked(["scontrol", "requeue", str(job_id)])

    async def cancel(self, job_id: int) -> None:
        await self._checked(["scancel", str(job_id)])

    async def reserve(self, name: str, nodes: Sequence[str], user: str) -> None:
        """A reservation of ``nodes`` for ``user`` from now on, until deleted: created over
        running jobs (IGNORE_JOBS: they finish, nothing new lands) and over other
        reservations (MAINT: a maintenance reservation may overlap them)."""
        await self._checked(["scontrol", "create", "reservation", f"ReservationName={name}",
                             f"Nodes={','.join(nodes)}", "StartTime=now", "Duration=UNLIMITED", f"Users={user}",
                             "Flags=MAINT,IGNORE_JOBS"])

    async def unreserve(self, name: str) -> None:
        await self._checked(["scontrol", "delete", f"reservation={name}"])

    async def submit(self, argv: Sequence[str]) -> int:
        """``sbatch --parsable …``: the new job's id. The job is given the adapter's environment
        without its own settings and credentials path (``HEALTHPLANE_*``)."""
        environ = {key: value for key, value in self.environ.items() if not key.startswith("HEALTHPLANE_")}
        ran = await self._checked(argv, environ)
        said = ran.stdout.decode("utf-8", "replace").strip().split(";")[0]  # "<id>;<cluster>" on federations
        if not said.isdigit():
            raise SlurmError("sbatch", f"unexpected output: {said[:200]!r}", transient=False)
        return int(said)


def read_tail(path: str, limit: int) -> str | None:
    """The last ``limit`` bytes of a run's output file as text (never more read, whatever its
    size; a character cut at the start is dropped), or None when there is no such file."""
    try:
        with open(path, "rb") as output:
            size = output.seek(0, os.SEEK_END)
            output.seek(max(0, size - limit))
            data = output.read(limit)
    except FileNotFoundError:
        return None
    if size > limit:  # cut inside the file: a character's trailing bytes are no character
        data = data.lstrip(bytes(range(0x80, 0xC0)))
    text = data.decode("utf-8", "replace")
    while len(text.encode()) > limit:  # a replacement character is wider than the byte it stands for
        text = text[1:]
    return text


async def _read_bounded(stream: asyncio.StreamReader | None, shown: str) -> bytes:
    """Everything the command prints, refused past ``MAX_OUTPUT_BYTES``."""
    chunks: list[bytes] = []
    size = 0
    while stream is not None and (chunk := await stream.read(1 << 16)):
        size += len(chunk)
        if size > MAX_OUTPUT_BYTES:
            raise SlurmError(shown, f"printed more than {MAX_OUTPUT_BYTES} bytes", transient=False)
        chunks.append(chunk)
    return b"".join(chunks)


def _kill(process: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _decode(decoder: msgspec.json.Decoder[T], data: bytes, command: str) -> T:
    try:
        return decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise SlurmError(command, f"unexpected output: {exc}", transient=False) from None


def _refuse_errors(command: str, errors: list[_Problem]) -> None:
    if errors:
        said = "; ".join(" ".join(p for p in (e.description, e.source, e.error) if p) for e in errors)
        raise SlurmError(command, said or "error", transient=True)
