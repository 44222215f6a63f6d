"""Eviction as a service on a real nats-server, driven through the real CLI (EVI-1 … EVI-4,
REL-1, REL-3). The scheduler's side of the protocol is played by the test: it publishes
allocations and reads the directives eviction sends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.runtime.replay import read_all
from healthplane.stack.natsserver import NatsServer
from tests.component.test_health_ingest import until
from tests.support.secure import env_for

pytestmark = pytest.mark.nats
NOW = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def start(server: NatsServer, name: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "healthplane.cli", "service", name],
                            env=env_for(server, name),
                            stdout=subprocess.DEVNULL, stderr=open(log, "ab"))


def node_cli(server: NatsServer, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "healthplane.cli", "node", *args, "--nats-url", server.url],
                          capture_output=True, text=True, timeout=60, input=stdin,
                          env=env_for(server, "admin", "alice", HEALTHPLANE_ACTOR="alice"))


async def register(js: JetStreamContext, node_id: str, *, provisioned: bool = False, ready: bool = True) -> None:
    report = wire.ResourceReport(node_id=node_id, cluster="default", hostname=f"host-{node_id}", sent_at=NOW,
                                 ready=ready, cores=192, memory_bytes=1 << 40, provisioned=provisioned)
    await js.publish(subjects.resource("default", node_id), wire.encode(report))


async def allocate(js: JetStreamContext, node_id: str, alloc_id: str, state: str = "started", **fields: object) -> None:
    alloc = wire.Allocation(id=alloc_id, job_id=alloc_id.split(".")[0], node_id=node_id, cluster="default",
                            state=state, at=NOW, **fields)  # type: ignore[arg-type]
    await js.publish(subjects.allocation("default", node_id, alloc_id), wire.encode(alloc))


async def directives(server: NatsServer, js: JetStreamContext) -> list[wire.Directive]:
    nc = js._nc  # type: ignore[attr-defined]
    return [wire.decode(wire.Directive, m.data) for m in await read_all(nc, js, "HP_DIRECTIVES", "hp.directive.>")]


async def node_events(js: JetStreamContext, kind: str) -> list[wire.NodeEvent]:
    nc = js._nc  # type: ignore[attr-defined]
    return [wire.decode(wire.NodeEvent, m.data)
            for m in await read_all(nc, js, "HP_NODE_EVENTS", f"hp.event.*.*.{kind}")]


@pytest.fixture
async def services(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path):  # type: ignore[no-untyped-def]
    processes = {name: start(nats_server, name, tmp_path / f"{name}.log") for name in ("eviction", "scorer")}

    async def running() -> bool:
        return all("service started" in (tmp_path / f"{n}.log").read_text() for n in processes)

    await until(running)
    yield processes
    for process in processes.values():
        process.terminate()
        process.wait(timeout=10)


async def views(js: JetStreamContext) -> dict[str, wire.NodeView]:
    nc = js._nc  # type: ignore[attr-defined]
    found = await read_all(nc, js, "HP_NODES", "hp.node.>", last_per_subject=True)
    return {v.node_id: v for v in (wire.decode(wire.NodeView, m.data) for m in found)}


async def registered(js: JetStreamContext, *nodes: str) -> None:
    async def seen() -> bool:
        return set(nodes) <= set(await views(js))

    await until(seen)


async def test_evi1_cordon_evict_uncordon_and_release_through_the_cli(
        nats_server: NatsServer, js: JetStreamContext, services: object) -> None:
    await register(js, "cn-042")
    await registered(js, "cn-042")
    cordon = node_cli(nats_server, "cordon", "cn-042", "--reason", "flaky NIC")
    assert cordon.returncode == 0, cordon.stderr
    assert cordon.stdout.startswith("cordon hold created for cn-042: ")
    evict = node_cli(nats_server, "evict", "cn-042", "--reason", "GPU 2 throwing uncorrectable ECC")
    assert evict.stdout.startswith("evict hold created for cn-042: ")
    uncordon = node_cli(nats_server, "uncordon", "cn-042")
    assert uncordon.stdout.strip() == "1 cordon hold(s) released for cn-042: 1 hold(s) remain (evict)"

    async def held() -> bool:
        view = (await views(js))["cn-042"]
        return view.status == "CORDONED" and [h.effect for h in view.holds] == ["evict"]

    await until(held)  # the node's view (scorer) follows the hold events
    release = node_cli(nats_server, "hold", "release", "--all", "--node", "cn-042", "--effect", "evict")
    assert release.stdout.strip() == "1 hold(s) released for cn-042: 0 hold(s) remain", release.stderr

    async def ready() -> bool:
        return (await views(js))["cn-042"].status == "READY"

    await until(ready)
    as_json = json.loads(node_cli(nats_server, "cordon", "cn-042", "-o", "json").stdout)
    assert as_json["result"] == "applied" and len(as_json["holdIds"]) == 1


async def test_evi2_drain_refusals_and_counts(nats_server: NatsServer, js: JetStreamContext, services: object) -> None:
    await register(js, "ready-1")
    await register(js, "ready-2")
    await register(js, "maint", ready=False)
    await registered(js, "ready-1", "ready-2", "maint")
    refused = node_cli(nats_server, "drain", "maint")
    assert refused.returncode == 1
    assert refused.stderr.strip() == ("Error: node maint is NOT_READY and cannot be drained: only a READY or "
                                      "already cordoned node can be taken out of service")
    await allocate(js, "ready-1", "job.0.0")
    drained = node_cli(nats_server, "drain", "--all", "--active", "--reason", "failing disk")
    assert drained.stdout.strip() == "Cordoned 2 node(s); requeued 1 allocation(s)", drained.stderr
    sent = await directives(nats_server, js)
    assert [(d.node_id, d.action, d.allocation_id) for d in sent] == [("ready-1", "requeue", "job.0.0")]
    again = node_cli(nats_server, "drain", "--all")
    assert again.stdout.strip() == "Cordoned 0 node(s)"  # what it took out, not what it examined


async def test_evi4_deprovision_static_unknown_and_all(nats_server: NatsServer, js: JetStreamContext,
                                                       services: object) -> None:
    await register(js, "static-1", provisioned=False)
    await register(js, "cloud-1", provisioned=True)
    await registered(js, "static-1", "cloud-1")
    static = node_cli(nats_server, "deprovision", "static-1")
    assert (static.returncode, static.stderr.strip()) == (1, "Error: cannot deprovision static node static-1")
    usage = node_cli(nats_server, "deprovision", "--all", "--force")
    assert usage.returncode == 2 and "--force cannot be combined with --all or --evict" in usage.stderr
    declined = node_cli(nats_server, "deprovision", "--all", "--evict", stdin="")
    assert declined.returncode == 1 and "--yes" in declined.stderr
    assert "Take running work off and tear down" in declined.stdout
    assert not await node_events(js, "HOLD_CREATED")  # declining changed nothing
    await allocate(js, "cloud-1", "long.0.0", retry_on=["node"], retry_attempts=3)
    everything = node_cli(nats_server, "deprovision", "--all", "--evict", "--reason", "scaling down",
                          stdin="y\n")
    lines = everything.stdout.splitlines()
    assert lines[0] == ("Take running work off and tear down every node Healthplane provisioned in the cluster? "
                        "[y/N] ")
    assert lines[1].startswith("deprovision hold created for cloud-1: ")
    assert lines[2].startswith("evict hold created for cloud-1: ")
    assert lines[3] == "skipped static-1: statically provisioned; Healthplane did not create this instance"
    assert everything.returncode == 0, everything.stderr
    sent = await directives(nats_server, js)
    assert [(d.node_id, d.action) for d in sent] == [("cloud-1", "requeue")]
    await allocate(js, "cloud-1", "long.0.0", state="requeued")

    async def terminated() -> bool:
        return [d.action for d in await directives(nats_server, js)] == ["requeue", "terminate"]

    await until(terminated)
    terminate = (await directives(nats_server, js))[-1]
    await js.publish(subjects.provision("default", "cloud-1"), wire.encode(wire.TerminationResult(
        directive_id=terminate.id, node_id="cloud-1", cluster="default", accepted=True, message="terminating",
        at=NOW)))

    async def gone() -> bool:
        return bool(await node_events(js, "NODE_DEPROVISIONED"))

    await until(gone)


async def test_evi4_unknown_provisioning_is_retryable(nats_server: NatsServer, js: JetStreamContext,
                                                      services: object) -> None:
    event = wire.NodeEvent(id="e1", node_id="fresh", cluster="default", type="HEARTBEAT_RESUMED", occurred_at=NOW,
                           message="", actor="health-ingest")
    await js.publish(subjects.event("default", "fresh", "HEARTBEAT_RESUMED"), wire.encode(event))
    result = node_cli(nats_server, "deprovision", "fresh", "--cluster", "default")
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip() == ("rpc error: code = Unavailable desc = node fresh has not reported its "
                                     "resources yet, so whether Healthplane provisioned it is not known; retry")


async def test_command_is_pending_not_lost_while_eviction_is_down(nats_server: NatsServer, js: JetStreamContext,
                                                                  tmp_path: Path) -> None:
    scorer = start(nats_server, "scorer", tmp_path / "scorer.log")
    try:
        await register(js, "cn-1")
        await registered(js, "cn-1")
        pending = node_cli(nats_server, "cordon", "cn-1", "--timeout", "1")
        assert pending.returncode == 0
        assert "accepted" in pending.stdout and "pending" in pending.stdout
        eviction = start(nats_server, "eviction", tmp_path / "eviction.log")
        try:
            async def cordoned() -> bool:
                return (await views(js))["cn-1"].status == "CORDONED"

            await until(cordoned)
        finally:
            eviction.terminate()
            eviction.wait(timeout=10)
    finally:
        scorer.terminate()
        scorer.wait(timeout=10)


async def test_rel1_kill_9_in_the_middle_of_drain_all(nats_server: NatsServer, js: JetStreamContext,
                                                      tmp_path: Path) -> None:
    """Every node ends in exactly one correct state: one cordon hold, one NODE_DRAINED, one
    outcome per command, however the kill fell."""
    scorer = start(nats_server, "scorer", tmp_path / "scorer.log")
    nodes = [f"n{i:04d}" for i in range(600)]
    try:
        for node in nodes:
            await register(js, node)
        await registered(js, *nodes)
        eviction = start(nats_server, "eviction", tmp_path / "eviction.log")
        drain = subprocess.Popen([sys.executable, "-m", "healthplane.cli", "node", "drain", "--all", "--timeout",
                                  "60", "--nats-url", nats_server.url], stdout=subprocess.PIPE, text=True)

        async def some_drained() -> bool:
            return len(await node_events(js, "NODE_DRAINED")) > 100

        await until(some_drained, timeout=60)
        os.kill(eviction.pid, signal.SIGKILL)
        eviction.wait()
        eviction = start(nats_server, "eviction", tmp_path / "eviction.log")
        try:
            out, _ = drain.communicate(timeout=90)
            assert out.strip() == f"Cordoned {len(nodes)} node(s)"

            async def all_drained() -> bool:  # the CLI waits for the cordons; the drains follow
                return len(await node_events(js, "NODE_DRAINED")) >= len(nodes)

            await until(all_drained, timeout=60)
        finally:
            eviction.terminate()
            eviction.wait(timeout=10)
        drained = [e.node_id for e in await node_events(js, "NODE_DRAINED")]
        holds = [e.node_id for e in await node_events(js, "HOLD_CREATED")]
        assert sorted(drained) == nodes and sorted(holds) == nodes
        nc = js._nc  # type: ignore[attr-defined]
        outcomes = [wire.decode(wire.CommandOutcome, m.data).node_id
                    for m in await read_all(nc, js, "HP_COMMANDS", "hp.outcome.>")]
        assert sorted(outcomes) == nodes
    finally:
        scorer.terminate()
        scorer.wait(timeout=10)


async def test_rel3_a_malformed_command_does_not_block_the_next(nats_server: NatsServer, js: JetStreamContext,
                                                                admin: JetStreamContext, services: object) -> None:
    await register(js, "cn-7")
    await registered(js, "cn-7")
    await admin.publish(subjects.command("default", "cn-7", "cordon", "test"), b'{"id": 1}')
    cordon = node_cli(nats_server, "cordon", "cn-7")
    assert cordon.returncode == 0 and cordon.stdout.startswith("cordon hold created for cn-7: ")
