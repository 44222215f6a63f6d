"""Bad records on the streams the CLI and `up` read: each is named once and skipped, the
rest is read as usual, and no command prints a traceback (REL-3, issue "operator fidelity")."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import parse_cluster_config
from healthplane.runtime import configstore
from healthplane.stack.natsserver import NatsServer
from tests.support.secure import apply_config, publish_as_admin

pytestmark = pytest.mark.nats

CLUSTER = "default"
T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
NOT_JSON = b"cluster: ["
NOT_A_CONFIG = json.dumps({"version": 7, "appliedAt": "2026-11-30T09:00:00Z", "actor": "mallory",
                           "config": {"nodeHealth": {"mode": "reboot-everything"}}}).encode()


def cli(server: NatsServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "healthplane.cli", *args, "--nats-url", server.url],
                          capture_output=True, text=True, timeout=60)


def clean(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr


def view(node: str) -> wire.NodeView:
    return wire.NodeView(node_id=node, cluster=CLUSTER, hostname=node, status="READY", health="HEALTHY",
                         last_reported_at=T0, score=100, score_explanation=None, conditions=[],
                         attributed_failures=wire.AttributedFailures(), holds=[])


def event(node: str, n: int) -> wire.NodeEvent:
    return wire.NodeEvent(id=f"e{n}", node_id=node, cluster=CLUSTER, type="NODE_CORDONED", occurred_at=T0,
                          message=f"cordoned {n}", actor="operator")


async def test_config_show_and_apply_read_past_bad_records(nats_server: NatsServer, js: JetStreamContext) -> None:
    # REL-3 / issue 15.1: a non-JSON record and a record whose config does not validate
    # leave the config in force readable and the next apply working.
    await apply_config(js, parse_cluster_config({"cluster": "prod"}))
    await publish_as_admin(js, subjects.CONFIG, NOT_JSON)
    await publish_as_admin(js, subjects.CONFIG, NOT_A_CONFIG)

    shown = cli(nats_server, "config", "show", "-o", "json")
    clean(shown)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["version"] == 1
    warnings = shown.stderr.splitlines()
    assert len(warnings) == 2
    assert "hp.config record 2 skipped: invalid ConfigEnvelope: malformed JSON" in warnings[1]
    assert "hp.config record 3 skipped:" in warnings[0] and "nodeHealth.mode" in warnings[0]

    found = await configstore.read(js)
    assert found.in_force is not None and found.in_force.seq == 1 and found.last_seq == 3
    assert [r.seq for r in found.skipped] == [3, 2]


async def test_config_apply_after_a_bad_record(nats_server: NatsServer, js: JetStreamContext,
                                               tmp_path: Path) -> None:
    # REL-3: apply expects the newest record's sequence, bad or not, and takes the next version.
    await apply_config(js, parse_cluster_config({"cluster": "prod"}))
    await publish_as_admin(js, subjects.CONFIG, NOT_JSON)
    config = tmp_path / "cluster.yaml"
    config.write_text("cluster: prod\nnodeHealth:\n  mode: cordon\n")
    applied = cli(nats_server, "config", "apply", "-f", str(config))
    clean(applied)
    assert applied.returncode == 0, applied.stderr
    assert "config version 2 applied" in applied.stdout
    assert "hp.config record 2 skipped" in applied.stderr
    shown = cli(nats_server, "config", "show", "-o", "json")
    assert shown.returncode == 0 and shown.stderr == ""  # the bad record is behind the one in force
    assert json.loads(shown.stdout)["config"]["nodeHealth"]["mode"] == "cordon"


async def test_only_bad_config_records(nats_server: NatsServer, js: JetStreamContext) -> None:
    # REL-3: nothing valid was ever applied: one line, exit 1; the first apply is version 1.
    await publish_as_admin(js, subjects.CONFIG, NOT_JSON)
    shown = cli(nats_server, "config", "show")
    clean(shown)
    assert shown.returncode == 1
    assert shown.stderr.splitlines() == [
        "healthplane: warning: hp.config record 1 skipped: invalid ConfigEnvelope: malformed JSON "
        "(JSON is malformed: invalid character (byte 0))",
        "healthplane: no valid config applied yet; services use the built-in defaults",
    ]
    assert await apply_config(js, parse_cluster_config({})) == 1


async def test_node_reads_skip_bad_views_and_events(nats_server: NatsServer, js: JetStreamContext) -> None:
    # REL-3: a bad node view or node event is named and skipped; the rest is listed.
    await js.publish(subjects.node_view(CLUSTER, "n1"), wire.encode(view("n1")))
    await js.publish(subjects.node_view(CLUSTER, "n2"), b"\xff\xfe not a view")
    await js.publish(subjects.node_view(CLUSTER, "n3"), b'{"nodeId": "n3"}')
    await js.publish(subjects.event(CLUSTER, "n1", "NODE_CORDONED"), wire.encode(event("n1", 1)))
    await js.publish(subjects.event(CLUSTER, "n1", "NODE_CORDONED"), b"[1, 2")
    await js.publish(subjects.event(CLUSTER, "n1", "NODE_CORDONED"), wire.encode(event("n1", 2)))

    for output in ("text", "json"):
        listed = cli(nats_server, "node", "list", "-o", output)
        clean(listed)
        assert listed.returncode == 0, listed.stderr
        assert "n1" in listed.stdout and "n3" not in listed.stdout
        assert listed.stderr.count("HP_NODES record skipped: invalid NodeView") == 2
    assert [v["nodeId"] for v in json.loads(cli(nats_server, "node", "list", "-o", "json").stdout)] == ["n1"]

    shown = cli(nats_server, "node", "show", "n2")
    clean(shown)
    assert shown.returncode == 1
    assert shown.stderr.splitlines()[-1] == "healthplane: node n2 not found"
    assert "HP_NODES record" in shown.stderr and "(hp.node.default.n2) skipped" in shown.stderr

    events = cli(nats_server, "node", "events", "n1", "-o", "json")
    clean(events)
    assert events.returncode == 0, events.stderr
    assert [e["message"] for e in json.loads(events.stdout)["events"]] == ["cordoned 1", "cordoned 2"]
    assert "HP_NODE_EVENTS record 2 (hp.event.default.n1.NODE_CORDONED) skipped: invalid NodeEvent" in events.stderr


async def test_sim_jobs_skips_a_bad_job(nats_server: NatsServer, js: JetStreamContext) -> None:
    # REL-3: `sim jobs` reads HP_ALLOCATIONS; a bad job record does not end it.
    await js.publish(f"{subjects.PREFIX}.job.{CLUSTER}.k1", b"{}")
    jobs = cli(nats_server, "sim", "jobs", "-o", "json")
    clean(jobs)
    assert jobs.returncode == 0 and json.loads(jobs.stdout) == []
    assert "HP_ALLOCATIONS record 1 (hp.job.default.k1) skipped: invalid Job" in jobs.stderr
