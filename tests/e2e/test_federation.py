"""FED-1..3 end to end: a hub and two clusters, each its own ``healthplane up`` on its own
nats-server, the clusters' leaf connections to the hub real, cluster a's through a link the
test can cut (``tests.support.link``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from healthplane.runtime.connect import connect
from tests.support.link import Link
from tests.support.stack import Stack, launched, running, wait_for

pytestmark = pytest.mark.slow
UNREACHABLE_AFTER_S = 5  # the hub's threshold in this test (the default is 10 s)
NODES = 4


def _health(rows: list[dict[str, Any]]) -> dict[str, tuple[str, str, int | None]]:
    return {row["nodeId"]: (row["status"], row["health"], row["score"]) for row in rows}


def _hub_rows(hub: Stack, cluster: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = hub.cli_json("node", "list", "--federation", "--cluster", cluster)
    return found


def _own_rows(member: Stack) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = member.cli_json("node", "list")
    return found


def _same_as_own(hub: Stack, member: Stack, cluster: str) -> bool:
    own = _health(_own_rows(member))
    return len(own) == NODES and _health(_hub_rows(hub, cluster)) == own


def _metric(hub: Stack, name: str, cluster: str) -> float | None:
    url = next(s["metricsUrl"] for s in hub.stack["services"] if s["name"] == "api")
    with urllib.request.urlopen(url, timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(f'{name}{{cluster="{cluster}"}}'):
                return float(line.rsplit(" ", 1)[1])
    return None


@contextmanager
def federation(tmp_path: Path) -> Iterator[tuple[Stack, Stack, Stack, Link]]:
    with ExitStack() as stack:
        hub = stack.enter_context(running(tmp_path / "hub", "--federation-hub", "--leaf-port", "0", nodes=0))
        leaf_port = int(hub.stack["leafUrl"].rsplit(":", 1)[1])
        link = Link(leaf_port)
        stack.callback(link.close)
        launches = []
        for name, url in (("a", link.url), ("b", hub.stack["leafUrl"])):
            creds = tmp_path / f"{name}.member.creds"
            attach = hub.cli("federation", "attach", name, "--data-dir", str(hub.data_dir), "-o", str(creds))
            assert attach.returncode == 0, attach.stderr
            assert f"--attach {hub.stack['leafUrl']} --attach-creds {creds}" in attach.stdout
            config = tmp_path / f"{name}.yaml"
            config.write_text(f"cluster: {name}\n", encoding="utf-8")
            launches.append(stack.enter_context(launched(tmp_path / name, "--attach", url, "--attach-creds",
                                                         str(creds), "--config", str(config), nodes=NODES)))
        a, b = (launch.ready() for launch in launches)  # both clusters start side by side
        yield hub, a, b, link


async def _spy_on_commands(hub: Stack) -> int:
    """What the hub's maintainer (the one who may make streams there, SEC-10) gets by sourcing
    cluster a's HP_COMMANDS into a stream of its own."""
    nc = await connect(str(hub.stack["natsUrl"]), name="spy", creds=str(hub.stack["maintainerCreds"]),
                       give_up_after=5)
    try:
        config = {"name": "SPY", "subjects": [], "storage": "file", "num_replicas": 1,
                  "sources": [{"name": "HP_COMMANDS", "external": {"api": "$JS.a.API"}}]}
        await nc.request("$JS.API.STREAM.CREATE.SPY", json.dumps(config).encode(), timeout=5)
        await asyncio.sleep(6)
        info = json.loads((await nc.request("$JS.API.STREAM.INFO.SPY", b"{}", timeout=5)).data)
        return int(info["state"]["messages"])
    finally:
        await nc.close()


