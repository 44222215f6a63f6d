"""SEC-9, played as the attacker: a viewer (or the api, or any service) reads every byte of
every stream it may read, looking for a webhook's secret to sign forged CloudEvents with.
The config names the secret by reference; the webhook dispatcher — a real process — reads it
on its own host and signs with it (the receiver verifies), and no stream holds it."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from healthplane.contracts import streams, subjects, wire
from healthplane.contracts.config import parse_cluster_config
from healthplane.runtime.connect import connect
from healthplane.runtime.replay import read_all
from healthplane.stack.natsserver import NatsServer
from tests.support.secure import apply_config, creds_for, env_for
from tests.support.webhook_receiver import Receiver

pytestmark = pytest.mark.nats
SECRET = "sec9-never-on-the-bus-7f3a91"


async def test_sec9_no_stream_a_viewer_reads_holds_the_webhook_secret(nats_server: NatsServer, js: JetStreamContext,
                                                                      tmp_path: Path) -> None:
    secret_file = tmp_path / "hook.secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)
    receiver = await Receiver(SECRET).start()
    log = tmp_path / "dispatcher.log"
    with open(log, "ab") as out:
        dispatcher = subprocess.Popen([sys.executable, "-m", "healthplane.cli", "service", "webhook-dispatcher",
                                       "--metrics-port", "0"], env=env_for(nats_server, "webhook-dispatcher"),
                                      stdout=subprocess.DEVNULL, stderr=out)
    try:
        await apply_config(js, parse_cluster_config({"nodeEventWebhooks": [
            {"url": receiver.url, "secretFile": str(secret_file)}]}), actor="test")
        async with asyncio.timeout(30):  # the dispatcher starts, reads its config, then delivers
            sent = 0
            while not receiver.received:  # a new event each time: its consumer delivers from when it was made
                sent += 1
                event = wire.NodeEvent(id=f"sec9-{sent}", node_id="n1", cluster="c1", type="NODE_CORDONED",
                                       occurred_at=datetime.now(UTC), message="cordoned", actor="test")
                await js.publish(subjects.event("c1", "n1", "NODE_CORDONED"), wire.encode(event),
                                 headers={"Nats-Msg-Id": event.id})
                await asyncio.sleep(0.5)
        assert receiver.received[0].verified  # signed with the secret the file holds
        viewer = await connect(nats_server.url, name="viewer", creds=creds_for(nats_server, "viewer", "victor"),
                               give_up_after=5)
        try:
            vjs = viewer.jetstream()
            for stream in [s.name for s in streams.STREAMS]:
                for msg in await read_all(viewer, vjs, stream, ">"):
                    raw = (msg.data or b"") + b"".join(f"{k}:{v}".encode() for k, v in (msg.headers or {}).items())
                    assert SECRET.encode() not in raw, f"{stream} record {msg.seq} holds it"
        finally:
            await viewer.close()
        assert SECRET not in log.read_text(errors="replace")
    finally:
        dispatcher.send_signal(signal.SIGTERM)
        dispatcher.wait(30)
        await receiver.close()
