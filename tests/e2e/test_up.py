"""`healthplane up`: starts, answers, stops cleanly, and refuses with one line."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from nats.aio.client import Client as NATS

from healthplane.contracts import streams
from healthplane.runtime import configstore
from healthplane.runtime.connect import connect

pytestmark = [pytest.mark.slow, pytest.mark.nats]


def _up(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "healthplane.cli", "up", "--nats-port", "0", "--data-dir",
         str(tmp_path / "hp"), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose only once reaped; up reaps its own children.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _wait_for_stack(path: Path, process: subprocess.Popen[str], timeout: float = 60) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())  # type: ignore[no-any-return]
        if process.poll() is not None:
            raise AssertionError(f"up exited early: {process.stderr.read() if process.stderr else ''}")
        time.sleep(0.1)
    raise AssertionError("stack.json never appeared")


def test_up_starts_answers_and_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    process = _up(tmp_path, "--no-sim")
    try:
        stack = _wait_for_stack(tmp_path / "hp" / "stack.json", process)
        nats_pid = int(stack["natsServerPid"])  # type: ignore[call-overload]
        pids = [nats_pid] + [int(s["pid"]) for s in stack["services"]]  # type: ignore[union-attr, index]

        async def check() -> None:
            nc = await connect(str(stack["natsUrl"]), name="test", creds=str(stack["adminCreds"]), give_up_after=10)
            js = nc.jetstream()
            for definition in streams.STREAMS:
                await js.stream_info(definition.name)
            applied = (await configstore.read(js)).in_force
            assert applied is not None and applied.envelope.version == 1
            await nc.close()

        asyncio.run(check())
        for service in stack["services"]:  # type: ignore[union-attr]
            assert httpx.get(service["metricsUrl"], timeout=5).status_code == 200  # type: ignore[index]
    finally:
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "nats-server" in out and "SERVICE" in out
    for pid in pids:
        assert not _alive(pid), f"process {pid} outlived `healthplane up`"


def test_rel1_a_stack_whose_bus_died_stops_at_ctrl_c_in_seconds_each_service_by_itself(tmp_path: Path) -> None:
    """Its nats-server killed, `up` stops at Ctrl-C in seconds, every service on its own
    ("service stopped"), none killed at up's 10 s grace: a stop used to wait on what the gone
    bus would never answer (a follower's round, the last snapshot, the lease's release)."""
    process = _up(tmp_path, "--no-sim")
    logs = tmp_path / "hp" / "logs"
    try:
        stack = _wait_for_stack(tmp_path / "hp" / "stack.json", process)
        names = [str(s["name"]) for s in stack["services"]]  # type: ignore[union-attr, index]
        deadline = time.monotonic() + 60
        while not all('"service started"' in _read(logs / f"{name}.log") for name in names):
            assert time.monotonic() < deadline, "the services never started"
            time.sleep(0.2)
        time.sleep(2)  # each in its loops: following, leading, folding
        os.kill(int(stack["natsServerPid"]), signal.SIGKILL)  # type: ignore[call-overload]
        time.sleep(1)
    finally:
        stop_at = time.monotonic()
        process.send_signal(signal.SIGINT)
        _out, err = process.communicate(timeout=60)
    took_s = time.monotonic() - stop_at
    assert process.returncode == 0, err
    assert [name for name in names if '"service stopped"' not in _read(logs / f"{name}.log")] == []
    assert took_s < 7, f"up took {took_s:.1f} s to stop"  # 10.3 s before; 3.1 s alone after


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_sec3_up_is_secure_by_default_and_lists_paths_never_keys(tmp_path: Path) -> None:
    process = _up(tmp_path, "--no-sim")
    try:
        stack_path = tmp_path / "hp" / "stack.json"
        stack = _wait_for_stack(stack_path, process)
        assert stack["insecure"] is False
        for key in ("adminCreds", "viewerCreds", "adminToken", "viewerToken"):
            path = Path(str(stack[key]))
            assert path.is_file() and stat.S_IMODE(path.stat().st_mode) == 0o600, key
        text = stack_path.read_text()
        assert "-----BEGIN" not in text and "eyJ" not in text and not re.search(r"\bSU[A-Z2-7]{50,}", text)

        async def check() -> None:
            anonymous = NATS()
            with pytest.raises(Exception, match=r"(?i)authorization"):
                await anonymous.connect(servers=[str(stack["natsUrl"])], allow_reconnect=False, connect_timeout=2)
            await anonymous.close()
            nc = await connect(str(stack["natsUrl"]), name="test", creds=str(stack["adminCreds"]), give_up_after=10)
            await nc.close()

        asyncio.run(check())
    finally:
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    assert f"export HEALTHPLANE_NATS_URL={stack['natsUrl']} HEALTHPLANE_NATS_CREDS={stack['adminCreds']}" in out
    # Nothing a log line or the table shows holds key material (SEC-6).
    logs = "".join(p.read_text() for p in (tmp_path / "hp" / "logs").glob("*.log")) + out + err
    assert "-----BEGIN" not in logs and not re.search(r"\bSU[A-Z2-7]{50,}", logs)


def test_sec4_up_tls_serves_tls_with_a_throwaway_ca_the_cli_verifies(tmp_path: Path) -> None:
    process = _up(tmp_path, "--no-sim", "--tls")
    try:
        stack = _wait_for_stack(tmp_path / "hp" / "stack.json", process)
        assert str(stack["natsUrl"]).startswith("tls://") and Path(str(stack["tlsCa"])).is_file()
        env = {**os.environ, "HEALTHPLANE_NATS_URL": str(stack["natsUrl"]),
               "HEALTHPLANE_NATS_CREDS": str(stack["adminCreds"]), "HEALTHPLANE_NATS_TLS_CA": str(stack["tlsCa"])}
        listed = subprocess.run([sys.executable, "-m", "healthplane.cli", "node", "list"], capture_output=True,
                                text=True, timeout=60, env=env)
        assert listed.returncode == 0, listed.stderr
        without_ca = subprocess.run([sys.executable, "-m", "healthplane.cli", "node", "list"], capture_output=True,
                                    text=True, timeout=60, env={k: v for k, v in env.items()
                                                                if k != "HEALTHPLANE_NATS_TLS_CA"})
        assert without_ca.returncode == 3 and "certificate" in without_ca.stderr.lower(), without_ca.stderr
    finally:
        process.send_signal(signal.SIGINT)
        out, _err = process.communicate(timeout=60)
    assert f"HEALTHPLANE_NATS_TLS_CA={stack['tlsCa']}" in out


def test_sec3_up_insecure_runs_without_auth_and_says_so(tmp_path: Path) -> None:
    process = _up(tmp_path, "--no-sim", "--insecure")
    try:
        stack = _wait_for_stack(tmp_path / "hp" / "stack.json", process)
        assert stack["insecure"] is True and "adminCreds" not in stack and "viewerCreds" not in stack

        async def check() -> None:
            anonymous = NATS()
            await anonymous.connect(servers=[str(stack["natsUrl"])], allow_reconnect=False, connect_timeout=2)
            await anonymous.close()

        asyncio.run(check())
    finally:
        process.send_signal(signal.SIGINT)
        _out, err = process.communicate(timeout=60)
    assert "--insecure" in err and "WITHOUT authentication" in err
    assert not (tmp_path / "hp" / "creds").exists()


def test_up_refuses_a_taken_port_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "healthplane.cli", "up", "--nats-port", str(port), "--data-dir",
             str(tmp_path / "hp"), "--no-sim"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert f"port 127.0.0.1:{port} is taken" in result.stderr


def test_up_refuses_a_bad_config_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text("nodeHealth:\n  drainBelow: 101\n")
    result = subprocess.run(
        [sys.executable, "-m", "healthplane.cli", "up", "--nats-port", "0", "--data-dir",
         str(tmp_path / "hp"), "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "nodeHealth.drainBelow" in result.stderr
    assert not (tmp_path / "hp" / "stack.json").exists()


def test_up_with_a_simulated_fleet_reports_registers_and_takes_faults(tmp_path: Path) -> None:
    # COL-14 end to end: the fleet reports, the bridge registers every node, and an injected
    # Xid comes back as an out-of-band report.
    process = _up(tmp_path, "--nodes", "3")
    try:
        stack = _wait_for_stack(tmp_path / "hp" / "stack.json", process)
        assert "sim" in [s["name"] for s in stack["services"]]  # type: ignore[union-attr, index]
        url = str(stack["natsUrl"])
        admin = {**os.environ, "HEALTHPLANE_NATS_CREDS": str(stack["adminCreds"])}

        async def check() -> None:
            from healthplane.contracts import subjects, wire
            from healthplane.runtime.replay import replay

            nc = await connect(url, name="test", creds=str(stack["adminCreds"]), give_up_after=10)
            js = nc.jetstream()
            reports = await nc.subscribe(subjects.report("default", "sim-001"))
            async with asyncio.timeout(30):
                while True:
                    registered = [m async for m in replay(js, "HP_NODE_EVENTS", "hp.event.*.*.NODE_REGISTERED")]
                    if len(registered) == 3:
                        break
                    await asyncio.sleep(0.2)
            injected = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "healthplane.cli", "sim", "inject", "sim-001", "--fault", "xid:79", "--gpu", "0",
                 "--nats-url", url], capture_output=True, text=True, timeout=30, env=admin)
            assert injected.returncode == 0, injected.stderr
            async with asyncio.timeout(15):
                while True:
                    report = wire.decode(wire.HealthReport, (await reports.next_msg(timeout=15)).data)
                    if report.trigger == "kmsg":
                        break
            assert report.signals.kmsg.xid[0].xid == 79 and report.signals.gpu.status == "failed"

            # health-ingest turns it into conditions within that one report (ING-1, ING-2).
            async with asyncio.timeout(15):
                while True:
                    raised = {e.condition.type: e.condition for e in [
                        wire.decode(wire.NodeEvent, m.data)
                        async for m in replay(js, "HP_NODE_EVENTS", subjects.node_events("default", "sim-001"))]
                        if e.type == "CONDITION_RAISED" and e.condition}
                    if "gpu_xid_errors" in raised:
                        break
                    await asyncio.sleep(0.2)
            assert (raised["gpu_xid_errors"].reason, raised["gpu_xid_errors"].severity) == ("GpuXidHardware", "critical")
            assert "collector_failed" in raised

            # ... and `node show` explains the new score (SCO-4): -45 for the hardware Xid.
            async with asyncio.timeout(20):
                while True:
                    shown = await asyncio.to_thread(
                        subprocess.run, [sys.executable, "-m", "healthplane.cli", "node", "show", "sim-001", "-o",
                                         "json", "--nats-url", url], capture_output=True, text=True, timeout=30, env=admin)
                    view = json.loads(shown.stdout) if shown.returncode == 0 else {}
                    if view.get("score") == 55:
                        break
                    await asyncio.sleep(0.3)
            assert {"reason": "GpuXidHardware", "condition": "gpu_xid_errors", "points": -45} in view[
                "scoreExplanation"]["contributions"]
            assert view["health"] == "DEGRADED" and view["hostname"] == "sim-001"
            listing = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "healthplane.cli", "node", "list", "--nats-url", url],
                capture_output=True, text=True, timeout=30, env=admin)
            assert [line.split()[0] for line in listing.stdout.splitlines()[1:]] == ["sim-000", "sim-001", "sim-002"]
            refused = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "healthplane.cli", "sim", "inject", "sim-404", "--fault", "xid:79",
                 "--nats-url", url], capture_output=True, text=True, timeout=30, env=admin)
            assert refused.returncode == 1 and "no simulated node 'sim-404'" in refused.stderr
            await nc.close()

        asyncio.run(check())
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    assert process.returncode == 0
