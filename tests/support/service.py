"""``healthplane service NAME`` started by a test on a metrics port the kernel picks
(``--metrics-port 0``): bound as it is picked. A port a test picked free first and handed over
is not yet bound, and in a full run another worker's process took one before the service
listened ("metrics endpoint cannot listen", the slurm adapter gone with EXIT_PORT_IN_USE). The
port is read from the service's own log line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

LISTEN_TIMEOUT_S = 60.0  # a service's imports, on a machine the whole suite keeps busy
ENDPOINT_EVENT = "metrics endpoint"  # healthplane.runtime.lifecycle logs it with the URL it serves


def spawn(service: str, env: dict[str, str], log: Path, **popen: Any) -> tuple[subprocess.Popen[bytes], int]:
    """The service's process, listening on its metrics port, and that port. Its log lines are
    appended to ``log`` (a restart may share it: the port is from this process's line)."""
    earlier = len(_endpoints(log))
    with open(log, "ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "healthplane.cli", "service", service, "--metrics-port", "0"],
                                   env=env, stdout=subprocess.DEVNULL, stderr=out, **popen)
    deadline = time.monotonic() + LISTEN_TIMEOUT_S
    while len(_endpoints(log)) == earlier:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"{service} did not listen: {_tail(log)}")
        time.sleep(0.05)
    return process, listening_port(log)


def listening_port(log: Path) -> int:
    """The metrics port the service that wrote ``log`` last said it listens on."""
    found = _endpoints(log)
    port = urlsplit(found[-1]).port if found else None
    assert port is not None, f"no {ENDPOINT_EVENT!r} line with a port: {_tail(log)}"
    return port


def _endpoints(log: Path) -> list[str]:
    urls = []
    for line in (log.read_text(encoding="utf-8", errors="replace") if log.exists() else "").splitlines():
        if line.startswith("{") and ENDPOINT_EVENT in line:
            record = json.loads(line)
            if record.get("event") == ENDPOINT_EVENT:
                urls.append(str(record["url"]))
    return urls


def _tail(log: Path) -> str:
    return log.read_text(encoding="utf-8", errors="replace")[-2000:] if log.exists() else ""
