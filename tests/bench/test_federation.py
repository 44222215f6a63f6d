"""Issue 22's figures: how the hub's copy of a cluster (durable sourcing through the member's
``hub`` consumer, ``healthplane.client.federation``) catches up after an outage of the link, and the
bytes the link carries per node change, against a raw stream mirror of the same data over its
own, identical link, in the same run (and an ephemeral source, nats-server's other way).

Two pairs of real nats-servers (a hub and a member each), each member's leaf connection
through a link the bench cuts (``tests.support.link``). Both members get the same records: a
view for every node, one change per node, then changes at a fleet's pace (every node's view
rewritten once per 30 s report interval) for the length of the outage. The links mended, the
time until each hub's copy holds the member's last record.

HP_BENCH_FED_NODES (default 10,000) and HP_BENCH_FED_OUTAGE_S (default 600) size it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from healthplane.client import federation
from healthplane.contracts import subjects
from healthplane.runtime import converge
from healthplane.runtime.connect import connect
from healthplane.runtime.publish import Publisher
from healthplane.stack.natsserver import Federation, NatsServer, free_port
from tests.bench import harness
from tests.support.link import Link

pytestmark = pytest.mark.insecure
NODES = int(os.environ.get("HP_BENCH_FED_NODES", "10000"))
OUTAGE_S = float(os.environ.get("HP_BENCH_FED_OUTAGE_S", "600"))
RESTART_S = 30.0
INTERVAL_S = 30.0
MEMBER = "m"


def _view(node: int, version: int) -> bytes:
    """A node view of the size the scorer writes for a node with one condition (~1 KB)."""
    return json.dumps({
        "nodeId": f"gpu-{node:05d}", "cluster": MEMBER, "hostname": f"gpu-{node:05d}.example", "status": "READY",
        "health": "DEGRADED" if version % 7 == 0 else "HEALTHY", "score": 100 - version % 50, "jobs": version % 3,
        "lastReportedAt": f"2026-12-03T12:{version // 60 % 60:02d}:{version % 60:02d}Z", "reportIntervalSeconds": 30,
        "conditions": [{"type": "gpu_xid", "severity": "warning", "message": "Xid 31 on GPU 3 (a user's fault)",
                        "firstSeen": "2026-12-03T11:00:00Z", "observations": version}],
        "holds": [], "definition": "gpu-pool", "provisioned": False,
        "scoreExplanation": {"penalties": "cluster", "contributions": [
            {"reason": "gpu_xid warning", "type": "gpu_xid", "points": -(version % 50)}]},
        "attributedFailures": {"count": 0, "last": None, "byFault": {}},
    }).encode()


class Pair:
    """A hub and a member, the member's leaf through a link; the hub's copy of the member's
    HP_NODES the federation aggregate (durable sourcing), a raw mirror or an ephemeral source."""

    def __init__(self, root: Path, kind: str) -> None:
        self.kind = kind
        leaf_port = free_port()
        self.hub = NatsServer(root / f"{kind}-hub", federation=Federation(federation.HUB_DOMAIN,
                                                                          leaf_port=leaf_port)).start()
        self.link = Link(leaf_port)
        self.member = NatsServer(root / f"{kind}-member", federation=Federation(
            MEMBER, hub_url=self.link.url, guarded=kind == "aggregate")).start()
        self.copy = federation.aggregate_stream(MEMBER) if kind == "aggregate" else kind.upper()

    async def open(self) -> None:
        self.hub_nc = await connect(self.hub.url, name="bench-hub", give_up_after=10)
        self.member_nc = await connect(self.member.url, name="bench-member", give_up_after=10)
        await converge.ensure(self.member_nc.jetstream())
        if self.kind == "aggregate":
            await federation.offer_to_hub(self.member_nc, MEMBER)
            await federation.attach(self.hub_nc, MEMBER)
        else:  # nats-server's own ephemeral consumer, created by the hub in the member
            origin = {"name": "HP_NODES", "external": {"api": f"$JS.{MEMBER}.API"}}
            config: dict[str, Any] = {"name": self.copy, "storage": "file", "num_replicas": 1,
                                      "max_msgs_per_subject": 1}
            config |= {"mirror": origin} if self.kind == "mirror" else {"subjects": [], "sources": [origin]}
            await _api(self.hub_nc, f"$JS.API.STREAM.CREATE.{self.copy}", config)

    async def close(self) -> None:
        await self.hub_nc.close()
        await self.member_nc.close()
        self.link.close()
        self.member.stop()
        self.hub.stop()

    async def caught_up(self) -> bool:
        """The hub's copy holds the member's last record."""
        last = (await _api(self.member_nc, "$JS.API.STREAM.INFO.HP_NODES", {}))["state"]["last_seq"]
        info = await _api(self.hub_nc, f"$JS.API.STREAM.INFO.{self.copy}", {})
        if self.kind == "mirror":
            return bool(info["state"]["last_seq"] >= last)
        sources = info.get("sources") or [{}]
        return bool(int(sources[0].get("seq", 0)) >= last)

    def leaf_bytes(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.hub.monitor_port}/leafz", timeout=5) as answer:
            leafs = json.loads(answer.read()).get("leafs") or []
        return sum(int(leaf.get("in_bytes", 0)) + int(leaf.get("out_bytes", 0)) for leaf in leafs)


async def _api(nc: Any, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads((await nc.request(subject, json.dumps(body).encode(), timeout=10)).data)
    assert "error" not in answer, answer["error"]
    return answer


async def _until_caught_up(pairs: list[Pair], timeout_s: float) -> dict[str, float]:
    """Seconds until each pair's hub copy holds its member's last record."""
    started, done = time.monotonic(), {}
    while len(done) < len(pairs):
        for pair in pairs:
            if pair.kind not in done and await pair.caught_up():
                done[pair.kind] = time.monotonic() - started
        assert time.monotonic() - started < timeout_s, f"not caught up within {timeout_s:g}s: {done}"
        await asyncio.sleep(0.1)
    return done


async def _publish(pairs: list[Pair], records: list[tuple[str, bytes]]) -> None:
    for pair in pairs:
        if pair.member_nc.is_closed:
            pair.member_nc = await connect(pair.member.url, name="bench-member", give_up_after=10)
        publisher = Publisher(pair.member_nc, window=2048)
        for subject, payload in records:
            await publisher.publish(subject, payload)
        await publisher.flush()


async def test_fed_catch_up_after_an_outage_and_bytes_per_change_against_a_raw_mirror(tmp_path: Path) -> None:
    pairs = [Pair(tmp_path, "aggregate"), Pair(tmp_path, "mirror"), Pair(tmp_path, "source")]
    try:
        for pair in pairs:
            await pair.open()
        version = 1
        await _publish(pairs, [(subjects.node_view(MEMBER, f"gpu-{n:05d}"), _view(n, version)) for n in range(NODES)])
        initial = await _until_caught_up(pairs, 120)

        # Steady state: one change per node, the bytes each link carried for it.
        before = {p.kind: p.leaf_bytes() for p in pairs}
        version += 1
        await _publish(pairs, [(subjects.node_view(MEMBER, f"gpu-{n:05d}"), _view(n, version)) for n in range(NODES)])
        await _until_caught_up(pairs, 120)
        await asyncio.sleep(2)  # the last flow-control answers
        per_change = {p.kind: (p.leaf_bytes() - before[p.kind]) / NODES for p in pairs}

        # The outage: both links cut, the fleet's changes go on at its pace, then both mended.
        for pair in pairs:
            pair.link.cut()
        rate = NODES / INTERVAL_S
        changes, started = 0, time.monotonic()
        while (elapsed := time.monotonic() - started) < OUTAGE_S:
            due = int(elapsed * rate) - changes
            if due > 0:
                batch = [(changes + i) % NODES for i in range(due)]
                await _publish(pairs, [(subjects.node_view(MEMBER, f"gpu-{n:05d}"),
                                        _view(n, version + (changes + i) // NODES + 1)) for i, n in enumerate(batch)])
                changes += due
            await asyncio.sleep(0.2)
        before = {p.kind: p.leaf_bytes() for p in pairs}
        for pair in pairs:
            pair.link.mend()
        catch_up = await _until_caught_up(pairs, OUTAGE_S + 300)
        await asyncio.sleep(2)
        catch_up_bytes = {p.kind: (p.leaf_bytes() - before[p.kind]) for p in pairs}

        # The member's server down (a host restart) for RESTART_S, then a change per node.
        for pair in pairs:
            pair.member.stop()
        await asyncio.sleep(RESTART_S)
        for pair in pairs:
            pair.member.start()
        version += OUTAGE_S * rate // NODES + 2
        await _publish(pairs, [(subjects.node_view(MEMBER, f"gpu-{n:05d}"), _view(n, int(version)))
                               for n in range(NODES)])
        restarted = await _until_caught_up(pairs, 300)
    finally:
        for pair in pairs:
            await pair.close()

    minutes = OUTAGE_S / 60
    # The goal is the user's: a returning cluster's changes on the hub within 10 s.
    harness.record(f"federation catch-up after a {minutes:g}-min link outage, {NODES:,} nodes (durable source)",
                   catch_up["aggregate"], "s", baseline=catch_up["mirror"], target="value <= 10")
    harness.record(f"federation catch-up after a {minutes:g}-min link outage, {NODES:,} nodes (ephemeral source)",
                   catch_up["source"], "s", baseline=catch_up["mirror"])
    harness.record(f"federation catch-up after the member's server restarts, {NODES:,} nodes (durable source)",
                   restarted["aggregate"], "s", baseline=restarted["mirror"], target="value <= 10")
    harness.record(f"federation catch-up after the member's server restarts, {NODES:,} nodes (ephemeral source)",
                   restarted["source"], "s", baseline=restarted["mirror"])
    harness.record(f"federation link bytes per node change, {NODES:,} nodes (durable source)",
                   per_change["aggregate"], "B", baseline=per_change["mirror"], target="ratio <= 1.2")
    harness.record(f"federation bytes to catch up {changes:,} changes of {NODES:,} nodes (durable source)",
                   catch_up_bytes["aggregate"] / 1e6, "MB", baseline=catch_up_bytes["mirror"] / 1e6)
    harness.record(f"federation first copy of {NODES:,} nodes (durable source)", initial["aggregate"], "s",
                   baseline=initial["mirror"])
    print(f"\nfederation: first copy {initial}, bytes/change {per_change}, outage {OUTAGE_S:g}s with {changes} "
          f"changes, catch-up {catch_up} s, {catch_up_bytes} B; after a restart {restarted} s", file=sys.stderr)
