"""The node agent: collect every signal, build the reports, publish them.

Every signal is read concurrently and bounded by its timeout; a signal that raises or hangs
is reported ``failed`` with the reason and never stops the others (COL-4, COL-12). The
kernel ring buffer is read continuously; a machine check, hardware error record, EDAC UE or
Xid triggers an out-of-band report at once (COL-2), bursts coalesced within 100 ms. That
report refreshes the fast signals and reuses the last SMART reading: smartctl can take
seconds per disk and would delay the one report that must be quick; the next scheduled report
reads it again.

The resource report (COL-11) goes out at start (not ready), whenever it changes, and at once
when udev says a block or PCI device was added or removed (:class:`Hotplug`, fed by
``udev.py``): that re-reads the inventory and the device's signal first. Its GPUs are the PCI
list merged with the latest GPU signal (``resources.merge_gpus``).

``--slurm-health-check`` (SLU-6) runs one cycle of the same code (:func:`report_once`): the
scheduled health report and the resource report, on the same subjects, then exits; its kmsg
reader (:meth:`KmsgWatcher.catch_up`) carries cursor and counts from one run to the next.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, Protocol, TypeVar

import msgspec

from healthplane import __version__
from healthplane.contracts import subjects, wire
from healthplane.runtime.backoff import Backoff
from healthplane_collector import probe
from healthplane_collector.hotplug import Reprobe
from healthplane_collector.inventory import Inventory, InventoryError
from healthplane_collector.kmsg import KmsgTally, MalformedRecord, is_out_of_band, parse_record
from healthplane_collector.kmsg_reader import (
    CarriedTally,
    Cursor,
    KmsgSource,
    after,
    last_seq,
    load_cursor,
    load_tally,
    resume_point,
    save_cursor,
    save_tally,
)
from healthplane_collector.resources import merge_gpus

GpuSource = Literal["auto", "nvml", "nvidia-smi"]
SignalName = Literal["edac", "smart", "ioerr", "kmsg", "mounts", "gpu"]
SIGNAL_TYPES: Final[dict[str, type[Any]]] = {
    "edac": wire.EdacSignal, "smart": wire.SmartSignal, "ioerr": wire.IoerrSignal,
    "kmsg": wire.KmsgSignal, "mounts": wire.MountsSignal, "gpu": wire.GpuSignal,
}
OUT_OF_BAND_COALESCE_S: Final = 0.1
KMSG_BACKOFF_MAX_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class Settings:
    node_id: str
    cluster: str = "default"
    root: Path = Path("/")
    state_dir: Path = Path("/var/lib/healthplane/collector")
    gpu_source: GpuSource = "auto"
    interval_s: int = 30
    health_disabled: bool = False
    maintenance: bool = False
    definition: str | None = None
    provisioned: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)
    expected_read_only: tuple[str, ...] = ()
    smartctl_timeout_s: float = 10.0
    signal_timeout_s: float = 15.0


def failed(name: str, reason: str) -> Any:
    return SIGNAL_TYPES[name](status="failed", reason=reason)


async def bounded(name: str, read: Callable[[], Awaitable[Any]], timeout_s: float | None) -> Any:
    """One signal, whatever happens inside it: its reading, or ``failed`` with the reason.
    ``timeout_s=None`` is for sources that cannot hang (the simulator's memory)."""
    try:
        async with asyncio.timeout(timeout_s):  # no extra task per read, unlike wait_for
            return await read()
    except TimeoutError:
        return failed(name, f"timed out after {timeout_s:g}s")
    except Exception as exc:
        return failed(name, f"{type(exc).__name__}: {exc}")


def build_report(settings: Settings, hostname: str, signals: Mapping[str, Any], trigger: wire.ReportTrigger,
                 sent_at: datetime, boot_id: str | None, cut: dict[str, int] | None = None) -> wire.HealthReport:
    """The health report, its lists and texts cut to the wire's bounds (``within_bounds``;
    what was cut is added to ``cut``)."""
    cut = {} if cut is None else cut
    return wire.HealthReport(
        node_id=settings.node_id, cluster=settings.cluster, hostname=hostname, sent_at=sent_at,
        interval_seconds=settings.interval_s, trigger=trigger,
        signals=wire.Signals(**{name: within_bounds(signals[name], cut) for name in SIGNAL_TYPES}),
        boot_id=boot_id, agent_version=__version__,
    )


def build_resource_report(settings: Settings, inventory: Inventory, ready: bool, sent_at: datetime,
                          gpu: wire.GpuSignal | None = None,
                          remediation: wire.RemediationOutcome | None = None) -> wire.ResourceReport:
    """The resource report; its GPUs carry what ``gpu`` (the latest GPU signal) read of them,
    ``boot_id`` the inventory's and ``remediation`` the latest remediation outcome (REM-2)."""
    devices = _cut(list(merge_gpus(inventory.gpus, gpu.devices if gpu is not None else ())), wire.GPUS_MAX,
                   "resource.devices", {})
    annotations = dict(sorted(settings.annotations.items())[:wire.ANNOTATIONS_MAX]
                       if len(settings.annotations) > wire.ANNOTATIONS_MAX else settings.annotations)
    return wire.ResourceReport(
        node_id=settings.node_id, cluster=settings.cluster, hostname=inventory.hostname, sent_at=sent_at,
        ready=ready and not settings.maintenance, cores=inventory.cores, memory_bytes=inventory.memory_bytes,
        devices=devices, annotations=annotations, definition=settings.definition,
        provisioned=settings.provisioned, health_reporting=not settings.health_disabled,
        boot_id=inventory.boot_id, remediation=remediation,
    )


# ---------------------------------------------------------------------------- bounds (SEC-11)

T = TypeVar("T")
R = TypeVar("R", bound=msgspec.Struct)


def within_bounds(signal: R, cut: dict[str, int]) -> R:
    """``signal`` with every list and text the wire bounds (``wire.*_MAX``) cut to its bound, so
    that a kernel-log storm or a huge machine never makes the whole report undecodable: the
    worst and newest entries are kept, in their order; ``cut`` gains, per field, how many
    entries (or characters) went. The common signal, well within every bound, is returned as is."""
    fields: dict[str, Any] = {}
    reason = getattr(signal, "reason", None)
    if reason is not None and len(reason) > wire.TEXT_MAX:
        fields["reason"] = _text(reason, f"{_NAMES.get(type(signal), 'signal')}.reason", cut)
    match signal:
        case wire.EdacSignal(controllers=controllers):
            fields["controllers"] = _each(
                _cut(controllers, wire.MEMORY_CONTROLLERS_MAX, "edac.controllers", cut, lambda c: (-c.ue, -c.ce)),
                lambda c: _with(c, dimms=_cut(c.dimms, wire.DIMMS_MAX, "edac.controllers[].dimms", cut,
                                              lambda d: (-d.ue, -d.ce))))
        case wire.SmartSignal(devices=devices):
            fields["devices"] = _each(
                _cut(devices, wire.DISKS_MAX, "smart.devices", cut, _smart_worst_first),
                lambda d: d if d.error is None or len(d.error) <= wire.TEXT_MAX
                else _with(d, error=_text(d.error, "smart.devices[].error", cut)))
        case wire.IoerrSignal(devices=devices):
            fields["devices"] = _cut(devices, wire.DISKS_MAX, "ioerr.devices", cut, lambda d: -d.count)
        case wire.KmsgSignal(xid=xid, sxid=sxid, remount_read_only=remounts):
            fields["xid"] = _each(_cut(xid, wire.XID_ENTRIES_MAX, "kmsg.xid", cut, _newest_first),
                                  lambda e: _message_within(e, "kmsg.xid[].lastMessage", cut))
            fields["sxid"] = _each(_cut(sxid, wire.SXID_ENTRIES_MAX, "kmsg.sxid", cut, lambda e: -e.count),
                                   lambda e: _message_within(e, "kmsg.sxid[].lastMessage", cut))
            fields["remount_read_only"] = _each(_cut(remounts, wire.MOUNTS_MAX, "kmsg.remountReadOnly", cut),
                                                lambda e: _message_within(e, "kmsg.remountReadOnly[].lastMessage", cut))
        case wire.MountsSignal(read_only=read_only):
            fields["read_only"] = _cut(read_only, wire.MOUNTS_MAX, "mounts.readOnly", cut)
        case wire.GpuSignal(devices=devices):
            fields["devices"] = _cut(devices, wire.GPUS_MAX, "gpu.devices", cut)
    return _with(signal, **fields)


_NAMES: Final[dict[type[Any], str]] = {kind: name for name, kind in SIGNAL_TYPES.items()}
# Room at the end of a cut text for saying how much was cut.
_CUT_NOTE_CHARS: Final = 64


def _with(record: R, **fields: Any) -> R:
    """``record`` with ``fields`` replaced; ``record`` itself when none of them changed."""
    changed = {name: value for name, value in fields.items() if value is not getattr(record, name)}
    return msgspec.structs.replace(record, **changed) if changed else record


def _each(items: list[T], fix: Callable[[T], T]) -> list[T]:
    """``fix`` applied to every item; ``items`` itself when it changed none."""
    fixed = [fix(item) for item in items]
    return items if all(a is b for a, b in zip(fixed, items, strict=True)) else fixed


def _cut(items: list[T], bound: int, where: str, cut: dict[str, int],
         worst_first: Callable[[T], Any] | None = None) -> list[T]:
    """``items`` itself when within ``bound``; else the ``bound`` first by ``worst_first`` (or
    the first ``bound``), in their order."""
    if len(items) <= bound:
        return items
    cut[where] = cut.get(where, 0) + len(items) - bound
    if worst_first is None:
        return items[:bound]
    kept = sorted(sorted(range(len(items)), key=lambda i: worst_first(items[i]))[:bound])
    return [items[i] for i in kept]


def _text(text: str, where: str, cut: dict[str, int]) -> str:
    """``text`` cut to ``wire.TEXT_MAX`` characters, ending with how many more there were."""
    kept = wire.TEXT_MAX - _CUT_NOTE_CHARS
    cut[where] = cut.get(where, 0) + len(text) - kept
    return f"{text[:kept]} ... ({len(text) - kept} more characters)"


M = TypeVar("M", wire.XidEntry, wire.SxidEntry, wire.RemountReadOnly)


def _message_within(entry: M, where: str, cut: dict[str, int]) -> M:
    if len(entry.last_message) <= wire.TEXT_MAX:
        return entry
    return msgspec.structs.replace(entry, last_message=_text(entry.last_message, where, cut))


def _smart_worst_first(disk: wire.SmartDevice) -> int:
    if disk.passed is False or disk.critical_warning:
        return 0
    return 1 if disk.failing_now or disk.failed_in_past or disk.error else 2


def _newest_first(entry: wire.XidEntry) -> float:
    return -entry.last_at.timestamp() if entry.last_at is not None else 0.0


class Sources(Protocol):
    """Where the signals come from: the real machine under ``--root``, or a simulated node.
    ``in_memory`` sources cannot hang, so they are read in turn without timeouts."""

    in_memory: bool

    async def read(self, name: str) -> Any: ...
    def inventory(self) -> Inventory: ...


class HostSources:
    """This machine under ``--root``, read through ``probe``: file trees in a thread, probe
    processes under their timeouts."""

    in_memory = False

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def read(self, name: str) -> Any:
        root = self.settings.root
        if name == "edac":
            return await asyncio.to_thread(probe.read_edac, root)
        if name == "ioerr":
            return await asyncio.to_thread(probe.read_ioerr, root)
        if name == "mounts":
            return await asyncio.to_thread(probe.read_mounts, root, self.settings.expected_read_only)
        if name == "smart":
            return await probe.read_smart(None, self.settings.smartctl_timeout_s)
        if name == "gpu":
            return await self._gpu()
        raise KeyError(name)

    async def _gpu(self) -> wire.GpuSignal:
        source = self.settings.gpu_source
        if source in ("auto", "nvml"):
            try:
                return await asyncio.to_thread(probe.read_gpu_nvml)
            except probe.NvmlUnavailable as exc:
                if source == "nvml":
                    return wire.GpuSignal(status="unavailable", reason=exc.reason, source="nvml")
        return await probe.read_gpu_smi(None, self.settings.signal_timeout_s)

    def inventory(self) -> Inventory:
        return probe.read_inventory(self.settings.root)


class KmsgView(Protocol):
    """What a report needs of the ring buffer: the kmsg signal for the current GPU map."""

    def signal(self, gpus_by_pci: Mapping[str, int]) -> wire.KmsgSignal: ...


class KmsgWatcher:
    """The continuous ring-buffer reader behind the kmsg signal."""

    def __init__(self, path: Path, state_dir: Path, boot_id: str | None, log: Any = None,
                 on_out_of_band: Callable[[], None] | None = None) -> None:
        self.path, self.state_dir, self.boot_id, self.log = path, state_dir, boot_id, log
        self.tally = KmsgTally()
        self.backlog_skipped: bool | None = None
        self.failure: str | None = None
        self.unavailable: str | None = None
        self._source = KmsgSource(path)
        self._on_out_of_band = on_out_of_band
        self._resume_after: int | None = None
        self._last_seq: int | None = None

    def read_once(self) -> None:
        """``--once``: the whole current buffer, no cursor."""
        if not self.path.exists():
            self.unavailable = f"{self.path} does not exist"
            return
        try:
            self._source.open()
            self.backlog_skipped = False
            records, _ = self._source.read_available()
            self._fold(records)
        except OSError as exc:
            self.failure = f"cannot read {self.path}: {exc.strerror or exc}"
        finally:
            self._source.close()

    def catch_up(self) -> None:
        """``--slurm-health-check``: one read, as a periodic agent would have read the records
        that arrived since the last run. Where to start is the agent's (``resume_point``: no
        cursor skips the backlog, a cursor of this boot resumes after it, another boot's reads
        the whole buffer); the counts go on from the last run's when its tally goes with the
        cursor, so a steady trickle of corrected errors still reads as a climbing counter."""
        if not self.path.exists():
            self.unavailable = f"{self.path} does not exist"
            return
        try:
            self._source.open()
            records, _ = self._source.read_available()
        except OSError as exc:
            self.failure = f"cannot read {self.path}: {exc.strerror or exc}"
            return
        finally:
            self._source.close()
        saved = load_cursor(self.state_dir)
        where, seq = resume_point(saved, self.boot_id)
        skip_backlog = where == "end" and not self._source.is_fifo  # a FIFO cannot seek: read it all
        carried = load_tally(self.state_dir, saved) if where == "after" else None
        if carried is not None:
            self.tally, self.backlog_skipped = KmsgTally.from_state(carried.tally), carried.backlog_skipped
        else:
            self.backlog_skipped = skip_backlog
        self._fold([] if skip_backlog else after(records, seq))
        if self.boot_id is None:
            return  # as the agent: a cursor without its boot could not be trusted
        newest = last_seq(records)
        if where == "after" and seq is not None:
            newest = seq if newest is None else max(newest, seq)
        # An empty buffer still leaves a cursor: the next run reads what arrives in between.
        cursor = Cursor(self.boot_id, -1 if newest is None else newest)
        try:
            save_cursor(self.state_dir, cursor)
            save_tally(self.state_dir, CarriedTally(boot_id=cursor.boot_id, seq=cursor.seq,
                                                    backlog_skipped=self.backlog_skipped, tally=self.tally.state()))
        except OSError as exc:  # the next run would count these records again: say so, report anyway
            self.failure = f"cannot save the kmsg cursor in {self.state_dir}: {exc.strerror or exc}"

    def start(self) -> None:
        if not self.path.exists():
            self.unavailable = f"{self.path} does not exist"
            return
        self._source.open()
        where, seq = resume_point(load_cursor(self.state_dir), self.boot_id)
        if where == "end":
            self.backlog_skipped = self._source.seek_end()
        else:
            self.backlog_skipped = False
            self._resume_after = seq

    def poll(self, now: datetime) -> bool:
        """Read what is there; True when the source reached its end (FIFO writer gone)."""
        records, at_end = self._source.read_available()
        records = after(records, self._resume_after)
        self._fold(records, now)
        newest = last_seq(records)
        if newest is not None and self.boot_id is not None:
            self._last_seq = newest
            save_cursor(self.state_dir, Cursor(self.boot_id, newest))
        return at_end

    def _fold(self, records: list[bytes], now: datetime | None = None) -> None:
        at = now or datetime.now(UTC)
        out_of_band = False
        for raw in records:
            try:
                record = parse_record(raw)
            except MalformedRecord:
                self.tally.add_malformed()
                continue
            finding = self.tally.add(record, at)
            out_of_band = out_of_band or is_out_of_band(finding)
        if out_of_band and self._on_out_of_band is not None:
            self._on_out_of_band()

    async def run(self, stopping: asyncio.Event) -> None:
        """Poll the source until ``stopping``; a lost read → failed, backoff up to 60 s (COL-6)."""
        if self.unavailable:
            return
        backoff = Backoff(1.0, KMSG_BACKOFF_MAX_S)
        loop = asyncio.get_running_loop()
        while not stopping.is_set():
            readable = asyncio.Event()
            try:
                if self._source.fd is None:
                    self._source.open()
                    self._resume_after = self._last_seq
                if self._source.is_device or self._source.is_fifo:
                    loop.add_reader(self._source.fd, readable.set)  # type: ignore[arg-type]
                try:
                    self.poll(datetime.now(UTC))
                    self.failure = None
                    backoff.reset()
                    await _wait_any(stopping, readable, within_s=None if self._source.is_device or self._source.is_fifo else 0.25)
                finally:
                    if self._source.fd is not None and (self._source.is_device or self._source.is_fifo):
                        loop.remove_reader(self._source.fd)
            except OSError as exc:
                self.failure = f"lost the read of {self.path}: {exc.strerror or exc}"
                delay = backoff.next()
                if self.log is not None:
                    self.log.warning("kmsg read lost, retrying", path=str(self.path), error=self.failure,
                                     retry_in_s=delay)
                self._source.close()
                await _wait_any(stopping, asyncio.Event(), within_s=delay)
        self._source.close()

    def signal(self, gpus_by_pci: Mapping[str, int]) -> wire.KmsgSignal:
        if self.unavailable:
            return wire.KmsgSignal(status="unavailable", reason=self.unavailable)
        reading = self.tally.signal(gpus_by_pci, self.backlog_skipped)
        if self.failure:
            return msgspec.structs.replace(reading, status="failed", reason=self.failure)
        return reading


async def _wait_any(stopping: asyncio.Event, *others: asyncio.Event | None, within_s: float | None) -> None:
    waits = [asyncio.create_task(event.wait()) for event in (stopping, *others) if event is not None]
    try:
        await asyncio.wait(waits, timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()


def gpus_by_pci(gpu: wire.GpuSignal, inventory: Inventory | None) -> dict[str, int]:
    """Which device index a PCI address is: from the GPU signal, else from the PCI scan."""
    if gpu.devices:
        return {d.pci_bus_id: d.index for d in gpu.devices}
    if inventory is not None:
        return {d.pci_bus_id: d.index for d in inventory.gpus if d.vendor == "nvidia"}
    return {}


class Collector:
    """Reports for one node from its sources; the same code runs on a node and in the simulator."""

    # An out-of-band report re-reads everything but SMART (seconds per disk, unrelated to
    # kernel faults), and gives the GPU a short bound: a GPU that fell off the bus must show
    # as failed in the very report that carries its Xid 79 (COL-8).
    FAST: Final = ("edac", "ioerr", "mounts", "gpu")
    SLOW: Final = ("smart",)
    OUT_OF_BAND_GPU_TIMEOUT_S: Final = 2.0

    def __init__(self, settings: Settings, sources: Sources, kmsg: KmsgView | None, log: Any = None) -> None:
        self.settings = settings
        self.sources = sources
        self.kmsg = kmsg
        self.log = log
        self.last: dict[str, Any] = {}
        self.inventory: Inventory | None = None
        self.inventory_error: str | None = None
        # REM-2: the latest remediation outcome, in every resource report from now on;
        # ``remediated`` asks the agent to send one at once.
        self.remediation: wire.RemediationOutcome | None = None
        self.remediated = asyncio.Event()
        self.cut_told: set[str] = set()  # fields whose cut to the wire's bounds was logged (SEC-11)

    def refresh_inventory(self) -> Inventory | None:
        try:
            self.inventory = self.sources.inventory()
            self.inventory_error = None
        except InventoryError as exc:
            self.inventory_error = str(exc)
        return self.inventory

    def _timeout(self, name: str, trigger: wire.ReportTrigger) -> float:
        if name == "smart":  # smartctl has its own per-disk timeout; leave it room
            return self.settings.signal_timeout_s + self.settings.smartctl_timeout_s
        if name == "gpu" and trigger == "kmsg":
            return min(self.settings.signal_timeout_s, self.OUT_OF_BAND_GPU_TIMEOUT_S)
        return self.settings.signal_timeout_s

    async def probe(self, names: Iterable[str], trigger: wire.ReportTrigger = "scheduled") -> None:
        """Read these signals now; the readings replace the last ones."""
        names = tuple(names)
        if self.sources.in_memory:
            readings = [await bounded(n, lambda n=n: self.sources.read(n), None) for n in names]  # type: ignore[misc]
        else:
            readings = await asyncio.gather(
                *(bounded(n, lambda n=n: self.sources.read(n), self._timeout(n, trigger)) for n in names)  # type: ignore[misc]
            )
        self.last.update(zip(names, readings, strict=True))

    def resource_report(self, ready: bool, sent_at: datetime) -> wire.ResourceReport | None:
        """From the last inventory and GPU reading; None while the inventory is unreadable."""
        if self.inventory is None:
            return None
        return build_resource_report(self.settings, self.inventory, ready, sent_at, self.last.get("gpu"),
                                     self.remediation)

    def report_outcome(self, outcome: wire.RemediationOutcome) -> None:
        """A remediation outcome for the next resource report, which goes out at once."""
        self.remediation = outcome
        self.remediated.set()

    def nvidia_gpus(self) -> tuple[int, ...]:
        """The NVIDIA GPU indices the resource report lists (``nvidia-smi -i``'s numbers)."""
        if self.inventory is None:
            return ()
        gpu = self.last.get("gpu")
        merged = merge_gpus(self.inventory.gpus, gpu.devices if gpu is not None else ())
        return tuple(d.index for d in merged if d.vendor == "nvidia")

    async def collect(self, trigger: wire.ReportTrigger, now: datetime | None = None) -> wire.HealthReport:
        names = self.FAST if trigger == "kmsg" and all(n in self.last for n in self.SLOW) else self.FAST + self.SLOW
        await self.probe(names, trigger)
        inventory = self.inventory
        kmsg = (self.kmsg.signal(gpus_by_pci(self.last["gpu"], inventory)) if self.kmsg is not None
                else wire.KmsgSignal(status="unavailable", reason="no kernel ring buffer in this source"))
        signals = {**self.last, "kmsg": kmsg}
        hostname = inventory.hostname if inventory else socket.gethostname()
        cut: dict[str, int] = {}
        report = build_report(self.settings, hostname, signals, trigger, now or datetime.now(UTC),
                              inventory.boot_id if inventory else None, cut)
        if cut and not cut.keys() <= self.cut_told:  # once per field in the agent's life, not per report
            self.cut_told |= cut.keys()
            if self.log is not None:
                self.log.warning("report cut to the wire's bounds (SEC-11): the worst and newest entries kept",
                                 cut=cut)
        return report


class Hotplug:
    """Devices added or removed that the agent has not handled yet (udev calls ``add``)."""

    def __init__(self) -> None:
        self.pending = asyncio.Event()
        self._reprobe: Reprobe | None = None

    def add(self, reprobe: Reprobe) -> None:
        self._reprobe = reprobe if self._reprobe is None else self._reprobe.union(reprobe)
        self.pending.set()

    def take(self) -> Reprobe | None:
        reprobe, self._reprobe = self._reprobe, None
        self.pending.clear()
        return reprobe


Send = Callable[[str, wire.Record], Awaitable[None]]


async def report_cycle(collector: Collector, send: Send, trigger: wire.ReportTrigger,
                       last_resources: wire.ResourceReport | None) -> wire.ResourceReport | None:
    """One cycle: the health report (none while ``health.disabled``), then the resource report
    when it differs from ``last_resources`` (always when that is None). Returns the resource
    report now in force."""
    settings = collector.settings
    if not settings.health_disabled:  # disabled: resource reports only (COL-1)
        report = await collector.collect(trigger)
        await send(subjects.report(settings.cluster, settings.node_id), report)
    elif trigger != "kmsg":
        await collector.probe(("gpu",))  # the resource report's GPU details stay current
    collector.refresh_inventory()
    resources = collector.resource_report(True, datetime.now(UTC))
    if resources is not None and (last_resources is None or _resources_changed(last_resources, resources)):
        await send(subjects.resource(settings.cluster, settings.node_id), resources)
        return resources
    return last_resources


async def report_once(collector: Collector, publish: Callable[[str, bytes], Awaitable[None]]) -> None:
    """``--slurm-health-check``: the agent's cycle once, as a scheduled report: the health
    report and the resource report (ready). A publish that fails raises: the caller must be
    able to say the health check was not published."""

    async def send(subject: str, record: wire.Record) -> None:
        await publish(subject, wire.encode(record))

    await report_cycle(collector, send, "scheduled", None)


async def run_agent(collector: Collector, publish: Callable[[str, bytes], Awaitable[None]],
                    stopping: asyncio.Event, out_of_band: asyncio.Event, log: Any,
                    hotplug: Hotplug | None = None) -> None:
    """Resource report at start (not ready), on change, on hotplug and at once when a
    remediation outcome is ready (``Collector.report_outcome``); health reports on the
    interval and out of band. Publishing failures are logged; the next report supersedes."""
    settings = collector.settings

    async def send(subject: str, record: wire.Record) -> None:
        started = time.perf_counter()
        try:
            await publish(subject, wire.encode(record))
        except Exception as exc:
            log.warning("publish failed", subject=subject, error=str(exc) or type(exc).__name__)
            return
        log.debug("published", subject=subject, ms=round((time.perf_counter() - started) * 1000, 1))

    resource_subject = subjects.resource(settings.cluster, settings.node_id)
    collector.refresh_inventory()
    await collector.probe(("gpu",))  # so that the first resource report names the GPUs' models
    collector.remediated.clear()  # an outcome settled before the start goes in the start's report
    resources = collector.resource_report(False, datetime.now(UTC))
    if resources is None:
        log.error("inventory unreadable; resource report withheld", reason=collector.inventory_error)
    else:
        await send(resource_subject, resources)
    first = True
    last_resources: wire.ResourceReport | None = None
    next_due = time.monotonic()
    while not stopping.is_set():
        if not first and hotplug is not None and hotplug.pending.is_set():
            await asyncio.sleep(OUT_OF_BAND_COALESCE_S)  # a card's functions, a disk's partitions
            reprobe = hotplug.take()
            if reprobe is not None:
                await collector.probe(sorted(reprobe.signals))
                collector.refresh_inventory()
                collector.remediated.clear()  # this report carries the latest outcome too
                resources = collector.resource_report(True, datetime.now(UTC))
                log.info("device added or removed; resource report sent", devices=list(reprobe.devices),
                         reprobed=sorted(reprobe.signals), sent=resources is not None)
                if resources is not None:  # at once, changed or not (COL-11)
                    await send(resource_subject, resources)
                    last_resources = resources
        elif not first and collector.remediated.is_set():
            collector.remediated.clear()
            resources = collector.resource_report(True, datetime.now(UTC))
            if resources is not None:  # at once (REM-2): eviction waits on it
                await send(resource_subject, resources)
                last_resources = resources
            else:
                log.error("inventory unreadable; remediation outcome withheld", reason=collector.inventory_error)
        else:
            collector.remediated.clear()  # a changed resource report, carrying the outcome, goes out in this cycle
            trigger: wire.ReportTrigger = "start" if first else "scheduled"
            if not first and out_of_band.is_set():
                await asyncio.sleep(OUT_OF_BAND_COALESCE_S)
                trigger = "kmsg"
            else:
                next_due = time.monotonic() + settings.interval_s
            # This report carries every finding folded so far, so it answers an out-of-band
            # call made before it too: at the start, an error the kernel logged before the first
            # report. Another report right after would add nothing and read as quiet, which
            # clears a climbing counter's condition (quietReportsToClear) the moment it rose.
            out_of_band.clear()
            last_resources = await report_cycle(collector, send, trigger, last_resources)
            first = False
        await _wait_any(stopping, out_of_band, hotplug.pending if hotplug else None, collector.remediated,
                        within_s=max(0.0, next_due - time.monotonic()))


def _resources_changed(before: wire.ResourceReport, after: wire.ResourceReport) -> bool:
    return msgspec.structs.replace(before, sent_at=after.sent_at) != after
