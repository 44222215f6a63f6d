"""INT-2 and INT-3 on a real nats-server with real HTTP receivers: webhooks at least once with
the stream as the backlog (one durable consumer slot per endpoint, acked after delivery or a
dead letter), `healthplane webhooks replay`, and CEL filters checked at `config apply`."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from healthplane.contracts import streams, subjects, wire
from healthplane.runtime import configstore, deadletters
from healthplane.stack.natsserver import NatsServer
from healthplane_webhook_dispatcher.rules import Settings, endpoint_label
from tests.component import test_webhook_dispatcher as dispatcher_tests
from tests.component.test_webhook_dispatcher import (
    SECRET,
    apply_hooks,
    node_event,
    publish,
    referenced,
    sample,
    until,
)
from tests.support.secure import creds_for, env_for
from tests.support.webhook_receiver import Received

pytestmark = pytest.mark.nats

STREAM = "HP_NODE_EVENTS"
# The dispatcher in process on its own identity, and real receivers: the same fixtures.
start_dispatcher = dispatcher_tests.start_dispatcher
receivers = dispatcher_tests.receivers


def slot_consumer(slot: int) -> str:
    return streams.consumer_name("webhook-dispatcher", STREAM, slot)


async def cli(nats_server: NatsServer, *argv: str, creds: str | None = None) -> tuple[int, str, str]:
    """The real CLI as the test's admin (or ``creds``)."""
    extra = ["--creds", creds] if creds else []
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "healthplane.cli", *argv, "--nats-url", nats_server.url, *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


# ---------------------------------------------------------------------------- INT-2: crash, stop, burst


def _service(nats_server: NatsServer, log_path: Path, **env: str) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            [sys.executable, "-m", "healthplane.cli", "service", "webhook-dispatcher"],
            env=env_for(nats_server, "webhook-dispatcher", **env), stdout=subprocess.DEVNULL, stderr=log_file)


def _log_of(log_path: Path) -> str:
    return log_path.read_text()


async def _in_force(process: subprocess.Popen[bytes], log_path: Path, times: int) -> None:
    async with asyncio.timeout(30):
        while _log_of(log_path).count("webhook endpoints in force") < times:
            assert process.poll() is None, _log_of(log_path)[-3000:]
            await asyncio.sleep(0.05)


