"""`healthplane collector --once -o json` on this machine: every signal's status is honest
(COL-4): unavailable only where the machine lacks the hardware or tool, never "ok" with
nothing behind it. And the collector's resource report on a fixture tree (COL-11)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.stack.natsserver import NatsServer
from tests.support.live import live
from tests.support.secure import env_for
from tests.unit.collector.test_inventory import machine, pci_device

FIXTURES = Path(__file__).parents[1] / "fixtures" / "collector" / "nvidia_smi"


def test_once_on_this_machine_is_honest(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "healthplane.cli", "collector", "--once", "-o", "json",
                             "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    signals = report["signals"]
    assert set(signals) == {"edac", "smart", "ioerr", "kmsg", "mounts", "gpu"}
    for name, signal in signals.items():
        assert signal["status"] in ("ok", "unavailable", "failed"), name
        if signal["status"] != "ok":
            assert signal["reason"], f"{name} is {signal['status']} without saying why"

    edac_root = Path("/sys/devices/system/edac/mc")
    has_edac = edac_root.is_dir() and any(re.fullmatch(r"mc\d+", p.name) for p in edac_root.iterdir())
    assert (signals["edac"]["status"] == "unavailable") == (not has_edac)
    if shutil.which("smartctl") is None:
        assert signals["smart"]["status"] == "unavailable" and "smartctl" in signals["smart"]["reason"]
    if shutil.which("nvidia-smi") is None and not Path("/proc/driver/nvidia").exists():
        assert signals["gpu"]["status"] == "unavailable"
    if not Path("/dev/kmsg").exists():
        assert signals["kmsg"]["status"] == "unavailable"
    else:
        assert signals["kmsg"]["backlogSkipped"] is False  # --once reads the whole buffer
    assert report["trigger"] == "start" and report["intervalSeconds"] == 30


@pytest.mark.nats
async def test_resource_report_names_the_gpus_the_driver_reads_COL_11(
        nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> None:
    """COL-11: the collector as a process on a fixture tree with two NVIDIA GPUs on the PCI bus
    and nvidia-smi printing the A100 capture (FORMATS §8) for one of them. Its resource report
    gives that one its uuid, model and memoryBytes and lists the other without them. With
    ``--root`` a fixture tree, udev is not watched: one log line says so, the agent carries on."""
    root = machine(tmp_path / "root")
    pci_device(root, "0000:01:00.0", "0x10de", "0x030200")  # the A100 nvidia-smi reads
    pci_device(root, "0000:41:00.0", "0x10de", "0x030200")  # on the bus, unseen by the driver
    (tmp_path / "bin").mkdir()
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n/bin/cat {FIXTURES / 'a100_535_mig.xml'}\n")
    smi.chmod(0o755)
    config = tmp_path / "collector.yaml"
    config.write_text(json.dumps({"config": {"node-id": "gpu-node-7", "cluster": "lab",
                                             "health": {"report-interval-seconds": 3600}}}))
    resources = await live(js, subjects.resource("lab", "gpu-node-7"))
    log = tmp_path / "collector.log"
    with log.open("ab") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "healthplane.cli", "collector", "--root", str(root), "--state-dir",
             str(tmp_path / "state"), "--gpu-source", "nvidia-smi", "--config", str(config)],
            env={**env_for(nats_server, "collector", "lab/gpu-node-7"),
                 "PATH": str(tmp_path / "bin")},  # nvidia-smi only: no smartctl
            stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        starting = wire.decode(wire.ResourceReport, (await resources.next_msg(timeout=30)).data)
        ready = wire.decode(wire.ResourceReport, (await resources.next_msg(timeout=30)).data)
    finally:
        process.terminate()  # SIGTERM
        process.wait(20)

    assert process.returncode == 0
    assert (starting.ready, ready.ready) == (False, True)
    for report in (starting, ready):
        seen, unseen = (wire.to_builtins(d) for d in report.devices)
        assert seen == {"kind": "gpu", "vendor": "nvidia", "index": 0, "pciBusId": "0000:01:00.0",
                        "uuid": "GPU-513536b6-7d19-9063-b049-1e69664bb298", "model": "NVIDIA A100-SXM4-80GB",
                        "memoryBytes": 81920 * 1024 * 1024, "fabric": None}  # nvidia-smi tells no fabric (DOM-1)
        assert unseen == {"kind": "gpu", "vendor": "nvidia", "index": 1, "pciBusId": "0000:41:00.0",
                          "uuid": None, "model": None, "memoryBytes": None, "fabric": None}
    udev_lines = [json.loads(line) for line in log.read_text().splitlines() if "udev" in line]
    assert [line["event"] for line in udev_lines] == [
        "udev unavailable; devices added or removed are seen at the next cycle"]
    assert str(root) in udev_lines[0]["reason"]
