"""SEC-8, played as the attacker: a service's durable consumers are its own.

A viewer, the api, an admin and another service each try every way to take over a service's
durable consumer: delete it, pull its messages, ack them, re-filter it (by the unnamed create
that takes a name in its body, by the named create, by the durable create). The server
refuses each one; the consumer is still there with its filter, and its owner still pulls from
it. Readers read the same records by direct gets, which need no consumer at all.
"""

from __future__ import annotations

import json

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.contracts import permissions, streams, subjects
from healthplane.runtime import consumers
from healthplane.runtime.replay import read_all, read_payloads
from healthplane.stack.keystore import CONSUMER_LIMIT, Keystore
from healthplane.stack.natsserver import NatsServer
from tests.component.test_security import _as, _refused
from tests.support.secure import creds_for

pytestmark = pytest.mark.nats

EVICTION_COMMANDS = streams.consumer_name("eviction", "HP_COMMANDS")
FILTER = "hp.cmd.>"
# (role, name): everyone but the owner, a person of each kind, the api, and two other services.
ATTACKERS = (("viewer", "victor"), ("admin", "alice"), ("api", None), ("policy", None), ("scorer", None))


def _takeovers(stream: str, consumer: str) -> list[tuple[str, str, bytes]]:
    """(what, subject, body): every JetStream request that would change, drain or ack ``consumer``."""
    refilter = json.dumps({"stream_name": stream, "config": {
        "name": consumer, "durable_name": None, "ack_policy": "explicit", "filter_subject": "hp.cmd.elsewhere.>"}})
    api = "$JS.API.CONSUMER"
    return [
        ("delete", f"{api}.DELETE.{stream}.{consumer}", b""),
        ("pull", f"{api}.MSG.NEXT.{stream}.{consumer}", b'{"batch": 10}'),
        ("ack", f"$JS.ACK.{stream}.{consumer}.1.1.1.1700000000000000000.0", b"+ACK"),
        ("re-filter by the unnamed create", f"{api}.CREATE.{stream}", refilter.encode()),
        ("re-filter by name", f"{api}.CREATE.{stream}.{consumer}", refilter.encode()),
        ("re-filter by name and filter", f"{api}.CREATE.{stream}.{consumer}.hp.cmd.elsewhere.>", refilter.encode()),
        ("durable create", f"{api}.DURABLE.CREATE.{stream}.{consumer}", refilter.encode()),
    ]


async def _owned(nats_server: NatsServer) -> NATS:
    """Eviction, connected as itself, with its durable on HP_COMMANDS and a command waiting."""
    eviction = await _as(nats_server, creds_for(nats_server, "eviction"), name="eviction")
    ejs = eviction.jetstream()
    await consumers.ensure(ejs, "HP_COMMANDS", consumers.durable(
        EVICTION_COMMANDS, filter_subjects=(FILTER,), ack_wait_s=30.0, max_ack_pending=64))
    return eviction


@pytest.mark.parametrize(("role", "name"), ATTACKERS)
async def test_sec8_no_other_identity_takes_over_a_services_durable(
        nats_server: NatsServer, js: JetStreamContext, role: str, name: str | None) -> None:
    eviction = await _owned(nats_server)
    alice = await _as(nats_server, creds_for(nats_server, "admin", "alice"), name="alice")
    try:
        await alice.jetstream().publish(subjects.command("c1", "n1", "cordon", "alice"), b'{"verb": "cordon"}',
                                        timeout=5)
    finally:
        await alice.close()
    attacker = await _as(nats_server, creds_for(nats_server, role, name))
    try:
        for what, subject, body in _takeovers("HP_COMMANDS", EVICTION_COMMANDS):
            assert await _refused(attacker, subject, body), f"{role} could {what} eviction's durable"
        info = await js.consumer_info("HP_COMMANDS", EVICTION_COMMANDS)
        assert info.config.filter_subject == FILTER and info.num_pending == 1  # untouched, nothing taken
        # The owner still pulls and acks its own.
        psub = await eviction.jetstream().pull_subscribe_bind(EVICTION_COMMANDS, "HP_COMMANDS")
        [msg] = await psub.fetch(1, timeout=5)
        await msg.ack_sync(timeout=5)
        assert (await js.consumer_info("HP_COMMANDS", EVICTION_COMMANDS)).num_ack_pending == 0
    finally:
        await attacker.close()
        await eviction.close()


@pytest.mark.parametrize(("role", "name"), [("viewer", "victor"), ("subscriber", "sue"), ("admin", "alice"),
                                            ("api", None), ("policy", None), ("substrate-bridge", None)])
