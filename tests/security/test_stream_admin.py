"""SEC-10, played as the attacker: stream administration is the maintainer's alone.

The admin who commands and applies config, its bearer token (what the HTTP API and the UI
carry), and the substrate bridge each try to create, change, purge and delete streams, move
a stream's leader, write into the nodes bucket by hand and replay a record onto another
node's subject. The server refuses each one and nothing changes; the maintainer may, and
commands nothing. No token carries the maintainer's role.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from healthplane.contracts import permissions, streams, subjects
from healthplane.runtime import deadletters
from healthplane.runtime.connect import connect
from healthplane.runtime.creds import CredsError
from healthplane.stack.keystore import Keystore
from healthplane.stack.natsserver import NatsServer
from tests.component.test_security import _as, _refused
from tests.support.secure import creds_for, env_for

pytestmark = pytest.mark.nats

NEW_STREAM = json.dumps({"name": "EVIL", "subjects": ["evil.>"]}).encode()


def _administration() -> list[tuple[str, str, bytes]]:
    """(what, subject, body): what stream administration is, each aimed at a real stream."""
    api = "$JS.API.STREAM"
    shrink = json.dumps({"name": "HP_NODE_EVENTS", "subjects": ["hp.event.>"], "max_age": 1}).encode()
    return [
        ("create a stream", f"{api}.CREATE.EVIL", NEW_STREAM),
        ("change a stream (its age)", f"{api}.UPDATE.HP_NODE_EVENTS", shrink),
        ("purge a stream", f"{api}.PURGE.HP_NODE_EVENTS", b"{}"),
        ("delete a stream", f"{api}.DELETE.HP_NODE_EVENTS", b""),
        ("move a stream's leader", f"{api}.LEADER.STEPDOWN.HP_NODE_EVENTS", b""),
        ("write the nodes bucket by hand", f"$KV.{streams.NODES_BUCKET}.default.n1", b"{}"),
        ("replay a record onto a node's subject", subjects.resource("default", "n1"), b"{}"),
    ]


async def _events(js: JetStreamContext) -> tuple[int, float]:
    info = await js.stream_info("HP_NODE_EVENTS")
    return info.state.messages, info.config.max_age or 0


async def _refuses_all(client: NATS, who: str) -> None:
    for what, subject, body in _administration():
        assert await _refused(client, subject, body), f"{who} could {what}"


async def test_sec10_the_admin_and_its_token_administer_no_stream(
        nats_server: NatsServer, js: JetStreamContext, keystore: Keystore) -> None:
    await js.publish(subjects.event("default", "n1", "NODE_REGISTERED"), b"{}", timeout=5)
    before = await _events(js)
    admin = await _as(nats_server, creds_for(nats_server, "admin", "alice"))
    token = await connect(nats_server.url, name="alice-token", bearer=keystore.token("alice", "admin"),
                          give_up_after=5)
    try:
        await _refuses_all(admin, "the admin")
        await _refuses_all(token, "the admin's bearer token")
    finally:
        await admin.close()
        await token.close()
    assert await _events(js) == before
    with pytest.raises(NotFoundError):
        await js.stream_info("EVIL")


async def test_sec10_the_bridge_writes_the_bucket_but_may_not_resize_it(
        nats_server: NatsServer, js: JetStreamContext) -> None:
    bridge = await _as(nats_server, creds_for(nats_server, "substrate-bridge"))
    try:
        bucket = f"KV_{streams.NODES_BUCKET}"
        info = await js.stream_info(bucket)
        grown = json.dumps({"name": bucket, "subjects": info.config.subjects, "max_bytes": 2**31,
                            "republish": {"src": ">", "dest": "hp.cmd.default.n1.drain.policy"}}).encode()
        assert await _refused(bridge, f"$JS.API.STREAM.UPDATE.{bucket}", grown)
        assert (await js.stream_info(bucket)).config.max_bytes == info.config.max_bytes
        await bridge.jetstream().publish(f"$KV.{streams.NODES_BUCKET}.default.n1", b"{}", timeout=5)  # its job
    finally:
        await bridge.close()


async def test_sec10_the_maintainer_administers_streams_and_commands_nothing(
        nats_server: NatsServer, js: JetStreamContext) -> None:
    maintainer = await _as(nats_server, creds_for(nats_server, "maintainer", "morgan"))
    try:
        mjs = maintainer.jetstream()
        await mjs.add_stream(name="SCRATCH", subjects=["scratch.>"])
        await mjs.delete_stream("SCRATCH")
        await mjs.purge_stream("HP_DEAD_LETTERS")
        for subject in (subjects.command("default", "n1", "drain", "morgan"), subjects.CONFIG,
                        subjects.remediate("default", "n1")):
            assert await _refused(maintainer, subject, b"{}"), subject
    finally:
        await maintainer.close()


def test_sec10_no_token_carries_stream_administration(keystore: Keystore) -> None:
    with pytest.raises(CredsError, match="stream administration never goes through the HTTP API"):
        keystore.token("morgan", permissions.MAINTAINER)
    assert permissions.MAINTAINER not in keystore.token_signer_roles().values()
    done = subprocess.run([sys.executable, "-m", "healthplane.cli", "creds", "token", "morgan", "--role", "maintainer",
                           "--keys", str(keystore.directory)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "invalid choice: 'maintainer'" in done.stderr and "Traceback" not in done.stderr


async def test_sec10_a_dead_letter_is_replayed_by_the_maintainer_not_the_admin(
        nats_server: NatsServer, js: JetStreamContext) -> None:
    ingest = await _as(nats_server, creds_for(nats_server, "health-ingest"))  # only a service sets one aside
    try:
        ack = await ingest.jetstream().publish(
            subjects.dead_letter("health-ingest", "HP_RESOURCES"), b'{"nodeId": "n1"}', timeout=5,
            headers={deadletters.INPUT_SUBJECT: subjects.resource("default", "n1"), deadletters.SERVICE: "health-ingest"})
    finally:
        await ingest.close()
    before = (await js.stream_info("HP_RESOURCES")).state.messages

    def replay(role: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "healthplane.cli", "dead-letters", "replay", str(ack.seq)],
                              capture_output=True, text=True, timeout=60, env=env_for(nats_server, role, "pat"))

    refused = replay("admin")
    assert refused.returncode != 0 and "permission denied" in refused.stderr and "maintainer" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    assert (await js.stream_info("HP_RESOURCES")).state.messages == before
    done = replay("maintainer")
    assert done.returncode == 0, done
    assert (await js.stream_info("HP_RESOURCES")).state.messages == before + 1
