"""The policy service as its own process on a real nats-server: records in, commands on
``hp.cmd.*`` and POLICY_* events out (POL-1..POL-4, POL-6). Times in the records are the
injected clock: the service decides with the time each record carries."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import parse_cluster_config
from healthplane.runtime.replay import replay
from healthplane.stack.natsserver import NatsServer
from tests.support.secure import apply_config, env_for
from tests.support.service import listening_port, spawn

pytestmark = pytest.mark.nats
CLUSTER = "lab"
T0 = datetime.now(UTC).replace(microsecond=0)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


@asynccontextmanager
async def policy_service(server: NatsServer, js: JetStreamContext, log: Path) -> AsyncIterator[subprocess.Popen[bytes]]:
    earlier = _read(log).count("service started")  # a restart appends to the same log
    process, _ = spawn("policy", env_for(server, "policy"), log)  # its port: listening_port(log)
    try:
        async def started() -> bool:
            return _read(log).count("service started") > earlier

        await until(started, timeout=60)  # a loaded machine starts a Python process slowly
        await settled(js)  # what was published before the start (config, fleet) is folded first
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            assert process.wait(20) == 0, _read(log)[-2000:]


def _read(log: Path) -> str:
    return log.read_text() if log.exists() else ""


def _scrape(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text


async def apply(js: JetStreamContext, node_health: dict[str, Any]) -> None:
    await apply_config(js, parse_cluster_config({"cluster": CLUSTER, "nodeHealth": node_health}))


async def publish_event(js: JetStreamContext, node: str, kind: str, when: datetime, *, actor: str = "scorer",
                        **fields: Any) -> None:
    record = wire.NodeEvent(id=f"{kind}:{node}:{when.timestamp()}:{sorted(fields)}", node_id=node, cluster=CLUSTER,
                            type=kind, occurred_at=when, message=kind.lower(), actor=actor, **fields)  # type: ignore[arg-type]
    await js.publish(subjects.event(CLUSTER, node, kind), wire.encode(record))


async def register(js: JetStreamContext, count: int, *, provisioned: bool = False) -> None:
    for i in range(count):
        await publish_event(js, f"n{i}", "NODE_REGISTERED", at(0), actor="substrate-bridge", definition="gpu-pool",
                            provisioned=provisioned, hostname=f"n{i}")
        await publish_event(js, f"n{i}", "SCORE_CHANGED", at(0), score=100)


async def degrade(js: JetStreamContext, node: str, value: int, minute: float, previous: int = 100) -> None:
    await publish_event(js, node, "SCORE_CHANGED", at(minute), score=value, previous_score=previous)


async def report(js: JetStreamContext, node: str, value: int, minute: float) -> None:
    """The scorer's view after one more report with the same score (a re-check)."""
    view = wire.NodeView(node_id=node, cluster=CLUSTER, hostname=node, status="READY", health="DEGRADED",
                         last_reported_at=at(minute), score=value, score_explanation=None, conditions=[],
                         attributed_failures=wire.AttributedFailures(), holds=[], definition="gpu-pool")
    await js.publish(subjects.node_view(CLUSTER, node), wire.encode(view))


async def commands(js: JetStreamContext) -> list[wire.Command]:
    return [wire.decode(wire.Command, m.data) async for m in replay(js, "HP_COMMANDS", "hp.cmd.>")]


async def policy_events(js: JetStreamContext) -> list[wire.NodeEvent]:
    found = [wire.decode(wire.NodeEvent, m.data) async for m in replay(js, "HP_NODE_EVENTS", "hp.event.>")]
    return [e for e in found if e.type.startswith("POLICY_")]


async def until(predicate: Callable[[], Awaitable[bool]], timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.05)


async def settled(js: JetStreamContext) -> None:
    """Every input the service consumes has been folded and acked (nothing pending)."""
    async def drained() -> bool:
        for stream in ("HP_NODE_EVENTS", "HP_NODES", "HP_ALLOCATIONS", "HP_COMMANDS", "HP_CONFIG"):
            try:
                info = await js.consumer_info(stream, f"policy_0-{stream}")
            except NotFoundError:
                return False  # not started consuming yet
            if info.num_pending or info.num_ack_pending:
                return False
        return True

    await until(drained)


async def echo(js: JetStreamContext, command: wire.Command, when: datetime) -> None:
    """What eviction answers to a policy command: its hold, and the drain record."""
    effect = "deprovision" if command.verb == "replace" else "cordon"
    hold = wire.Hold(id=f"h-{command.id}", effect=effect, reason=command.reason, actor="policy", created_at=when)
    await publish_event(js, command.node_id, "HOLD_CREATED", when, actor="policy", hold=hold, command_id=command.id)
    if command.verb == "drain":
        await publish_event(js, command.node_id, "NODE_DRAINED", when, actor="policy", drain_mode="passive")


