"""Two writers never both write (issue 16.3, HA-3): a lease holder whose event loop froze past
the TTL wakes up fenced off; the node views equal a replay."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.runtime.connect import connect
from healthplane.runtime.fold import Inbound
from healthplane.runtime.lease import HEADER, RELEASE_TIMEOUT_S, Lease
from healthplane.runtime.replay import read_all, replay
from healthplane.stack.natsserver import NatsServer
from healthplane_scorer.fold import ScorerCore, node_view
from tests.support.pipeline import view_of
from tests.support.secure import creds_for, env_for

pytestmark = pytest.mark.nats
T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
NODES = [f"n{i:02d}" for i in range(12)]
SMART = wire.Condition(type="disk_degraded", reason="SmartFailing", severity="critical",
                       message="SMART health check failing on /dev/sda", first_seen=T0, observations=1)


async def test_the_fence_closes_before_the_lease_can_expire(nats_server: NatsServer, js: JetStreamContext) -> None:
    # Issue 16.3: no renewal for TTL minus the margin, and the holder may no longer write.
    # As the scorer: a service may hold only its own lease key (SEC-1).
    nc = await connect(nats_server.url, name="fence-test", creds=creds_for(nats_server, "scorer"), give_up_after=5)
    try:
        lease = Lease(nc.jetstream(), "scorer", "me", ttl_s=3.0)
        assert lease.fence() is None  # never held
        assert await lease.attempt()
        revision = lease.fence()
        assert revision is not None and lease.is_leader
        await asyncio.sleep(2.1)  # past 3 s - max(1 s, 3 s / 5)
        assert lease.fence() is None and not lease.is_leader
        await lease.release()
    finally:
        await nc.close()


async def test_a_restarted_instance_takes_its_own_lease_back_at_once(nats_server: NatsServer,
                                                                    js: JetStreamContext) -> None:
    # HA-3: a replica killed and started again under its instance name (runtime.lease) leads at
    # its first attempt, not a TTL later; another instance still waits for the lease to lapse.
    nc = await connect(nats_server.url, name="restart-test", creds=creds_for(nats_server, "scorer"), give_up_after=5)
    try:
        crashed = Lease(nc.jetstream(), "scorer", "host-a/scorer")
        assert await crashed.attempt()
        revision = crashed.fence()  # then kill -9: no release
        other = Lease(nc.jetstream(), "scorer", "host-b/scorer")
        assert not await other.attempt()
        restarted = Lease(nc.jetstream(), "scorer", "host-a/scorer")
        assert await restarted.attempt()
        renewed = restarted.fence()
        assert renewed is not None and revision is not None and renewed > revision
        assert not await crashed.attempt()  # the old process, were it alive, holds nothing
        assert not await other.attempt()
        await restarted.release()
    finally:
        await nc.close()


def _assessment(node: str, n: int) -> wire.Assessment:
    at = T0 + timedelta(seconds=n)
    failing = n % 2 == 1
    return wire.Assessment(node_id=node, cluster="lab", assessed_at=at, report_sent_at=at,
                           health="DEGRADED" if failing else "HEALTHY", conditions=[SMART] if failing else [],
                           real_fault=failing, last_report_at=at, interval_seconds=30)


def _scorer(server: NatsServer, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "healthplane.cli", "service", "scorer"],
                            env=env_for(server, "scorer", HEALTHPLANE_INSTANCE=log.stem),  # two replicas
                            stdout=subprocess.DEVNULL, stderr=open(log, "ab"))


async def _revisions(nc, js: JetStreamContext, stream: str, subject: str) -> list[int]:  # type: ignore[no-untyped-def]
    found = await read_all(nc, js, stream, subject)
    return [int((m.headers or {})[HEADER]) for m in found]


async def test_a_frozen_holder_wakes_fenced_off(nats_server: NatsServer, nc, js: JetStreamContext,  # type: ignore[no-untyped-def]
                                               tmp_path: Path) -> None:
    # Issue 16.3: SIGSTOP the holder past the TTL under load; the standby takes over; SIGCONT:
    # the old holder writes nothing after the standby's first write (every stream's lease
    # revisions never go down), and the latest node views equal a replay.
    publishing = asyncio.Event()
    sent = 0

    async def load() -> None:
        nonlocal sent
        while not publishing.is_set():
            for node in NODES:
                await js.publish(subjects.assessment("lab", node), wire.encode(_assessment(node, sent)))
            sent += 1
            await asyncio.sleep(0.05)

    first = _scorer(nats_server, tmp_path / "first.log")
    second: subprocess.Popen[bytes] | None = None
    loader = asyncio.create_task(load())
    try:
        async with asyncio.timeout(60):
            while not await _revisions(nc, js, "HP_NODES", "hp.node.>"):
                await asyncio.sleep(0.2)
        second = _scorer(nats_server, tmp_path / "second.log")
        await asyncio.sleep(3)  # the standby is up and waiting for the lease
        old = max(await _revisions(nc, js, "HP_NODES", "hp.node.>"))
        first.send_signal(signal.SIGSTOP)
        async with asyncio.timeout(60):  # the TTL (10 s) and one attempt interval
            while max(await _revisions(nc, js, "HP_NODES", "hp.node.>")) <= old:
                await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        first.send_signal(signal.SIGCONT)
        await asyncio.sleep(4.0)  # the old holder runs again, under load
        assert first.poll() is None  # fenced off, waiting to lead again: not crashed
    finally:
        publishing.set()
        await loader
        # The holder folds what is left (bounded: the assertions below say what it missed).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(30):
                while await _differences_from_replay(nc, js):
                    await asyncio.sleep(0.2)
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.send_signal(signal.SIGTERM)
                process.wait(30)
    for stream, subject in (("HP_NODES", "hp.node.>"), ("HP_NODE_EVENTS", "hp.event.>")):
        revisions = await _revisions(nc, js, stream, subject)
        assert revisions == sorted(revisions), f"{stream}: a fenced-off holder wrote after the new one"
        assert revisions[-1] > old
    assert "lease" in (tmp_path / "first.log").read_text()

    # The latest views are what a replay of the latest assessments folds to.
    assert await _differences_from_replay(nc, js) == []


async def _differences_from_replay(nc, js: JetStreamContext) -> list[str]:  # type: ignore[no-untyped-def]
    """The nodes whose latest view is not what a replay of the latest assessments folds to."""
    core, state = ScorerCore(), ScorerCore().initial_state()
    async for seq, msg in _numbered(js):
        state, _, _ = core.step(state, Inbound("HP_ASSESSMENTS", seq, msg.subject, msg.data, {}, T0, True))
    latest = {wire.decode(wire.NodeView, m.data).node_id: wire.decode(wire.NodeView, m.data)
              for m in await read_all(nc, js, "HP_NODES", "hp.node.>", last_per_subject=True)}
    return sorted({*NODES} - {*latest}) + [node.node_id for node in state.nodes.values()
                                           if not view_of(latest.get(node.node_id), node_view(state, node))]


async def _numbered(js: JetStreamContext):  # type: ignore[no-untyped-def]
    async for msg in replay(js, "HP_ASSESSMENTS", "hp.assess.>"):
        yield msg.seq, msg


async def test_a_release_with_the_bus_gone_gives_up_within_its_bound(nats_server: NatsServer,
                                                                     js: JetStreamContext) -> None:
    # A clean stop while the server is down: the release is a courtesy (the TTL frees the key
    # anyway), so it gives up within RELEASE_TIMEOUT_S, not the bucket request's own timeout
    # (30 s here), and the stop goes on.
    nc = await connect(nats_server.url, name="release-test", creds=creds_for(nats_server, "scorer"), give_up_after=5)
    lease = Lease(nc.jetstream(timeout=30), "scorer", "me")
    assert await lease.attempt()
    await asyncio.to_thread(nats_server.stop)
    async with asyncio.timeout(5):
        while nc.is_connected:
            await asyncio.sleep(0.02)
    started = asyncio.get_running_loop().time()
    await lease.release()
    assert asyncio.get_running_loop().time() - started < RELEASE_TIMEOUT_S + 0.5
    assert not lease.is_leader and lease.fence() is None
    await asyncio.to_thread(nats_server.start)  # the connection's own end
    async with asyncio.timeout(15):
        while not nc.is_connected:
            await asyncio.sleep(0.05)
    await nc.close()
