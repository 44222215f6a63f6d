"""Tests that play the attacker (SEC-1..3, SEC-6) against a real nats-server with auth on.

Each attack is made the way a user with a shell on a compute node would: plain nats-py with
whatever credentials file they hold. The server, not our code, refuses it; the test then
checks that nothing was stored and that the legitimate client keeps working.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from healthplane.contracts import subjects
from healthplane.runtime import creds
from healthplane.runtime.connect import connect
from healthplane.stack.keystore import Keystore
from healthplane.stack.natsserver import NatsServer
from tests.component.test_node_cli import fleet  # noqa: F401 - the fixture
from tests.support.secure import creds_for, env_for

pytestmark = pytest.mark.nats
REFUSAL_WAIT_S = 1.0


async def _as(server: NatsServer, path: str | None, name: str = "attacker") -> NATS:
    return await connect(server.url, name=name, creds=path, give_up_after=5)


async def _refused(nc: NATS, subject: str, payload: bytes = b"{}") -> bool:
    """Publish ``subject`` as ``nc``; True when the server answered with a permissions violation."""
    await nc.publish(subject, payload)
    await nc.flush(timeout=5)
    deadline = time.monotonic() + REFUSAL_WAIT_S  # the -ERR may come just after the flush's PONG
    while time.monotonic() < deadline:
        error = str(nc.last_error or "").lower()
        if "permissions violation" in error and f'"{subject.lower()}"' in error:
            return True
        await asyncio.sleep(0.01)
    return False


async def _count(js: JetStreamContext, stream: str) -> int:
    return int((await js.stream_info(stream)).state.messages)


def _node(keystore: Keystore, tmp_path: Path, node: str = "n1", cluster: str = "c1") -> str:
    return str(keystore.node(node, cluster, tmp_path / f"{cluster}-{node}.creds"))


async def test_sec1_no_credentials_is_refused(nats_server: NatsServer) -> None:
    client = NATS()
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await client.connect(servers=[nats_server.url], allow_reconnect=False, connect_timeout=2)
    await client.close()


async def test_sec1_a_node_speaks_only_for_itself(nats_server: NatsServer, js: JetStreamContext,
                                                  keystore: Keystore, tmp_path: Path) -> None:
    node = await _as(nats_server, _node(keystore, tmp_path))
    try:
        njs = node.jetstream()
        await njs.publish(subjects.report("c1", "n1"), b"{}", timeout=5)
        await njs.publish(subjects.resource("c1", "n1"), b"{}", timeout=5)
        assert await _count(js, "HP_REPORTS") == 1 and await _count(js, "HP_RESOURCES") == 1
        forged = [subjects.report("c1", "n2"), subjects.resource("c1", "n2"), subjects.report("c2", "n1"),
                  subjects.command("c1", "n1", "deprovision", "n1"), subjects.CONFIG,
                  subjects.event("c1", "n1", "NODE_REGISTERED"), "$JS.API.CONSUMER.CREATE.HP_NODE_EVENTS",
                  "$JS.API.DIRECT.GET.KV_substrate-nodes.$KV.substrate-nodes.c1.n2",
                  "$JS.API.STREAM.DELETE.HP_REPORTS", "$KV.substrate-nodes.c1.n1"]
        for subject in forged:
            assert await _refused(node, subject), f"the server let node n1 publish {subject}"
        # A subscription outside its own inbox is refused (and delivers nothing).
        heard: list[bytes] = []

        async def on_event(msg: Msg) -> None:
            heard.append(msg.data)

        sub = await node.subscribe("hp.event.>", cb=on_event)
        await node.flush(timeout=5)
        await js.publish(subjects.event("c1", "n1", "SCORE_CHANGED"), b"{}")
        await asyncio.sleep(REFUSAL_WAIT_S)
        assert "permissions violation for subscription" in str(node.last_error).lower() and heard == []
        await sub.unsubscribe()
        # ...and after every refusal, the node still reports.
        await njs.publish(subjects.report("c1", "n1"), b"{}", timeout=5)
        assert await _count(js, "HP_REPORTS") == 2
        assert await _count(js, "HP_COMMANDS") == 0 and await _count(js, "HP_CONFIG") == 0
    finally:
        await node.close()


async def test_sec1_a_service_cannot_write_what_another_service_owns(nats_server: NatsServer, js: JetStreamContext,
                                                                     tmp_path: Path) -> None:
    scorer = await _as(nats_server, creds_for(nats_server, "scorer"))
    try:
        events = await _count(js, "HP_NODE_EVENTS")
        for subject in (subjects.event("c1", "n1", "HOLD_CREATED"), subjects.event("c1", "n1", "CONDITION_RAISED"),
                        subjects.command("c1", "n1", "cordon", "alice"), subjects.directive("c1", "n1"),
                        subjects.CONFIG, subjects.snapshot("eviction")):
            assert await _refused(scorer, subject), f"the scorer may publish {subject}"
        await scorer.jetstream().publish(subjects.event("c1", "n1", "SCORE_CHANGED"), b"{}", timeout=5)
        assert await _count(js, "HP_NODE_EVENTS") == events + 1
    finally:
        await scorer.close()


async def test_sec1_an_admin_commands_only_as_herself(nats_server: NatsServer, js: JetStreamContext) -> None:
    alice = await _as(nats_server, creds_for(nats_server, "admin", "alice"))
    try:
        assert await _refused(alice, subjects.command("c1", "n1", "cordon", "bob"))
        assert await _refused(alice, subjects.command("c1", "n1", "cordon", "policy"))
        assert await _refused(alice, "hp.cmd.c1.n1.cordon")  # no identity token at all
        await alice.jetstream().publish(subjects.command("c1", "n1", "cordon", "alice"), b"{}", timeout=5)
        assert await _count(js, "HP_COMMANDS") == 1
    finally:
        await alice.close()


def _cli(server: NatsServer, role: str, *args: str, name: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "healthplane.cli", *args], capture_output=True, text=True,
                          timeout=60, env=env_for(server, role, name))


@pytest.mark.usefixtures("fleet")
async def test_sec1_a_viewer_reads_and_cannot_command(nats_server: NatsServer, js: JetStreamContext) -> None:
    for read in (("node", "list", "-o", "json"), ("node", "show", "node-02"), ("node", "events", "node-02"),
                 ("config", "show")):
        done = _cli(nats_server, "viewer", *read, name="carol")
        assert "permission" not in done.stderr and "Traceback" not in done.stderr, (read, done.stderr)
        assert done.returncode == 0 or read == ("config", "show"), (read, done.stderr)  # no config applied yet
    assert "node-02" in _cli(nats_server, "viewer", "node", "show", "node-02", name="carol").stdout
    cordon = _cli(nats_server, "viewer", "node", "cordon", "node-02", "--reason", "x", name="carol")
    assert cordon.returncode == 1
    assert "permission denied: carol (role viewer)" in cordon.stderr and "hp.cmd" in cordon.stderr, cordon.stderr
    assert await _count(js, "HP_COMMANDS") == 0
    config = str(Path(__file__).parents[2] / "deploy" / "config" / "cluster.yaml")
    apply = _cli(nats_server, "viewer", "config", "apply", "-f", config, name="carol")
    assert apply.returncode == 1 and "permission denied" in apply.stderr and await _count(js, "HP_CONFIG") == 0
    # The same commands as an admin go through, under the admin's own name.
    assert _cli(nats_server, "admin", "config", "apply", "-f", config, name="dana").returncode == 0


async def test_sec2_a_revoked_node_is_refused_within_10s(nats_server: NatsServer, js: JetStreamContext,
                                                         keystore: Keystore, tmp_path: Path) -> None:
    path = _node(keystore, tmp_path, "n9")
    node = await _as(nats_server, path, "n9")
    closed = asyncio.Event()
    try:
        await node.jetstream().publish(subjects.report("c1", "n9"), b"{}", timeout=5)
        revoke = _cli(nats_server, "admin", "creds", "revoke", "n9", "--cluster", "c1", "--keys",
                      str(keystore.directory), "--nats-url", nats_server.url)
        assert revoke.returncode == 0, revoke.stderr
        started = time.monotonic()
        while time.monotonic() - started < 10:
            if not node.is_connected:
                closed.set()
                break
            await asyncio.sleep(0.05)
        assert closed.is_set(), "the revoked node's connection stayed open for 10 s"
        with pytest.raises(ConnectionError):
            await connect(nats_server.url, name="n9-again", creds=path, give_up_after=3)
        # Refused by the server for its credentials. The client usually reads the server's
        # 'Authorization Violation', but may see only the reset of the connection that follows it.
        assert "authentication error" in (nats_server.store_dir / "nats-server.log").read_text()
        # Another node is untouched.
        other = await _as(nats_server, _node(keystore, tmp_path, "n8"), "n8")
        await other.jetstream().publish(subjects.report("c1", "n8"), b"{}", timeout=5)
        await other.close()
    finally:
        await node.close()


def test_sec2_sec6_files_are_0600_and_hold_no_secret_in_stack_or_listing(keystore: Keystore, tmp_path: Path) -> None:
    out = keystore.node("n1", "c1", tmp_path / "n1.creds")
    for path in [out, *keystore.directory.rglob("*")]:
        if path.is_file() and path.name != ".lock":
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(keystore.directory.stat().st_mode) == 0o700
    seed = out.read_text().split("-----BEGIN USER NKEY SEED-----")[1].split()[0]
    listing = subprocess.run([sys.executable, "-m", "healthplane.cli", "creds", "list", "--keys",
                              str(keystore.directory), "-o", "json"], capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0 and seed not in listing.stdout
    rows = json.loads(listing.stdout)
    assert [(r["name"], r["role"], r["cluster"]) for r in rows if r["role"] == "collector"] == [("n1", "collector", "c1")]
    assert "SU" not in repr(keystore)


def test_sec2_a_token_verifies_for_its_role_until_revoked(keystore: Keystore) -> None:
    token = keystore.token("carol", "viewer")
    assert keystore.verify_token(token)["role"] == "viewer"
    tampered = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    with pytest.raises(creds.CredsError):
        keystore.verify_token(tampered)
    keystore.revoke("carol")
    with pytest.raises(creds.CredsError, match="revoked"):
        keystore.verify_token(token)


def test_sec2_names_that_are_not_one_token_are_refused(keystore: Keystore, tmp_path: Path) -> None:
    with pytest.raises(creds.CredsError):
        keystore.user("a.b", "admin", tmp_path / "x.creds")
    with pytest.raises(creds.CredsError, match="automation actor"):
        keystore.user("policy", "admin", tmp_path / "x.creds")
    assert not os.path.exists(tmp_path / "x.creds")


async def test_sec4_tls_verifies_the_server_and_refuses_plaintext(tmp_path: Path) -> None:
    from healthplane.runtime.tls import ClientTls
    from healthplane.stack.tls import make_throwaway

    keystore = Keystore.init(tmp_path / "tls-creds")
    files = make_throwaway(tmp_path / "tls")
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    server = NatsServer(tmp_path / "tls-nats", keystore=keystore, tls=files).start()
    try:
        assert server.url.startswith("tls://")
        admin = str(keystore.user("ops", "admin", tmp_path / "ops.creds"))
        nc = await connect(server.url, name="tls", creds=admin, tls=ClientTls(str(files.ca)), give_up_after=5)
        await nc.jetstream().account_info()
        await nc.close()
        # A CA that did not sign the server's certificate: the client refuses the server.
        stranger = make_throwaway(tmp_path / "stranger")
        with pytest.raises(ConnectionError, match=r"(?i)certificate"):
            await connect(server.url, name="tls", creds=admin, tls=ClientTls(str(stranger.ca)), give_up_after=3)
        # Plaintext: the server refuses the client.
        with pytest.raises(ConnectionError):
            await connect(server.url.replace("tls://", "nats://"), name="plain", creds=admin, give_up_after=3)
    finally:
        server.stop()


def test_sec1_a_collector_with_another_nodes_credentials_says_so_in_one_line(nats_server: NatsServer,
                                                                            tmp_path: Path) -> None:
    from tests.component.test_collector_live import collector_config, fixture_root

    fixture_root(tmp_path / "root")
    config = collector_config(tmp_path / "collector.json")  # node gpu-node-7, cluster lab
    done = subprocess.run(
        [sys.executable, "-m", "healthplane.cli", "collector", "--root", str(tmp_path / "root"), "--state-dir",
         str(tmp_path / "state"), "--gpu-source", "nvidia-smi", "--config", str(config)],
        env={**env_for(nats_server, "collector", "lab/gpu-node-8"), "PATH": str(tmp_path / "bin")},
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    [line] = [json.loads(x) for x in done.stderr.splitlines() if x.startswith("{") and '"error"' in x]
    assert "credentials of node gpu-node-8 (cluster lab)" in line["reason"] and "gpu-node-7" in line["reason"]
    assert "Traceback" not in done.stderr


def test_sec2_a_key_directory_an_older_build_made_gains_the_new_roles_keys(keystore: Keystore, tmp_path: Path) -> None:
    """SEC-2 across an upgrade: a role this build added (FED's ``member``) has no signing key in
    a directory an older build made; a revocation re-signs the account, which makes the key,
    instead of failing with "missing key"."""
    (keystore.directory / "signers" / "member.nk").unlink()
    keystore.user("dave", "viewer", tmp_path / "dave.creds")
    keystore.revoke("dave")
    assert (keystore.directory / "signers" / "member.nk").is_file()
    assert keystore.member("a", tmp_path / "a.creds").is_file()
