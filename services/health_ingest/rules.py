"""health-ingest's rules: reports in, conditions, heartbeat and health state out (ING-1..ING-7).

Pure: no I/O, no clock, no logging. ``now`` is the stream time of the record being folded
(or of the sweep), config arrives as an argument.

One condition per type: its severity and reason are those of the worst finding of that type;
its message names every finding behind that reason. Three kinds of finding:

- **state** — raised while the report shows it (read-only mount, throttling, SMART health
  failing or an NVMe critical warning, a failing SMART attribute, GPU correctable ECC while
  its volatile count since driver load is non-zero, a failed collector). SMART follows the
  drive's own verdict (ING-2a): a report with no verdict for a disk (smartctl failed on it)
  keeps the last one, the first passing verdict clears it;
- **climbing** — raised while a counter rises from one report to the next, cleared after
  ``quietReportsToClear`` reports in which it did not (EDAC CE, corrected MCE, GHES
  corrected/recoverable, non-hardware Xids, I/O errors). A counter that goes backwards
  (agent restart, driver reload) starts a new baseline: never a negative delta, never a
  false rise;
- **sticky** — raised once and held until ``healthplane node service`` records service
  (NODE_SERVICED) or the device is replaced (another GPU UUID or disk serial): fatal MCE and
  GHES, uncorrectable memory, hardware Xids, uncorrectable GPU ECC, row-remap failure.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Final

import msgspec

from healthplane.contracts import automation, domains, promotion, wire
from healthplane.contracts import xid as xid_catalog
from healthplane.contracts.config import DEFAULT_PROMOTION_RULES, PromotionRule
from healthplane.contracts.subjects import node_key
from healthplane.runtime import heap
from healthplane_health_ingest import jobs
from healthplane_health_ingest.detectors import Detection, DetectorSpec, NodeFacts

HEARTBEAT_FLOOR_S: Final = 15.0
INTERVAL_CAP_S: Final = 24 * 3600
# scheduler_drained (JOB-4) is the scheduler's word, not Healthplane's evidence: shown, never a
# real fault (no DEGRADED health, no attribution, nothing automation acts on).
NOT_REAL_FAULTS: Final = frozenset({"heartbeat_missed", "telemetry_stale", "collector_failed", "scheduler_drained"})
# JOB-4: the condition's reason by what the scheduler set.
SCHEDULER_REASONS: Final = {"DRAIN": "SchedulerDrain", "DOWN": "SchedulerDown", "FAIL": "SchedulerFail"}
READ_ONLY_BY_NATURE: Final = frozenset({"squashfs", "iso9660", "erofs", "cramfs", "udf"})
SEVERITY_ORDER: Final = {"info": 1, "warning": 2, "critical": 3}
# SEC-11: sticky faults one node may hold. A real node holds a few; the biggest (16 GPUs, 32
# memory controllers) failing every way at once, each GPU with a dozen distinct critical Xids
# (ECC, GSP, NVLink, fallen off the bus) and its ECC and row-remap faults, would hold
# 16 x 14 + 32 + 4 node-wide = 260: the cap is 4x that, ~300 KB of state for a node at it.
# Past it a node is making devices up (each made-up PCI address in an Xid entry is a key of
# its own): the first STICKY_MAX in fold order stay, so a replay keeps the same ones, and the
# rest are refused (``NodeState.sticky_refused``; the fold notes it once).
STICKY_MAX: Final = 1024
# SEC-11: the climbing counters a node keeps (one per memory controller, disk, Xid of a GPU,
# ...): a real node keeps a few hundred at most. A node that names new devices in every report
# would grow the state without end; past the cap a new counter is not kept (the first in fold
# order stay, so a replay agrees), and the fold notes it once, as for sticky faults.
COUNTERS_MAX: Final = 16_384


# RUL-1: the rules in force until a config says otherwise.
DEFAULT_RULES: Final = tuple(PromotionRule.model_validate(rule).compiled() for rule in DEFAULT_PROMOTION_RULES)


class SilenceWatch(msgspec.Struct, frozen=True):
    """A ``nodeHealth.domainFaults`` entry as correlated silence reads it (silence.py, DOM-3)."""

    kind: str
    share: int = 50
    min_members: int = 4


class IngestConfig(msgspec.Struct, frozen=True):
    heartbeat_miss_threshold: int = 3
    quiet_reports_to_clear: int = 1
    ignore_read_only_mounts: tuple[str, ...] = ()
    detectors: tuple[DetectorSpec, ...] = ()
    promotion: tuple[promotion.Rule, ...] = DEFAULT_RULES
    jobs: jobs.JobTestConfig = jobs.JobTestConfig()  # JOB-2
    # DOM-3: the domains (DOM-1) whose members' silence together is told early (silence.py).
    domain_spec: domains.Spec = domains.Spec()
    silence: tuple[SilenceWatch, ...] = ()


class Finding(msgspec.Struct, frozen=True, omit_defaults=True):
    type: str
    reason: str
    severity: str
    detail: str
    action: str | None = None  # XID-1: the catalog's immediate action (Xid findings only)
    promoted: bool = False  # RUL-1: a promotion rule's, which names a condition it shares with its faults


class Climb(msgspec.Struct, gc=False):
    """A counter's reading as snapshots before packed counters held it (``NodeState.climbs``):
    read once, into ``counters``, on the node's next report."""

    last: int
    active: bool = False
    quiet: int = 0


class Sticky(msgspec.Struct, frozen=True):
    finding: Finding
    device: str = ""       # the GPU's PCI address or the disk's name, "" for the node
    identity: str = ""     # GPU UUID or disk serial when known: another one means replaced


