"""Failure domains in the policy service as its own process on a real nats-server (DOM-2,
DOM-3): node views carrying their domains and node events in, DOMAIN_* events, POLICY_HALTED
and commands out. Times in the records are the injected clock."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from healthplane.client import reads
from healthplane.contracts import subjects, wire
from healthplane.runtime.replay import replay
from healthplane.stack.natsserver import NatsServer
from tests.component.test_policy import (
    CLUSTER,
    apply,
    at,
    commands,
    degrade,
    policy_events,
    policy_service,
    publish_event,
    register,
    settled,
    until,
)

pytestmark = pytest.mark.nats


def view_of(i: int, rack_size: int = 8, nvlink_size: int = 0, score: int = 100) -> wire.NodeView:
    """The scorer's view of node n{i} with its domains (DOM-1): racks of ``rack_size``, and NVLink
    domains of ``nvlink_size`` when not 0."""
    placed = {"rack": f"r{i // rack_size}"} | ({"nvlink": f"nvl-{i // nvlink_size}"} if nvlink_size else {})
    return wire.NodeView(node_id=f"n{i}", cluster=CLUSTER, hostname=f"n{i}", status="READY", health="HEALTHY",
                         last_reported_at=at(0), score=score, score_explanation=None, conditions=[],
                         attributed_failures=wire.AttributedFailures(), holds=[], definition="gpu-pool",
                         domains=placed)


async def place(js: JetStreamContext, count: int, *, rack_size: int = 8, nvlink_size: int = 0) -> None:
    for i in range(count):
        await js.publish(subjects.node_view(CLUSTER, f"n{i}"), wire.encode(view_of(i, rack_size, nvlink_size)))


async def heartbeat(js: JetStreamContext, node: str, kind: str, minute: float) -> None:
    change = wire.ConditionChange(type="heartbeat_missed", reason="HeartbeatMissed", severity="warning",
                                  message="no report since earlier")
    await publish_event(js, node, kind, at(minute), actor="health-ingest", condition=change)


async def domain_events(js: JetStreamContext) -> list[wire.NodeEvent]:
    found = [wire.decode(wire.NodeEvent, m.data) async for m in replay(js, "HP_NODE_EVENTS", "hp.event.>")]
    return [e for e in found if e.type.startswith("DOMAIN_")]


async def test_dom3_a_rack_losing_power_is_one_domain_degraded_no_drains_survives_kill_9_then_recovers(
        nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> None:
    await apply(js, {"mode": "drain", "maxUnavailablePercent": 100,
                     "domainFaults": [{"kind": "rack", "share": 50, "window": "10m", "minMembers": 4,
                                       "recoverAfter": "5m"}]})
    await register(js, 16)
    await place(js, 16)  # racks r0 (n0..n7) and r1 (n8..n15)
    log = tmp_path / "policy.log"
    async with policy_service(nats_server, js, log) as first:
        for i in range(4):  # half of rack r0 misses its heartbeat within a minute: its power is gone
            await heartbeat(js, f"n{i}", "CONDITION_RAISED", 1 + i / 4)

        async def degraded() -> bool:
            return len(await domain_events(js)) >= 1

        await until(degraded)
        await degrade(js, "n5", 20, 2)  # a member scoring badly is held with its rack
        await settled(js)
        why = await reads.automation_status(js, view_of(5, score=20), at(2))  # `node show`'s Automation line
        assert why.startswith("held with its domain: domain rack=r0: 4 of 8 members silent or degraded within 10m")
        first.send_signal(signal.SIGKILL)  # in the middle of the episode
        first.wait()
    async with policy_service(nats_server, js, log):
        await heartbeat(js, "n4", "CONDITION_RAISED", 2.5)  # one more of the rack: still the same fault
        for i in range(5):
            await heartbeat(js, f"n{i}", "CONDITION_CLEARED", 4)  # power back
        await degrade(js, "n15", 100, 8, previous=100)  # time passes: below the threshold 4 minutes
        await settled(js)
        assert [e.type for e in await domain_events(js)] == ["DOMAIN_DEGRADED"]
        await degrade(js, "n15", 99, 9.5, previous=100)  # 5.5 minutes

        async def recovered() -> bool:
            return len(await domain_events(js)) >= 2

        await until(recovered)
        await settled(js)
    found = await domain_events(js)
    assert [(e.type, e.node_id, e.actor) for e in found] == [
        ("DOMAIN_DEGRADED", "domain:rack=r0", "policy"), ("DOMAIN_RECOVERED", "domain:rack=r0", "policy")]
    first_event = found[0]
    assert first_event.domain is not None and first_event.domain.failing == ["n0", "n1", "n2", "n3"]
    assert first_event.domain.member_count == 8 and first_event.domain.conditions == {"heartbeat_missed": 4}
    assert "needs attention" in first_event.message
    assert await commands(js) == []  # no per-node drains: neither the silent nodes nor n5
    assert [e for e in await policy_events(js) if e.node_id.startswith("n") and int(e.node_id[1:]) < 8] == []


async def test_dom2_a_limit_of_2_per_nvlink_domain_halts_the_third_drain_while_the_cluster_has_room(
        nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> None:
    await apply(js, {"mode": "drain", "maxUnavailablePercent": 50,
                     "domainLimits": [{"kind": "nvlink", "maxUnavailable": 2}]})
    await register(js, 12)
    await place(js, 12, nvlink_size=4)  # nvl-0: n0..n3, nvl-1: n4..n7, nvl-2: n8..n11
    async with policy_service(nats_server, js, tmp_path / "policy.log"):
        for i in range(3):
            await degrade(js, f"n{i}", 30, 1 + i)
        await degrade(js, "n4", 30, 4)

        async def four() -> bool:
            return len(await policy_events(js)) >= 4

        await until(four)
        await settled(js)
        why = await reads.automation_status(js, view_of(2, nvlink_size=4, score=30), at(4))
        assert why.startswith("drain: score 30; halted: 2 of 4 nodes of domain nvlink=nvl-0 are out of service")
    assert [(c.node_id, c.verb, c.active) for c in await commands(js)] == [
        ("n0", "drain", False), ("n1", "drain", False), ("n4", "drain", False)]
    halted = [e for e in await policy_events(js) if e.type == "POLICY_HALTED"]
    assert [(e.node_id, e.message) for e in halted] == [
        ("n2", "drain: score 30; halted: 2 of 4 nodes of domain nvlink=nvl-0 are out of service and one more "
               "would pass domainLimits nvlink maxUnavailable 2")]


async def test_dom3_drain_the_domain_drains_every_member_passively_at_once_and_survives_kill_9(
        nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> None:
    """DOM-3 with "drain the domain" for racks: a rack's power lost (half its members silent
    within seconds) is one DOMAIN_DEGRADED and a passive drain of every member at once, no
    per-node drain beside them (a member scoring badly meanwhile is not drained again); a
    kill -9 of policy in the middle of the episode repeats neither the event nor a drain."""
    await apply(js, {"mode": "drain", "maxUnavailablePercent": 100,
                     "domainFaults": [{"kind": "rack", "share": 50, "window": "10m", "minMembers": 4,
                                       "recoverAfter": "5m", "action": "drain"}]})
    await register(js, 16)
    await place(js, 16)  # racks r0 (n0..n7) and r1 (n8..n15)
    log = tmp_path / "policy.log"
    rack = [f"n{i}" for i in range(8)]
    async with policy_service(nats_server, js, log) as first:
        for i in range(4):  # within seconds of each other: the rack's feed is gone
            await heartbeat(js, f"n{i}", "CONDITION_RAISED", 1 + i / 60)

        async def every_member_drained() -> bool:
            return len(await commands(js)) >= len(rack)

        await until(every_member_drained)
        await degrade(js, "n5", 20, 2)  # already drained with its rack: no drain of its own
        await degrade(js, "n9", 100, 2, previous=100)  # the other rack: nothing to do
        await settled(js)
        first.send_signal(signal.SIGKILL)  # in the middle of the episode
        first.wait()
    async with policy_service(nats_server, js, log):
        await heartbeat(js, "n4", "CONDITION_RAISED", 2.5)  # one more of the rack: the same fault
        await degrade(js, "n6", 30, 3)
        for i in range(5):
            await heartbeat(js, f"n{i}", "CONDITION_CLEARED", 4)  # power back
        await degrade(js, "n15", 100, 8, previous=100)
        await settled(js)
        assert [e.type for e in await domain_events(js)] == ["DOMAIN_DEGRADED"]
        await degrade(js, "n15", 99, 9.5, previous=100)  # 5.5 minutes below the threshold

        async def recovered() -> bool:
            return len(await domain_events(js)) >= 2

        await until(recovered)
        await settled(js)
    found = await domain_events(js)
    assert [(e.type, e.node_id) for e in found] == [("DOMAIN_DEGRADED", "domain:rack=r0"),
                                                    ("DOMAIN_RECOVERED", "domain:rack=r0")]
    degraded = found[0].domain
    assert degraded is not None and degraded.action == "drain"
    assert degraded.failing == ["n0", "n1", "n2", "n3"] and degraded.drained == rack
    drains = await commands(js)
    assert sorted((c.node_id, c.verb, c.active, c.actor) for c in drains) == [
        (node, "drain", False, "policy") for node in sorted(rack)]  # each once: none repeated after the kill
    assert len({c.id for c in drains}) == len(rack)
