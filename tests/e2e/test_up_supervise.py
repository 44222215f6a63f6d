"""`healthplane up` supervises what it started (issue 15.6): a service killed with -9 is
restarted on its metrics port and the pipeline goes on; a crash loop is given up with one line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_up import _up, _wait_for_stack
from tests.support.stack import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.nats]


def _service(stack_path: Path, name: str) -> dict[str, Any]:
    stack = json.loads(stack_path.read_text())
    [entry] = [s for s in stack["services"] if s["name"] == name]
    return entry  # type: ignore[no-any-return]


def _wait(what: str, check: Any, timeout: float = 60) -> Any:
    return wait_for(check, timeout, what)


def _cli(url: str, *args: str, creds: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "healthplane.cli", *args, "--nats-url", url, "--creds", creds],
                          capture_output=True, text=True, timeout=60)


def test_a_killed_service_is_restarted_and_a_crash_loop_given_up(tmp_path: Path) -> None:
    process = _up(tmp_path, "--nodes", "2")
    stack_path = tmp_path / "hp" / "stack.json"
    try:
        stack = _wait_for_stack(stack_path, process)
        url, admin = str(stack["natsUrl"]), str(stack["adminCreds"])
        first = _service(stack_path, "health-ingest")
        assert (first["state"], first["restarts"]) == ("running", 0)

        # kill -9: restarted on the same metrics URL, and a fault injected afterwards still
        # reaches `node show` (the pipeline did not silently stop). A kernel-logged hardware
        # error, which an agent reports at once: a SMART verdict would wait for the next
        # 30 s report, and prove nothing more.
        os.kill(first["pid"], signal.SIGKILL)
        again = _wait("the restart", lambda: (s := _service(stack_path, "health-ingest"))["restarts"] == 1
                      and s["state"] == "running" and s)
        assert again["pid"] != first["pid"] and again["metricsUrl"] == first["metricsUrl"]
        _wait("its metrics", lambda: _answers(again["metricsUrl"]))
        assert _cli(url, "sim", "inject", "sim-001", "--fault", "hw-error-corrected", creds=admin).returncode == 0

        def degraded() -> bool:
            shown = _cli(url, "node", "show", "sim-001", "-o", "json", creds=admin)
            return shown.returncode == 0 and json.loads(shown.stdout)["health"] == "DEGRADED"

        _wait("the fault in node show", degraded, timeout=90)

        # Its metrics port taken by another process while it is down: the restart there exits
        # saying so (EXIT_PORT_IN_USE), and the next one runs on a port picked again, rather
        # than failing on the same one until up gives up (a CI run lost its scheduler so).
        policy = _service(stack_path, "policy")
        squatter = socket.socket()
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        os.kill(policy["pid"], signal.SIGKILL)
        _wait("policy's port free", lambda: _bound(squatter, policy["metricsUrl"]))
        with squatter:
            moved = _wait("policy on another port", lambda: (s := _service(stack_path, "policy"))["state"] == "running"
                          and s["metricsUrl"] != policy["metricsUrl"] and s)
            _wait("its metrics on the new port", lambda: _answers(moved["metricsUrl"]))

        # A crash loop: killed each time it comes back, five failures within a minute.
        for _ in range(4):
            pid = _service(stack_path, "scheduler")["pid"]
            os.kill(pid, signal.SIGKILL)
            _wait("the next scheduler", lambda p=pid: _service(stack_path, "scheduler")["pid"] != p)  # type: ignore[misc]
        os.kill(_service(stack_path, "scheduler")["pid"], signal.SIGKILL)
        given_up = _wait("giving up", lambda: (s := _service(stack_path, "scheduler"))["state"] == "failed" and s)
        assert given_up["restarts"] == 4
        assert _service(stack_path, "health-ingest")["state"] == "running"  # the rest runs on
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGINT)
        _out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "health-ingest killed by SIGKILL; restarting in 1s" in err
    assert "health-ingest restarted (pid" in err
    assert "scheduler killed by SIGKILL and failed 5 times within 60s; not restarting it" in err
    assert "Traceback" not in err
    assert "policy exited with 98; restarting in" in err, err


def _bound(sock: socket.socket, url: str) -> bool:
    try:
        sock.bind(("127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0])))
    except OSError:
        return False
    sock.listen()
    return True


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
