"""``healthplane service NAME`` started by a test on a metrics port picked free, as `up` starts
its children: a port picked free is not yet bound, and another worker's process may take it
before the service listens (seen in full runs: "metrics endpoint cannot listen", the service
gone with EXIT_PORT_IN_USE). The service is then started again on another port, up to
PORT_PICKS times, and the test never sees the first try."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from healthplane.runtime.lifecycle import EXIT_PORT_IN_USE
from healthplane.stack.natsserver import PORT_PICKS, free_port

LISTEN_TIMEOUT_S = 60.0  # a service's imports, on a machine the whole suite keeps busy


def spawn(service: str, env: dict[str, str], log: Path, **popen: Any) -> tuple[subprocess.Popen[bytes], int]:
    """The service's process, listening on its metrics port (or exited for another reason,
    which the test sees), and that port. Its log lines are appended to ``log``."""
    for attempt in range(1, PORT_PICKS + 1):
        port = free_port()
        with open(log, "ab") as out:
            process = subprocess.Popen([sys.executable, "-m", "healthplane.cli", "service", service,
                                        "--metrics-port", str(port)],
                                       env=env, stdout=subprocess.DEVNULL, stderr=out, **popen)
        if not _lost_its_port(process, port, log) or attempt == PORT_PICKS:
            return process, port
    raise AssertionError("unreachable")


def _lost_its_port(process: subprocess.Popen[bytes], port: int, log: Path) -> bool:
    """Until the service logs its metrics endpoint on ``port`` (its own line: a connection to
    the port could reach the process that took it) or exits; True if it exited over the port."""
    listening = f':{port}/metrics"'
    deadline = time.monotonic() + LISTEN_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return process.returncode == EXIT_PORT_IN_USE
        if listening in log.read_text(encoding="utf-8", errors="replace"):
            return False
        time.sleep(0.05)
    return False
