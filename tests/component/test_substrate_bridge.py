"""substrate-bridge on a real nats-server, run as its own process (BRG-1..BRG-3)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType

from healthplane.contracts import streams, subjects, wire
from healthplane.contracts.config import parse_cluster_config
from healthplane.runtime import configstore, converge, deadletters
from healthplane.runtime.replay import replay
from healthplane.stack.natsserver import NatsServer
from healthplane_substrate_bridge.metrics import BucketGauges
from tests.support.records import resource_report
from tests.support.secure import env_for
from tests.support.service import spawn

pytestmark = pytest.mark.nats
MIB = 1024 * 1024


class BridgeProcess:
    def __init__(self, server: NatsServer, log: Path, **env: str) -> None:
        self.log = log
        self.process, self.port = spawn(
            "substrate-bridge", env_for(server, "substrate-bridge", HEALTHPLANE_BUCKET_SAMPLE_SECONDS="0.2", **env), log)

    def lines(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]

    def wait_for_line(self, event: str, timeout: float = 20) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines():
                if line.get("event") == event:
                    return line
            assert self.process.poll() is None, self.log.read_text()
            time.sleep(0.05)
        raise AssertionError(f"no {event!r} log line: {self.log.read_text()}")

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text

    def wait_ready(self, timeout: float = 20) -> None:
        """Until /readyz says caught up: the lease held, the replay folded (ARCH rule 4)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=2).status_code == 200 \
                        and "caught up" in httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=2).text:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"not ready: {self.log.read_text()}")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(20)


@pytest.fixture
def bridges(nats_server: NatsServer, tmp_path: Path) -> Iterator[list[BridgeProcess]]:
    started: list[BridgeProcess] = []
    yield started
    for bridge in started:
        if bridge.process.poll() is None:
            bridge.process.kill()
            bridge.process.wait()


def _start(bridges: list[BridgeProcess], server: NatsServer, tmp_path: Path, **env: str) -> BridgeProcess:
    bridge = BridgeProcess(server, tmp_path / f"bridge-{len(bridges)}.log", **env)
    bridges.append(bridge)
    bridge.wait_ready()
    return bridge


async def _publish(js: JetStreamContext, report: wire.ResourceReport) -> None:
    await js.publish(subjects.resource(report.cluster, report.node_id), wire.encode(report))


async def _until(predicate, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.05)


async def _cores_are(kv, node_id: str, cores: int) -> bool:  # type: ignore[no-untyped-def]
    """Whether the bucket holds a report of ``node_id`` with ``cores`` cores."""
    try:
        entry = await kv.get(subjects.kv_node_key("default", node_id))
    except Exception:
        return False
    return wire.decode(wire.ResourceReport, entry.value or b"").cores == cores


async def _registrations(js: JetStreamContext) -> list[wire.NodeEvent]:
    return [wire.decode(wire.NodeEvent, m.data) async for m in replay(js, "HP_NODE_EVENTS", "hp.event.*.*.NODE_REGISTERED")]


async def test_registration_and_latest_wins(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path,
                                            bridges: list[BridgeProcess]) -> None:
    # BRG-1, BRG-3: latest report per node in the bucket; NODE_REGISTERED once per node.
    bridge = _start(bridges, nats_server, tmp_path)
    await _publish(js, resource_report("10.0.0.42/9100", provisioned=True))
    await _publish(js, resource_report("cn-042", definition=None))
    await _publish(js, resource_report("cn-042", definition=None, cores=96))
    kv = await js.key_value(streams.NODES_BUCKET)

    await _until(lambda: _cores_are(kv, "cn-042", 96))
    stored = wire.decode(wire.ResourceReport, (await kv.get("default.10=2E0=2E0=2E42=2F9100")).value or b"")
    assert stored.provisioned is True and stored.node_id == "10.0.0.42/9100"
    events = await _registrations(js)
    assert sorted(e.node_id for e in events) == ["10.0.0.42/9100", "cn-042"]
    by_node = {e.node_id: e for e in events}
    assert by_node["10.0.0.42/9100"].provisioned is True and by_node["cn-042"].provisioned is False
    assert by_node["10.0.0.42/9100"].definition == "gpu-pool"

    # A restart registers nobody again, and a later report still lands.
    assert bridge.stop() == 0
    _start(bridges, nats_server, tmp_path)
    await _publish(js, resource_report("cn-042", definition=None, cores=64))

    await _until(lambda: _cores_are(kv, "cn-042", 64))
    assert len(await _registrations(js)) == 2

    # The bucket lost a node's key (purged by hand) while the bridge was down: its next report
    # lands again and is not registered twice: the fold keeps the registrations it stored.
    assert bridges[-1].stop() == 0
    await kv.purge(subjects.kv_node_key("default", "cn-042"))
    _start(bridges, nats_server, tmp_path)
    await _publish(js, resource_report("cn-042", definition=None, cores=32))

    await _until(lambda: _cores_are(kv, "cn-042", 32))
    assert len(await _registrations(js)) == 2