# Three whole stacks (a hub and two members, every service each) on 2 cores: 58 s alone, 105 s
# inside a full parallel run, past the suite's 120 s once in a fresh-clone CI run.
@pytest.mark.timeout(360)
def test_fed1_fed2_fed3_two_clusters_on_a_hub_through_an_outage(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """FED-1: both clusters' nodes on the hub, each as its own cluster shows it; a fault shows
    on the hub within seconds. FED-3: a cordon from the hub is executed by the node's cluster.
    FED-2: a's link cut, a's nodes show no health ("unreachable since T") while b's are
    untouched, a command for a's node is refused as retryable; the link mended, the hub
    catches up with what changed meanwhile. The hub's series say the same."""
    monkeypatch.setenv("HEALTHPLANE_FEDERATION_UNREACHABLE_AFTER_S", str(UNREACHABLE_AFTER_S))
    with federation(tmp_path) as (hub, a, b, link):
        wait_for(lambda: _same_as_own(hub, a, "a") and _same_as_own(hub, b, "b"), 60, "both clusters on the hub")
        listed = hub.get("/api/v1/nodes", federation="true").json()
        assert listed["total"] == 2 * NODES and _health(listed["nodes"]) == _health(_hub_rows(hub, "a") +
                                                                                    _hub_rows(hub, "b"))
        assert [(c["cluster"], c["label"]) for c in hub.get("/api/v1/summary").json()["clusters"]] == [
            ("a", "All healthy"), ("b", "All healthy")]

        injected = a.cli("sim", "inject", "sim-001", "--fault", "xid:79", "--gpu", "0", "--cluster", "a")
        assert injected.returncode == 0, injected.stderr
        started = time.monotonic()
        wait_for(lambda: _health(_hub_rows(hub, "a"))["sim-001"][1:] == ("DEGRADED", 55), 20, "the fault on the hub")
        print(f"FED-1: fault injected in a -> shown on the hub in {time.monotonic() - started:.1f}s", file=sys.stderr)
        assert _same_as_own(hub, a, "a")

        cordon = hub.cli("node", "cordon", "sim-002", "--cluster", "a", "--federation", "--reason", "from the hub")
        assert cordon.returncode == 0, cordon.stderr
        assert "cordon hold created for sim-002" in cordon.stdout
        [hold] = a.cli_json("node", "show", "sim-002", "--cluster", "a")["holds"]
        assert (hold["effect"], hold["reason"], hold["actor"]) == ("cordon", "from the hub", "admin")
        viewer = hub.cli("node", "cordon", "sim-003", "--cluster", "a", "--federation", role="viewer")
        assert viewer.returncode == 1 and "permission denied" in viewer.stderr
        assert asyncio.run(_spy_on_commands(hub)) == 0, "the hub read a stream a did not offer it"

        link.cut()
        cut_at = time.monotonic()
        b_before = _health(_own_rows(b))

        def a_unreachable() -> list[dict[str, Any]] | None:
            rows = _hub_rows(hub, "a")
            return rows if all(r["health"] == "UNKNOWN" and r["score"] is None for r in rows) else None

        rows = wait_for(a_unreachable, UNREACHABLE_AFTER_S + 10, "a's nodes without health on the hub")
        print(f"FED-2: link cut -> a unreachable on the hub in {time.monotonic() - cut_at:.1f}s", file=sys.stderr)
        assert len(rows) == NODES
        assert all(r["status"] == "UNKNOWN" and r["unreachable"].startswith("cluster a unreachable since ")
                   for r in rows)
        assert _health(_hub_rows(hub, "b")) == b_before == _health(_own_rows(b))
        summary = {c["cluster"]: c for c in hub.cli_json("node", "summary", "--federation")["clusters"]}
        assert summary["a"]["label"].startswith("No health: cluster a unreachable since ")
        assert summary["b"]["label"] == "All healthy"
        # (the moment in "since T" is the hub's now less the source's silence: each read's own)
        api_rows = {c["cluster"]: c for c in hub.get("/api/v1/summary").json()["clusters"]}
        assert api_rows["a"]["label"].startswith("No health: cluster a unreachable since ") and not api_rows["a"]["readable"]
        assert api_rows["b"] == summary["b"]
        dashboard = hub.get("/").text
        assert "Federation health" in dashboard and "No health: cluster a unreachable since " in dashboard
        refused = hub.cli("node", "cordon", "sim-003", "--cluster", "a", "--federation")
        assert refused.returncode == 3, refused.stderr
        assert "cluster a unreachable since" in refused.stderr and "nothing was sent" in refused.stderr
        wait_for(lambda: _metric(hub, "healthplane_federation_cluster_reachable", "a") == 0, 10, "the series")
        assert _metric(hub, "healthplane_federation_cluster_reachable", "b") == 1
        assert (_metric(hub, "healthplane_federation_cluster_data_age_seconds", "a") or 0) >= UNREACHABLE_AFTER_S

        during = a.cli("sim", "inject", "sim-003", "--fault", "xid:79", "--gpu", "0", "--cluster", "a")
        assert during.returncode == 0, during.stderr
        wait_for(lambda: _health(_own_rows(a))["sim-003"][1] == "DEGRADED", 20, "the fault in a during the outage")

        link.mend()
        mended_at = time.monotonic()
        wait_for(lambda: _same_as_own(hub, a, "a"), 60, "the hub caught up with a")
        print(f"FED-2: link mended -> hub caught up in {time.monotonic() - mended_at:.1f}s", file=sys.stderr)
        assert _health(_hub_rows(hub, "a"))["sim-003"][1:] == ("DEGRADED", 55)
        wait_for(lambda: _metric(hub, "healthplane_federation_cluster_reachable", "a") == 1, 10, "the series back")


@pytest.mark.parametrize(("flags", "config", "message"), [
    (["--attach", "nats-leaf://127.0.0.1:7422"], None, "--attach needs --attach-creds FILE"),
    (["--attach-creds", "x.creds"], None, "--attach-creds goes with --attach URL"),
    (["--attach", "127.0.0.1:7422", "--insecure"], None, "--attach 127.0.0.1:7422: the hub's leaf URL(s)"),
    (["--attach", "nats-leaf://127.0.0.1:7422", "--attach-creds", "missing.creds"], None,
     "--attach-creds missing.creds: no such file"),
    (["--attach", "nats-leaf://127.0.0.1:7422", "--insecure"], "cluster: Bad.Name\n",
     "cluster name 'Bad.Name' cannot join a federation"),
])
def test_fed1_up_refuses_a_federation_it_cannot_run_in_one_line(tmp_path: Path, flags: list[str], config: str | None,
                                                                 message: str) -> None:
    extra = []
    if config is not None:
        (tmp_path / "c.yaml").write_text(config, encoding="utf-8")
        extra = ["--config", str(tmp_path / "c.yaml")]
    done = subprocess.run([sys.executable, "-m", "healthplane.cli", "up", "--data-dir", str(tmp_path / "hp"),
                           "--nats-port", "0", *flags, *extra], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    [line] = done.stderr.strip().splitlines()
    assert done.returncode == 1 and line.startswith("healthplane up: ") and message in line
