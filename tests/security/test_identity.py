"""SEC-7, played as the attacker of issue 40: root on compute node ``sim-002`` holds that node's
own credentials, and nats-server lets it publish on ``hp.report.lab.sim-002`` — so it writes a
report there whose payload names ``sim-003`` and carries an Xid 79, and a resource report for
``sim-003`` on its own resource subject. The subject is the identity: health-ingest and the
substrate bridge (real processes, a real secure nats-server) set both aside as dead letters
naming why, count them in ``healthplane_identity_mismatch_total``, and fold nothing of them:
no condition, assessment or event for ``sim-003``, no bucket entry. ``sim-002``'s own report
goes on being folded."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NotFoundError

from healthplane.contracts import streams, subjects, wire
from healthplane.runtime import deadletters
from healthplane.runtime.connect import connect
from healthplane.runtime.replay import read_all
from healthplane.stack.keystore import Keystore
from healthplane.stack.natsserver import NatsServer
from healthplane_collector.agent import Collector, Settings
from healthplane_collector.sim import SimNode
from tests.support.records import resource_report
from tests.support.secure import env_for
from tests.support.service import spawn

pytestmark = pytest.mark.nats
CLUSTER = "lab"


async def _report(node: SimNode) -> bytes:
    collector = Collector(Settings(node_id=node.node_id, cluster=CLUSTER, interval_s=30), node, node.kmsg)
    collector.refresh_inventory()
    return wire.encode(await collector.collect("scheduled", datetime.now(UTC)))


def _start(server: NatsServer, service: str, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    return spawn(service, env_for(server, service), log)


def _mismatches(port: int, service: str, stream: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    wanted = f'healthplane_identity_mismatch_total{{service="{service}",stream="{stream}"}} '
    return next((float(line.removeprefix(wanted)) for line in text.splitlines() if line.startswith(wanted)), 0.0)


async def test_sec7_a_node_cannot_report_for_another_node(nats_server: NatsServer, nc: NATS, js: JetStreamContext,
                                                          keystore: Keystore, tmp_path: Path) -> None:
    started = {name: _start(nats_server, name, tmp_path / f"{name}.log") for name in ("health-ingest", "substrate-bridge")}
    processes, ports = [process for process, _ in started.values()], {name: port for name, (_, port) in started.items()}
    node_creds = keystore.node("sim-002", CLUSTER, tmp_path / "sim-002.creds")
    attacker = await connect(nats_server.url, name="root-on-sim-002", creds=str(node_creds), give_up_after=5)
    try:
        victim = SimNode("sim-003")
        victim.inject("xid:79", 0, datetime.now(UTC))
        ajs = attacker.jetstream()
        # The server takes both: they are on sim-002's own subjects.
        await ajs.publish(subjects.report(CLUSTER, "sim-002"), await _report(victim), timeout=5)
        await ajs.publish(subjects.resource(CLUSTER, "sim-002"),
                          wire.encode(resource_report("sim-003", cluster=CLUSTER)), timeout=5)
        # ...and sim-002's own report after them, which the pipeline still folds.
        await ajs.publish(subjects.report(CLUSTER, "sim-002"), await _report(SimNode("sim-002")), timeout=5)

        async def folded_own() -> bool:
            try:
                await js.get_last_msg("HP_ASSESSMENTS", subjects.assessment(CLUSTER, "sim-002"))
            except NotFoundError:
                return False
            return len(await read_all(nc, js, "HP_DEAD_LETTERS", "hp.dead.>")) >= 3

        async with asyncio.timeout(60):
            while not await folded_own():
                await asyncio.sleep(0.1)
        letters = [deadletters.parse(m) for m in await read_all(nc, js, "HP_DEAD_LETTERS", "hp.dead.>")]
        assert sorted((d.service, d.input_stream) for d in letters) == [
            ("health-ingest", "HP_REPORTS"), ("health-ingest", "HP_RESOURCES"), ("substrate-bridge", "HP_RESOURCES")]
        for letter in letters:
            assert "sim-003" in letter.error and "SEC-7" in letter.error, letter
        # Nothing of sim-003 was folded: no assessment, no event, no bucket entry.
        with pytest.raises(NotFoundError):
            await js.get_last_msg("HP_ASSESSMENTS", subjects.assessment(CLUSTER, "sim-003"))
        assert await read_all(nc, js, "HP_NODE_EVENTS", subjects.node_events(CLUSTER, "sim-003")) == []
        kv = await js.key_value(streams.NODES_BUCKET)
        with pytest.raises(KeyNotFoundError):
            await kv.get(subjects.kv_node_key(CLUSTER, "sim-003"))
        own = wire.decode(wire.Assessment, (await js.get_last_msg(
            "HP_ASSESSMENTS", subjects.assessment(CLUSTER, "sim-002"))).data)
        assert own.node_id == "sim-002" and own.health == "HEALTHY"
        assert _mismatches(ports["health-ingest"], "health-ingest", "HP_REPORTS") == 1.0
        assert _mismatches(ports["health-ingest"], "health-ingest", "HP_RESOURCES") == 1.0
        assert _mismatches(ports["substrate-bridge"], "substrate-bridge", "HP_RESOURCES") == 1.0
    finally:
        await attacker.close()
        for process in processes:
            process.send_signal(signal.SIGTERM)
            process.wait(30)


async def test_sec7_a_node_whose_id_needs_escaping_is_still_its_own(nats_server: NatsServer, js: JetStreamContext,
                                                                    keystore: Keystore, tmp_path: Path) -> None:
    """The references' id form (``10.0.0.42/9100``) travels escaped in its subject token; the
    identity check compares encoded tokens, so the node's own report is folded, not refused."""
    node_id = "10.0.0.42/9100"
    ingest, port = _start(nats_server, "health-ingest", tmp_path / "health-ingest.log")
    creds = keystore.node(node_id, CLUSTER, tmp_path / "escaped.creds")
    node = await connect(nats_server.url, name="escaped", creds=str(creds), give_up_after=5)
    try:
        await node.jetstream().publish(subjects.report(CLUSTER, node_id), await _report(SimNode(node_id)), timeout=5)
        async with asyncio.timeout(60):
            while True:
                try:
                    found = await js.get_last_msg("HP_ASSESSMENTS", subjects.assessment(CLUSTER, node_id))
                    break
                except NotFoundError:
                    await asyncio.sleep(0.1)
        assert wire.decode(wire.Assessment, found.data).node_id == node_id
        assert _mismatches(port, "health-ingest", "HP_REPORTS") == 0.0
    finally:
        await node.close()
        ingest.send_signal(signal.SIGTERM)
        ingest.wait(30)
