"""Hotplug through udev (COL-11): a block or PCI device added or removed sends a resource report
at once and re-probes that device. The decision is pure and tested as a table; the udev side
uses devices libudev builds from this machine's own sysfs; the agent publishes to a real
nats-server."""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats.errors
import pytest
import pyudev
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane_collector import udev
from healthplane_collector.agent import Collector, HostSources, Hotplug, Settings, run_agent
from healthplane_collector.hotplug import DeviceEvent, Reprobe, reprobe_for
from tests.support.live import live
from tests.support.log import Log
from tests.unit.collector.test_inventory import machine, pci_device
from tests.unit.collector.test_resources import MIB, fake_nvidia_smi, smi_log

GPU = frozenset({"gpu"})
DISK = frozenset({"smart", "ioerr"})
NOTHING: frozenset[str] = frozenset()


def pci(action: str, pci_id: str | None = "10DE:2330", slot: str = "0000:3b:00.0") -> DeviceEvent:
    return DeviceEvent(action=action, subsystem="pci", sys_name=slot,
                       device_path=f"/devices/pci0000:3a/0000:3a:00.0/{slot}", pci_id=pci_id)


def block(action: str, name: str = "nvme1n1", device_type: str = "disk",
          path: str = "/devices/pci0000:00/0000:00:1d.0/nvme/nvme1/nvme1n1") -> DeviceEvent:
    return DeviceEvent(action=action, subsystem="block", sys_name=name, device_path=path, device_type=device_type)


@pytest.mark.parametrize(
    ("event", "signals"),
    [
        (pci("add"), GPU),
        (pci("remove"), GPU),
        (pci("bind"), GPU),  # the driver can read a GPU only once bound to it
        (pci("unbind"), GPU),
        (pci("add", pci_id="10de:2330"), GPU),
        (pci("add", pci_id="1002:74A1"), NOTHING),  # AMD: inventory-only (COL-3)
        (pci("add", pci_id="15B3:1021"), NOTHING),  # a NIC: the inventory, no signal
        (pci("add", pci_id=None), NOTHING),
        (pci("change"), None),
        (pci("move"), None),
        (block("add"), DISK),
        (block("remove", name="sdb", path="/devices/pci0000:00/0000:00:17.0/ata3/host2/target2:0:0/2:0:0:0/block/sdb"), DISK),
        (block("add", name="nvme1n1p1", device_type="partition"), None),  # comes with its disk
        (block("change"), None),
        (block("add", name="loop7", path="/devices/virtual/block/loop7"), None),
        (block("add", name="dm-3", path="/devices/virtual/block/dm-3"), None),
        (DeviceEvent(action="add", subsystem="usb", sys_name="1-1", device_path="/devices/usb1/1-1"), None),
        (DeviceEvent(action=None, subsystem="pci", sys_name="0000:3b:00.0", device_path="/devices/x"), None),
    ],
)
def test_what_a_udev_event_asks_of_the_agent_COL_11(event: DeviceEvent, signals: frozenset[str] | None) -> None:
    reprobe = reprobe_for(event)
    if signals is None:
        assert reprobe is None
    else:
        assert reprobe == Reprobe(signals, (f"{event.action} {event.subsystem} {event.sys_name}",))


def test_events_that_arrive_together_are_one_reprobe_COL_11() -> None:
    hotplug = Hotplug()
    for event in (pci("unbind"), pci("remove"), block("add")):
        reprobe = reprobe_for(event)
        assert reprobe is not None
        hotplug.add(reprobe)
    assert hotplug.pending.is_set()
    assert hotplug.take() == Reprobe(GPU | DISK, ("unbind pci 0000:3b:00.0", "remove pci 0000:3b:00.0",
                                                  "add block nvme1n1"))
    assert not hotplug.pending.is_set() and hotplug.take() is None


# ---------------------------------------------------------------------------- the udev side


@pytest.fixture
def context() -> Any:
    # libudev comes with the machine (pyudev's own requirement): without it this fails, loudly.
    return pyudev.Context()


def local(kind: str) -> Path:
    """A device of this machine in /sys of the given subsystem, resolved."""
    base = Path("/sys/bus/pci/devices") if kind == "pci" else Path("/sys/class/block")
    for entry in sorted(base.iterdir()) if base.is_dir() else ():
        path = entry.resolve()
        if kind == "pci" or ((path / "device").exists() and "/virtual/" not in str(path)):
            return path
    raise AssertionError(f"no {kind} device in /sys on this machine: the udev tests need one real device")


