"""The README's walk-through, command by command as a new user types it, against `./dev up`'s
stack: every command succeeds, and no service logs a warning or an error (issue 15.5: normal
operation is quiet; a rejected-input counter moves only on bad input)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_up import _up, _wait_for_stack

pytestmark = [pytest.mark.slow, pytest.mark.nats]
README = Path(__file__).resolve().parents[2] / "README.md"
# `silent` takes 90 s to show (ING-4) and then logs the heartbeat warning ING-4 asks for.
# `events watch` is a live tail that runs until Ctrl-C, and `creds user` writes into `./dev up`'s
# own data dir: tests/component/test_events_watch.py and test_subscribing.py run them (INT-1).
NOT_HERE = ("--fault silent", "events watch", "creds user")


def walkthrough() -> list[list[str]]:
    """The `.venv/bin/healthplane …` lines of the README's shell blocks, in order."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    commands = []
    for block in blocks:
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == [".venv/bin/healthplane"] and not any(n in line for n in NOT_HERE):
                commands.append(words[1:])
    return commands


def _rejected(metrics_url: str) -> float:
    text = httpx.get(metrics_url, timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("healthplane_messages_rejected_total{"))


def _exported(process: subprocess.Popen[str], timeout_s: float = 60) -> dict[str, str]:
    """The variables of the `export` line `up` prints once the stack runs (SEC-3)."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    # Blocking reads: `up` prints the line right after stack.json, and the test's timeout
    # bounds a `up` that never does (select would miss lines already in the pipe's buffer).
    for line in process.stdout:
        if line.startswith("export "):
            return dict(word.split("=", 1) for word in shlex.split(line)[1:])
        if time.monotonic() > deadline:
            break
    raise AssertionError("up printed no export line")


def test_the_readme_walkthrough_runs_and_no_service_logs_a_warning(tmp_path: Path) -> None:
    commands = walkthrough()
    assert len(commands) >= 12 and ["node", "show", "sim-001"] in commands
    process = _up(tmp_path)
    try:
        stack = _wait_for_stack(tmp_path / "hp" / "stack.json", process)
        # As a new user does: paste the printed line, then type the README's commands as they are.
        exported = _exported(process)
        assert exported["HEALTHPLANE_NATS_CREDS"] == stack["adminCreds"] and stack["insecure"] is False
        env = {**os.environ, **exported}
        deadline = time.monotonic() + 60
        for words in commands:
            while True:
                done = subprocess.run([sys.executable, "-m", "healthplane.cli", *words],
                                      capture_output=True, text=True, timeout=60, input="y\n", env=env)
                # The fleet's first reports and registrations take a few seconds after `up`.
                if done.returncode in (0,) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert done.returncode == 0, f"{shlex.join(words)}: {done.stderr}"
            assert "Traceback" not in done.stderr and "warning" not in done.stderr, done.stderr
        time.sleep(3)  # what the last commands caused is folded and logged
        for service in stack["services"]:  # type: ignore[union-attr]
            assert _rejected(service["metricsUrl"]) == 0, service["name"]  # type: ignore[index]
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    noisy = []
    for log in sorted((tmp_path / "hp" / "logs").glob("*.log")):
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                level = json.loads(line).get("level")
            except ValueError:
                level = "not a log record"
            if level not in ("debug", "info"):
                noisy.append(f"{log.name}: {line}")
    assert noisy == []
