"""scorer and the CLI read side: assessments/s through the scorer against the raw pull baseline,
`node list` over 100,000 nodes, `node events --latest` on a node with 100,000 events."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.runtime.fold import Inbound
from healthplane.runtime.processor import Processor
from healthplane.stack.natsserver import NatsServer
from healthplane_scorer.fold import INPUTS, OUTPUTS, ScorerCore, ScorerState
from tests.bench import harness
from tests.bench.bus import (
    CpuMeter,
    core_cpu_per_record,
    processor_rate,
    publish_all,
    raw_consume_rate,
    record_service_loop,
)

# In-process services run as the test's own identity: on an open server, as the other
# component benches (what identities cost is tests/bench/test_auth_pipeline.py's).
pytestmark = pytest.mark.insecure

NODES = 100_000
T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


async def test_scorer_throughput(nats_server: NatsServer, nc, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    condition = wire.Condition(type="disk_degraded", reason="SmartFailing", severity="critical",
                               message="SMART health check failing on /dev/sda", first_seen=T0)
    payloads = [(subjects.assessment("bench", f"cn-{i:06d}"), wire.encode(wire.Assessment(
        node_id=f"cn-{i:06d}", cluster="bench", assessed_at=T0, report_sent_at=T0, health="DEGRADED",
        conditions=[condition] if i % 10 == 0 else [], last_report_at=T0, interval_seconds=30))) for i in range(NODES)]
    await publish_all(nc, payloads)
    meter = CpuMeter(nats_server).start()
    raw = await raw_consume_rate(nc, js, "HP_ASSESSMENTS", NODES)
    raw_cpu = meter.per(NODES)

    proc = Processor(nc=nc, js=js, service="scorer-bench", core=ScorerCore(), state_type=ScorerState, inputs=INPUTS,
                     outputs=OUTPUTS, batch=512, snapshot_every_inputs=10**9, snapshot_every_s=10**9)
    await proc.start()
    rate = await processor_rate(proc, "HP_ASSESSMENTS", NODES, meter)
    proc_cpu = meter.reading
    raw = max(raw, await raw_consume_rate(nc, js, "HP_ASSESSMENTS", NODES))  # the better of before and after
    # The core alone: decode, score, SCORE_CHANGED and the view built and encoded (two appends
    # for every node here: its first score and its first view).
    core_us = core_cpu_per_record(ScorerCore(), ScorerState(), [
        Inbound("HP_ASSESSMENTS", seq, subject, data, {}, T0, False) for seq, (subject, data) in enumerate(payloads, 1)])
    record_service_loop("scorer", "assessment", rate, raw, proc_cpu, raw_cpu, core_us)

    # node list over the 100,000 views the scorer just wrote: the command as a user runs it,
    # start-up and imports included. Best of three: an absolute time on a shared machine.
    server_url = nc.connected_url.geturl()
    times = []
    for _ in range(3):
        started = time.perf_counter()
        listing = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "healthplane.cli", "node", "list",
                                                           "--cluster", "bench", "--nats-url", server_url],
                                          capture_output=True, text=True, timeout=120)
        times.append(time.perf_counter() - started)
        assert listing.returncode == 0, listing.stderr
        lines = listing.stdout.splitlines()
        assert len(lines) == NODES + 1 and lines[1].startswith("cn-000000 ") and lines[-1].startswith("cn-099999 ")
    harness.record("cli.node_list_100k_nodes", min(times), "s", target="value <= 2")


async def test_node_events_latest_on_a_long_history(nats_server: NatsServer, nc, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    view = wire.NodeView(node_id="busy-1", cluster="bench", hostname="busy-1", status="READY", health="HEALTHY",
                         last_reported_at=T0, score=100, score_explanation=None, conditions=[],
                         attributed_failures=wire.AttributedFailures(), holds=[])
    await js.publish(subjects.node_view("bench", "busy-1"), wire.encode(view))
    events = []
    for i in range(NODES):
        kind = "CONDITION_RAISED" if i % 2 else "CONDITION_CLEARED"
        events.append((subjects.event("bench", "busy-1", kind), wire.encode(wire.NodeEvent(
            id=f"e{i}", node_id="busy-1", cluster="bench", type=kind, occurred_at=T0, message=f"event {i}",  # type: ignore[arg-type]
            actor="bench"))))
        if i % 10 == 0:  # other nodes' events interleaved: the read must not scan them
            events.append((subjects.event("bench", f"other-{i}", "SCORE_CHANGED"), b"{}"))
    await publish_all(nc, events)
    started = time.perf_counter()
    result = await asyncio.to_thread(subprocess.run, [
        sys.executable, "-m", "healthplane.cli", "node", "events", "busy-1", "--latest", "-o", "json",
        "--nats-url", nats_server.url], capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - started
    assert result.returncode == 0, result.stderr
    assert '"e99999"' in result.stdout
    harness.record("cli.node_events_latest_100k_events", elapsed, "s", target="value <= 1")
