"""A real ``healthplane up`` for tests that need the whole stack (the API, the web UI): started
in a temp dir, waited for until every simulated node has a score, stopped with Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx


@dataclass
class Stack:
    data_dir: Path
    process: subprocess.Popen[str]
    stack: dict[str, Any]

    @property
    def api_url(self) -> str:
        return str(next(s["url"] for s in self.stack["services"] if s["name"] == "api")).rstrip("/")

    def token(self, role: str) -> str:
        return Path(self.stack[f"{role}Token"]).read_text(encoding="utf-8").strip()

    def env(self, role: str = "admin") -> dict[str, str]:
        return {**os.environ, "HEALTHPLANE_NATS_URL": str(self.stack["natsUrl"]),
                "HEALTHPLANE_NATS_CREDS": str(self.stack[f"{role}Creds"])}

    def cli(self, *args: str, role: str = "admin", timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "healthplane.cli", *args], capture_output=True, text=True,
                              timeout=timeout, env=self.env(role))

    def cli_json(self, *args: str) -> Any:
        done = self.cli(*args, "-o", "json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def get(self, path: str, role: str | None = "admin", **params: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token(role)}"} if role else {}
        return httpx.get(self.api_url + path, headers=headers, params=params, timeout=30)

    def post(self, path: str, body: dict[str, Any] | None = None, role: str | None = "admin") -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token(role)}"} if role else {}
        return httpx.post(self.api_url + path, headers=headers, json=body or {}, timeout=30)

    def wait_until(self, check: Any, timeout: float, what: str) -> Any:
        return wait_for(check, timeout, what)


def wait_for(check: Any, timeout: float, what: str) -> Any:
    """``check()``'s first truthy answer, polled every 0.2 s, or as long as the check took when
    that is longer; past ``timeout`` an AssertionError. A check that starts the CLI costs some
    0.4 CPU-seconds: polled every 0.2 s, one wait kept over half of one of a full run's 2
    cores busy, and slowed the other workers' tests."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = time.monotonic()
        found = check()
        if found:
            return found
        time.sleep(max(0.2, time.monotonic() - started))
    raise AssertionError(f"timed out waiting for {what} ({timeout:g}s)")


@dataclass
class Launch:
    """An ``up`` started and not yet waited for: several can start side by side."""

    data_dir: Path
    process: subprocess.Popen[str]
    nodes: int

    def ready(self) -> Stack:
        """The stack once its ``stack.json`` exists and each simulated node has been scored."""
        path = self.data_dir / "stack.json"
        deadline = time.monotonic() + 90
        while not path.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"up did not start: {self.process.stderr.read() if self.process.stderr else ''}")
            time.sleep(0.1)
        stack = Stack(self.data_dir, self.process, json.loads(path.read_text()))

        def scored() -> bool:
            try:  # the api's metrics answer before its pages do: a refused connection is "not yet"
                answer = stack.get("/api/v1/summary")
            except httpx.TransportError:
                return False
            return answer.status_code == 200 and (answer.json()["fleet"]["nodes"] or 0) >= self.nodes

        stack.wait_until(scored, 60, f"{self.nodes} nodes scored")
        return stack


@contextmanager
def launched(root: Path, *extra: str, nodes: int = 8) -> Iterator[Launch]:
    """``healthplane up`` with ``nodes`` simulated nodes, started; stopped with Ctrl-C at the end."""
    data_dir = root / "hp"
    process = subprocess.Popen([sys.executable, "-m", "healthplane.cli", "up", "--nats-port", "0", "--data-dir",
                                str(data_dir), "--nodes", str(nodes), *extra],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield Launch(data_dir, process, nodes)
    finally:
        interrupt(process, 60)


def interrupt(up: subprocess.Popen[Any], timeout_s: float) -> None:
    """Stop ``healthplane up`` as a person does (Ctrl-C), killed if it has not stopped in time."""
    if up.poll() is None:
        up.send_signal(signal.SIGINT)
    try:
        up.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        up.kill()
        up.communicate()


@contextmanager
def running(root: Path, *extra: str, nodes: int = 8) -> Iterator[Stack]:
    """``healthplane up`` with ``nodes`` simulated nodes, once each has been scored."""
    with launched(root, *extra, nodes=nodes) as launch:
        yield launch.ready()