class NodeState(msgspec.Struct, omit_defaults=True):
    cluster: str
    node_id: str
    last_report_at: datetime | None = None
    last_report_seq: int = 0
    interval_s: int = 30
    missed: bool = False
    # Every counter the climbing and sticky rules read, by key, packed (see _pack): ten a node,
    # where an object each was half a kilobyte a node. A kernel-log count that has only ever
    # read 0 has no entry (it starts at 0 anyway); a sysfs one has, its first reading being
    # only a baseline.
    counters: dict[str, int] = {}
    # Most nodes have no sticky fault, condition or failing disk: those fields share one empty
    # dict (heap.EMPTY), and are replaced, never changed in place.
    sticky: dict[str, Sticky] = msgspec.field(default_factory=heap.empty)
    # Sticky faults refused since the map was last below STICKY_MAX at a report (SEC-11).
    sticky_refused: int = 0
    counters_refused: int = 0  # SEC-11: new counters not kept, the node's counters being full
    conditions: dict[str, wire.Condition] = msgspec.field(default_factory=heap.empty)
    # Disks whose latest SMART verdict was failing (ING-2a): a state, not a sticky fault.
    # Disk name -> serial (a dict, not a set: its order survives a snapshot unchanged).
    smart_failing: dict[str, str] = msgspec.field(default_factory=heap.empty)
    definition: str | None = None
    report_sent_at: datetime | None = None
    climbs: dict[str, Climb] | None = None  # only in snapshots from before ``counters``
    # JOB-4: a drain, DOWN or FAIL someone else set in the scheduler (SCHEDULER_DRAINED), held
    # as a finding of every report until SCHEDULER_UNDRAINED.
    scheduler_drain: Finding | None = None
    # RUL-1: the node's open promotion-rule windows; None while it has none (most nodes).
    windows: promotion.NodeWindows | None = None
    # JOB-2: job_failures_anomalous while the job-outcome test holds it, as a finding of every
    # report (its evidence is the job outcomes, not the report).
    job_failures: Finding | None = None


class IngestState(msgspec.Struct, dict=True):
    # dict=True: room for what the fold derives from the state and keeps with it, never
    # encoded (the heartbeat deadline index, fold.py), so a snapshot is the fields alone.
    nodes: dict[str, NodeState] = {}
    config: IngestConfig = IngestConfig()
    config_version: int = 0
    # Decommissioned nodes -> when: a report sent before that (in flight when the instance
    # went) is ignored, so a gone node never comes back to miss its heartbeat.
    gone: dict[str, datetime] = {}
    # What detectors read from each node's latest resource report (POL-8).
    facts: dict[str, NodeFacts] = {}
    # JOB-2: job outcome histories and each cluster's pool of them (jobs.py).
    jobs: jobs.JobsState = msgspec.field(default_factory=jobs.JobsState)



# ---------------------------------------------------------------------------- findings


# A counter packed in one int: its last reading, the quiet reports since it last rose (while
# climbing), whether it is climbing. A quiet count saturates at a million reports (a year at a
# 30 s interval): a larger quietReportsToClear clears there.
QUIET_BITS: Final = 20
QUIET_MAX: Final = (1 << QUIET_BITS) - 1
_LAST_SHIFT: Final = QUIET_BITS + 1


def _pack(last: int, active: bool, quiet: int) -> int:
    return (last << _LAST_SHIFT) | (min(quiet, QUIET_MAX) << 1) | active


def _unpack(packed: int) -> tuple[int, bool, int]:
    return packed >> _LAST_SHIFT, bool(packed & 1), (packed >> 1) & QUIET_MAX


def _keep(node: NodeState, key: str, packed: int, *, baseline_zero: bool) -> None:
    counters = node.counters
    if baseline_zero and packed == 0:
        counters.pop(key, None)  # what a missing entry reads as
    elif key in counters:
        counters[key] = packed
    elif len(counters) >= COUNTERS_MAX:
        node.counters_refused += 1  # SEC-11: full; this counter is not followed
    else:
        # Interned: the same counters (a memory controller, a disk, a GPU) on every node.
        counters[sys.intern(key)] = packed


def _climb(node: NodeState, key: str, value: int, quiet_to_clear: int, *, baseline_zero: bool) -> bool:
    """Fold one counter reading; True while the counter counts as climbing."""
    packed = node.counters.get(key)
    if packed is None:
        if baseline_zero and value == 0:
            return False  # the common reading: nothing counted, nothing to keep
        # kmsg counts start at zero when the agent starts; sysfs counters count since boot
        # or driver load, so their first reading is only a baseline.
        last, active, quiet = (0 if baseline_zero else value), False, 0
    elif packed == value << _LAST_SHIFT:
        return False  # the common reading: the same value, not climbing
    else:
        last, active, quiet = _unpack(packed)
    if value > last:
        active, quiet = True, 0
    elif active:
        quiet += 1
        if quiet >= min(quiet_to_clear, QUIET_MAX):
            active, quiet = False, 0
    # The new value is the baseline, also after a reset (a lower value).
    _keep(node, key, _pack(value, active, quiet), baseline_zero=baseline_zero)
    return active


def _rose(node: NodeState, key: str, value: int, *, baseline_zero: bool) -> bool:
    """True when ``value`` is above the last reading (a sticky trigger); keeps the baseline."""
    packed = node.counters.get(key)
    if packed is None:
        if not (baseline_zero and value == 0):
            _keep(node, key, _pack(value, False, 0), baseline_zero=baseline_zero)
        return baseline_zero and value > 0
    last, active, quiet = _unpack(packed)
    if value != last:
        _keep(node, key, _pack(value, active, quiet), baseline_zero=baseline_zero)
    return value > last


def _migrate_climbs(node: NodeState) -> None:
    """A node from a snapshot taken before counters were packed."""
    node.counters = {sys.intern(k): _pack(c.last, c.active, c.quiet if c.active else 0)
                     for k, c in (node.climbs or {}).items()}
    node.climbs = None


def _sticky(node: NodeState, key: str, finding: Finding, device: str = "", identity: str = "") -> None:
    if key not in node.sticky:
        if len(node.sticky) >= STICKY_MAX:
            node.sticky_refused += 1  # SEC-11: full
            return
        node.sticky = {**node.sticky, key: Sticky(finding, device, identity)}


