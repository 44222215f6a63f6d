"""SEC-12: credentials that end. Every identity the keystore issues expires (a person's in a
quarter, what runs unattended in a year), and ``healthplane creds rotate NAME`` puts a fresh
key in NAME's credentials file and revokes the old one: against a real server, a copy of the
old file is refused, the rotated file connects, and a connection made with the old key is
dropped within 10 s (a service then exits, and its supervisor — systemd, `up` — starts it
again on the rotated file)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from healthplane.contracts import subjects
from healthplane.runtime.connect import connect
from healthplane.runtime.creds import expires_at, identity_of
from healthplane.stack.keystore import DAY_S, Keystore
from healthplane.stack.natsserver import NatsServer

pytestmark = pytest.mark.nats


def test_sec12_every_identity_expires_by_its_role(keystore: Keystore, tmp_path: Path) -> None:
    now = time.time()
    issued = {
        "person": keystore.user("alice", "admin", tmp_path / "alice.creds"),
        "service": keystore.service("scorer", tmp_path / "scorer.creds"),
        "node": keystore.node("n1", "c1", tmp_path / "n1.creds"),
        "sim": keystore.sim("c1", tmp_path / "sim.creds"),
    }
    days = {kind: ((expires_at(path) or 0) - now) / DAY_S for kind, path in issued.items()}
    assert 89.9 < days["person"] <= 90 and all(364.9 < days[k] <= 365 for k in ("service", "node", "sim")), days


async def test_sec12_rotate_gives_a_fresh_key_and_the_old_one_is_refused(nats_server: NatsServer, js: JetStreamContext,
                                                                         keystore: Keystore, tmp_path: Path) -> None:
    path = tmp_path / "n7.creds"
    keystore.node("n7", "c1", path)
    old_copy = tmp_path / "n7-old.creds"
    shutil.copy(path, old_copy)
    running = await connect(nats_server.url, name="n7", creds=str(path))
    try:
        await running.jetstream().publish(subjects.report("c1", "n7"), b"{}", timeout=5)
        done = subprocess.run([sys.executable, "-m", "healthplane.cli", "creds", "rotate", "n7", "--cluster", "c1",
                               "--keys", str(keystore.directory), "--nats-url", nats_server.url],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert f"rotated {path}" in done.stdout and "refuses the old keys now" in done.stdout
        assert path.read_text() != old_copy.read_text() and identity_of(path) == identity_of(old_copy)
        with pytest.raises(ConnectionError):
            await connect(nats_server.url, name="n7-old", creds=str(old_copy), give_up_after=3)
        fresh = await connect(nats_server.url, name="n7-new", creds=str(path), give_up_after=5)
        await fresh.jetstream().publish(subjects.report("c1", "n7"), b"{}", timeout=5)
        await fresh.close()
        async with asyncio.timeout(10):  # the connection made with the old key is dropped
            while running.is_connected:
                await asyncio.sleep(0.05)
    finally:
        await running.close()
