"""`healthplane node list | show | events` against records on a real nats-server (EVT-1, EVT-2)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.stack.natsserver import NatsServer

pytestmark = pytest.mark.nats
T0 = datetime(2026, 8, 5, 13, 41, 2, tzinfo=UTC)


def cli(server: NatsServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "healthplane.cli", "node", *args, "--nats-url", server.url],
                          capture_output=True, text=True, timeout=60)


def view(node_id: str, *, score: int | None, hostname: str, health: str = "HEALTHY") -> wire.NodeView:
    conditions = []
    explanation = None
    if score is not None:
        contributions = []
        if score < 100:
            conditions = [wire.Condition(type="disk_degraded", reason="SmartFailing", severity="critical",
                                         message="SMART health check failing on /dev/sda", first_seen=T0,
                                         observations=12)]
            contributions = [wire.Contribution(reason="SmartFailing", condition="disk_degraded", points=-40),
                             wire.Contribution(reason="attributed job failures", condition="", points=-5)]
        explanation = wire.ScoreExplanation(penalties="cluster", contributions=contributions)
    return wire.NodeView(
        node_id=node_id, cluster="default", hostname=hostname, status="READY", health=health,  # type: ignore[arg-type]
        last_reported_at=T0 + timedelta(minutes=24) if score is not None else None, score=score,
        score_explanation=explanation, conditions=conditions,
        attributed_failures=wire.AttributedFailures(count=1, last=T0 + timedelta(minutes=21),
                                                    by_fault={"DISK_DEGRADED": 1}) if score == 55 else wire.AttributedFailures(),
        holds=[])


@pytest.fixture
async def fleet(js: JetStreamContext) -> None:
    for v in (view("node-01", score=100, hostname="compute-1"),
              view("node-02", score=55, hostname="compute-2", health="DEGRADED"),
              view("node-03", score=None, hostname="compute-3", health="UNKNOWN")):
        await js.publish(subjects.node_view(v.cluster, v.node_id), wire.encode(v))
    for i in range(25):
        kind = "SCORE_CHANGED" if i % 5 == 0 else "CONDITION_RAISED"
        event = wire.NodeEvent(id=f"e{i}", node_id="node-02", cluster="default", type=kind,  # type: ignore[arg-type]
                               occurred_at=T0 + timedelta(hours=i), message=f"event {i}", actor="test")
        await js.publish(subjects.event("default", "node-02", kind), wire.encode(event))
    other = wire.NodeEvent(id="x", node_id="node-01", cluster="default", type="NODE_CORDONED", occurred_at=T0,
                           message="not node-02's", actor="test")
    await js.publish(subjects.event("default", "node-01", "NODE_CORDONED"), wire.encode(other))


async def test_list_text_and_json(nats_server: NatsServer, fleet: None) -> None:
    text = cli(nats_server, "list")
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines() == [
        "ID        CLUSTER   HOSTNAME    STATUS   HEALTH     SCORE   JOBS",
        "node-01   default   compute-1   Ready    Healthy    100     0",
        "node-02   default   compute-2   Ready    Degraded   55      0",
        "node-03   default   compute-3   Ready    Unknown    -       0",
    ]
    rows = json.loads(cli(nats_server, "list", "-o", "json").stdout)
    assert [(r["nodeId"], r["score"], r["health"]) for r in rows] == [
        ("node-01", 100, "HEALTHY"), ("node-02", 55, "DEGRADED"), ("node-03", None, "UNKNOWN")]
    assert {"nodeId", "cluster", "hostname", "status", "health", "score", "jobs"} <= set(rows[0])


async def test_list_orders_by_cluster_then_node_whatever_order_views_were_written(
        nats_server: NatsServer, js: JetStreamContext) -> None:
    """EVT-1 listing: the stream holds views in the order they last changed; the table and the
    JSON array are by cluster, then node id, and ``--cluster`` keeps one cluster."""
    written = [("b", "n-2"), ("a", "n-9"), ("b", "n-10"), ("a", "n-1"), ("ab", "n-0"), ("a", "n-1")]
    for cluster, node_id in written:  # a-n-1 written twice: the latest only
        v = msgspec.structs.replace(view(node_id, score=100, hostname=f"h-{node_id}"), cluster=cluster)
        await js.publish(subjects.node_view(cluster, node_id), wire.encode(v))
    listed = [line.split()[:2] for line in cli(nats_server, "list").stdout.splitlines()[1:]]
    assert listed == [["n-1", "a"], ["n-9", "a"], ["n-0", "ab"], ["n-10", "b"], ["n-2", "b"]]
    rows = json.loads(cli(nats_server, "list", "-o", "json").stdout)
    assert [(r["cluster"], r["nodeId"]) for r in rows] == [(c, n) for n, c in listed]
    only_b = cli(nats_server, "list", "--cluster", "b").stdout.splitlines()
    assert [line.split()[0] for line in only_b[1:]] == ["n-10", "n-2"]
    empty = cli(nats_server, "list", "--cluster", "nowhere")
    assert empty.returncode == 0 and empty.stdout == "ID   CLUSTER   HOSTNAME   STATUS   HEALTH   SCORE   JOBS\n"
    assert json.loads(cli(nats_server, "list", "--cluster", "nowhere", "-o", "json").stdout) == []


async def test_show_reads_like_the_reference(nats_server: NatsServer, fleet: None) -> None:
    shown = cli(nats_server, "show", "node-02")
    assert shown.stdout.splitlines() == [
        "Node:      node-02 (compute-2, cluster default)",
        "Status:    Ready",
        "Health:    Degraded (last reported 2026-08-05T14:05:02Z)",
        # Issue 15.6: a view months old on a node not OFFLINE says so, never just "Degraded".
        shown.stdout.splitlines()[3],
        "Score:     55/100 (penalties: cluster)",
        "  -40  SmartFailing",
        "  -5   attributed job failures",
        # API-4: no config applied, so the defaults: observe mode recommends and never acts.
        "Automation: observe mode: recommended cordon at 55 (mode observe recommends, never acts)",
        "Conditions:",
        "  Disk Degraded [Critical] SMART health check failing on /dev/sda",
        "    first seen 2026-08-05T13:41:02Z, 12 observations",
        "Attributed job failures: 1 (last 2026-08-05T14:02:02Z)",
        "  Disk Degraded: 1",
    ]
    assert shown.stdout.splitlines()[3].startswith("Stale:     this view is ")
    assert "(30s report interval): health-ingest or the scorer is not folding reports" in shown.stdout
    unscored = cli(nats_server, "show", "node-03").stdout.splitlines()
    assert unscored[2:4] == ["Health:    Unknown", "Score:     not yet scored"]
    document = json.loads(cli(nats_server, "show", "node-02", "-o", "json").stdout)
    assert document["scoreExplanation"]["contributions"][0] == {"reason": "SmartFailing", "condition": "disk_degraded",
                                                                "points": -40}
    assert document["attributedFailures"] == {"count": 1, "last": "2026-08-05T14:02:02Z", "byFault": {"DISK_DEGRADED": 1}}
    assert document["automation"].startswith("observe mode: recommended cordon at 55")


async def test_unknown_node_exits_1_naming_it(nats_server: NatsServer, fleet: None) -> None:
    result = cli(nats_server, "show", "node-99")
    assert result.returncode == 1 and "node node-99 not found" in result.stderr


async def test_events_pages_oldest_first_and_latest(nats_server: NatsServer, fleet: None) -> None:
    first = json.loads(cli(nats_server, "events", "node-02", "--page-size", "10", "-o", "json").stdout)
    assert [e["id"] for e in first["events"]] == [f"e{i}" for i in range(10)]
    second = json.loads(cli(nats_server, "events", "node-02", "--page-size", "10", "--page-token",
                            first["nextPageToken"], "-o", "json").stdout)
    assert [e["id"] for e in second["events"]] == [f"e{i}" for i in range(10, 20)]
    third = json.loads(cli(nats_server, "events", "node-02", "--page-size", "10", "--page-token",
                           second["nextPageToken"], "-o", "json").stdout)
    assert [e["id"] for e in third["events"]] == [f"e{i}" for i in range(20, 25)] and third["nextPageToken"] is None
    latest = json.loads(cli(nats_server, "events", "node-02", "--latest", "--page-size", "4", "-o", "json").stdout)
    assert [e["id"] for e in latest["events"]] == ["e21", "e22", "e23", "e24"] and latest["nextPageToken"] is None


async def test_events_filter_by_type_and_since(nats_server: NatsServer, fleet: None) -> None:
    scores = json.loads(cli(nats_server, "events", "node-02", "--type", "SCORE_CHANGED", "-o", "json").stdout)
    assert [e["id"] for e in scores["events"]] == ["e0", "e5", "e10", "e15", "e20"]
    since = json.loads(cli(nats_server, "events", "node-02", "--since", "2026-08-06T10:00:00Z", "-o", "json").stdout)
    assert [e["id"] for e in since["events"]] == ["e21", "e22", "e23", "e24"]
    text = cli(nats_server, "events", "node-02", "--type", "SCORE_CHANGED").stdout.splitlines()
    assert text[0].startswith("TIME") and text[1] == "2026-08-05T13:41:02Z | SCORE_CHANGED | event 0"
    bad = cli(nats_server, "events", "node-02", "--since", "yesterday")
    assert bad.returncode == 2 and "--since" in bad.stderr