def sticky_capped(node: NodeState | None) -> bool:
    """SEC-11: the node's sticky map is full and has refused a fault since it last had room."""
    return node is not None and node.sticky_refused > 0 and len(node.sticky) >= STICKY_MAX


def counters_capped(node: NodeState | None) -> bool:
    """SEC-11: the node's counters are full and have refused one."""
    return node is not None and node.counters_refused > 0 and len(node.counters) >= COUNTERS_MAX


def findings(node: NodeState, report: wire.HealthReport, config: IngestConfig) -> list[Finding]:
    """Every finding of one report, folding counters and sticky faults into ``node``."""
    quiet = config.quiet_reports_to_clear
    out: list[Finding] = []
    signals = report.signals
    if node.sticky and signals.gpu.status == "ok":
        _forget_replaced(node, {g.pci_bus_id: g.uuid or "" for g in signals.gpu.devices})
    if node.sticky and signals.smart.status == "ok":
        _forget_replaced(node, {d.name: d.serial or "" for d in signals.smart.devices})

    failed = [name for name in ("edac", "smart", "ioerr", "kmsg", "mounts", "gpu")
              if getattr(signals, name).status == "failed"]

    # Memory: EDAC sysfs (per controller) and EDAC lines in the ring buffer.
    if signals.edac.status == "ok":
        for mc in signals.edac.controllers:
            if _climb(node, f"edac.ce.{mc.name}", mc.ce, quiet, baseline_zero=False):
                out.append(Finding("memory_errors", "CorrectableMemoryErrors", "warning",
                                   f"{mc.name}: {mc.ce} correctable memory errors, rising"))
            if _rose(node, f"edac.ue.{mc.name}", mc.ue, baseline_zero=False):
                _sticky(node, f"edac.ue.{mc.name}", Finding("memory_errors", "UncorrectableMemoryErrors", "critical",
                                                            f"{mc.name}: {mc.ue} uncorrectable memory errors"))
    kmsg = signals.kmsg
    if kmsg.status != "unavailable":
        if _climb(node, "kmsg.edac.ce", kmsg.edac.ce, quiet, baseline_zero=True):
            out.append(Finding("memory_errors", "CorrectableMemoryErrors", "warning",
                               f"{kmsg.edac.ce} corrected memory errors logged by the kernel, rising"))
        if _rose(node, "kmsg.edac.ue", kmsg.edac.ue, baseline_zero=True):
            _sticky(node, "kmsg.edac.ue", Finding("memory_errors", "UncorrectableMemoryErrors", "critical",
                                                  "uncorrectable memory error logged by the kernel"))
        # Machine checks and hardware error records.
        if _rose(node, "kmsg.mce.fatal", kmsg.machine_checks.fatal, baseline_zero=True):
            _sticky(node, "kmsg.mce.fatal", Finding("machine_check_errors", "MachineCheckFatal", "critical",
                                                    "fatal machine check logged"))
        if _climb(node, "kmsg.mce.corrected", kmsg.machine_checks.corrected, quiet, baseline_zero=True):
            out.append(Finding("machine_check_errors", "MachineCheckCorrected", "warning",
                               f"{kmsg.machine_checks.corrected} corrected machine checks since the agent started, rising"))
        if _rose(node, "kmsg.ghes.fatal", kmsg.hardware_errors.fatal, baseline_zero=True):
            _sticky(node, "kmsg.ghes.fatal", Finding("machine_check_errors", "HardwareErrorRecord", "critical",
                                                     "fatal hardware error record (APEI/GHES)"))
        recoverable = kmsg.hardware_errors.corrected + kmsg.hardware_errors.recoverable
        if _climb(node, "kmsg.ghes.other", recoverable, quiet, baseline_zero=True):
            out.append(Finding("machine_check_errors", "HardwareErrorRecord", "warning",
                               f"{recoverable} corrected or recoverable hardware error records, rising"))
        out.extend(_xid_findings(node, report, quiet))

    # Disks.
    if signals.smart.status in ("ok", "failed"):
        _fold_smart_verdicts(node, signals.smart)
        for disk in signals.smart.devices:
            if disk.failing_now or disk.failed_in_past:
                names = ", ".join(a.name for a in [*disk.failing_now, *disk.failed_in_past])
                out.append(Finding("disk_degraded", "SmartAttributeFailing", "warning",
                                   f"SMART attributes failing on {disk.name}: {names}"))
    out.extend(Finding("disk_degraded", "SmartFailing", "critical", f"SMART health check failing on {name}")
               for name in sorted(node.smart_failing))
    if signals.ioerr.status == "ok":
        for counter in signals.ioerr.devices:
            if _climb(node, f"ioerr.{counter.name}", counter.count, quiet, baseline_zero=False):
                out.append(Finding("disk_degraded", "IoErrors", "warning",
                                   f"{counter.name}: {counter.count} I/O errors, rising"))
    if signals.mounts.status == "ok":
        for mount in signals.mounts.read_only:
            if _read_only_counts(mount, config.ignore_read_only_mounts):
                out.append(Finding("disk_readonly", "ReadOnlyMount", "critical",
                                   f"{mount.mount_point} ({mount.device}, {mount.fs_type}) is read-only"))

    # GPUs (NVML / nvidia-smi).
    if signals.gpu.status == "ok":
        for gpu in signals.gpu.devices:
            bus = gpu.pci_bus_id
            if gpu.ecc.status == "ok" and gpu.ecc.volatile is not None:
                if gpu.ecc.volatile.uncorrected > 0:
                    _sticky(node, f"gpu.ecc.ue.{bus}", Finding("gpu_ecc_errors", "GpuEccUncorrectable", "critical",
                                                              f"GPU {bus}: {gpu.ecc.volatile.uncorrected} uncorrectable ECC errors"),
                            bus, gpu.uuid or "")
                if gpu.ecc.volatile.corrected > 0:
                    out.append(Finding("gpu_ecc_errors", "GpuEccCorrectable", "warning",
                                       f"GPU {bus}: {gpu.ecc.volatile.corrected} correctable ECC errors since driver load"))
            if gpu.row_remap is not None and gpu.row_remap.failed:
                _sticky(node, f"gpu.remap.{bus}", Finding("gpu_ecc_errors", "GpuRowRemapFailure", "critical",
                                                          f"GPU {bus}: row remapping failed"), bus, gpu.uuid or "")
            if gpu.throttle.thermal:
                out.append(Finding("gpu_throttling", "GpuThermalThrottle", "warning", f"GPU {bus}: thermal slowdown"))
            if gpu.throttle.power_brake:
                out.append(Finding("gpu_throttling", "GpuPowerBrake", "warning", f"GPU {bus}: power brake slowdown"))
    if failed:  # last: whether a fault explains it is known once this report's faults are folded
        out.insert(0, _collector_failed(node, signals, failed))
    if node.scheduler_drain is not None:
        out.append(node.scheduler_drain)
    if node.job_failures is not None:
        out.append(node.job_failures)
    # Hardware Xids are sticky too, but reported per device above with their latest Xid.
    return out + [s.finding for k, s in node.sticky.items() if not k.startswith("xid.")]


