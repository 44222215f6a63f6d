"""Issue 45's figure: a subscriber's end-to-end latency, from a node's fault report to the
node event it causes arriving at a third party's subscription, at fleet size.

A real ``healthplane up --no-sim`` (every service, a secure bus) with ``healthplane sim load
--nodes N --interval 30`` (tests/bench/test_cockpit.py's fleet), and a subscriber as
docs/subscribing.md writes one: ``creds user … --role subscriber``, nats-py with the printed
inbox prefix, a core subscription on ``hp.event.>``. Once the startup wave is scored, one
node a second gets Xid 79 through the simulator's inject subject (the simulated agent sends
its out-of-band report at once, COL-2); the latency of each is from the inject's answer (the
report is on its way) to the first ``CONDITION_RAISED`` of ``gpu_xid_errors`` for that node
on the subscription. FAULTS faults; p50, p99 and the worst.

HEALTHPLANE_BENCH_SUBSCRIBER_FLEETS (default "1000,10000"): the first size is the baseline
each later size is recorded against, in the same run.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import msgspec
import nats
from nats.aio.msg import Msg

from healthplane.runtime.connect import connect
from healthplane_collector.sim import InjectRequest, inject_subject
from tests.bench import harness
from tests.bench.test_cockpit import _fleet, _quantile
from tests.support.stack import Stack

FLEETS = [int(n) for n in os.environ.get("HEALTHPLANE_BENCH_SUBSCRIBER_FLEETS", "1000,10000").split(",")]
FAULTS = int(os.environ.get("HEALTHPLANE_BENCH_SUBSCRIBER_FAULTS", "100"))
EVERY_S = 1.0
WAIT_S = 60.0  # a fault whose event has not arrived by then counts as this long (a bound, not a time)
P99_GOAL_S = 2.0  # the issue sets none; the SSE stream's bound (docs/api.md) is 2 s


async def _latencies(stack: Stack, root: Path, nodes: int) -> list[float]:
    creds = root / f"subscriber-{nodes}.creds"
    issued = stack.cli("creds", "user", "bench", "--role", "subscriber", "--data-dir", str(stack.data_dir),
                       "-o", str(creds))
    assert issued.returncode == 0, issued.stderr
    prefix = issued.stdout.strip().rpartition("inbox prefix ")[2]
    assert prefix.startswith("_INBOX.subscriber."), issued.stdout
    url = str(stack.stack["natsUrl"])
    # As docs/subscribing.md's subscriber connects: nats-py, the credentials, the printed prefix.
    subscriber = await nats.connect(url, user_credentials=str(creds), inbox_prefix=prefix, name="bench-subscriber")
    injector = await connect(url, name="bench-injector", creds=str(stack.stack["adminCreds"]), give_up_after=30)
    sent: dict[str, float] = {}
    arrived: dict[str, float] = {}

    async def on_event(msg: Msg) -> None:
        event = json.loads(msg.data)
        node = event["nodeId"]
        if (event["type"] == "CONDITION_RAISED" and node in sent and node not in arrived
                and (event.get("condition") or {}).get("type") == "gpu_xid_errors"):
            arrived[node] = time.monotonic()

    await subscriber.subscribe("hp.event.>", cb=on_event)
    try:
        for i in range(FAULTS):
            node = f"load-{(i * 7919) % nodes:06d}"  # spread over the fleet, each node once
            request = InjectRequest(node_id=node, fault="xid:79", gpu=0)
            answer = await injector.request(inject_subject("default"), msgspec.json.encode(request), timeout=5)
            assert b'"ok":true' in answer.data, answer.data
            sent[node] = time.monotonic()
            await asyncio.sleep(EVERY_S)
        deadline = time.monotonic() + WAIT_S
        while len(arrived) < len(sent) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    finally:
        await subscriber.close()
        await injector.close()
    return [arrived.get(node, at + WAIT_S) - at for node, at in sent.items()]


def test_int1_a_subscriber_hears_a_fault_within_seconds_at_fleet_size(tmp_path: Path) -> None:
    """INT-1 (issue 45, figures): report → event at a subscriber, p99, at each fleet size."""
    base: dict[str, float] | None = None
    for nodes in FLEETS:
        with _fleet(tmp_path, nodes) as stack:
            found = asyncio.run(_latencies(stack, tmp_path, nodes))
        figures = {"p50": statistics.median(found), "p99": _quantile(found, 0.99), "worst": max(found)}
        missing = sum(1 for value in found if value >= WAIT_S)
        print(f"subscriber {nodes}: {figures} over {len(found)} faults, {missing} not heard", flush=True)
        for name, value in figures.items():
            harness.record(f"subscriber.{nodes}.report_to_event_{name}_s", value, "s",
                           baseline=base[name] if base else None,
                           target=f"value <= {P99_GOAL_S:g}" if name == "p99" else "")
        harness.record(f"subscriber.{nodes}.faults_not_heard", missing, "faults", target="value <= 0")
        base = base or figures
