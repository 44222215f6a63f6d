"""``just screenshots``: the README's pictures of the web UI (issue 44 item 7), what an operator
of a fleet sees. A real ``healthplane up --no-sim`` with ``healthplane sim load`` of NODES nodes,
in racks of 100 by the cluster config's ``domains:`` rules (and a domain-fault rule); then a
rack's power fails (``sim inject --domain rack=r0042 --fault silent``: its 100 nodes go quiet
until their heartbeats are missed), one GPU falls off the bus (Xid 79), another node's
collector cannot read EDAC, and an operator cordons a node. Taken in Debian's
Chromium, logged in as the admin: the dashboard (the heatmap, the needs-attention queue), the
nodes table filtered to what is not healthy, and the Xid node's page (docs/img/)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from playwright.sync_api import expect

from healthplane.stack.natsserver import terminate
from tests.support.browser import chromium
from tests.support.stack import Stack, interrupt, wait_for

NODES = int(os.environ.get("HEALTHPLANE_SCREENSHOT_NODES", "10000"))
RACK = "r0042"  # load-004200 .. load-004299
XID_NODE = "load-000123"
BLIND_NODE = "load-007001"
CORDONED_NODE = "load-002718"
CONFIG = """cluster: default
domains:
  rules:
    - {kind: rack, regex: 'load-(?P<r>\\d{4})\\d\\d', value: 'r{r}'}
nodeHealth:
  domainFaults:
    - {kind: rack, share: 50, window: 10m}
"""
PICTURES = ("dashboard.png", "nodes.png", "node.png")


@contextmanager
def _fleet(root: Path) -> Iterator[Stack]:
    data = root / "hp"
    config = root / "cluster.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    up = subprocess.Popen([sys.executable, "-m", "healthplane.cli", "up", "--no-sim", "--nats-port", "0",
                           "--data-dir", str(data), "--config", str(config)],
                          stdout=subprocess.DEVNULL, stderr=(root / "up.log").open("ab"), text=True)
    generator = None
    try:
        wait_for(lambda: (data / "stack.json").exists() or up.poll() is not None, 120, "up's stack.json")
        if up.poll() is not None:
            raise SystemExit(f"screenshots: up did not start:\n{(root / 'up.log').read_text()[-2000:]}")
        stack = Stack(data, up, json.loads((data / "stack.json").read_text()))
        generator = subprocess.Popen(
            [sys.executable, "-m", "healthplane.cli", "sim", "load", "--nodes", str(NODES), "--interval", "30"],
            stdout=subprocess.DEVNULL, stderr=(root / "load.log").open("ab"),
            env={**os.environ, "HEALTHPLANE_NATS_URL": str(stack.stack["natsUrl"]),
                 "HEALTHPLANE_NATS_CREDS": str(data / "creds" / "sim.creds")})

        def healthy() -> bool:
            try:
                return bool(stack.get("/api/v1/summary").json()["fleet"]["healthy"] == NODES)
            except (httpx.HTTPError, KeyError, ValueError):
                return False

        print(f"screenshots: {NODES} simulated nodes starting", flush=True)
        wait_for(healthy, 300, f"{NODES} nodes healthy")
        yield stack
    finally:
        if generator is not None:
            terminate(generator, 10)
        interrupt(up, 90)


def _cli(stack: Stack, *args: str) -> None:
    done = stack.cli(*args, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"screenshots: healthplane {' '.join(args)}: {done.stderr or done.stdout}")


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as root, _fleet(Path(root)) as stack, chromium() as browser:
        _cli(stack, "sim", "inject", "--domain", f"rack={RACK}", "--fault", "silent")
        _cli(stack, "sim", "inject", XID_NODE, "--fault", "xid:79", "--gpu", "0")
        _cli(stack, "sim", "inject", BLIND_NODE, "--fault", "collector-failed:edac")
        _cli(stack, "sim", "inject", BLIND_NODE, "--fault", "mce-corrected")  # reports now, blind
        _cli(stack, "node", "cordon", CORDONED_NODE, "--reason", "DIMM swap, ticket 4471")
        print(f"screenshots: rack {RACK} silent; waiting for its heartbeats to be missed", flush=True)
        started = time.monotonic()
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(stack.api_url + "/login")
        page.fill("textarea[name=token]", stack.token("admin"))
        page.click("form.login button[type=submit]")
        # The heartbeat deadline is three report intervals (ING-4): the rack is unknown after 90 s.
        expect(page.locator(f".heatmap[data-kind=rack] .cell[data-value={RACK}].unknown")).to_be_attached(
            timeout=240_000)
        expect(page.locator("#tile-health-unknown")).to_have_attribute("data-count", re.compile(r"^1\d\d$"),
                                                                       timeout=60_000)  # the rack, and more
        expect(page.locator("#attention li[data-kind=blind]").first).to_be_attached()
        print(f"screenshots: the fault is on the dashboard after {time.monotonic() - started:.0f} s", flush=True)
        page.screenshot(path=str(out / "dashboard.png"), full_page=True)

        page.goto(stack.api_url + "/nodes?health=DEGRADED&health=UNKNOWN&sort=health&pageSize=50")
        expect(page.locator("#nodes tbody tr").first).to_be_visible()
        page.screenshot(path=str(out / "nodes.png"))

        page.goto(stack.api_url + f"/nodes/{XID_NODE}")
        expect(page.locator("#trend circle")).to_have_count(2)
        page.screenshot(path=str(out / "node.png"), full_page=True)
    print(f"screenshots: {', '.join(f'{out / n} ({(out / n).stat().st_size // 1024} KB)' for n in PICTURES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img")))
