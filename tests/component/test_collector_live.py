"""The collector as a process on a fixture root: a Xid written into a kmsg FIFO comes out as
an out-of-band report on NATS (COL-2), and the resource report precedes it (COL-11)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nats.errors
import pytest
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.stack.natsserver import NatsServer
from tests.support.live import live
from tests.support.secure import env_for

pytestmark = pytest.mark.nats

XID_RECORD = (b"4,5120,90000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
              b" SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n")


def fixture_root(root: Path) -> Path:
    (root / "dev").mkdir(parents=True)
    os.mkfifo(root / "dev" / "kmsg")
    (root / "etc").mkdir()
    (root / "etc" / "hostname").write_text("gpu-node-7\n")
    (root / "proc" / "sys" / "kernel" / "random").mkdir(parents=True)
    (root / "proc" / "sys" / "kernel" / "random" / "boot_id").write_text("0f0e0d0c-0b0a-0908-0706-050403020100\n")
    (root / "proc" / "cpuinfo").write_text("".join(f"processor\t: {i}\n\n" for i in range(4)))
    (root / "proc" / "meminfo").write_text("MemTotal:       16384000 kB\n")
    (root / "proc" / "mounts").write_text("/dev/vda1 / ext4 rw,relatime 0 0\nproc /proc proc rw 0 0\n")
    return root


def collector_config(path: Path, interval: int = 3600, **extra: object) -> Path:
    health = {"report-interval-seconds": interval, **extra.pop("health", {})}  # type: ignore[dict-item]
    path.write_text(json.dumps({"config": {"node-id": "gpu-node-7", "cluster": "lab", "health": health, **extra}}))
    return path


def start_collector(server: NatsServer, tmp_path: Path, config: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "healthplane.cli", "collector", "--root", str(tmp_path / "root"),
         "--state-dir", str(tmp_path / "state"), "--gpu-source", "nvidia-smi", "--config", str(config)],
        env={**env_for(server, "collector", "lab/gpu-node-7"),
             "PATH": str(tmp_path / "bin")},  # no smartctl, no nvidia-smi: honest "unavailable"
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "collector.log", "ab"))


async def test_xid_in_kmsg_triggers_an_out_of_band_report(nats_server: NatsServer, js: JetStreamContext,
                                                          tmp_path: Path) -> None:
    fixture_root(tmp_path / "root")
    (tmp_path / "bin").mkdir()
    reports = await live(js, subjects.report("lab", "gpu-node-7"))
    resources = await live(js, subjects.resource("lab", "gpu-node-7"))
    process = start_collector(nats_server, tmp_path, collector_config(tmp_path / "collector.yaml"))
    try:
        first = wire.decode(wire.HealthReport, (await reports.next_msg(timeout=30)).data)
        assert first.trigger == "start"
        assert first.signals.edac.status == "unavailable" and first.signals.smart.status == "unavailable"
        resource = wire.decode(wire.ResourceReport, (await resources.next_msg(timeout=5)).data)
        assert (resource.hostname, resource.cores, resource.ready) == ("gpu-node-7", 4, False)

        writer = os.open(tmp_path / "root" / "dev" / "kmsg", os.O_WRONLY)
        sent = time.monotonic()
        os.write(writer, XID_RECORD)
        os.close(writer)
        report = wire.decode(wire.HealthReport, (await reports.next_msg(timeout=10)).data)
        elapsed = time.monotonic() - sent
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(20)
    assert report.trigger == "kmsg"
    assert elapsed < 5  # the bound here is generous; latency is measured in tests/bench
    (entry,) = report.signals.kmsg.xid
    assert (entry.pci_bus_id, entry.xid, entry.count, entry.gpu_index) == ("0000:3b:00.0", 79, 1, None)
    assert process.returncode == 0
    cursor = json.loads((tmp_path / "state" / "kmsg.cursor").read_text())
    assert cursor == {"bootId": "0f0e0d0c-0b0a-0908-0706-050403020100", "seq": 5120}


async def test_health_disabled_still_publishes_resources(nats_server: NatsServer, js: JetStreamContext,
                                                         tmp_path: Path) -> None:
    # COL-1, COL-11: health.disabled stops health reports; the resource report still goes out,
    # and maintenance: true makes it say ready: false.
    fixture_root(tmp_path / "root")
    (tmp_path / "bin").mkdir()
    reports = await live(js, subjects.report("lab", "gpu-node-7"))
    resources = await live(js, subjects.resource("lab", "gpu-node-7"))
    config = collector_config(tmp_path / "collector.yaml", interval=1, health={"disabled": True}, maintenance=True)
    process = start_collector(nats_server, tmp_path, config)
    try:
        resource = wire.decode(wire.ResourceReport, (await resources.next_msg(timeout=30)).data)
        assert resource.ready is False and resource.health_reporting is False
        await asyncio.sleep(2.5)
        with pytest.raises(nats.errors.TimeoutError):
            await reports.next_msg(timeout=0.5)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(20)
