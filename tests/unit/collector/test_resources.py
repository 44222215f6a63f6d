"""The resource report's GPU list (COL-11): the PCI bus from sysfs merged with what the driver
reads (uuid, model, memoryBytes), matched by normalised bus id."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthplane.contracts import wire
from healthplane_collector.agent import (
    Collector,
    HostSources,
    Settings,
    _resources_changed,
    build_resource_report,
)
from healthplane_collector.inventory import Inventory
from healthplane_collector.probe import read_inventory
from healthplane_collector.resources import merge_gpus
from tests.unit.collector.test_inventory import machine, pci_device

FIXTURES = Path(__file__).parents[2] / "fixtures" / "collector" / "nvidia_smi"
NOW = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
MIB = 1 << 20
H100 = "NVIDIA H100 80GB HBM3"
H100_BYTES = 81559 * MIB


def on_bus(bus_id: str, index: int = 0, vendor: str = "nvidia") -> wire.ResourceDevice:
    return wire.ResourceDevice(kind="gpu", vendor=vendor, index=index, pci_bus_id=bus_id)  # type: ignore[arg-type]


def read(bus_id: str, index: int = 0, uuid: str | None = None, name: str | None = H100,
         memory_bytes: int | None = H100_BYTES) -> wire.GpuDevice:
    return wire.GpuDevice(index=index, pci_bus_id=bus_id, uuid=uuid or f"GPU-{bus_id}", name=name,
                          memory_bytes=memory_bytes, ecc=wire.GpuEcc(status="ok"), throttle=wire.GpuThrottle())


def described(bus_id: str, index: int = 0, uuid: str | None = None, model: str | None = H100,
              memory_bytes: int | None = H100_BYTES, vendor: str = "nvidia") -> wire.ResourceDevice:
    return wire.ResourceDevice(kind="gpu", vendor=vendor, index=index, pci_bus_id=bus_id,  # type: ignore[arg-type]
                               uuid=uuid or f"GPU-{bus_id}", model=model, memory_bytes=memory_bytes)


# ---------------------------------------------------------------------------- the merge


@pytest.mark.parametrize(
    ("case", "bus", "driver", "expected"),
    [
        ("every GPU read", [on_bus("0000:1b:00.0", 0), on_bus("0000:bb:00.0", 1)],
         [read("0000:1b:00.0", 0), read("0000:bb:00.0", 1)],
         (described("0000:1b:00.0", 0), described("0000:bb:00.0", 1))),
        ("NVML's 8-digit upper-case domain matches sysfs", [on_bus("0000:3b:00.0")],
         [read("00000000:3B:00.0", uuid="GPU-x")],
         (described("0000:3b:00.0", uuid="GPU-x"),)),
        ("one the driver cannot read is listed bare", [on_bus("0000:1b:00.0", 0), on_bus("0000:bb:00.0", 1)],
         [read("0000:1b:00.0", 0)],
         (described("0000:1b:00.0", 0), on_bus("0000:bb:00.0", 1))),
        ("no driver: the PCI list as it is", [on_bus("0000:1b:00.0", 0), on_bus("0000:bb:00.0", 1)], [],
         (on_bus("0000:1b:00.0", 0), on_bus("0000:bb:00.0", 1))),
        ("only the driver sees it: listed, as NVIDIA", [], [read("0000:3b:00.0")],
         (described("0000:3b:00.0"),)),
        ("a driver-only GPU takes its place in bus order", [on_bus("0000:1b:00.0", 0), on_bus("0000:bb:00.0", 1)],
         [read("0000:3b:00.0", 1)],
         (on_bus("0000:1b:00.0", 0), described("0000:3b:00.0", 1), on_bus("0000:bb:00.0", 2))),
        ("AMD keeps its own index and no details",
         [on_bus("0000:03:00.0", 0, "amd"), on_bus("0000:1b:00.0", 0), on_bus("0000:c1:00.0", 1, "amd")],
         [read("0000:1b:00.0")],
         (on_bus("0000:03:00.0", 0, "amd"), described("0000:1b:00.0", 0), on_bus("0000:c1:00.0", 1, "amd"))),
        ("a field the driver did not read stays null", [on_bus("0000:1b:00.0")],
         [read("0000:1b:00.0", name=None, memory_bytes=None)],
         (described("0000:1b:00.0", model=None, memory_bytes=None),)),
        ("an unparseable driver address is neither matched nor listed", [on_bus("0000:1b:00.0")],
         [read("the bus")], (on_bus("0000:1b:00.0"),)),
        ("a bus id listed twice by the driver: the first reading", [on_bus("0000:1b:00.0")],
         [read("0000:1b:00.0", uuid="GPU-first"), read("00000000:1B:00.0", uuid="GPU-second")],
         (described("0000:1b:00.0", uuid="GPU-first"),)),
    ],
)
def test_merge_COL_11(case: str, bus: list[wire.ResourceDevice], driver: list[wire.GpuDevice],
                      expected: tuple[wire.ResourceDevice, ...]) -> None:
    assert merge_gpus(bus, driver) == expected, case


BUS_IDS = st.builds(lambda domain, bus, dev, fn: f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}",
                    st.integers(0, 1), st.integers(0, 0xFF), st.integers(0, 0x1F), st.integers(0, 7))


def sysfs_list(bus_ids: set[str], amd: set[str]) -> list[wire.ResourceDevice]:
    """What the inventory would list: per-vendor index in bus order."""
    counts = {"nvidia": 0, "amd": 0}
    listed = []
    for bus_id in sorted(bus_ids):
        vendor = "amd" if bus_id in amd else "nvidia"
        listed.append(on_bus(bus_id, counts[vendor], vendor))
        counts[vendor] += 1
    return listed


def driver_form(bus_id: str) -> str:
    """NVML's spelling of a sysfs address."""
    return "0000" + bus_id.upper()