async def test_pol2_observe_records_one_recommendation_per_episode(nats_server: NatsServer, js: JetStreamContext,
                                                                   tmp_path: Path) -> None:
    await register(js, 3)
    async with policy_service(nats_server, js, tmp_path / "policy.log"):
        await degrade(js, "n0", 55, 1)
        for minute in (2, 3, 4):
            await report(js, "n0", 55, minute)
        await degrade(js, "n0", 50, 5, previous=55)
        await settled(js)
        await degrade(js, "n0", 100, 6, previous=50)  # recovered: the next degradation is a new episode
        await degrade(js, "n0", 55, 7)
        await settled(js)
    recommended = await policy_events(js)
    assert [(e.type, e.message, e.policy_mode) for e in recommended] == [
        ("POLICY_RECOMMENDED", "cordon: score 55", "observe")] * 2
    assert await commands(js) == []


async def test_pol1_pol3_cordon_mode_cordons_below_60_and_the_20_percent_ceiling_halts(
        nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> None:
    await apply(js, {"mode": "cordon"})
    await register(js, 10)
    async with policy_service(nats_server, js, tmp_path / "policy.log"):
        await degrade(js, "n9", 60, 1)  # at cordonBelow: stays
        for i in range(3):
            await degrade(js, f"n{i}", 55, 1 + i)

        async def three_decisions() -> bool:
            return len(await policy_events(js)) >= 3

        await until(three_decisions)
        await settled(js)
    cordons = await commands(js)
    assert [(c.node_id, c.verb, c.actor) for c in cordons] == [("n0", "cordon", "policy"), ("n1", "cordon", "policy")]
    found = await policy_events(js)
    assert [(e.node_id, e.type) for e in found] == [("n0", "POLICY_ACTED"), ("n1", "POLICY_ACTED"),
                                                    ("n2", "POLICY_HALTED")]
    assert "maxUnavailablePercent 20%" in found[2].message


async def test_pol3_a_manual_uncordon_suppresses_for_30_minutes(nats_server: NatsServer, js: JetStreamContext,
                                                                tmp_path: Path) -> None:
    await apply(js, {"mode": "cordon", "maxUnavailablePercent": 100})
    await register(js, 2)
    async with policy_service(nats_server, js, tmp_path / "policy.log"):
        await degrade(js, "n0", 50, 1)

        async def cordoned() -> bool:
            return len(await commands(js)) == 1

        await until(cordoned)
        first = (await commands(js))[0]
        await echo(js, first, at(1))
        hold = wire.Hold(id=f"h-{first.id}", effect="cordon", reason=None, actor="policy", created_at=at(1))
        await publish_event(js, "n0", "HOLD_RELEASED", at(2), actor="alice", hold=hold)
        await publish_event(js, "n0", "NODE_UNCORDONED", at(2), actor="alice")
        await report(js, "n0", 50, 12)
        await report(js, "n0", 50, 31)
        await settled(js)
        assert len(await commands(js)) == 1  # the operator's decision stands for 30 minutes
        await report(js, "n0", 50, 32.5)

        async def recordoned() -> bool:
            return len(await commands(js)) == 2

        await until(recordoned)
    assert [c.verb for c in await commands(js)] == ["cordon", "cordon"]


async def test_pol4_replace_terminates_only_when_empty_within_the_hourly_budget(
        nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> None:
    await apply(js, {"mode": "replace", "maxUnavailablePercent": 100, "maxReplacementsPerHour": 1,
                     "circuitBreaker": {"enabled": False}})
    await register(js, 3, provisioned=True)
    for alloc in ("a1", "a2"):
        await js.publish(subjects.allocation(CLUSTER, "n0", alloc), wire.encode(wire.Allocation(
            id=alloc, job_id="j1", node_id="n0", cluster=CLUSTER, state="started", at=at(0))))

    async def issued(count: int) -> list[wire.Command]:
        async def enough() -> bool:
            return len(await commands(js)) >= count

        await until(enough)
        return await commands(js)

    async with policy_service(nats_server, js, tmp_path / "policy.log"):
        await degrade(js, "n0", 30, 1)
        drain = (await issued(1))[0]
        assert (drain.verb, drain.active) == ("drain", False)
        await echo(js, drain, at(1))
        await settled(js)
        assert [c.verb for c in await commands(js)] == ["drain"]  # two allocations still running
        waiting = (await policy_events(js))[0]
        assert waiting.message == "drain: score 30; waiting for 2 allocation(s) to finish before replacing"
        for alloc in ("a1", "a2"):
            await js.publish(subjects.allocation(CLUSTER, "n0", alloc), wire.encode(wire.Allocation(
                id=alloc, job_id="j1", node_id="n0", cluster=CLUSTER, state="finished", at=at(2))))
        replace = (await issued(2))[1]
        assert (replace.node_id, replace.verb, replace.actor) == ("n0", "replace", "policy")
        await echo(js, replace, at(2))
        # The provider rejects it: nothing counts against the hour, so n1 may be replaced.
        await js.publish(subjects.provision(CLUSTER, "n0"), wire.encode(wire.TerminationResult(
            directive_id="d0", node_id="n0", cluster=CLUSTER, accepted=False, message="quota exceeded", at=at(3))))
        await degrade(js, "n1", 30, 4)
        drain1 = (await issued(3))[2]
        await echo(js, drain1, at(4))
        replace1 = (await issued(4))[3]
        assert (replace1.node_id, replace1.verb) == ("n1", "replace")
        await echo(js, replace1, at(4))
        await js.publish(subjects.provision(CLUSTER, "n1"), wire.encode(wire.TerminationResult(
            directive_id="d1", node_id="n1", cluster=CLUSTER, accepted=True, message="terminated", at=at(5))))
        await publish_event(js, "n1", "NODE_REPLACED", at(5), actor="policy", provisioned=True)
        await degrade(js, "n2", 30, 6)
        drain2 = (await issued(5))[4]
        await echo(js, drain2, at(6))

        async def halted() -> bool:
            return any(e.type == "POLICY_HALTED" for e in await policy_events(js))

        await until(halted)
        await settled(js)
    assert [(c.node_id, c.verb) for c in await commands(js)] == [
        ("n0", "drain"), ("n0", "replace"), ("n1", "drain"), ("n1", "replace"), ("n2", "drain")]
    stop = [e for e in await policy_events(js) if e.type == "POLICY_HALTED"]
    assert len(stop) == 1 and stop[0].node_id == "n2"
    assert "maxReplacementsPerHour 1 reached for gpu-pool (1 replacement(s) in the last hour)" in stop[0].message


async def test_pol6_breaker_trips_at_its_bound_reports_metrics_and_resets_from_the_cli(
        nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> None:
    await apply(js, {"mode": "cordon", "maxUnavailablePercent": 100,
                     "circuitBreaker": {"percentage": 0, "maxNodes": 2, "duration": "10m"}})
    await register(js, 8)
    async with policy_service(nats_server, js, tmp_path / "policy.log"):
        port = listening_port(tmp_path / "policy.log")
        for i in range(4):
            await degrade(js, f"n{i}", 50, 1)

        async def four_decisions() -> bool:
            return len(await policy_events(js)) >= 4

        await until(four_decisions)
        assert [c.node_id for c in await commands(js)] == ["n0", "n1"]
        text = await asyncio.to_thread(_scrape, port)
        assert 'healthplane_policy_breaker_threshold_nodes{bound="maxNodes",cluster="lab"} 2.0' in text
        assert 'healthplane_policy_breaker_tripped{cluster="lab"} 1.0' in text
        assert 'healthplane_policy_breaker_utilization{cluster="lab"} 0.25' in text
        reset = await asyncio.to_thread(subprocess.run, [
            sys.executable, "-m", "healthplane.cli", "policy", "breaker", "reset", "--cluster", CLUSTER,
            "--reason", "bad firmware rollout, fixed", "--nats-url", nats_server.url],
            capture_output=True, text=True, timeout=30)
        assert reset.returncode == 0 and "circuit breaker reset requested for cluster lab" in reset.stdout
        await settled(js)
        await report(js, "n2", 50, 3)

        async def resumed() -> bool:
            return len(await commands(js)) == 3

        await until(resumed)
    assert [c.node_id for c in await commands(js)] == ["n0", "n1", "n2"]
    assert "circuit breaker reset" in _read(tmp_path / "policy.log")


async def test_rel1_a_killed_policy_restarts_without_repeating_a_command(nats_server: NatsServer, js: JetStreamContext,
                                                                         tmp_path: Path) -> None:
    await apply(js, {"mode": "cordon", "maxUnavailablePercent": 100, "circuitBreaker": {"enabled": False}})
    await register(js, 6)
    log = tmp_path / "policy.log"
    async with policy_service(nats_server, js, log) as first:
        for i in range(3):
            await degrade(js, f"n{i}", 50, 1)

        async def three() -> bool:
            return len(await commands(js)) == 3

        await until(three)
        first.send_signal(signal.SIGKILL)
        first.wait()
    async with policy_service(nats_server, js, log):
        await degrade(js, "n3", 50, 2)
        for i in range(3):
            await report(js, f"n{i}", 50, 3)  # re-checks of nodes already cordoned: nothing new

        async def four() -> bool:
            return len(await commands(js)) >= 4

        await until(four)
        await settled(js)
    found = await commands(js)
    assert sorted(c.node_id for c in found) == ["n0", "n1", "n2", "n3"]
    assert len({c.id for c in found}) == 4
    assert len([e for e in await policy_events(js) if e.type == "POLICY_ACTED"]) == 4