# XID-2: the faults that take a GPU off the bus or make the driver drop it (NVIDIA's catalog:
# 79 fell off the bus; 48 a double-bit ECC error; 95 an uncontained ECC error), and the sticky
# keys of the uncorrectable ECC and failed row remap it may have reported before.
GPU_LOSING_XIDS: Final = frozenset({48, 79, 95})
_GPU_LOSING_KEYS: Final = ("gpu.ecc.ue.", "gpu.remap.")
_LOST_GPU: Final = re.compile(r"GPU is lost|GPU_IS_LOST|fallen off the bus|Unable to determine the device handle",
                              re.IGNORECASE)
_BUS: Final = re.compile(r"\b[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\b")


def _collector_failed(node: NodeState, signals: wire.Signals, failed: list[str]) -> Finding:
    """collector_failed; ``EXPLAINED`` (XID-2) when the only failure is the GPU read of a GPU
    that is gone and a fatal fault of that GPU is on record: evidence, not blindness."""
    reasons = "; ".join(f"{n}: {getattr(signals, n).reason or 'failed'}" for n in failed)
    if failed == ["gpu"] and _LOST_GPU.search(signals.gpu.reason or ""):
        cause = _gpu_loss_cause(node, signals.gpu.reason or "")
        if cause is not None:
            return Finding("collector_failed", automation.EXPLAINED, "warning",
                           f"collector failed ({reasons}), explained by {cause}: the GPU is gone, not unseen")
    return Finding("collector_failed", "CollectorFailed", "warning", f"collector failed ({reasons})")


def _gpu_loss_cause(node: NodeState, reason: str) -> str | None:
    """The fatal fault on record of the GPU ``reason`` names (of any GPU when it names none)."""
    named = {match.lower() for match in _BUS.findall(reason)}
    for key, held in sorted(node.sticky.items()):
        device = held.device.lower()
        if named and not any(device.endswith(bus) or bus.endswith(device) for bus in named):
            continue
        if key.startswith("xid.") and int(key.rsplit(".", 1)[1]) in GPU_LOSING_XIDS:
            return f"Xid {key.rsplit('.', 1)[1]} on {held.device}"
        if key.startswith(_GPU_LOSING_KEYS):
            return f"{held.finding.detail}"
    return None


def _xid_findings(node: NodeState, report: wire.HealthReport, quiet: int) -> list[Finding]:
    """ING-2, XID-1: grade per device by its worst Xid; message names each device's latest Xid.
    Which Xids are critical and sticky, and what each asks for, is NVIDIA's catalog's
    (``healthplane.contracts.xid``, decoded from the Xid's log line where the catalog says so);
    the finding carries the most disruptive action among the Xids behind it. Xids whose address
    matches no device are graded all the same."""
    if not report.signals.kmsg.xid and not any(k.startswith("xid.") for k in node.sticky):
        return []  # the common report: nothing logged, nothing held
    uuids = {g.pci_bus_id: g.uuid or "" for g in report.signals.gpu.devices}
    per_device: dict[str, list[wire.XidEntry]] = {}
    for entry in report.signals.kmsg.xid:
        per_device.setdefault(entry.pci_bus_id, []).append(entry)
    held_buses = {s.device for k, s in node.sticky.items() if k.startswith("xid.")}
    out: list[Finding] = []
    for bus in sorted(set(per_device) | held_buses):
        entries = per_device.get(bus, [])
        climbing: list[str] = []  # the actions of the Xids climbing on this device
        for entry in entries:
            key = f"xid.{bus}.{entry.xid}"
            if xid_catalog.sticky(entry.xid, entry.last_message):
                if _rose(node, key, entry.count, baseline_zero=True):
                    action = xid_catalog.recommended_action(entry.xid, entry.last_message)
                    _sticky(node, key, Finding("gpu_xid_errors", "GpuXidHardware", "critical", f"Xid {entry.xid}",
                                               action), bus, uuids.get(bus, ""))
            elif _climb(node, key, entry.count, quiet, baseline_zero=True):
                climbing.append(xid_catalog.recommended_action(entry.xid, entry.last_message))
        held_keys = [k for k in node.sticky if k.startswith(f"xid.{bus}.")]
        held = [int(k.rsplit(".", 1)[1]) for k in held_keys]
        if not climbing and not held:
            continue
        worst = max(held, default=None)
        latest = max(entries, key=lambda e: (e.last_at.timestamp() if e.last_at else 0.0)).xid if entries else worst
        matched = any(e.gpu_index is not None for e in entries) or bus in uuids
        where = f"GPU {bus}" if matched else f"GPU {bus} (no matching device)"
        suffix = f" (worst {worst})" if worst is not None and worst != latest else ""
        if worst is None:
            out.append(Finding("gpu_xid_errors", "GpuXidApplication", "warning", f"{where}: Xid {latest}",
                               xid_catalog.worst_action(climbing)))
        else:
            # A fault held from before findings carried actions has the catalog's for its code.
            actions = [node.sticky[k].finding.action or xid_catalog.recommended_action(code)
                       for k, code in zip(held_keys, held, strict=True)]
            out.append(Finding("gpu_xid_errors", "GpuXidHardware", "critical", f"{where}: Xid {latest}{suffix}",
                               xid_catalog.worst_action(actions)))
    return out


