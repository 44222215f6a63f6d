"""SEC-11: the collector cuts its own lists and texts to the wire's bounds before it publishes,
so a kernel-log storm or an enormous machine never makes the whole report undecodable (a report
past a bound is refused whole by every fold): the worst and newest entries are kept, and the cut
is logged once per field."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from healthplane.contracts import wire
from healthplane_collector.agent import Collector, Settings, build_resource_report, within_bounds
from healthplane_collector.inventory import Inventory

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
OVER = 10  # entries past each bound


class Storm:
    """A machine past every bound at once: too many controllers, disks, mounts, GPUs, Xids, and
    a reason longer than any text may be. The failing disk, the erroring controller and the
    newest Xids come last, where a plain cut would lose them."""

    in_memory = True

    async def read(self, name: str) -> Any:
        if name == "edac":
            quiet = [wire.EdacController(name=f"mc{i}", ce=0, ue=0) for i in range(wire.MEMORY_CONTROLLERS_MAX + OVER)]
            return wire.EdacSignal(status="ok", controllers=[*quiet, wire.EdacController(name="mc-bad", ce=0, ue=1)])
        if name == "smart":
            disks = [wire.SmartDevice(name=f"/dev/sd{i}", passed=True) for i in range(wire.DISKS_MAX + OVER)]
            return wire.SmartSignal(status="ok", devices=[*disks, wire.SmartDevice(name="/dev/failing", passed=False)])
        if name == "ioerr":
            return wire.IoerrSignal(status="failed", reason="x" * (wire.TEXT_MAX * 2))
        if name == "mounts":
            return wire.MountsSignal(status="ok", read_only=[
                wire.ReadOnlyMount(mount_point=f"/m/{i}", device="/dev/sdb1", fs_type="ext4")
                for i in range(wire.MOUNTS_MAX + OVER)])
        if name == "gpu":
            return wire.GpuSignal(status="ok", devices=[
                wire.GpuDevice(index=i, pci_bus_id=f"0000:{i:02x}:00.0", ecc=wire.GpuEcc(status="unavailable"),
                               throttle=wire.GpuThrottle()) for i in range(wire.GPUS_MAX + OVER)])
        raise KeyError(name)

    def inventory(self) -> Inventory:
        raise NotImplementedError


class StormKmsg:
    """Xids on made-up addresses, oldest first: the newest XID_ENTRIES_MAX must be kept."""

    def signal(self, gpus_by_pci: Mapping[str, int]) -> wire.KmsgSignal:
        xid = [wire.XidEntry(pci_bus_id=f"{i:012x}", gpu_index=None, xid=13, count=1,
                             last_at=T0 + timedelta(seconds=i), last_message="NVRM: Xid 13")
               for i in range(wire.XID_ENTRIES_MAX + OVER)]
        return wire.KmsgSignal(status="ok", xid=xid)


class Log:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.warnings.append((event, fields))


async def test_sec11_a_report_past_every_bound_is_cut_to_fit_keeping_the_worst_and_newest() -> None:
    """SEC-11: what the collector publishes decodes, whatever the machine and its kernel log."""
    log = Log()
    collector = Collector(Settings(node_id="n1", cluster="c"), Storm(), StormKmsg(), log)
    report = await collector.collect("scheduled", T0)
    decoded = wire.decode(wire.HealthReport, wire.encode(report))  # not refused: every list fits
    signals = decoded.signals
    assert len(signals.edac.controllers) == wire.MEMORY_CONTROLLERS_MAX
    assert any(c.name == "mc-bad" for c in signals.edac.controllers)  # the erroring one kept
    assert len(signals.smart.devices) == wire.DISKS_MAX
    assert any(d.name == "/dev/failing" for d in signals.smart.devices)  # the failing disk kept
    assert [e.pci_bus_id for e in signals.kmsg.xid] == [f"{i:012x}" for i in range(OVER, wire.XID_ENTRIES_MAX + OVER)]
    assert len(signals.mounts.read_only) == wire.MOUNTS_MAX
    assert len(signals.gpu.devices) == wire.GPUS_MAX
    reason = signals.ioerr.reason or ""
    assert len(reason) <= wire.TEXT_MAX and reason.endswith("more characters)")
    # Logged once, naming each field and how much went...
    assert len(log.warnings) == 1
    event, fields = log.warnings[0]
    assert "SEC-11" in event
    assert fields["cut"] == {"edac.controllers": OVER + 1, "smart.devices": OVER + 1, "kmsg.xid": OVER,
                             "mounts.readOnly": OVER, "gpu.devices": OVER,
                             "ioerr.reason": wire.TEXT_MAX * 2 - len(reason.split(" ... (")[0])}
    # ...not on every report.
    await collector.collect("scheduled", T0)
    assert len(log.warnings) == 1


def test_sec11_a_signal_within_every_bound_is_published_as_is() -> None:
    """SEC-11: the common signal is not copied (the simulator reports for 100,000 nodes)."""
    signal = wire.KmsgSignal(status="ok", xid=[wire.XidEntry(pci_bus_id="0000:18:00.0", gpu_index=0, xid=79, count=1,
                                                             last_message="NVRM: Xid 79")])
    cut: dict[str, int] = {}
    assert within_bounds(signal, cut) is signal and cut == {}


def test_sec11_the_resource_report_is_cut_to_its_bounds_too() -> None:
    """SEC-11: GPUs past GPUS_MAX and annotations past ANNOTATIONS_MAX are cut, so the resource
    report (the node's registration) is never refused whole."""
    gpus = tuple(wire.ResourceDevice(kind="gpu", vendor="nvidia", index=i, pci_bus_id=f"{i:04x}:18:00.0")
                 for i in range(wire.GPUS_MAX + OVER))
    inventory = Inventory(hostname="n1", cores=8, memory_bytes=1 << 30, boot_id=None, gpus=gpus)
    settings = Settings(node_id="n1", annotations={f"a{i:05d}": "v" for i in range(wire.ANNOTATIONS_MAX + OVER)})
    resources = build_resource_report(settings, inventory, True, T0)
    decoded = wire.decode(wire.ResourceReport, wire.encode(resources))
    assert len(decoded.devices) == wire.GPUS_MAX and len(decoded.annotations) == wire.ANNOTATIONS_MAX
