"""SEC-11, played as the attacker: root on compute node ``sim-002``, with that node's own
credentials and on its own subject, sends a report that stays under its identity's 256 KiB cap
but packs as many list items as that can hold (~86,000 empty strings: a JSON list item takes
at least three bytes, ``"",``, so 100,000 cannot fit under the cap). nats-server stores it; a
real health-ingest refuses it when it decodes it, dead-letters it naming the field and the
bound, counts it, logs it once, and folds the node's next ordinary report as if it never came."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from pathlib import Path

import httpx
import msgspec
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from healthplane.contracts import permissions, subjects, wire
from healthplane.runtime import deadletters
from healthplane.runtime.connect import connect
from healthplane.stack.keystore import Keystore
from healthplane.stack.natsserver import NatsServer
from healthplane_collector.sim import SimNode
from tests.security.test_identity import CLUSTER, _report, _start

pytestmark = pytest.mark.nats
NODE = "sim-002"
FIELD = "$.signals.gpu.devices[0].throttle.reasons"


def _series(port: int, name: str, **labels: str) -> float:
    """One sample of ``name`` whose labels include ``labels`` (0 when there is none)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for line in text.splitlines():
        found = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if found and all(f'{k}="{v}"' in found.group(1) for k, v in labels.items()):
            return float(found.group(2))
    return 0.0


def _packed(report: bytes) -> tuple[bytes, int]:
    """``report`` with as many list items as fit under the node's cap, in one GPU's throttle
    reasons (bounded at wire.THROTTLE_REASONS_MAX)."""
    value = msgspec.json.decode(report)
    items = (permissions.NODE_PAYLOAD_LIMIT - len(report) - 64) // len(b'"",')
    value["signals"]["gpu"]["devices"][0]["throttle"]["reasons"] = [""] * items
    return msgspec.json.encode(value), items


async def test_sec11_a_report_of_many_list_items_under_the_cap_is_dead_lettered_and_the_node_goes_on(
        nats_server: NatsServer, nc: NATS, js: JetStreamContext, keystore: Keystore, tmp_path: Path) -> None:
    """SEC-11, REL-3: the decoder's bound refuses what the payload cap lets through."""
    log = tmp_path / "health-ingest.log"
    ingest, port = _start(nats_server, "health-ingest", log)
    node = await connect(nats_server.url, name=f"root-on-{NODE}",
                         creds=str(keystore.node(NODE, CLUSTER, tmp_path / f"{NODE}.creds")), give_up_after=5)
    try:
        packed, items = _packed(await _report(SimNode(NODE)))
        assert items > 80_000 and len(packed) <= permissions.NODE_PAYLOAD_LIMIT
        njs = node.jetstream()
        await njs.publish(subjects.report(CLUSTER, NODE), packed, timeout=5)  # the server takes it: under the cap
        await njs.publish(subjects.report(CLUSTER, NODE), await _report(SimNode(NODE)), timeout=5)

        async def folded_next() -> bool:
            try:
                await js.get_last_msg("HP_ASSESSMENTS", subjects.assessment(CLUSTER, NODE))
            except NotFoundError:
                return False
            return len(await deadletters.read(nc, js, "health-ingest")) >= 1

        async with asyncio.timeout(60):
            while not await folded_next():
                await asyncio.sleep(0.1)
        # Dead-lettered, with the reason naming the field and the bound...
        [letter] = await deadletters.read(nc, js, "health-ingest")
        assert (letter.input_stream, letter.input_seq, letter.reason) == ("HP_REPORTS", 1, "malformed")
        assert f"length <= {wire.THROTTLE_REASONS_MAX} - at `{FIELD}`" in letter.error, letter.error
        assert letter.payload == packed  # kept byte for byte, for `dead-letters replay`
        # ...counted...
        assert _series(port, "healthplane_messages_rejected_total", service="health-ingest", stream="HP_REPORTS",
                       reason="malformed") == 1.0
        assert _series(port, "healthplane_dead_letters_total", service="health-ingest", reason="malformed") == 1.0
        # ...and the node's next report folded, as if the bad one never came.
        own = wire.decode(wire.Assessment, (await js.get_last_msg(
            "HP_ASSESSMENTS", subjects.assessment(CLUSTER, NODE))).data)
        assert own.node_id == NODE and own.health == "HEALTHY"
    finally:
        await node.close()
        ingest.send_signal(signal.SIGTERM)
        ingest.wait(30)
    # Logged once, naming the field.
    rejected = [line for line in log.read_text().splitlines()
                if line.startswith("{") and json.loads(line).get("event") == "input rejected"]
    assert len(rejected) == 1 and FIELD in json.loads(rejected[0])["reason"], rejected