def _fold_smart_verdicts(node: NodeState, smart: wire.SmartSignal) -> None:
    """ING-2a: each disk's current verdict replaces its last; a disk without one keeps it.

    Snapshots from before SMART was a state held it as a sticky fault: it becomes the disk's
    last verdict here, so the next passing report clears it like any other."""
    failing = node.smart_failing
    if any(k.startswith("smart.") for k in node.sticky):
        failing = {**failing, **{k.removeprefix("smart."): s.identity for k, s in node.sticky.items()
                                 if k.startswith("smart.")}}
        node.sticky = {k: s for k, s in node.sticky.items() if not k.startswith("smart.")} or heap.EMPTY
    for disk in smart.devices:
        if disk.passed is None and disk.critical_warning is None:
            continue
        if disk.passed is False or bool(disk.critical_warning):
            if failing.get(disk.name) != (disk.serial or ""):
                failing = {**failing, disk.name: disk.serial or ""}
        else:
            failing = heap.without(failing, disk.name)
    if smart.status == "ok" and failing:  # a disk no longer listed has no verdict to keep
        present = {disk.name for disk in smart.devices}
        failing = {n: serial for n, serial in failing.items() if n in present}
    node.smart_failing = failing or heap.EMPTY


def _forget_replaced(node: NodeState, identities: Mapping[str, str]) -> None:
    """ING-3: a device with another UUID or serial than the one that faulted was replaced."""
    def replaced(sticky: Sticky) -> bool:
        current = identities.get(sticky.device)
        return bool(sticky.device and sticky.identity and current and current != sticky.identity)

    if any(replaced(s) for s in node.sticky.values()):
        node.sticky = {k: s for k, s in node.sticky.items() if not replaced(s)} or heap.EMPTY


def _read_only_counts(mount: wire.ReadOnlyMount, ignore: Iterable[str]) -> bool:
    """ING-7: block-device filesystems only; read-only by nature or by configuration never."""
    if mount.fs_type in READ_ONLY_BY_NATURE or not mount.device.startswith("/dev/"):
        return False
    return not any(fnmatch.fnmatchcase(mount.mount_point, pattern) for pattern in ignore)


# ---------------------------------------------------------------------------- conditions


def conditions_from(found: Iterable[Finding], previous: Mapping[str, wire.Condition],
                    now: datetime) -> dict[str, wire.Condition]:
    """One condition per type: the worst finding sets severity and reason; its message names
    every finding with that reason. firstSeen survives while the condition stays raised."""
    by_type: dict[str, list[Finding]] = {}
    for finding in found:
        by_type.setdefault(finding.type, []).append(finding)
    out: dict[str, wire.Condition] = {}
    for condition_type, items in by_type.items():
        # Of equal severity, a promotion rule's (it names what the faults add up to), then the
        # one asking the most.
        worst = max(items, key=lambda f: (SEVERITY_ORDER[f.severity], f.promoted, xid_catalog.rank(f.action)))
        details = sorted({f.detail for f in items if f.reason == worst.reason and f.detail})
        action = xid_catalog.worst_action(f.action for f in items if f.reason == worst.reason)
        before = previous.get(condition_type)
        out[condition_type] = wire.Condition(
            type=condition_type,  # type: ignore[arg-type]
            reason=worst.reason,
            severity=worst.severity,  # type: ignore[arg-type]
            message="; ".join(details) or worst.reason,
            first_seen=before.first_seen if before else now,
            observations=(before.observations + 1) if before else 1,
            recommended_action=action,
        )
    return out


def condition_events(before: Mapping[str, wire.Condition], after: Mapping[str, wire.Condition],
                     ) -> list[tuple[str, wire.ConditionChange]]:
    """ING-6: CONDITION_RAISED on raise or escalation (with previousSeverity; an escalation of
    severity or of the recommended action, XID-1, RUL-1), CONDITION_CLEARED on clear; nothing
    when a condition merely stays."""
    changes: list[tuple[str, wire.ConditionChange]] = []
    for condition_type, now_c in after.items():
        was = before.get(condition_type)
        if was is None:
            changes.append(("CONDITION_RAISED", _change(now_c)))
        elif SEVERITY_ORDER[now_c.severity] > SEVERITY_ORDER[was.severity] \
                or xid_catalog.rank(now_c.recommended_action) > xid_catalog.rank(was.recommended_action):
            # An escalation: of severity, or of what the condition asks (a promotion rule that
            # fired on a fault already raised asks a human where the fault asked a reboot).
            changes.append(("CONDITION_RAISED", _change(now_c, was.severity)))
    for condition_type, was in before.items():
        if condition_type not in after:
            changes.append(("CONDITION_CLEARED", _change(was)))
    return changes


def _change(condition: wire.Condition, previous: str | None = None) -> wire.ConditionChange:
    return wire.ConditionChange(type=condition.type, reason=condition.reason, severity=condition.severity,
                                message=condition.message, previous_severity=previous,  # type: ignore[arg-type]
                                recommended_action=condition.recommended_action)


def health(node: NodeState) -> wire.Health:
    """ING-5: Unknown when the node cannot be fully seen, unless real fault evidence shows."""
    if node.last_report_at is None or node.missed:
        return "UNKNOWN"
    if any(t not in NOT_REAL_FAULTS for t in node.conditions):
        return "DEGRADED"
    if "collector_failed" in node.conditions:
        return "UNKNOWN"
    return "HEALTHY"


# ---------------------------------------------------------------------------- heartbeat


def miss_deadline(node: NodeState, threshold: int) -> datetime | None:
    """ING-4: last report + max(15 s, threshold * min(interval, 24 h)); None if never reported."""
    if node.last_report_at is None:
        return None
    window = max(HEARTBEAT_FLOOR_S, threshold * min(max(node.interval_s, 1), INTERVAL_CAP_S))
    return node.last_report_at + timedelta(seconds=window)