class Received:
    """A device of this machine as a monitor hands it over. libudev sets ``action`` only on
    devices it receives from udev (and ``Devices.from_environment`` rewrites the process
    environment in place), so the stand-in monitor attaches the action it announces to the
    real ``pyudev.Device``; everything else is read from this machine's sysfs."""

    def __init__(self, device: Any, action: str, **properties: str) -> None:
        self.device, self.action = device, action
        self.properties = {**device.properties, **properties}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.device, name)


def udev_event(context: Any, sys_path: Path, action: str, **properties: str) -> Received:
    return Received(pyudev.Devices.from_sys_path(context, str(sys_path)), action, **properties)


def test_a_device_read_from_sysfs_is_not_an_event_COL_11(context: Any) -> None:
    """A device found in sysfs, not received from a monitor, has no action: nothing to do."""
    device = pyudev.Devices.from_sys_path(context, str(local("pci")))
    event = udev.event_of(device)
    assert (event.action, event.subsystem) == (None, "pci")
    assert event.pci_id == device.properties.get("PCI_ID")
    assert reprobe_for(event) is None


def test_events_on_this_machines_devices_COL_11(context: Any) -> None:
    """A PCI device and a disk of this machine, removed and added: what the agent re-reads."""
    card = local("pci")
    removed = udev.event_of(udev_event(context, card, "remove"))
    assert (removed.action, removed.subsystem, removed.sys_name) == ("remove", "pci", card.name)
    assert removed.device_path == str(card).removeprefix("/sys")
    uevent = dict(line.split("=", 1) for line in (card / "uevent").read_text().splitlines())
    assert removed.pci_id == uevent["PCI_ID"]  # what the kernel says of the card
    expected = GPU if (removed.pci_id or "").lower().startswith("10de:") else NOTHING
    assert reprobe_for(removed) == Reprobe(expected, (f"remove pci {card.name}",))

    disk = local("block")
    added = udev.event_of(udev_event(context, disk, "add"))
    assert (added.subsystem, added.device_type) == ("block", "disk")
    assert reprobe_for(added) == Reprobe(DISK, (f"add block {disk.name}",))


