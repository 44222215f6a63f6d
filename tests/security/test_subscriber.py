"""INT-1 with SEC-1: a third party's identity that follows node events and nothing else.

`healthplane creds user NAME --role subscriber`: it hears node events live and reads their
history by direct get; it may read no other stream, hear no other record, publish nothing."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.js import JetStreamContext

from healthplane.contracts import subjects
from healthplane.runtime.replay import read_all
from healthplane.stack.natsserver import NatsServer
from tests.component.test_security import _as, _refused
from tests.support.secure import creds_for

pytestmark = pytest.mark.nats


async def test_int1_a_subscriber_follows_node_events_and_nothing_else(nats_server: NatsServer,
                                                                     js: JetStreamContext) -> None:
    await js.publish(subjects.event("c1", "n1", "NODE_REGISTERED"), b'{"id": "before"}', timeout=5)
    third_party = await _as(nats_server, creds_for(nats_server, "subscriber", "ticketing"), name="ticketing")
    try:
        heard = await third_party.subscribe("hp.event.>")
        await third_party.flush()
        await js.publish(subjects.event("c1", "n1", "NODE_CORDONED"), b'{"id": "live"}', timeout=5)
        assert (await heard.next_msg(timeout=5)).data == b'{"id": "live"}'
        history = await read_all(third_party, third_party.jetstream(), "HP_NODE_EVENTS", "hp.event.>")
        assert [m.data for m in history] == [b'{"id": "before"}', b'{"id": "live"}']
        # Nothing else: another stream's records, another record's live subject, any publish.
        assert await _refused(third_party, "$JS.API.DIRECT.GET.HP_COMMANDS", b'{"seq": 1}')
        assert await _refused(third_party, subjects.command("c1", "n1", "cordon", "ticketing"), b"{}")
        assert await _refused(third_party, subjects.event("c1", "n1", "NODE_CORDONED"), b"{}")
        await third_party.subscribe("hp.cmd.>")
        deadline = time.monotonic() + 2
        while "subscription" not in str(third_party.last_error or "").lower() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert 'subscription to "hp.cmd.>"' in str(third_party.last_error).lower()
    finally:
        await third_party.close()