def heartbeat_condition(node: NodeState, now: datetime) -> wire.Condition:
    last = node.last_report_at.isoformat().replace("+00:00", "Z") if node.last_report_at else "never"
    return wire.Condition(type="heartbeat_missed", reason="HeartbeatMissed", severity="warning",
                          message=f"no report since {last}", first_seen=now, observations=1)


# ---------------------------------------------------------------------------- the fold


class Change(msgspec.Struct, frozen=True):
    """One node event to append, before it gets its id and time."""

    type: str
    message: str
    condition: wire.ConditionChange | None = None
    fault: wire.FaultObservation | None = None  # FAULT_OBSERVED (RUL-1)
    rule: wire.RuleFiring | None = None  # RULE_FIRED (RUL-1)


# Custom detectors (POL-8): given the report and the conditions the built-in rules found on
# it, what else the node carries. Pure, so a replay reaches the same conditions.
Detect = Callable[[wire.HealthReport, Mapping[str, wire.Condition]], list[Detection]]


def assess(state: IngestState, report: wire.HealthReport, now: datetime, seq: int,
           detect: Detect | None = None) -> tuple[NodeState, list[Change]]:
    """Fold one report: conditions, heartbeat resumption, and the events to append."""
    key = node_key(report.cluster, report.node_id)
    node = state.nodes.get(key)
    if node is None:
        node = state.nodes[key] = NodeState(cluster=sys.intern(report.cluster), node_id=report.node_id)
    changes: list[Change] = []
    before = dict(node.conditions)
    if node.missed:
        node.missed = False
        changes.append(Change("HEARTBEAT_RESUMED", f"Node {report.node_id} reporting again"))
    if node.climbs is not None:
        _migrate_climbs(node)
    if node.sticky_refused and len(node.sticky) < STICKY_MAX:
        node.sticky_refused = 0  # room again (serviced, a device replaced): a new cap is a new occurrence
    found = findings(node, report, state.config)
    previous = {k: v for k, v in before.items() if k != "heartbeat_missed"}
    if detect is not None:
        found += [Finding(d.condition, d.reason, d.severity, d.message)
                  for d in detect(report, conditions_from(found, previous, now))]
    after = conditions_from(found, previous, now)
    node.conditions = after or heap.EMPTY
    node.last_report_at, node.last_report_seq = now, seq
    node.interval_s = report.interval_seconds
    node.report_sent_at = report.sent_at
    changes += [Change(kind, _condition_message(kind, change), change) for kind, change in condition_events(before, after)]
    return node, changes


def serviced(state: IngestState, cluster: str, node_id: str, now: datetime) -> tuple[NodeState | None, list[Change]]:
    """ING-3: service recorded: every sticky fault of the node clears now."""
    node = state.nodes.get(node_key(cluster, node_id))
    if node is None or not node.sticky:
        return node, []
    sticky_types = {s.finding.type for s in node.sticky.values()}
    node.sticky = heap.EMPTY
    node.windows = None  # RUL-1: a serviced node counts afresh
    before = dict(node.conditions)
    # What is not sticky stays as the last report showed it; the next report re-evaluates.
    node.conditions = {t: c for t, c in node.conditions.items() if t not in sticky_types} or heap.EMPTY
    return node, [Change(kind, _condition_message(kind, change), change)
                  for kind, change in condition_events(before, node.conditions)]


VALIDATION_KEY: Final = "validation"


def validated(state: IngestState, event: wire.NodeEvent) -> tuple[NodeState | None, list[Change]]:
    """VAL-1: a failed validation of this node alone raises ``validation_failed`` (critical),
    held like a sticky fault until a later pass or a service record; a pass clears it. A run
    over several nodes that failed names none of them (an isolation goes on to find which),
    unless it ran across a domain (DOM-4): then the domain's fabric failed, and every member
    carries it."""
    node = state.nodes.get(node_key(event.cluster, event.node_id))
    record = event.validation
    if node is None or record is None:
        return node, []
    before = dict(node.conditions)
    if event.type == "VALIDATION_FAILED" and (record.nodes == 1 or record.domain is not None):
        across = f" (across domain {record.domain})" if record.domain is not None else ""
        finding = Finding("validation_failed", "ValidationFailed", "critical",
                          f"suite {record.suite}{across}: {record.reason or 'failed'}")
        node.sticky = {**node.sticky, VALIDATION_KEY: Sticky(finding)}
        found = conditions_from([finding], before, event.occurred_at)
        node.conditions = {**before, "validation_failed": found["validation_failed"]}
    elif event.type == "VALIDATION_PASSED" and (VALIDATION_KEY in node.sticky or _validating_rules(state, node)):
        # A pass clears validation_failed and answers the promotion rules that asked for one
        # (RUL-1); a failure keeps them.
        answered = _validating_rules(state, node)
        reasons = {k.removeprefix(RULE_KEY) for k in answered}
        if VALIDATION_KEY in node.sticky:
            answered.add(VALIDATION_KEY)
            reasons.add("ValidationFailed")
        node.sticky = {k: v for k, v in node.sticky.items() if k not in answered} or heap.EMPTY
        node.conditions = {t: c for t, c in node.conditions.items() if c.reason not in reasons} or heap.EMPTY
    else:
        return node, []
    return node, [Change(kind, _condition_message(kind, change), change)
                  for kind, change in condition_events(before, node.conditions)]