@given(st.sets(BUS_IDS, max_size=10), st.sets(BUS_IDS, max_size=10), st.data())
def test_merge_properties_COL_11(bus_ids: set[str], driver_ids: set[str], data: st.DataObject) -> None:
    """COL-11: every GPU either side lists appears once, in bus order, indexed per vendor from
    0; it carries the driver's details exactly when the driver read its bus id."""
    amd = data.draw(st.sets(st.sampled_from(sorted(bus_ids)))) if bus_ids else set()
    driver = [read(driver_form(b), i, uuid=f"GPU-{b}") for i, b in enumerate(sorted(driver_ids))]

    merged = merge_gpus(sysfs_list(bus_ids, amd), driver)

    assert [d.pci_bus_id for d in merged] == sorted(bus_ids | driver_ids)
    for vendor in ("nvidia", "amd"):
        assert [d.index for d in merged if d.vendor == vendor] == list(range(sum(d.vendor == vendor for d in merged)))
    for device in merged:
        seen = device.pci_bus_id in driver_ids
        assert (device.uuid, device.model, device.memory_bytes) == (
            (f"GPU-{device.pci_bus_id}", H100, H100_BYTES) if seen else (None, None, None))
        assert device.vendor == ("amd" if device.pci_bus_id in amd else "nvidia")
    assert merge_gpus(merged, driver) == merged  # merging again changes nothing
    if not driver_ids:
        assert merged == tuple(sysfs_list(bus_ids, amd))


# ---------------------------------------------------------------------------- the report


def inventory_of(gpus: list[wire.ResourceDevice]) -> Inventory:
    return Inventory(hostname="n1", cores=4, memory_bytes=1 << 34, boot_id=None, gpus=tuple(gpus))


def test_resource_report_json_names_the_gpus_COL_11() -> None:
    inventory = inventory_of([on_bus("0000:1b:00.0", 0), on_bus("0000:bb:00.0", 1)])
    gpu = wire.GpuSignal(status="ok", source="nvml", devices=[read("00000000:1B:00.0", uuid="GPU-4a1e")])

    report = build_resource_report(Settings(node_id="n1"), inventory, True, NOW, gpu)

    devices = json.loads(wire.encode(report))["devices"]
    assert devices == [
        {"kind": "gpu", "vendor": "nvidia", "index": 0, "pciBusId": "0000:1b:00.0", "uuid": "GPU-4a1e",
         "model": H100, "memoryBytes": H100_BYTES, "fabric": None},  # DOM-1: no NVLink fabric told
        {"kind": "gpu", "vendor": "nvidia", "index": 1, "pciBusId": "0000:bb:00.0", "uuid": None,
         "model": None, "memoryBytes": None, "fabric": None},
    ]
    assert build_resource_report(Settings(node_id="n1"), inventory, True, NOW).devices == [
        on_bus("0000:1b:00.0", 0), on_bus("0000:bb:00.0", 1)]  # no GPU reading yet