async def test_sec8_int2_no_other_identity_takes_over_a_webhook_endpoint_slot(
        nats_server: NatsServer, js: JetStreamContext, role: str, name: str | None) -> None:
    """INT-2's per-endpoint consumers are the dispatcher's fixed slots, granted by name: a
    viewer, a subscriber, an admin, the api and other services are refused every takeover of
    a slot in use and of the first and last free ones; the dispatcher still pulls from its own."""
    dispatcher = await _as(nats_server, creds_for(nats_server, "webhook-dispatcher"), name="webhook-dispatcher")
    in_use = streams.consumer_name("webhook-dispatcher", "HP_NODE_EVENTS", 5)
    await consumers.ensure(dispatcher.jetstream(), "HP_NODE_EVENTS", consumers.durable(
        in_use, filter_subjects=("hp.event.>",), ack_wait_s=30.0, max_ack_pending=64))
    await js.publish(subjects.event("c1", "n1", "NODE_CORDONED"), b'{"id": "e1"}', timeout=5)
    attacker = await _as(nats_server, creds_for(nats_server, role, name))
    try:
        for slot in (0, 5, streams.WEBHOOK_SLOTS - 1):
            consumer = streams.consumer_name("webhook-dispatcher", "HP_NODE_EVENTS", slot)
            for what, subject, body in _takeovers("HP_NODE_EVENTS", consumer):
                assert await _refused(attacker, subject, body), f"{role} could {what} webhook slot {slot}"
        info = await js.consumer_info("HP_NODE_EVENTS", in_use)
        assert info.config.filter_subject == "hp.event.>" and info.num_pending == 1
        psub = await dispatcher.jetstream().pull_subscribe_bind(in_use, "HP_NODE_EVENTS")
        [msg] = await psub.fetch(1, timeout=5)
        await msg.ack_sync(timeout=5)
    finally:
        await attacker.close()
        await dispatcher.close()


@pytest.mark.parametrize(("role", "name"), [("viewer", "victor"), ("api", None), ("collector", "c1/n1")])
async def test_sec8_no_reader_may_touch_any_services_durable(nats_server: NatsServer, js: JetStreamContext,
                                                              role: str, name: str | None) -> None:
    """Every durable of every service (its first partition's, and the ones named after the
    service), attacked by a viewer, the api and a node: each takeover refused by the server."""
    attacker = await _as(nats_server, creds_for(nats_server, role, name))
    try:
        for service in (s for s in permissions.SERVICE_ROLES if s != role):  # the api's own are its own
            for stream, consumer in streams.durables_of(service):
                if consumer.startswith(f"{service}_") and not consumer.startswith(f"{service}_0-"):
                    continue  # the other partitions' are the same grants, checked by the table test
                for what, subject, body in _takeovers(stream, consumer):
                    assert await _refused(attacker, subject, body), f"{role} could {what} {service}'s {consumer}"
    finally:
        await attacker.close()


async def test_sec8_readers_read_by_direct_get_and_see_consumers_without_touching_them(
        nats_server: NatsServer, js: JetStreamContext) -> None:
    """A viewer reads every record and the consumer list (``nats consumer ls``), makes none."""
    eviction = await _owned(nats_server)
    for i in range(30):
        await js.publish(subjects.node_view("c1", f"n{i:02d}"), b'{"nodeId": "n%02d"}' % i, timeout=5)
    viewer = await _as(nats_server, creds_for(nats_server, "viewer", "victor"))
    try:
        vjs = viewer.jetstream()
        assert len(await read_payloads(viewer, vjs, "HP_NODES", subjects.node_views(), last_per_subject=True)) == 30
        assert [m.subject for m in await read_all(viewer, vjs, "HP_NODES", subjects.node_views("c1"), limit=3)] == [
            subjects.node_view("c1", f"n{i:02d}") for i in range(3)]
        assert "HP_NODES" in [info.config.name for info in await vjs.streams_info()]  # nats stream ls (INT-1)
        assert EVICTION_COMMANDS in [c.name for c in await vjs.consumers_info("HP_COMMANDS")]
        assert (await vjs.consumer_info("HP_COMMANDS", EVICTION_COMMANDS)).config.filter_subject == FILTER
        # No consumer of its own either: a reader never needs one.
        assert await _refused(viewer, "$JS.API.CONSUMER.CREATE.HP_NODES", json.dumps(
            {"stream_name": "HP_NODES", "config": {"ack_policy": "none"}}).encode())
    finally:
        await viewer.close()
        await eviction.close()


def _control_subjects(service: str) -> list[str]:
    return [subject for stream, consumer in streams.durables_of(service)
            for subject in permissions.consumer_control(stream, consumer)]


def test_sec8_the_table_gives_each_durable_to_its_service_alone() -> None:
    """Generated from the stream table (so it cannot drift): no role's grants reach a consumer
    of another service, in any layout, and every service reaches all of its own."""
    for owner in permissions.SERVICE_ROLES:
        own = _control_subjects(owner)
        mine = permissions.of(owner).publish
        assert all(any(subjects.matches(p, s) for p in mine) for s in own), owner
        for role in permissions.ROLES:
            if role == owner:
                continue
            grants = permissions.of(role).publish
            reached = [s for s in own if any(subjects.matches(p, s) for p in grants)]
            assert reached == [], f"{role} reaches {owner}'s consumers: {reached[:3]}"


def test_sec8_the_account_bounds_its_consumers(keystore: Keystore) -> None:
    limits = json.loads(_payload(keystore.account_jwt()))["nats"]["limits"]
    assert limits["consumer"] == CONSUMER_LIMIT > 60 * 4  # the services' durables at 24 partitions, with room


def _payload(jwt: str) -> str:
    import base64
    body = jwt.split(".")[1]
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
