"""A real ``healthplane up`` without its own fleet, and a simulated fleet in racks beside it
(``sim run`` or ``sim load`` with ``--rack-size``, DOM-1), run as their own processes with up's
``sim`` credentials: what the rack tests and the time-to-DOMAIN_DEGRADED bench start."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.stack import Stack, launched


@contextmanager
def up_without_fleet(root: Path, config: str | None = None) -> Iterator[Stack]:
    """``up --no-sim`` (with ``config`` as its cluster config), once its api answers."""
    extra: list[str] = []
    if config is not None:
        path = root / "cluster.yaml"
        path.write_text(config, encoding="utf-8")
        extra = ["--config", str(path)]
    with launched(root, "--no-sim", *extra, nodes=0) as launch:
        yield launch.ready()


@contextmanager
def fleet(stack: Stack, log: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``healthplane sim ARGS`` against ``stack`` as the simulator's identity; stopped at the end."""
    creds = Path(stack.stack["adminCreds"]).parent / "sim.creds"
    process = subprocess.Popen([sys.executable, "-m", "healthplane.cli", "sim", *args],
                               env={**stack.env(), "HEALTHPLANE_NATS_CREDS": str(creds)},
                               stdout=subprocess.DEVNULL, stderr=open(log, "ab"), stdin=subprocess.DEVNULL)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(20)


def racks_of(stack: Stack) -> dict[str, str]:
    """node id -> the rack its view names (nodes without one left out)."""
    return {row["nodeId"]: row["domains"]["rack"] for row in stack.cli_json("node", "list")
            if "rack" in row.get("domains", {})}
