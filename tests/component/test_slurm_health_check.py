"""`healthplane collector --slurm-health-check` as Slurm's HealthCheckProgram (SLU-6): one
collection, its health and resource reports stored by JetStream, exit 0 with nothing on
stdout, well within the 60 s after which Slurm kills a health check; a bus that cannot be
reached is one line on stderr and exit 1 within the deadline, never a traceback."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.runtime.replay import read_all
from healthplane.stack.keystore import Keystore
from healthplane.stack.natsserver import NatsServer
from tests.support.secure import env_for
from tests.unit.collector.test_inventory import machine

NODE, CLUSTER = "n1", "default"
BACKLOG = b"4,5120,90000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"


def xid_13(seq: int) -> bytes:
    return (f"4,{seq},90000000,-;NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, "
            f"Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter\n").encode()


def node_root(tmp_path: Path) -> Path:
    """A machine under ``--root``: its ring buffer a regular file holding one old record."""
    root = machine(tmp_path / "root")
    (root / "dev").mkdir()
    (root / "dev" / "kmsg").write_bytes(BACKLOG)
    (root / "proc" / "mounts").write_text("/dev/vda1 / ext4 rw,relatime 0 0\nproc /proc proc rw 0 0\n")
    (tmp_path / "bin").mkdir()
    return root


def health_check(tmp_path: Path, env: dict[str, str], *extra: str,
                 timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "healthplane.cli", "collector", "--slurm-health-check", "--root",
         str(tmp_path / "root"), "--gpu-source", "nvidia-smi", "--node-id", NODE, "--cluster", CLUSTER,
         "--state-dir", str(tmp_path / "state"), *extra],
        env={**env, "PATH": str(tmp_path / "bin")},  # no smartctl, no nvidia-smi: honest "unavailable"
        capture_output=True, text=True, timeout=timeout)
    return result, time.monotonic() - started


async def stored(nc: NATS, js: JetStreamContext) -> tuple[list[wire.HealthReport], list[wire.ResourceReport]]:
    reports = await read_all(nc, js, "HP_REPORTS", subjects.report(CLUSTER, NODE), idle_timeout_s=2)
    resources = await read_all(nc, js, "HP_RESOURCES", subjects.resource(CLUSTER, NODE), idle_timeout_s=2)
    return ([wire.decode(wire.HealthReport, m.data) for m in reports],
            [wire.decode(wire.ResourceReport, m.data) for m in resources])


@pytest.mark.nats
async def test_one_collection_published_then_exit_SLU_6(nats_server: NatsServer, nc: NATS,
                                                        js: JetStreamContext, tmp_path: Path) -> None:
    """SLU-6: a health check run stores one scheduled health report and one ready resource
    report for its node, prints nothing on stdout and exits 0 well within Slurm's 60 s; the
    next run stores the next report."""
    node_root(tmp_path)
    env = env_for(nats_server, "collector", f"{CLUSTER}/{NODE}")

    result, elapsed = health_check(tmp_path, env, "--nats-url", nats_server.url)

    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert elapsed < 20, f"one health check took {elapsed:.1f} s"
    reports, resources = await stored(nc, js)
    (report,) = reports
    assert (report.node_id, report.cluster, report.trigger) == (NODE, CLUSTER, "scheduled")
    assert report.signals.smart.status == "unavailable" and report.signals.gpu.status == "unavailable"
    (resource,) = resources
    assert (resource.node_id, resource.hostname, resource.cores, resource.ready) == (NODE, "gpu-node-07", 4, True)

    again, _ = health_check(tmp_path, env, "--nats-url", nats_server.url)

    assert again.returncode == 0, again.stderr
    reports, _ = await stored(nc, js)
    assert len(reports) == 2 and reports[1].sent_at > reports[0].sent_at


@pytest.mark.nats
async def test_kmsg_reads_as_one_periodic_agent_across_runs_SLU_6(nats_server: NatsServer, nc: NATS,
                                                                  js: JetStreamContext, tmp_path: Path) -> None:
    """SLU-6 with COL-5: given a ring buffer with an old Xid 79, the first run skips that backlog
    (no cursor yet); each later run folds only the records since the run before, into counts
    that keep growing as a long-running agent's do (health-ingest reads a rise between reports)."""
    root = node_root(tmp_path)
    env = env_for(nats_server, "collector", f"{CLUSTER}/{NODE}")
    kmsg = root / "dev" / "kmsg"

    for new_records in (b"", xid_13(5121), xid_13(5122), b""):
        with kmsg.open("ab") as ring:
            ring.write(new_records)
        result, _ = health_check(tmp_path, env, "--nats-url", nats_server.url)
        assert result.returncode == 0, result.stderr

    reports, _ = await stored(nc, js)
    signals = [r.signals.kmsg for r in reports]
    assert [s.backlog_skipped for s in signals] == [True] * 4
    assert [[(x.xid, x.count) for x in s.xid] for s in signals] == [[], [(13, 1)], [(13, 2)], [(13, 2)]]


async def test_unreachable_bus_is_one_line_and_exit_1_SLU_6(keystore: Keystore, tmp_path: Path) -> None:
    """SLU-6: with nobody listening at the NATS URL and ``--deadline-seconds 3``, the health check
    gives up within its deadline: exit 1, one line on stderr naming the URL, no traceback."""
    node_root(tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"nats://127.0.0.1:{probe.getsockname()[1]}"  # closed again: nobody listens there
    creds = keystore.node(NODE, CLUSTER, tmp_path / "node.creds")
    env = {"HEALTHPLANE_NATS_URL": url, "HEALTHPLANE_NATS_CREDS": str(creds)}

    result, elapsed = health_check(tmp_path, env, "--deadline-seconds", "3", timeout=30)

    assert result.returncode == 1
    assert elapsed < 10, f"gave up after {elapsed:.1f} s"
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("healthplane collector: health check not published: ") and url in line
    assert "unreachable" in line and "Traceback" not in result.stderr


@pytest.mark.nats
def test_a_hung_server_is_bounded_by_the_deadline_SLU_6(nats_server: NatsServer, tmp_path: Path) -> None:
    """SLU-6: a nats-server that accepts the connection and then says nothing (SIGSTOPped) holds
    the health check no longer than its deadline: exit 1, one line on stderr."""
    node_root(tmp_path)
    env = env_for(nats_server, "collector", f"{CLUSTER}/{NODE}")
    assert nats_server.process is not None
    nats_server.process.send_signal(signal.SIGSTOP)
    try:
        result, elapsed = health_check(tmp_path, env, "--nats-url", nats_server.url, "--deadline-seconds", "3",
                                       timeout=30)
    finally:
        nats_server.process.send_signal(signal.SIGCONT)

    assert result.returncode == 1
    assert elapsed < 10, f"gave up after {elapsed:.1f} s"
    (line,) = result.stderr.splitlines()
    assert line.startswith("healthplane collector: health check not published: ") and nats_server.url in line
    assert "unreachable" in line


@pytest.mark.parametrize("flags", [["--once"], ["--deadline-seconds", "60"], ["--deadline-seconds", "0.5"]])
def test_usage_errors_SLU_6(tmp_path: Path, flags: list[str]) -> None:
    """SLU-6: --slurm-health-check with --once, or a deadline Slurm would not wait for, is a usage
    error: exit 2 and one line, before anything is read or sent."""
    result, _ = health_check(tmp_path, {}, *flags, timeout=30)

    assert result.returncode == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("healthplane collector: ")