async def test_cap_from_environment_is_clamped_and_logged(nats_server: NatsServer, js: JetStreamContext,
                                                          tmp_path: Path, bridges: list[BridgeProcess]) -> None:
    # BRG-1: a value that arrives without validation is clamped, and the log names both.
    bridge = _start(bridges, nats_server, tmp_path, HEALTHPLANE_NODES_BUCKET_MAX_BYTES="1024")
    line = bridge.wait_for_line("nodes bucket cap clamped")
    assert (line["configured_bytes"], line["clamped_bytes"], line["level"]) == (1024, 64 * MIB, "warning")
    assert bridge.wait_for_line("nodes bucket cap in force")["cap_bytes"] == 64 * MIB
    bridge.stop()
    # SEC-10: the bridge may not change a stream; it says what differs and who resizes.
    bridge = _start(bridges, nats_server, tmp_path, HEALTHPLANE_NODES_BUCKET_MAX_BYTES=str(8 * 1024 * MIB))
    line = bridge.wait_for_line("nodes bucket cap in force differs from the configured one")
    assert (line["cap_bytes"], line["configured_bytes"]) == (64 * MIB, 2048 * MIB)
    assert "streams converge" in line["fix"]
    assert (await js.stream_info("KV_substrate-nodes")).config.max_bytes == 64 * MIB


async def test_applied_cap_resizes_the_bucket_in_place_by_stream_administration(
        nats_server: NatsServer, js: JetStreamContext, admin: JetStreamContext, tmp_path: Path,
        bridges: list[BridgeProcess]) -> None:
    """BRG-1 with SEC-10: the config's cap is put in force by `healthplane streams converge` as
    the maintainer (up does the same at each start), in place; the bridge then logs it."""
    await _publish(js, resource_report("cn-1"))
    bridge = _start(bridges, nats_server, tmp_path)
    line = bridge.wait_for_line("nodes bucket cap in force")
    assert line["cap_bytes"] == 64 * MIB and "configured_bytes" not in line  # unset changes nothing
    kv = await js.key_value(streams.NODES_BUCKET)
    await _until(lambda: _has_key(kv, "default.cn-1"))
    bridge.stop()
    await configstore.apply(admin, parse_cluster_config({"substrate": {"nodesBucketMaxBytes": 128 * MIB}}))
    as_admin = _cli(nats_server, "admin", "streams", "converge")
    assert as_admin.returncode != 0 and "permission denied" in as_admin.stderr, as_admin
    assert len(as_admin.stderr.strip().splitlines()) == 1 and "Traceback" not in as_admin.stderr
    done = _cli(nats_server, "maintainer", "streams", "converge")
    assert done.returncode == 0 and "KV_substrate-nodes" in done.stdout, done
    assert (await js.stream_info("KV_substrate-nodes")).config.max_bytes == 128 * MIB
    bridge = _start(bridges, nats_server, tmp_path)
    line = bridge.wait_for_line("nodes bucket cap in force")
    assert line["cap_bytes"] == 128 * MIB and "configured_bytes" not in line
    assert await _has_key(kv, "default.cn-1")  # resized in place, nothing lost


def _cli(server: NatsServer, role: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "healthplane.cli", *args], capture_output=True, text=True, timeout=60,
                          env=env_for(server, role, role))


async def _has_key(kv, key: str) -> bool:  # type: ignore[no-untyped-def]
    try:
        await kv.get(key)
        return True
    except Exception:
        return False