def scheduler_word(state: IngestState, event: wire.NodeEvent) -> tuple[NodeState | None, list[Change]]:
    """JOB-4: SCHEDULER_DRAINED raises (or updates) ``scheduler_drained`` with the scheduler's
    reason and who set it; SCHEDULER_UNDRAINED clears it. A node that has not reported yet keeps
    it for its first report (None: nothing to assess now)."""
    drain = event.scheduler
    if drain is None:
        return None, []
    key = node_key(event.cluster, event.node_id)
    node = state.nodes.get(key)
    if node is None:
        node = state.nodes[key] = NodeState(cluster=sys.intern(event.cluster), node_id=event.node_id)
    before = dict(node.conditions)
    if event.type == "SCHEDULER_DRAINED":
        node.scheduler_drain = Finding("scheduler_drained", SCHEDULER_REASONS[drain.state], "warning", event.message)
        if node.last_report_at is None:
            return None, []
        found = conditions_from([node.scheduler_drain], before, event.occurred_at)
        node.conditions = {**before, "scheduler_drained": found["scheduler_drained"]}
    elif node.scheduler_drain is not None:
        node.scheduler_drain = None
        if node.last_report_at is None:
            return None, []
        node.conditions = heap.without(node.conditions, "scheduler_drained")
    else:
        return None, []
    return node, [Change(kind, _condition_message(kind, change), change)
                  for kind, change in condition_events(before, node.conditions)]


# ---------------------------------------------------------------------------- job outcomes (JOB-2, JOB-3)

JOB_CONDITION: Final = "job_failures_anomalous"


def job_finding(record: jobs.NodeRecord, config: jobs.JobTestConfig) -> Finding | None:
    """The condition's finding while the test holds it: a warning (the score's penalty gates
    the node, JOB-3), critical and for a human (CONTACT_SUPPORT: the catalog's needs-attention,
    XID-2) when the node passed a validation since and its jobs still fail."""
    if record.verdict is None:
        return None
    message = record.verdict.message(config)
    if record.validated:
        return Finding(JOB_CONDITION, "JobFailuresAfterValidation", "critical",
                       f"{message}; after a passed validation", "CONTACT_SUPPORT")
    return Finding(JOB_CONDITION, "JobFailuresAnomalous", "warning", message)


def job_outcome(state: IngestState, outcome: wire.JobOutcome, at: datetime) -> tuple[NodeState | None, list[Change]]:
    """JOB-2: one outcome folded, and the node it ran on looked at again."""
    config = state.config.jobs
    record = jobs.fold(state.jobs, outcome, config)
    if record is None or not config.enabled:
        return None, []
    jobs.judged(record, jobs.look(state.jobs, outcome.cluster, outcome.node_id, config), config)
    return _job_condition(state, outcome.cluster, outcome.node_id, record, at)


def job_validation(state: IngestState, event: wire.NodeEvent) -> tuple[NodeState | None, list[Change]]:
    """JOB-3 and VAL-3 on a validation's verdict: an isolation's narrows the blame of the job
    it looks into (the node named carries the whole failure, one cleared none); any other pass
    restarts the node's count, and clears the condition."""
    record = state.jobs.nodes.get(node_key(event.cluster, event.node_id))
    check = event.validation
    if record is None or check is None:
        return None, []
    config = state.config.jobs
    if check.isolating is not None:
        named = event.type == "VALIDATION_FAILED"
        if named and check.nodes != 1:
            return None, []  # a group failed: it names none of its nodes
        jobs.isolated(state.jobs, event.cluster, check.isolating, event.node_id, named)
        jobs.judged(record, jobs.look(state.jobs, event.cluster, event.node_id, config), config)
    elif event.type == "VALIDATION_PASSED":
        jobs.passed(record, event.occurred_at)
    return _job_condition(state, event.cluster, event.node_id, record, event.occurred_at)


def job_serviced(state: IngestState, cluster: str, node_id: str, now: datetime) -> tuple[NodeState | None, list[Change]]:
    """Service recorded: the node's runs count afresh."""
    record = state.jobs.nodes.get(node_key(cluster, node_id))
    if record is None:
        return None, []
    jobs.serviced(record, now)
    return _job_condition(state, cluster, node_id, record, now)


def _job_condition(state: IngestState, cluster: str, node_id: str, record: jobs.NodeRecord,
                   now: datetime) -> tuple[NodeState | None, list[Change]]:
    finding = job_finding(record, state.config.jobs)
    node = state.nodes.get(node_key(cluster, node_id))
    if node is None:
        if finding is None:
            return None, []
        node = state.nodes[node_key(cluster, node_id)] = NodeState(cluster=sys.intern(cluster), node_id=node_id)
    node.job_failures = finding
    if node.last_report_at is None:
        return None, []  # held for its first report
    before = dict(node.conditions)
    if finding is None:
        node.conditions = heap.without(before, JOB_CONDITION)
    else:
        node.conditions = {**before, JOB_CONDITION: conditions_from([finding], before, now)[JOB_CONDITION]}
    return node, [Change(kind, _condition_message(kind, change), change)
                  for kind, change in condition_events(before, node.conditions)]


def missed(node: NodeState, now: datetime, why: str = "") -> list[Change]:
    """ING-4: the node went silent past its deadline (or, with ``why``, with its domain: DOM-3)."""
    node.missed = True
    before = dict(node.conditions)
    node.conditions = {**node.conditions, "heartbeat_missed": heartbeat_condition(node, now)}
    last = node.last_report_at.isoformat().replace("+00:00", "Z") if node.last_report_at else "never"
    message = f"Node {node.node_id} missed its heartbeat; last report {last}" + (f"; {why}" if why else "")
    return [Change("HEARTBEAT_MISSED", message)] + [
        Change(kind, _condition_message(kind, change), change) for kind, change in condition_events(before, node.conditions)]


def _condition_message(kind: str, change: wire.ConditionChange) -> str:
    label = wire.condition_title(change.type)
    if kind == "CONDITION_CLEARED":
        return f"{label} cleared"
    if change.previous_severity:
        return f"{label} [{change.severity.title()}] (was {change.previous_severity.title()}): {change.message}"
    return f"{label} [{change.severity.title()}] {change.message}"


# ---------------------------------------------------------------------------- promotion rules (RUL-1)

RULE_KEY: Final = "rule."
# How a firing's finding is graded, by its rule's action: a human or a remedy is critical (the
# node leaves service through policy and the ladder); a validation asked for is a warning.
RULE_SEVERITY: Final = {"needs-attention": "critical", "remediate": "critical", "validate": "warning"}