async def test_int2_kill_9_with_5000_events_in_flight_loses_none(
        nats_server: NatsServer, nc: NATS, js: JetStreamContext, receivers: Any, tmp_path: Path) -> None:
    """INT-2: the real service, killed with SIGKILL while 5,000 events are on their way to a
    receiver that takes 2 ms each; started again, the receiver gets every event (once at
    least: what was delivered and not yet acked comes again, deduplicated on the id)."""

    async def slowish(_: Received) -> int:
        await asyncio.sleep(0.002)
        return 204

    receiver = await receivers(answer=slowish)
    await apply_hooks(js, {"url": receiver.url, "secret": SECRET})
    log_path = tmp_path / "dispatcher.log"
    env = {"HEALTHPLANE_WEBHOOK_ACK_WAIT_SECONDS": "2", "HEALTHPLANE_WEBHOOK_QUEUE_SIZE": "512",
           "HEALTHPLANE_WEBHOOK_CONCURRENCY": "8"}
    process = _service(nats_server, log_path, **env)
    try:
        await _in_force(process, log_path, 1)
        events = [node_event("CONDITION_RAISED", node_id=f"cn-{i:05d}") for i in range(5_000)]
        for event in events:
            await nc.publish(subjects.event("default", event.node_id, event.type), wire.encode(event))
        await nc.flush()
        await receiver.wait_for(500, timeout=60)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        at_kill = len(set(receiver.ids()))
        assert at_kill < 5_000, "the burst was over before the kill: nothing was shown"
        process = _service(nats_server, log_path, **env)
        async with asyncio.timeout(120):
            while len(set(receiver.ids())) < 5_000:
                assert process.poll() is None, _log_of(log_path)[-3000:]
                await asyncio.sleep(0.1)
        # Each delivery is acked once it is over: the consumer settles (the last acks follow
        # the last answers by a moment).
        async with asyncio.timeout(20):
            while (info := await js.consumer_info(STREAM, slot_consumer(0))).num_ack_pending or info.num_pending:
                await asyncio.sleep(0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(20)
    assert set(receiver.ids()) == {e.id for e in events}
    print(f"\nkill -9 at {at_kill} of 5000 delivered; {len(receiver.ids()) - 5_000} delivered twice")


async def test_int2_stopped_mid_burst_hands_back_what_it_held(
        js: JetStreamContext, start_dispatcher: Any, receivers: Any) -> None:
    """INT-2: a dispatcher stopped while it holds events naks them, so the next one sends them
    at once (not after the 30 s ack_wait), and nothing is lost."""

    async def slow(_: Received) -> int:
        await asyncio.sleep(0.05)
        return 204

    receiver = await receivers(answer=slow)
    await apply_hooks(js, {"url": receiver.url, "secret": SECRET})
    settings = Settings(queue_size=64, concurrency=2, timeout_s=2.0, drain_s=0.0)
    first = await start_dispatcher(settings)
    events = [node_event() for _ in range(200)]
    await publish(js, *events)
    await receiver.wait_for(10)
    [lane] = first.dispatcher.lanes.values()
    assert lane.held
    first.dispatcher.stop()
    await asyncio.sleep(0.5)
    started = time.monotonic()
    await start_dispatcher(Settings(queue_size=256, concurrency=8, timeout_s=2.0))
    async with asyncio.timeout(20):
        while set(receiver.ids()) != {e.id for e in events}:
            await asyncio.sleep(0.05)
    assert time.monotonic() - started < 15


async def test_int2_an_event_held_past_ack_wait_is_kept_once_not_delivered_twice(
        js: JetStreamContext, start_dispatcher: Any, receivers: Any) -> None:
    """INT-2: events waiting behind a slow receiver longer than the ack wait are sent to the
    dispatcher again by the server; it keeps the one it holds (acked through the newest
    delivery), so each arrives once and the consumer settles."""

    async def slow(_: Received) -> int:
        await asyncio.sleep(0.4)
        return 204

    receiver = await receivers(answer=slow)
    await apply_hooks(js, {"url": receiver.url, "secret": SECRET})
    running = await start_dispatcher(Settings(queue_size=8, concurrency=1, timeout_s=5.0, ack_wait_s=1.0))
    events = [node_event() for _ in range(8)]
    await publish(js, *events)
    await receiver.wait_for(8, timeout=20)
    [lane] = running.dispatcher.lanes.values()
    async with asyncio.timeout(10):
        while (info := await js.consumer_info(STREAM, lane.consumer)).num_ack_pending:
            await asyncio.sleep(0.05)
    assert info.delivered.consumer_seq > 8  # the server did send some again meanwhile
    await asyncio.sleep(1.5)  # past another ack wait: nothing comes back
    assert sorted(receiver.ids()) == sorted(e.id for e in events)


# ---------------------------------------------------------------------------- INT-2: dead letters, replay


async def test_int2_receiver_down_past_its_attempts_then_webhooks_replay_delivers(
        nats_server: NatsServer, nc: NATS, js: JetStreamContext, start_dispatcher: Any, receivers: Any) -> None:
    """INT-2: a receiver down for longer than the attempts: each event becomes a dead letter
    with the endpoint and the last answer (and is acked); once the receiver is back,
    `healthplane webhooks replay ENDPOINT --since 1h` delivers them, same ids, signed afresh."""
    down = True
    receiver = await receivers(answer=lambda _: 503 if down else 204)
    other = await receivers()
    await apply_hooks(js, {"url": receiver.url, "secret": SECRET, "maxAttempts": 2},
                      {"url": other.url, "secret": SECRET})
    running = await start_dispatcher()
    events = [node_event(node_id=f"cn-{i:02d}") for i in range(20)]
    await publish(js, *events)
    label = endpoint_label(receiver.url)
    await until(lambda: sample("healthplane_webhook_dead_letters_total", endpoint=label, reason="max_attempts") == 20)
    await other.wait_for(20)
    letters = [d for d in await deadletters.read(nc, js, "webhook-dispatcher") if d.endpoint == label]
    assert sorted(wire.decode(wire.NodeEvent, d.payload).id for d in letters) == sorted(e.id for e in events)
    assert {d.reason for d in letters} == {"undelivered"} and all("HTTP 503" in d.error for d in letters)
    lane = running.dispatcher.lanes[label]
    async with asyncio.timeout(10):  # each acked once its dead letter is stored
        while (info := await js.consumer_info(STREAM, lane.consumer)).num_ack_pending:
            await asyncio.sleep(0.05)
    assert info.num_pending == 0

    # `dead-letters replay` would append the event to the stream again: refused, naming the fix.
    code, _, err = await cli(nats_server, "dead-letters", "replay", str(letters[0].id),
                             creds=creds_for(nats_server, "maintainer", "test"))
    assert code == 2 and f"healthplane webhooks replay {label}" in err

    code, out, err = await cli(nats_server, "webhooks", "list", "-o", "json")
    assert code == 0, err
    listed = {e["endpoint"]: e for e in json.loads(out)}
    assert listed[label]["slot"] == lane.slot and listed[label]["lag"] == 0

    # A viewer may not ask for it (SEC-1): one line naming the permission.
    code, _, err = await cli(nats_server, "webhooks", "replay", label, "--since", "1h",
                             creds=creds_for(nats_server, "viewer", "victor"))
    assert code == 1 and "permission denied" in err and len(err.strip().splitlines()) == 1
    down = False
    before = len(receiver.received)
    code, out, err = await cli(nats_server, "webhooks", "replay", label, "--since", "1h")
    assert code == 0, err
    assert out.startswith(f"20 dead-lettered deliveries to {label} since ")
    replayed = await receiver.wait_for(before + 20, timeout=20)
    assert sorted(r.event_id for r in replayed[before:]) == sorted(e.id for e in events)
    assert all(r.verified for r in replayed[before:])
    assert len(other.received) == 20  # the other endpoint gets nothing again
    [line] = running.log.named("webhook replay requested")
    assert line["actor"] == "test" and line["queued"] == 20

    code, _, err = await cli(nats_server, "webhooks", "replay", "http://127.0.0.1:1/nowhere", "--since", "1h")
    assert code == 1 and "no webhook endpoint http://127.0.0.1:1/nowhere in force" in err


# ---------------------------------------------------------------------------- INT-2: slots across config changes


async def test_int2_each_endpoint_keeps_its_slot_across_config_changes_and_restarts(
        js: JetStreamContext, start_dispatcher: Any, receivers: Any) -> None:
    """INT-2: an endpoint's consumer slot is its own while it is configured: another endpoint
    added before it in the config does not move it; a changed filter re-filters its consumer;
    a removed endpoint's consumer is deleted; a new endpoint starts from now (DeliverPolicy.NEW);
    a restarted dispatcher finds every endpoint in its slot from the consumers' metadata."""
    a, b, c = await receivers(), await receivers(), await receivers()
    hook_a = {"url": a.url, "secret": SECRET, "events": ["POLICY_ACTED"]}
    hook_b = {"url": b.url, "secret": SECRET}
    await apply_hooks(js, hook_a)
    running = await start_dispatcher()
    assert running.dispatcher.lanes[endpoint_label(a.url)].slot == 0

    version = await apply_hooks(js, hook_b, {**hook_a, "events": ["POLICY_ACTED", "NODE_REPLACED"]})
    await until(lambda: running.dispatcher.config_version == version)
    lanes = running.dispatcher.lanes
    assert (lanes[endpoint_label(a.url)].slot, lanes[endpoint_label(b.url)].slot) == (0, 1)
    info = await js.consumer_info(STREAM, slot_consumer(0))
    assert sorted(info.config.filter_subjects or []) == sorted(streams.stored_filters(
        STREAM, subjects.event_type_filters(["POLICY_ACTED", "NODE_REPLACED"])))
    assert (info.config.metadata or {})[streams.WEBHOOK_SLOT_OWNER] == endpoint_label(a.url)
    replaced = node_event("NODE_REPLACED")
    await publish(js, replaced)
    await a.wait_for(1)
    assert a.ids() == [replaced.id]

    version = await apply_hooks(js, hook_b)
    await until(lambda: running.dispatcher.config_version == version)
    with pytest.raises(NotFoundError):
        await js.consumer_info(STREAM, slot_consumer(0))

    # Restarted: the slot comes from the consumer's metadata, not from the config's order.
    running.dispatcher.stop()
    await asyncio.sleep(0.3)
    before_c = node_event("POLICY_HALTED")
    await publish(js, before_c)
    version = await apply_hooks(js, {"url": c.url, "secret": SECRET}, hook_b)
    again = await start_dispatcher()
    lanes = again.dispatcher.lanes
    assert (lanes[endpoint_label(b.url)].slot, lanes[endpoint_label(c.url)].slot) == (1, 0)
    after_c = node_event("POLICY_HALTED")
    await publish(js, after_c)
    await c.wait_for(1)
    await b.wait_for(3)
    assert c.ids() == [after_c.id]  # from now on: not what happened before it was added
    assert b.ids()[-2:] == [before_c.id, after_c.id]  # b lost nothing while no dispatcher ran


# ---------------------------------------------------------------------------- INT-3


async def test_int3_cel_filter_selects_and_the_envelope_names_type_and_node(
        js: JetStreamContext, start_dispatcher: Any, receivers: Any) -> None:
    """INT-3: an endpoint's CEL filter over the event as JSON delivers only what it selects
    (the rest counted as filtered); CloudEvents ``type`` is per event kind and ``subject``
    the node id."""
    critical = await receivers()
    everything = await receivers()
    await apply_hooks(js, {"url": critical.url, "secret": SECRET,
                           "filter": "event.type == 'CONDITION_RAISED' && event.condition.severity == 'critical' "
                                     "&& event.nodeId.startsWith('gpu-')"},
                      {"url": everything.url, "secret": SECRET})
    await start_dispatcher()
    warning = node_event("CONDITION_RAISED", node_id="gpu-1", condition=wire.ConditionChange(
        type="gpu_ecc_errors", severity="warning", reason="GpuEccCorrectable", message="4 correctable"))
    wanted = node_event("CONDITION_RAISED", node_id="gpu-2", condition=wire.ConditionChange(
        type="gpu_xid_errors", severity="critical", reason="GpuXid79", message="fell off the bus"))
    elsewhere = node_event("CONDITION_RAISED", node_id="cpu-3", condition=wire.ConditionChange(
        type="memory_errors", severity="critical", reason="EdacUncorrectable", message="1 UE"))
    score = node_event("SCORE_CHANGED", node_id="gpu-2", score=60, previous_score=100)
    await publish(js, warning, wanted, elsewhere, score)
    await everything.wait_for(4)
    await critical.wait_for(1)
    await asyncio.sleep(0.3)
    assert critical.ids() == [wanted.id]
    label = endpoint_label(critical.url)
    await until(lambda: sample("healthplane_webhook_filtered_total", endpoint=label) == 3)
    types = {r.event["id"]: (r.event["type"], r.event["subject"]) for r in everything.received}
    assert types[score.id] == ("io.healthplane.node.SCORE_CHANGED", "gpu-2")
    assert types[elsewhere.id] == ("io.healthplane.node.CONDITION_RAISED", "cpu-3")


async def test_int3_a_bad_cel_filter_is_refused_at_config_apply(
        nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> None:
    """INT-3: `config apply` refuses an expression that does not compile, or reads a name
    other than ``event``, in one line naming the field; nothing is applied."""
    before = await configstore.read(js)
    for expression, why in (("event.type == ", "Syntax error"),
                            ("evnt.type == 'CONDITION_RAISED'", "unknown variable 'evnt'")):
        path = tmp_path / "cluster.yaml"
        hook = referenced({"url": "https://hooks.example.com/in", "secret": SECRET, "filter": expression})
        path.write_text(json.dumps({"nodeEventWebhooks": [hook]}))
        code, out, err = await cli(nats_server, "config", "apply", "-f", str(path))
        assert code == 1, out
        [line] = err.strip().splitlines()
        assert "nodeEventWebhooks[0].filter:" in line and why in line and "Traceback" not in err
    assert (await configstore.read(js)).last_seq == before.last_seq