class QueuedMonitor:
    """Stands in for ``pyudev.Monitor`` on the udev side only: it hands over devices that
    libudev built, through a real descriptor the event loop watches."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        self._queue: deque[Any] = deque()
        self.error: OSError | None = None

    def fileno(self) -> int:
        return self._read

    def push(self, *devices: Any) -> None:
        self._queue.extend(devices)
        os.write(self._write, b"!" * len(devices))

    def poll(self, timeout: float | None = None) -> Any:
        if self.error is not None:
            raise self.error
        try:
            os.read(self._read, 1)
        except BlockingIOError:
            return None
        return self._queue.popleft()

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


@pytest.fixture
def monitor() -> Iterator[QueuedMonitor]:
    queued = QueuedMonitor()
    yield queued
    queued.close()


async def test_watcher_drains_every_queued_event_COL_11(context: Any, monitor: QueuedMonitor) -> None:
    reprobes: list[Reprobe] = []
    got = asyncio.Event()
    watcher = udev.UdevWatcher(monitor, lambda r: (reprobes.append(r), got.set()), Log())
    watcher.attach(asyncio.get_running_loop())
    disk = local("block")
    monitor.push(udev_event(context, disk, "change"),  # ignored
                 udev_event(context, disk, "add"))
    async with asyncio.timeout(5):
        await got.wait()
    await asyncio.sleep(0.05)
    watcher.detach()
    assert reprobes == [Reprobe(DISK, (f"add block {disk.name}",))]


async def test_a_failing_monitor_is_dropped_with_a_warning_COL_11(monitor: QueuedMonitor) -> None:
    log = Log()
    watcher = udev.UdevWatcher(monitor, lambda r: None, log)
    watcher.attach(asyncio.get_running_loop())
    monitor.error = OSError(105, "No buffer space available")
    monitor.push(object())
    await asyncio.sleep(0.1)
    assert [line[:2] for line in log.lines] == [("warning", "udev monitor failed; hotplug seen at the next cycle")]
    watcher.detach()  # already detached: harmless


@pytest.mark.parametrize("where", ["fixture root", "no udev daemon"])
async def test_without_udev_the_agent_logs_one_line_and_carries_on_COL_11(tmp_path: Path, where: str) -> None:
    log = Log()
    root, control = (tmp_path, udev.UDEV_CONTROL) if where == "fixture root" else (Path("/"), tmp_path / "control")

    assert udev.watch(root, lambda r: None, log, control) is None

    ((level, message, fields),) = log.lines
    assert (level, message) == ("info", "udev unavailable; devices added or removed are seen at the next cycle")
    assert (str(tmp_path) if where == "fixture root" else "no udev daemon") in fields["reason"]


async def test_this_host_is_watched_when_it_runs_udev_COL_11() -> None:
    log = Log()
    watcher = udev.watch(Path("/"), lambda r: None, log)
    if udev.UDEV_CONTROL.exists():
        assert watcher is not None and log.lines[-1][1] == "watching udev for devices added or removed"
        watcher.detach()
    else:
        assert watcher is None and "does not exist" in log.lines[-1][2]["reason"]


# ---------------------------------------------------------------------------- in the agent loop


@pytest.mark.nats
async def test_a_gpu_plugged_in_sends_a_resource_report_at_once_COL_11(
        js: JetStreamContext, context: Any, monitor: QueuedMonitor, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """COL-11: the agent runs on a fixture tree with the A100 on the bus and an hour between
    reports; a T4 appears in sysfs and in nvidia-smi, udev says a PCI device was added, and a
    resource report naming the T4 is acked by JetStream within a second, the GPU re-probed."""
    root = machine(tmp_path / "root")
    pci_device(root, "0000:01:00.0", "0x10de", "0x030200")
    xml = tmp_path / "smi.xml"
    xml.write_text(smi_log("a100_535_mig.xml"))
    fake_nvidia_smi(tmp_path / "bin", xml)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no smartctl: honest "unavailable"
    settings = Settings(node_id="gpu-node-7", cluster="lab", root=root, gpu_source="nvidia-smi", interval_s=3600)
    collector = Collector(settings, HostSources(settings), None)
    resources = await live(js, subjects.resource("lab", "gpu-node-7"))
    reports = await live(js, subjects.report("lab", "gpu-node-7"))

    async def publish(subject: str, payload: bytes) -> None:
        await js.publish(subject, payload, timeout=5)

    hotplug, stopping = Hotplug(), asyncio.Event()
    watcher = udev.UdevWatcher(monitor, hotplug.add, Log())
    watcher.attach(asyncio.get_running_loop())
    agent = asyncio.create_task(run_agent(collector, publish, stopping, asyncio.Event(), Log(), hotplug))
    try:
        starting = wire.decode(wire.ResourceReport, (await resources.next_msg(timeout=10)).data)
        ready = wire.decode(wire.ResourceReport, (await resources.next_msg(timeout=10)).data)
        assert (starting.ready, ready.ready) == (False, True)
        assert [d.model for d in starting.devices] == [d.model for d in ready.devices] == ["NVIDIA A100-SXM4-80GB"]
        await reports.next_msg(timeout=10)

        pci_device(root, "0000:00:1e.0", "0x10de", "0x030200")  # the T4 capture's address
        xml.write_text(smi_log("a100_535_mig.xml", "t4_515_throttle_reasons.xml"))
        card = udev_event(context, local("pci"), "add", PCI_ID="10DE:1EB8")  # a Tesla T4
        sent = time.monotonic()
        monitor.push(card)
        plugged = wire.decode(wire.ResourceReport, (await resources.next_msg(timeout=5)).data)
        elapsed = time.monotonic() - sent
    finally:
        stopping.set()
        await agent
        watcher.detach()

    assert elapsed < 1.0
    assert plugged.ready is True
    assert [(d.index, d.pci_bus_id, d.model, d.memory_bytes) for d in plugged.devices] == [
        (0, "0000:00:1e.0", "Tesla T4", 15360 * MIB),
        (1, "0000:01:00.0", "NVIDIA A100-SXM4-80GB", 81920 * MIB),
    ]
    assert plugged.devices[0].uuid == "GPU-d37e67a5-91dd-3774-a5cb-99096249601a"
    with pytest.raises(nats.errors.TimeoutError):
        await reports.next_msg(timeout=0.2)  # a resource report, not an early health report
