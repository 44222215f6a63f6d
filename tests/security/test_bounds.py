"""SEC-11, played as the attacker: root on a compute node sends an 8 MB report, and a report
just past its identity's cap, on its own subject. nats-server refuses both (the cap is in the
node role's signing-key template, so every node identity carries it) and nothing is stored;
the same message from an identity without the cap (the simulator's) is stored, and the node's
next ordinary report is too."""

from __future__ import annotations

from pathlib import Path

import pytest
from nats.js import JetStreamContext

from healthplane.contracts import permissions, subjects
from healthplane.runtime.connect import connect
from healthplane.stack.keystore import Keystore
from healthplane.stack.natsserver import NatsServer
from tests.component.test_security import _count

pytestmark = pytest.mark.nats


async def test_sec11_a_node_cannot_send_a_report_past_its_cap(nats_server: NatsServer, js: JetStreamContext,
                                                                keystore: Keystore, tmp_path: Path) -> None:
    node_creds = str(keystore.node("n1", "c1", tmp_path / "n1.creds"))
    past_cap = b"x" * (permissions.NODE_PAYLOAD_LIMIT + 1)
    for payload in (b"x" * (8 * 1024 * 1024), past_cap):
        node = await connect(nats_server.url, name="root-on-n1", creds=node_creds, give_up_after=5)
        try:
            with pytest.raises(Exception):  # noqa: B017 - no ack: the server refused it (or the client would not send it)
                await node.jetstream().publish(subjects.report("c1", "n1"), payload, timeout=2)
            if payload is past_cap:  # under the server's own 8 MiB: refused for this identity
                assert "maximum payload" in str(node.last_error).lower(), node.last_error
        finally:
            await node.close()
        assert await _count(js, "HP_REPORTS") == 0
    sim = await connect(nats_server.url, name="sim", creds=str(keystore.sim("c1", tmp_path / "sim.creds")),
                        give_up_after=5)
    try:  # the cap is the node identity's, not the stream's
        await sim.jetstream().publish(subjects.report("c1", "n1"), past_cap, timeout=5)
    finally:
        await sim.close()
    node = await connect(nats_server.url, name="n1", creds=node_creds, give_up_after=5)
    try:
        await node.jetstream().publish(subjects.report("c1", "n1"), b"{}", timeout=5)
    finally:
        await node.close()
    assert await _count(js, "HP_REPORTS") == 2