def _last(node: NodeState, key: str) -> int | None:
    packed = node.counters.get(key)
    return None if packed is None else _unpack(packed)[0]


def fault_observations(node: NodeState, report: wire.HealthReport) -> list[wire.FaultObservation]:
    """RUL-1: the coded faults new in ``report`` (read before the report is folded, against the
    counters the last one left): each Xid and SXid by device, fatal machine checks and
    uncorrectable memory errors, with how many since. A kernel-log count starts at zero; a
    sysfs one's first reading is a baseline."""
    out: list[wire.FaultObservation] = []
    kmsg = report.signals.kmsg
    if kmsg.status != "unavailable":
        for entry in kmsg.xid:
            new = entry.count - (_last(node, f"xid.{entry.pci_bus_id}.{entry.xid}") or 0)
            if new > 0:
                out.append(wire.FaultObservation(
                    kind="xid", code=str(entry.xid), device=entry.pci_bus_id, count=new,
                    severity=xid_catalog.grade(entry.xid, entry.last_message),
                    recommended_action=xid_catalog.recommended_action(entry.xid, entry.last_message)))
        for sxid in kmsg.sxid:
            key = f"sxid.{sxid.device}.{sxid.sxid}"
            new = sxid.count - (_last(node, key) or 0)
            _rose(node, key, sxid.count, baseline_zero=True)  # the fold keeps no other SXid counter
            if new > 0:
                out.append(wire.FaultObservation(kind="sxid", code=str(sxid.sxid), device=sxid.device, count=new,
                                                 severity="critical"))
        new = kmsg.machine_checks.fatal - (_last(node, "kmsg.mce.fatal") or 0)
        if new > 0:
            out.append(wire.FaultObservation(kind="mce", code="fatal", count=new, severity="critical"))
        new = kmsg.edac.ue - (_last(node, "kmsg.edac.ue") or 0)
        if new > 0:
            out.append(wire.FaultObservation(kind="edac", code="ue", count=new, severity="critical"))
    if report.signals.edac.status == "ok":
        for mc in report.signals.edac.controllers:
            last = _last(node, f"edac.ue.{mc.name}")
            if last is not None and mc.ue > last:
                out.append(wire.FaultObservation(kind="edac", code="ue", device=mc.name, count=mc.ue - last,
                                                 severity="critical"))
    return out


def observed_changes(found: list[wire.FaultObservation]) -> list[Change]:
    return [Change("FAULT_OBSERVED", f"{f.kind} {f.code}" + (f" on {f.device}" if f.device else "")
                   + (f" (x{f.count})" if f.count > 1 else "")
                   + (f": {f.recommended_action}" if f.recommended_action else ""), fault=f) for f in found]


def promote(state: IngestState, node: NodeState, occurrences: Iterable[promotion.Occurrence]) -> list[Change]:
    """RUL-1, RUL-2: fold occurrences into the node's windows; a RULE_FIRED per firing, and an
    acting rule's finding held as a sticky fault (until service, or a validation's pass)."""
    rules = state.config.promotion
    if not rules:
        return []
    windows = node.windows or promotion.NodeWindows()
    changes: list[Change] = []
    for occurrence in occurrences:
        for firing in promotion.observe(rules, windows, occurrence):
            acts = firing.mode == "act" and firing.action != "none"
            changes.append(Change("RULE_FIRED", firing.message, rule=wire.RuleFiring(
                rule=firing.rule, mode=firing.mode, action=firing.action,  # type: ignore[arg-type]
                count=firing.count, devices=list(firing.devices), first_at=firing.first_at,
                condition=firing.condition if acts else None)))
            if acts:
                _sticky(node, f"{RULE_KEY}{firing.rule}", Finding(
                    firing.condition, firing.rule, RULE_SEVERITY[firing.action], firing.message,
                    promotion.ACTION_BUCKET[firing.action], promoted=True),
                    firing.devices[0] if len(firing.devices) == 1 else "")
    node.windows = windows if windows.counted or windows.devices or windows.reboots else None
    return changes


def promote_on_event(state: IngestState, event: wire.NodeEvent) -> tuple[NodeState | None, list[Change]]:
    """RUL-1 on eviction's events (remediations, reboots): a firing raises its condition now,
    not at the node's next report."""
    node = state.nodes.get(node_key(event.cluster, event.node_id))
    occurrences = promotion.occurrences_of(event)
    if node is None or not occurrences:
        return node, []
    return node, promote_now(state, node, occurrences, event.occurred_at)


def promote_now(state: IngestState, node: NodeState, occurrences: Iterable[promotion.Occurrence],
                now: datetime) -> list[Change]:
    """``promote``, and the conditions of the findings it added raised at once (on an event, or
    on the conditions a report raised: the report's own findings are already folded)."""
    held = set(node.sticky)
    changes = promote(state, node, occurrences)
    added = [s.finding for k, s in node.sticky.items() if k not in held]
    if added:
        before = dict(node.conditions)
        node.conditions = {**before, **conditions_from(added, before, now)}
        changes += [Change(kind, _condition_message(kind, change), change)
                    for kind, change in condition_events(before, node.conditions)]
    return changes


def raised_occurrences(state: IngestState, changes: Iterable[Change], at: datetime) -> list[promotion.Occurrence]:
    """The conditions a report raised, as occurrences, where a rule counts conditions."""
    raised = [c.condition for c in changes if c.type == "CONDITION_RAISED" and c.condition is not None]
    if not raised or not any(rule.kind == "condition" for rule in state.config.promotion):
        return []  # the common report raises nothing
    return [promotion.of_raise(condition, at) for condition in raised]


def _validating_rules(state: IngestState, node: NodeState) -> set[str]:
    """The sticky keys of the node's rule findings whose rule asked for a validation."""
    validating = {f"{RULE_KEY}{rule.name}" for rule in state.config.promotion if rule.action == "validate"}
    return {k for k in node.sticky if k in validating}