@pytest.mark.parametrize(
    ("what", "after"),
    [
        ("model", read("0000:1b:00.0", name="NVIDIA H200")),
        ("uuid (card replaced)", read("0000:1b:00.0", uuid="GPU-new-card")),
        ("memory", read("0000:1b:00.0", memory_bytes=40 * 1024 * MIB)),
    ],
)
def test_a_changed_gpu_detail_is_a_changed_resource_report_COL_11(what: str, after: wire.GpuDevice) -> None:
    inventory = inventory_of([on_bus("0000:1b:00.0")])
    settings = Settings(node_id="n1")
    before = build_resource_report(settings, inventory, True, NOW,
                                   wire.GpuSignal(status="ok", devices=[read("0000:1b:00.0")]))
    same = build_resource_report(settings, inventory, True, datetime.now(UTC),
                                 wire.GpuSignal(status="ok", devices=[read("0000:1b:00.0")]))
    changed = build_resource_report(settings, inventory, True, NOW, wire.GpuSignal(status="ok", devices=[after]))

    assert not _resources_changed(before, same)
    assert _resources_changed(before, changed), what
    lost = build_resource_report(settings, inventory, True, NOW, wire.GpuSignal(status="failed", reason="GPU is lost"))
    assert _resources_changed(before, lost)  # the driver no longer reads it: it is listed bare


# ---------------------------------------------------------------------------- on a fixture tree


def smi_log(*names: str) -> str:
    """One ``nvidia-smi -q -x`` log holding the first ``<gpu>`` of each fixture capture."""
    root = ET.fromstring((FIXTURES / names[0]).read_text())
    for gpu in root.findall("gpu")[1:]:
        root.remove(gpu)
    for name in names[1:]:
        gpu = ET.fromstring((FIXTURES / name).read_text()).find("gpu")
        assert gpu is not None
        root.append(gpu)
    return ET.tostring(root, encoding="unicode")


def fake_nvidia_smi(bin_dir: Path, xml_file: Path) -> Path:
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text(f'#!/bin/sh\n[ "$*" = "-q -x" ] || exit 2\n/bin/cat "{xml_file}"\n')
    script.chmod(0o755)
    return script


async def test_host_resource_report_carries_what_nvidia_smi_reads_COL_11(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """COL-11: on a fixture tree with two NVIDIA GPUs on the bus and nvidia-smi reading one
    (the A100 capture), that one carries uuid, model and memoryBytes; the other is listed bare."""
    root = machine(tmp_path / "root")
    pci_device(root, "0000:01:00.0", "0x10de", "0x030200")  # the A100 the capture reads
    pci_device(root, "0000:41:00.0", "0x10de", "0x030200")  # on the bus, not read by the driver
    xml = tmp_path / "smi.xml"
    xml.write_text(smi_log("a100_535_mig.xml"))
    fake_nvidia_smi(tmp_path / "bin", xml)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    collector = Collector(Settings(node_id="n1", root=root, gpu_source="nvidia-smi"),
                          HostSources(Settings(node_id="n1", root=root, gpu_source="nvidia-smi")), None)

    collector.refresh_inventory()
    await collector.probe(["gpu"])
    report = collector.resource_report(True, NOW)

    assert report is not None and collector.last["gpu"].status == "ok"
    assert report.devices == [
        wire.ResourceDevice(kind="gpu", vendor="nvidia", index=0, pci_bus_id="0000:01:00.0",
                            uuid="GPU-513536b6-7d19-9063-b049-1e69664bb298", model="NVIDIA A100-SXM4-80GB",
                            memory_bytes=81920 * MIB),
        wire.ResourceDevice(kind="gpu", vendor="nvidia", index=1, pci_bus_id="0000:41:00.0"),
    ]
    assert read_inventory(root).gpus == tuple(msgspec.structs.replace(d, uuid=None, model=None, memory_bytes=None)
                                              for d in report.devices)
