"""UI-2's inputs read from a real nats-server as the api's own identity (SEC-8: it reads every
stream, holds no consumer): the node events of the last 24 hours replayed and then followed
into the timeline, and the control plane's own state (a consumer far behind, dead letters,
the breaker's reset) read at most every few seconds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import pytest
import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig

from healthplane.contracts import subjects, wire
from healthplane.runtime.connect import connect
from healthplane.stack.natsserver import NatsServer
from healthplane_api import live, plane, timeline
from tests.support.secure import as_admin, creds_for

pytestmark = pytest.mark.nats


@pytest.fixture
async def api_nc(nats_server: NatsServer, js: JetStreamContext) -> AsyncIterator[NATS]:
    client = await connect(nats_server.url, name="api", creds=creds_for(nats_server, "api"), give_up_after=5)
    try:
        yield client
    finally:
        await client.close()


def _event(kind: str, node: str, at: datetime, message: str = "", actor: str = "policy", n: int = 0) -> wire.NodeEvent:
    return wire.NodeEvent(id=f"{kind}-{node}-{n}", node_id=node, cluster="default", type=kind,  # type: ignore[arg-type]
                          occurred_at=at, message=message or kind.lower(), actor=actor)


async def _put(js: JetStreamContext, event: wire.NodeEvent) -> None:
    await js.publish(subjects.event(event.cluster, event.node_id, event.type), wire.encode(event))


async def _until(check: object, what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


@asynccontextmanager
async def _recent(api_nc: NATS) -> AsyncIterator[tuple[live.Feed, live.Recent]]:
    """The api's timeline fold on the api's own connection, on its one tail of the node events."""
    log = structlog.get_logger("test")
    feed = live.Feed(log)
    recent = live.Recent(log, feed)
    stopping = asyncio.Event()
    events = live.node_events(api_nc, log)
    running = asyncio.gather(recent.run(api_nc, api_nc.jetstream(), stopping, events), events.run(stopping))
    try:
        yield feed, recent
    finally:
        stopping.set()
        await running


async def test_ui2_the_timeline_replays_stored_events_then_follows_new_ones(js: JetStreamContext,
                                                                             api_nc: NATS) -> None:
    now = datetime.now(UTC)
    await _put(js, _event("NODE_CORDONED", "n1", now - timedelta(minutes=5), actor="alice"))
    await _put(js, _event("VALIDATION_STARTED", "n2", now - timedelta(minutes=4)))
    await _put(js, _event("SCORE_CHANGED", "n1", now))  # a type the timeline never asks for
    halted = "cordon: score 40; halted: circuit breaker TRIPPED (2 automated cordon(s) against maxNodes 2 node(s))"
    await _put(js, _event("POLICY_HALTED", "n3", now - timedelta(minutes=3), message=halted))
    async with _recent(api_nc) as (feed, recent):
        await _until(lambda: recent.complete, "the 24 h replay")
        counted = timeline.hourly(recent.state, datetime.now(UTC))
        assert sum(counted.counts["cordon"]) == 1 and sum(counted.counts["halted"]) == 1
        assert [m.node_id for m in timeline.open_marks(recent.state, "validating")] == ["n2"]
        assert recent.state.breaker_halts["default"] == now - timedelta(minutes=3)
        before = feed.generation
        await _put(js, _event("VALIDATION_PASSED", "n2", datetime.now(UTC)))
        await _until(lambda: not timeline.open_marks(recent.state, "validating"), "the validation's end")
        assert feed.generation > before  # the dashboard was told


async def test_ui2_the_control_planes_state_is_read_as_the_api_and_cached(
        nats_server: NatsServer, js: JetStreamContext, api_nc: NATS, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plane, "CONSUMER_BEHIND_AT", 5)
    # A service's durable, made by the service itself (SEC-8: its own), then 6 reports behind.
    ingest = await connect(nats_server.url, name="health-ingest", creds=creds_for(nats_server, "health-ingest"),
                           give_up_after=5)
    scorer = await connect(nats_server.url, name="scorer", creds=creds_for(nats_server, "scorer"), give_up_after=5)
    try:
        await ingest.jetstream().add_consumer("HP_REPORTS", ConsumerConfig(durable_name="health-ingest_0-HP_REPORTS"))
        await scorer.jetstream().publish(subjects.dead_letter("scorer", "HP_ASSESSMENTS"), b"not an assessment")
    finally:
        await ingest.close()
        await scorer.close()
    for i in range(6):
        await js.publish(subjects.report("default", f"n{i}"), b"{}")
    async with as_admin(js) as admin:
        reset = wire.PolicyCommand(id="r1", cluster="default", action="breaker-reset", actor="test",
                                   issued_at=datetime(2026, 12, 1, tzinfo=UTC))
        await admin.publish(subjects.policy_command("default", "breaker-reset", "test"), wire.encode(reset))
    watcher = live.Plane(structlog.get_logger("test"))
    read = await watcher.read(api_nc.jetstream(), ["default", "other"], fleet=2)
    assert [(p.kind, p.message) for p, _ in read.problems] == [
        ("consumer-behind", "health-ingest's consumer health-ingest_0-HP_REPORTS is 6 records behind HP_REPORTS"),
        ("dead-letters", "1 input(s) set aside in HP_DEAD_LETTERS")]
    assert read.breaker_resets == {"default": datetime(2026, 12, 1, tzinfo=UTC)} and read.config is None
    first_seen = read.problems[0][1]
    await js.publish(subjects.report("default", "n9"), b"{}")
    assert await watcher.read(api_nc.jetstream(), ["default"], fleet=2) is read  # within READ_EVERY_S: no new read
    monkeypatch.setattr(live, "READ_EVERY_S", 0.0)
    again = await watcher.read(api_nc.jetstream(), ["default"], fleet=2)
    assert again.problems[0][0].message.endswith("is 7 records behind HP_REPORTS")
    assert again.problems[0][1] == first_seen  # dated from its first sighting


async def test_ui2_sec7_a_record_whose_type_is_not_its_subjects_is_not_counted(js: JetStreamContext,
                                                                             api_nc: NATS) -> None:
    """The timeline reads the node events on the api's one tail: a record's type is its
    subject's (the type token is its writer's permission), so a cordon written on a score's
    subject (the scorer's) or on a validation's is not a cordon."""
    now = datetime.now(UTC)
    forged = _event("NODE_CORDONED", "n1", now - timedelta(minutes=2), actor="scorer")
    await js.publish(subjects.event("default", "n1", "SCORE_CHANGED"), wire.encode(forged))
    await js.publish(subjects.event("default", "n2", "VALIDATION_STARTED"),
                     wire.encode(_event("NODE_CORDONED", "n2", now - timedelta(minutes=1))))
    await _put(js, _event("NODE_CORDONED", "n3", now - timedelta(minutes=1), actor="alice"))
    async with _recent(api_nc) as (_feed, recent):
        await _until(lambda: recent.complete, "the 24 h replay")
        counted = timeline.hourly(recent.state, datetime.now(UTC))
        assert sum(counted.counts["cordon"]) == 1  # n3's alone
        assert not timeline.open_marks(recent.state, "validating")