async def test_full_bucket_rejects_then_redelivers_until_space(nats_server: NatsServer, nc, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                               bridges: list[BridgeProcess]) -> None:
    # BRG-2: a full bucket refuses a new node and a larger report, smaller updates still
    # land; rejected reports are redelivered until space is freed; nothing is lost.
    js = nc.jetstream()
    size = len(wire.encode(resource_report("n-00")))
    await js.create_key_value(KeyValueConfig(bucket=streams.NODES_BUCKET, history=1, max_bytes=int(size * 4.5),
                                             storage=StorageType.FILE, direct=True))
    await converge.ensure(js)
    bridge = _start(bridges, nats_server, tmp_path)
    kv = await js.key_value(streams.NODES_BUCKET)
    for i in range(4):
        await _publish(js, resource_report(f"n-{i:02d}"))
    await _until(lambda: _has_key(kv, "default.n-03"))

    await _publish(js, resource_report("n-new"))                       # a node never seen
    await _publish(js, resource_report("n-00", padding=2000))          # larger than it replaces
    await _publish(js, resource_report("n-01", annotations=5))         # smaller: still lands

    async def smaller_landed() -> bool:
        entry = await kv.get("default.n-01")
        return len(wire.decode(wire.ResourceReport, entry.value or b"").annotations) == 5

    await _until(smaller_landed)
    await asyncio.sleep(5)  # a few redeliveries (2 s apart)
    failures = _counter(bridge.metrics(), "healthplane_substrate_nodes_bucket_put_failures_total")
    assert failures >= 4
    assert not await _has_key(kv, "default.n-new")
    errors = [line for line in bridge.lines() if line.get("level") == "error"]
    assert len(errors) == 1, errors  # at most one error line per 30 s
    assert errors[0]["key"] in ("default.n-new", "default.n-00") and "reason" in errors[0]

    info = await js.stream_info("KV_substrate-nodes")
    info.config.max_bytes = size * 20
    await js.update_stream(info.config)

    async def all_landed() -> bool:
        if not await _has_key(kv, "default.n-new"):
            return False
        entry = await kv.get("default.n-00")
        return "padding" in wire.decode(wire.ResourceReport, entry.value or b"").annotations

    await _until(all_landed, timeout=20)
    assert "n-new" in [e.node_id for e in await _registrations(js)]


async def test_malformed_report_is_set_aside_and_the_next_lands(nats_server: NatsServer, nc,  # type: ignore[no-untyped-def]
                                                                js: JetStreamContext, tmp_path: Path,
                                                                bridges: list[BridgeProcess]) -> None:
    # REL-3, issue 16.2: a report that does not decode is terminated, counted and kept in
    # HP_DEAD_LETTERS byte for byte with why; the reports behind it go on.
    bridge = _start(bridges, nats_server, tmp_path)
    garbage = b'{"node_id": "cn-9", "cores": "many"'
    ack = await js.publish(subjects.resource("default", "cn-9"), garbage)
    await _publish(js, resource_report("cn-10"))
    kv = await js.key_value(streams.NODES_BUCKET)
    await _until(lambda: _has_key(kv, "default.cn-10"))
    [dead] = await deadletters.read(nc, js, "substrate-bridge")
    assert (dead.input_stream, dead.input_seq, dead.reason, dead.payload) == ("HP_RESOURCES", ack.seq, "malformed", garbage)
    assert dead.producer == "substrate-bridge.0"
    assert bridge.wait_for_line("input rejected")["seq"] == ack.seq
    assert _counter(bridge.metrics(), "healthplane_messages_rejected_total") == 1
    assert not await _has_key(kv, "default.cn-9")


async def test_gauges_report_bucket_usage(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path,
                                          bridges: list[BridgeProcess]) -> None:
    # BRG-3: used and max bytes, sampled on the configured interval.
    bridge = _start(bridges, nats_server, tmp_path)
    await _publish(js, resource_report("cn-7"))
    kv = await js.key_value(streams.NODES_BUCKET)
    await _until(lambda: _has_key(kv, "default.cn-7"))
    await asyncio.sleep(0.5)
    text = bridge.metrics()
    assert _counter(text, "healthplane_substrate_nodes_bucket_bytes_max") == 64 * MIB
    assert _counter(text, "healthplane_substrate_nodes_bucket_bytes_used") > 0


def test_gauges_absent_before_the_first_sample() -> None:
    # BRG-3: absence means unknown, never zero.
    gauges = BucketGauges()
    assert list(gauges.collect()) == []
    gauges.sample = (10, 20)
    assert [m.name for m in gauges.collect()] == [
        "healthplane_substrate_nodes_bucket_bytes_used", "healthplane_substrate_nodes_bucket_bytes_max"]


def _counter(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exposed:\n{text}")
