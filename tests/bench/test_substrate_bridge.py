"""substrate-bridge: resource reports/s into the bucket with 100,000 nodes, against raw KV
puts in the same run; and the sizing figure for the docs (BRG-1)."""

from __future__ import annotations

import pytest
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType

from healthplane.contracts import subjects, wire
from healthplane.runtime.processor import Processor
from healthplane.stack.natsserver import NatsServer
from healthplane_substrate_bridge.fold import INPUTS, OUTPUTS, SERVICE, BridgeCore, BridgeState
from tests.bench import harness
from tests.bench.bus import CpuMeter, processor_rate, publish_all, raw_consume_rate
from tests.support.records import resource_report

# In-process services run as the test's own identity: on an open server, as the other
# component benches (what identities cost is tests/bench/test_auth_pipeline.py's).
pytestmark = pytest.mark.insecure

NODES = 100_000
MIB = 1024 * 1024


async def _raw_kv_rate(nc, payloads: list[tuple[str, bytes]]) -> float:  # type: ignore[no-untyped-def]
    """Puts into a bucket like ``substrate-nodes`` with the publisher the bridge uses (one write
    per window, every ack checked): the bucket's write rate through our own machinery."""
    await nc.jetstream().create_key_value(KeyValueConfig(bucket="raw", history=1, max_bytes=1024 * MIB,
                                                         storage=StorageType.FILE))
    return await publish_all(nc, [(f"$KV.raw.{key}", payload) for key, payload in payloads])


async def test_bridge_rate_and_sizing(nats_server: NatsServer, nc, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    template = resource_report("cn-000000")
    one_report = len(wire.encode(template))
    payloads = []
    for i in range(NODES):
        node_id = f"cn-{i:06d}"
        report = wire.encode(resource_report(node_id))
        payloads.append((subjects.kv_node_key("default", node_id), report))
    meter = CpuMeter(nats_server).start()
    raw = await _raw_kv_rate(nc, payloads)
    raw_cpu = meter.per(NODES)

    info = await js.stream_info("KV_substrate-nodes")
    info.config.max_bytes = 1024 * MIB
    await js.update_stream(info.config)

    async def consume(through: int) -> float:
        """Time the bridge alone, as the service runs it (its fold on the Processor, batch
        512): the reports are already in HP_RESOURCES, up to sequence ``through``."""
        proc = Processor(nc=nc, js=js, service=SERVICE, core=BridgeCore(), state_type=BridgeState, inputs=INPUTS,
                         outputs=OUTPUTS, batch=512, snapshot_every_inputs=10**9, snapshot_every_s=10**9)
        await proc.start()
        return await processor_rate(proc, "HP_RESOURCES", through, meter)

    await publish_all(nc, [(subjects.resource("default", f"cn-{i:06d}"), payload) for i, (_, payload) in enumerate(payloads)])
    registering = await consume(NODES)   # every node new: NODE_REGISTERED + put
    await publish_all(nc, [(subjects.resource("default", f"cn-{i:06d}"), payload) for i, (_, payload) in enumerate(payloads)])
    updating = await consume(2 * NODES)  # steady state: every node known, put only (from the snapshot)
    bridge_cpu = meter.reading
    raw = max(raw, await _raw_kv_rate(nc, payloads))  # the baseline again: the better of before and after
    registered = (await js.stream_info("HP_NODE_EVENTS")).state.messages
    assert registered == NODES

    used = (await js.stream_info("KV_substrate-nodes")).state.bytes
    per_report = used / NODES
    harness.record("bridge.reports_into_bucket_100k_nodes", updating, "reports/s", baseline=raw, target="ratio >= 0.5")
    harness.record("bridge.first_reports_with_registration", registering, "reports/s", baseline=raw)
    # Per report, against a raw put's: this process, and the server (which also delivers the
    # report to the bridge and takes its ack).
    harness.record("bridge.client_cpu_per_report", bridge_cpu[0], "us", baseline=raw_cpu[0])
    harness.record("bridge.server_cpu_per_report", bridge_cpu[1], "us", baseline=raw_cpu[1])
    # The bridge must receive and ack each report as well as put it: the shared pull loop
    # doing only that, and the rate of receive-ack-put one after the other with nothing else,
    # are the highest any bridge could reach against this baseline.
    consume = await raw_consume_rate(nc, js, "HP_RESOURCES", NODES)
    harness.record("bridge.raw_consume_per_s", consume, "reports/s", baseline=raw)
    harness.record("bridge.ceiling_consume_then_put", 1 / (1 / consume + 1 / raw), "reports/s", baseline=raw)
    harness.record("bridge.report_size_192c_8gpu_10ann", one_report, "bytes")
    harness.record("bridge.stored_bytes_per_report", per_report, "bytes")
    harness.record("bridge.reports_per_64MiB", 64 * MIB / per_report, "reports")
