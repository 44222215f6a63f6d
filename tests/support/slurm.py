"""A real Slurm 22.05 for tests: one slurmctld, a slurmd per node and a private munged, all
direct children of the test process, configured under a temp dir and stopped by pid
(docs/slurm-research.md). Never a mocked scheduler.

Debian's packages, installed by `sh tools/ensure-slurm` (which `just test` runs first). A
missing binary fails the test: Slurm is part of the contract, not an optional extra.

``ghost_nodes=N`` adds N configured nodes with no daemon behind them (``ghost-000``, …), so
that a benchmark sees a 1,000-node partition while only a few slurmd run.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from healthplane.stack.natsserver import die_with_parent

# Full paths, never /usr/sbin/slurmctld: slurm-wlm-emulator, if ever installed, repoints
# those alternatives at front-end binaries that cannot run this config.
SLURMCTLD = Path("/usr/sbin/slurmctld-wlm")
SLURMD = Path("/usr/sbin/slurmd-wlm")
SLURMSTEPD = Path("/usr/sbin/slurmstepd-wlm")
MUNGED = Path("/usr/sbin/munged")
CLIENTS = ("scontrol", "sinfo", "squeue", "sbatch", "scancel", "sacct")

DEFAULT_NODES = ("sim-000", "sim-001", "sim-002", "sim-003")
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
POLL_S = 0.1
LOG_TAIL_LINES = 25


class SlurmError(RuntimeError):
    """The cluster could not be started or its binaries are missing; the message says which
    daemon and ends with the tail of its log."""


class SlurmCommandError(subprocess.CalledProcessError):
    """A Slurm client exited non-zero; unlike CalledProcessError its message carries what the
    command printed, which is where Slurm says why."""

    def __str__(self) -> str:
        said = (self.stderr or self.stdout or "").strip()
        return f"{' '.join(map(str, self.cmd))} exited {self.returncode}: {said or '(no output)'}"


def find_bin_dir() -> Path:
    """The directory of the Slurm clients, after checking that every binary is there."""
    missing = [str(path) for path in (SLURMCTLD, SLURMD, SLURMSTEPD, MUNGED)
               if not os.access(path, os.X_OK)]
    found = {name: shutil.which(name) for name in CLIENTS}
    missing += [name for name, path in found.items() if path is None]
    if missing:
        raise SlurmError(f"Slurm is not installed (missing {', '.join(missing)}): run "
                         f"`sh tools/ensure-slurm` (as root it installs Debian's slurmctld, "
                         f"slurmd, slurm-client and munge)")
    return Path(str(found["sbatch"])).parent


def ghost_names(count: int) -> tuple[str, ...]:
    width = max(3, len(str(count - 1)))
    return tuple(f"ghost-{i:0{width}d}" for i in range(count))


def _tail(*paths: Path) -> str:
    parts = []
    for path in paths:
        try:
            lines = path.read_text(errors="replace").rstrip().splitlines()[-LOG_TAIL_LINES:]
        except FileNotFoundError:
            lines = ["(no such file)"]
        parts.append(f"--- {path}\n" + ("\n".join(lines) or "(empty)"))
    return "\n".join(parts)


def _stop_process(process: subprocess.Popen[bytes] | None, sig: signal.Signals = signal.SIGTERM) -> None:
    """Signal, then SIGKILL after STOP_TIMEOUT_S, and always wait(): the machine's PID 1 is
    not known to reap, so a child not waited for would stay a zombie."""
    if process is None:
        return
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
    process.wait()


class SlurmCluster:
    """One Slurm cluster on loopback. ``start()`` brings it up, ``stop()`` takes every
    process it caused down again, slurmstepd and job scripts included."""

    def __init__(self, root: Path, nodes: Sequence[str] = DEFAULT_NODES, ghost_nodes: int = 0) -> None:
        self.bin_dir = find_bin_dir()
        self.root = root
        self.nodes = tuple(nodes)
        self.ghosts = ghost_names(ghost_nodes) if ghost_nodes else ()
        self.conf = root / "etc" / "slurm.conf"
        self.jobs_dir = root / "jobs"
        self.log_dir = root / "log"
        # munged wants every directory above its socket world-executable (pytest's tmp_path
        # sits under a 0700 /tmp/pytest-of-<user>), and slurmd puts one unix socket per job
        # step in its spool dir, named <node>_<job>.4294967291: under tmp_path that passes
        # the 108-byte limit of a socket path. So sockets and spool live in a short dir of
        # their own, removed by stop(); config, state, logs and job output stay under root.
        self.run_dir = Path(tempfile.mkdtemp(prefix="hp-slurm-", dir="/tmp"))
        os.chmod(self.run_dir, 0o755)
        self.munge_socket = self.run_dir / "munge.socket.2"
        # Without the caller's SLURM_* variables: a test run inside a Slurm job must not
        # hand that job's id and options to sbatch and scontrol here.
        self.env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
        self.env["SLURM_CONF"] = str(self.conf)
        self._munged: subprocess.Popen[bytes] | None = None
        self._slurmctld: subprocess.Popen[bytes] | None = None
        self._slurmd: dict[str, subprocess.Popen[bytes]] = {}
        self._stopped = False

    # -- clients ---------------------------------------------------------------------

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster, from the jobs dir (sbatch writes
        slurm-<id>.out into its cwd)."""
        result = subprocess.run(argv, env=self.env, cwd=self.jobs_dir, capture_output=True,
                                text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise SlurmCommandError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def sbatch(self, script: str = "sleep 600", *, node: str | None = None, requeue: bool | None = None,
               name: str | None = None, nodes: int = 1, exclude: str | None = None) -> str:
        """Submits ``script`` as a batch job and returns its id. ``requeue=None`` keeps
        Slurm's default, which is requeueable."""
        argv = ["sbatch", "--parsable", f"--nodes={nodes}"]
        if node is not None:
            argv.append(f"--nodelist={node}")
        if exclude is not None:
            argv.append(f"--exclude={exclude}")
        if requeue is not None:
            argv.append("--requeue" if requeue else "--no-requeue")
        if name is not None:
            argv.append(f"--job-name={name}")
        argv += ["--wrap", script]
        return self.run(*argv).stdout.strip().split(";")[0]  # "<id>;<cluster>" on federations

    def held(self, then: str = "", bound_s: int = 300) -> tuple[str, Callable[[], None]]:
        """A job script that runs until the test releases it, then runs ``then`` (an exit
        status, say); and the release. A test whose job must still run while something
        happens ends it when that has happened, instead of guessing a ``sleep N`` long
        enough for a loaded machine. ``bound_s``: the job ends by itself then, whatever the
        test did (a failed test leaves no job behind)."""
        flag = self.jobs_dir / f"release-{os.urandom(4).hex()}"
        script = (f"for _ in $(seq {bound_s * 10}); do [ -e {flag} ] && break; sleep 0.1; done"
                  + (f"; {then}" if then else ""))
        return script, flag.touch

    def nodes_json(self) -> list[dict[str, Any]]:
        """`sinfo --json`'s node entries: 22.05's scontrol has no --json, and sinfo's entry
        holds every node field (state, state_flags, reason, ...)."""
        document = json.loads(self.run("sinfo", "--json").stdout)
        if document.get("errors"):
            raise SlurmError(f"sinfo --json: {document['errors']}")
        return list(document["nodes"])

    def node(self, name: str) -> dict[str, Any]:
        for entry in self.nodes_json():
            if entry["name"] == name:
                return entry
        raise KeyError(f"no node {name!r} in sinfo --json")

    def job(self, job_id: str) -> dict[str, Any] | None:
        """The job's `squeue --json -t all` entry; ended jobs stay there for MinJobAge."""
        document = json.loads(self.run("squeue", "--json", "-t", "all").stdout)
        # squeue exits 0 when it cannot reach the controller; only `errors` says so.
        if document.get("errors"):
            raise SlurmError(f"squeue --json: {document['errors']}")
        for entry in document["jobs"]:
            if str(entry["job_id"]) == job_id:
                return dict(entry)
        return None

    def drain(self, node: str, reason: str) -> None:
        self.run("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")

    def resume(self, node: str) -> None:
        self.run("scontrol", "update", f"nodename={node}", "state=resume")

    # -- waiting ---------------------------------------------------------------------

    def wait_for(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
            time.sleep(POLL_S)

    def wait_until_idle(self, timeout: float = 30) -> None:
        """Every node with a running slurmd registered, idle and without flags."""
        self.wait_for(lambda: self._all_running(lambda n: n["state"] == "idle" and not n["state_flags"]),
                      timeout, f"nodes {', '.join(self._slurmd)} idle")

    def _all_running(self, test: Callable[[dict[str, Any]], bool]) -> bool:
        entries = {entry["name"]: entry for entry in self.nodes_json()}
        return all(test(entries[name]) for name in self._slurmd)

    @staticmethod
    def _registered(entry: dict[str, Any], since: float = 0) -> bool:
        # A restarted slurmctld shows its nodes `unknown` (or NOT_RESPONDING) until their
        # slurmd registers again; slurmd_start_time tells a new slurmd from the one it replaced.
        return (entry["state"] != "unknown" and "NOT_RESPONDING" not in entry["state_flags"]
                and entry["slurmd_start_time"] >= int(since))

    def _await(self, check: Callable[[], bool], what: str, watched: Sequence[str]) -> None:
        """Like wait_for, for start-up: a daemon that exits or a START_TIMEOUT_S deadline
        raise SlurmError with the tail of the watched daemons' logs."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            for name in watched:
                process = self._process(name)
                if process is not None and process.poll() is not None:
                    raise SlurmError(f"{name} exited ({process.returncode}) while waiting for "
                                     f"{what}\n{_tail(*self._logs(name))}")
            with suppress(SlurmCommandError, SlurmError, subprocess.TimeoutExpired, json.JSONDecodeError):
                if check():
                    return
            if time.monotonic() > deadline:
                logs = [log for name in watched for log in self._logs(name)]
                raise SlurmError(f"timed out after {START_TIMEOUT_S:g} s waiting for {what}\n{_tail(*logs)}")
            time.sleep(POLL_S / 2)

    # -- daemons ---------------------------------------------------------------------

    def start(self) -> SlurmCluster:
        for folder in (self.root / "etc", self.root / "state", self.log_dir, self.jobs_dir,
                       self.root / "munge", self.run_dir / "spool"):
            folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        self._write_config()
        self._start_munged()
        self.start_controller()
        for name in self.nodes:
            self._spawn_slurmd(name)
        self._await(lambda: self._all_running(lambda n: self._registered(n) and n["state"] == "idle"),
                    "every slurmd registered and idle", ["slurmctld", *self.nodes])
        return self

    def _write_config(self) -> None:
        host = socket.gethostname()
        state, log, spool = self.root / "state", self.log_dir, self.run_dir / "spool"
        controller_port, *node_ports = _listen_ports(1 + len(self.nodes))
        lines = [
            "ClusterName=healthplane",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={controller_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire is also how long a requeued job is held before it may start again
            # (120 s by default).
            f"AuthInfo=socket={self.munge_socket},cred_expire=10",
            f"StateSaveLocation={state}",
            f"SlurmdSpoolDir={spool}/%n",
            f"SlurmctldPidFile={self.run_dir}/slurmctld.pid",
            f"SlurmdPidFile={self.run_dir}/slurmd-%n.pid",
            f"SlurmctldLogFile={log}/slurmctld.log",
            f"SlurmdLogFile={log}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "MailProg=/bin/true",  # otherwise "Configured MailProg is invalid"
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            # Without slurmdbd, `sacct -c` reads this file: one record per job end.
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={log}/jobcomp.txt",
            "SelectType=select/linear",  # with CPUs=1: one job per node
            "SchedulerType=sched/backfill",
            # A requeued job waits for the next scheduling pass: up to a minute by default.
            "SchedulerParameters=bf_interval=1,sched_interval=2",
            "MpiDefault=none",
            "ReturnToService=2",  # a node down for not responding is idle again once its slurmd registers
            "SlurmdParameters=config_overrides",  # the configured CPUs and memory win over the hardware
            "SlurmdTimeout=6",
            "SlurmctldTimeout=10",
            "MessageTimeout=5",  # clients give up on a stopped controller after ~4 s, not ~9 s
            "InactiveLimit=0",
            "MinJobAge=300",  # ended jobs stay in squeue that long
            "KillWait=2",
        ]
        lines += [f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                  f"CPUs=1 RealMemory=1000 State=UNKNOWN" for name, port in zip(self.nodes, node_ports, strict=True)]
        if self.ghosts:
            # Nothing listens on 127.0.0.2:9: the controller sees the nodes as never registered.
            first, last = self.ghosts[0].removeprefix("ghost-"), self.ghosts[-1].removeprefix("ghost-")
            lines.append(f"NodeName=ghost-[{first}-{last}] NodeHostname={host} NodeAddr=127.0.0.2 Port=9 "
                         f"CPUs=1 RealMemory=1000 State=UNKNOWN")
        lines.append("PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def _start_munged(self) -> None:
        munge = self.root / "munge"
        key = munge / "munge.key"
        # What `mungekey --create --bits=1024` writes: random bytes, owner-only.
        key.write_bytes(os.urandom(1024 // 8))
        os.chmod(key, 0o600)
        self._munged = self._spawn("munged", [
            str(MUNGED), "--foreground", f"--socket={self.munge_socket}", f"--key-file={key}",
            f"--log-file={self.log_dir / 'munged.log'}", f"--pid-file={self.run_dir / 'munged.pid'}",
            f"--seed-file={munge / 'munged.seed'}",
        ])
        self._await(self.munge_socket.exists, "munged's socket", ["munged"])

    def start_controller(self) -> None:
        """Starts slurmctld (again) and waits until it answers and every running slurmd has
        registered with it: until then a restarted controller shows those nodes `unknown`."""
        if self._slurmctld is not None and self._slurmctld.poll() is None:
            raise SlurmError("slurmctld is already running")
        self._slurmctld = self._spawn("slurmctld", [str(SLURMCTLD), "-D", "-f", str(self.conf)])
        self._await(lambda: self.run("scontrol", "ping", check=False, timeout=5).returncode == 0,
                    "slurmctld to answer `scontrol ping`", ["slurmctld"])
        if self._slurmd:
            self._await(lambda: self._all_running(self._registered),
                        "every running slurmd registered with slurmctld", ["slurmctld", *self._slurmd])

    def stop_controller(self) -> None:
        """SIGTERM: slurmctld saves its state first. (A kill -9 loses the last few seconds
        of it; see docs/slurm-research.md.)"""
        _stop_process(self._slurmctld)

    def start_slurmd(self, name: str) -> None:
        """Starts the node's slurmd (again) and waits until it has registered."""
        if name not in self.nodes:
            raise KeyError(f"{name!r} is not one of this cluster's slurmd nodes {self.nodes}")
        if name in self._slurmd and self._slurmd[name].poll() is None:
            raise SlurmError(f"slurmd {name} is already running")
        since = time.time()
        self._spawn_slurmd(name)
        self._await(lambda: self._registered(self.node(name), since), f"slurmd {name} registered",
                    ["slurmctld", name])

    def kill_slurmd(self, name: str) -> None:
        """SIGKILL, as a node that dies would: its slurmstepd and job go on running (stop()
        kills them), and slurmctld marks the node down after about 17 s."""
        _stop_process(self._slurmd.pop(name), signal.SIGKILL)

    def _spawn_slurmd(self, name: str) -> None:
        (self.run_dir / "spool" / name).mkdir(exist_ok=True)
        self._slurmd[name] = self._spawn(f"slurmd-{name}", [str(SLURMD), "-D", "-N", name, "-f", str(self.conf)])

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        # The daemons get this cluster's SLURM_CONF: slurmstepd and job scripts inherit it,
        # which is how stop() finds them.
        with open(self.log_dir / f"{name}.out", "ab") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.env, cwd=self.jobs_dir, start_new_session=True,
                                    preexec_fn=die_with_parent)

    def _process(self, name: str) -> subprocess.Popen[bytes] | None:
        if name == "munged":
            return self._munged
        if name == "slurmctld":
            return self._slurmctld
        return self._slurmd.get(name)

    def _logs(self, name: str) -> list[Path]:
        daemon = name if name in ("munged", "slurmctld") else f"slurmd-{name}"
        return [self.log_dir / f"{daemon}.out", self.log_dir / f"{daemon}.log"]

    # -- teardown --------------------------------------------------------------------

    def pids(self) -> list[int]:
        """Every live process that carries this cluster's SLURM_CONF in its environment:
        the daemons, slurmstepd and job scripts."""
        marker = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            # A zombie's environ reads empty, and a process that just ended has none.
            with suppress(OSError):
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
        return found

    def stop(self) -> None:
        """Cancels every job, stops the daemons by pid, then SIGKILLs what they leave
        behind: slurmstepd ignores SIGTERM and outlives slurmd. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self._slurmctld is not None and self._slurmctld.poll() is None:
                self._cancel_all()
            for process in self._slurmd.values():
                process.send_signal(signal.SIGTERM)  # all at once: each takes its time to stop
            for daemon in [*self._slurmd.values(), self._slurmctld, self._munged]:
                _stop_process(daemon)
        finally:
            self._kill_leftovers()
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def _cancel_all(self) -> None:
        # Bounded: a test that broke the cluster must not hang its teardown.
        with suppress(SlurmCommandError, subprocess.TimeoutExpired):
            listed = self.run("squeue", "-h", "-o", "%i", timeout=10).stdout.split()
            if listed:
                self.run("scancel", *listed, timeout=10)
            if not self._slurmd:
                return
            # Only a live slurmd ends its jobs; one on a killed node stays COMPLETING until
            # the node is marked down (~17 s), and its processes are killed below anyway.
            live = ",".join(self._slurmd)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while self.run("squeue", "-h", "-o", "%i", "-w", live, timeout=10).stdout.strip():
                if time.monotonic() > deadline:
                    break
                time.sleep(POLL_S)

    def _kill_leftovers(self) -> None:
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while (leftovers := self.pids()) and time.monotonic() < deadline:
            for pid in leftovers:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(POLL_S / 2)


def _listen_ports(count: int) -> list[int]:
    """``count`` distinct free ports below the kernel's ephemeral range. The daemons bind theirs
    seconds after the config names them (slurmd after slurmctld is up): a port from the
    ephemeral range (``free_port``) can meanwhile become the source port of any outgoing
    connection on the machine ("Unable to bind listen port: Address already in use", red once
    in CI); below the range only another listener can take it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    draw = random.SystemRandom()  # not the global generator, which hypothesis seeds
    found: list[int] = []
    while len(found) < count:
        port = draw.randrange(10000, max(10001, low))
        if port in found:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        found.append(port)
    return found


@contextmanager
def slurm_cluster(root: Path, nodes: Sequence[str] = DEFAULT_NODES, ghost_nodes: int = 0) -> Iterator[SlurmCluster]:
    """A started cluster, stopped on exit, also when starting it failed half-way."""
    cluster = SlurmCluster(root, nodes, ghost_nodes)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[SlurmCluster]:
    """A real 4-node Slurm (sim-000..sim-003, the simulated fleet's node ids), fresh per test."""
    with slurm_cluster(tmp_path / "slurm") as cluster:
        yield cluster
