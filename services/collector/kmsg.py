"""The kernel ring buffer, parsed: one ``/dev/kmsg`` read → a record, one message → a finding.

Pure: no I/O, no clock, no logging. The reader (open, seek, cursor, boot id, EPIPE backoff)
hands raw reads to :func:`parse_record` and records with their wall time to
:meth:`KmsgTally.add`; :meth:`KmsgTally.signal` builds the ``kmsg`` signal of a report.

Formats are ``reference/FORMATS.md`` §1 (record) and §2.1-2.9 (messages). Decisions where the
sources leave room:

* One machine check is one MCE bank record: the line ``CPU n: Machine Check[ Exception]: g
  Bank b: status`` (or, printed by the sbridge EDAC decoder instead of the core, ``… Machine
  Check Event: …``; the core stays silent when a decoder handled the record). The ``TSC``,
  ``RIP``, ``PROCESSOR`` lines, ``Machine check events logged`` and the panic lines belong to
  a record already counted. Pre-3.x kernels printed the bank on its own ``Bank b: status``
  line; that line is the record there.
* Fatal means uncorrected: ``MCi_STATUS.UC`` (bit 61) set. That includes a previous boot's
  fatal error that the BIOS left in the banks and the kernel logs at boot. A record printed
  without its status is fatal when it came through the #MC exception (only uncorrected errors
  raise it).
* One GHES/APEI (or BERT, eMCA) hardware error record is one ``event severity: …`` line,
  printed once per record; ``info`` and ``unknown`` severities are not errors and count nowhere.
* One NVSwitch SXid event is its ``Fatal, …`` / ``Non-fatal, …`` line; the ``Severity …`` and
  ``Data {…}`` lines the driver dumps for the same error are details of it.
* A GPU that fell off the bus is Xid 79 (NVIDIA's catalog name for the fault). The driver's
  ``GPU … has fallen off the bus`` line usually follows an Xid 79 line for the same event and
  then adds nothing; when no Xid was logged (the GPU fell off before the driver was up) the
  line stands in for it, so the fault is graded even without an Xid.
* Only kernel records (facility 0) count by default: userspace can write to ``/dev/kmsg``
  but never with facility 0, so a process cannot forge an Xid or a machine check.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Final, Literal, TypeAlias

import msgspec

from healthplane.contracts import wire
from healthplane_collector.pci import normalize

KERNEL_FACILITY: Final = 0
XID_FALLEN_OFF_THE_BUS: Final = 79
_SEQ_LIMIT: Final = 1 << 64
_MCI_STATUS_UC: Final = 1 << 61


class MalformedRecord(ValueError):
    """A record that cannot be parsed: skipped and counted (``malformedRecords``, COL-12)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# ---------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    """One ``/dev/kmsg`` record. ``usec`` is monotonic microseconds since boot, not wall time."""

    seq: int
    usec: int
    level: int
    facility: int
    message: str
    continuation: Mapping[str, str] = field(default_factory=dict)
    """The `` KEY=value`` lines after the message (``SUBSYSTEM``, ``DEVICE``)."""
    fragment: bool = False
    """Flag ``c``: the kernel marked this record as a fragment of a longer line."""
    caller: str | None = None
    """``caller=T<pid>`` / ``C<cpu>`` with ``CONFIG_PRINTK_CALLER``; opaque."""


_DIGITS = re.compile(rb"[0-9]+")
_FLAGS = re.compile(rb"[\x21-\x7e]+")
_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")


def _unescape(text: bytes) -> str:
    # The kernel escapes bytes, so a UTF-8 character arrives as several \xNN: join, then decode.
    raw = _ESCAPE.sub(lambda match: bytes((int(match.group(1), 16),)), text)
    return raw.decode("utf-8", errors="replace")


def _number(value: bytes, what: str) -> int:
    if not _DIGITS.fullmatch(value):
        raise MalformedRecord(f"{what} is not a number: {value!r}")
    return int(value)


def parse_record(raw: bytes) -> KmsgRecord:
    """One ``read()`` from ``/dev/kmsg``: ``pri,seq,usec,flags[,…];message`` then `` KEY=value`` lines.

    Only the first ``;`` ends the header; fields after the fourth are ignored (``caller=`` is
    kept). Raises :class:`MalformedRecord` for anything that is not such a record.
    """
    header, separator, body = bytes(raw).partition(b";")
    if not separator:
        raise MalformedRecord("no ';' ends the header")
    fields = header.split(b",")
    if len(fields) < 4:
        raise MalformedRecord(f"header has {len(fields)} fields, needs 4: {header!r}")
    priority = _number(fields[0], "priority")
    seq = _number(fields[1], "sequence number")
    usec = _number(fields[2], "timestamp")
    if seq >= _SEQ_LIMIT:
        raise MalformedRecord(f"sequence number exceeds 64 bits: {seq}")
    flags = fields[3]
    if not _FLAGS.fullmatch(flags):
        raise MalformedRecord(f"flags field is not printable: {flags!r}")
    caller = None
    for extra in fields[4:]:
        key, equals, value = extra.partition(b"=")
        if key == b"caller" and equals:
            caller = value.decode("ascii", errors="replace")

    lines = body.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the newline that ends the record
    continuation: dict[str, str] = {}
    for line in lines[1:]:
        if not line.startswith(b" "):
            raise MalformedRecord(f"line after the message is not a continuation line: {line!r}")
        key, equals, value = line[1:].partition(b"=")
        if not equals or not key:
            raise MalformedRecord(f"continuation line is not KEY=value: {line!r}")
        continuation[_unescape(key)] = _unescape(value)
    return KmsgRecord(
        seq=seq,
        usec=usec,
        level=priority & 7,
        facility=priority >> 3,
        message=_unescape(lines[0]) if lines else "",
        continuation=continuation,
        fragment=b"c" in flags,
        caller=caller,
    )


# ---------------------------------------------------------------------------- findings

HardwareErrorSeverity = Literal["corrected", "recoverable", "fatal"]
EdacKind = Literal["ce", "ue"]
SxidSeverity = Literal["fatal", "non-fatal"]


@dataclass(frozen=True, slots=True)
class XidFinding:
    """``NVRM: Xid (PCI:dddd:bb:dd): n, …`` (COL-7). ``pci_bus_id`` is normalised."""

    pci_bus_id: str
    xid: int
    message: str


@dataclass(frozen=True, slots=True)
class GpuOffBusFinding:
    """``NVRM: GPU dddd:bb:dd.f: GPU has fallen off the bus.`` and its variants (COL-8)."""

    pci_bus_id: str
    message: str


@dataclass(frozen=True, slots=True)
class SxidFinding:
    """``nvidia-nvswitchN: SXid (PCI:…): n, …``. ``severity`` is None on a detail line."""

    device: str
    pci_bus_id: str
    sxid: int
    severity: SxidSeverity | None
    message: str


@dataclass(frozen=True, slots=True)
class MachineCheckFinding:
    """One x86 MCE bank record. ``status`` is ``MCi_STATUS`` when the line carries it."""

    fatal: bool
    cpu: int | None = None
    bank: int | None = None
    status: int | None = None


@dataclass(frozen=True, slots=True)
class HardwareErrorFinding:
    """One GHES/APEI/BERT hardware error record, by CPER severity."""

    severity: HardwareErrorSeverity


@dataclass(frozen=True, slots=True)
class EdacFinding:
    """``EDAC MCn: k CE|UE …``: ``count`` errors on memory controller ``controller``."""

    kind: EdacKind
    count: int
    controller: int


@dataclass(frozen=True, slots=True)
class RemountReadOnlyFinding:
    """``EXT4-fs (sdd1): Remounting filesystem read-only`` and the same phrase elsewhere."""

    device: str
    message: str


Finding: TypeAlias = (
    XidFinding
    | GpuOffBusFinding
    | SxidFinding
    | MachineCheckFinding
    | HardwareErrorFinding
    | EdacFinding
    | RemountReadOnlyFinding
)

_XID = re.compile(r"NVRM: Xid \((?P<address>[^)]*)\)\s*:\s*(?P<xid>\d+)\b")
_OFF_BUS_ADDRESS = re.compile(r"NVRM: (?:The NVIDIA )?GPU (?:at )?(?P<address>\S+)")
_SXID = re.compile(
    r"(?:(?P<device>\S+): )?SXid \((?P<address>[^)]*)\)\s*:\s*(?P<sxid>\d+)\b(?:,\s*(?P<detail>.*))?",
    re.DOTALL,
)
_MCE = re.compile(
    r"\bCPU (?P<cpu>\d+): Machine Check(?P<path> Exception| Event)?: [0-9a-fA-F]+"
    r" Bank (?P<bank>\d+)(?:: (?P<status>[0-9a-fA-F]{1,16})\b)?"
)
_MCE_OLD_BANK = re.compile(r"Bank (?P<bank>\d+): (?P<status>[0-9a-fA-F]{16})(?: at [0-9a-fA-F]+)?\s*")
_GHES_SEVERITY = re.compile(r"\[Hardware Error\]:\s*event severity: (?P<severity>\w+)")
_EDAC = re.compile(r"\bEDAC MC(?P<controller>\d+): (?:(?P<count>\d+) )?(?P<kind>CE|UE)\b")
_REMOUNT_RO = re.compile(r"remounting filesystem read-only", re.IGNORECASE)
_FS_DEVICE = re.compile(r"\((?:device )?(?P<device>[^()\s]+)\)")


def _pci(address: str, message: str) -> str:
    try:
        return normalize(address)
    except ValueError:
        raise MalformedRecord(f"unparsable PCI address {address!r} in {message!r}") from None


def _xid(message: str) -> XidFinding:
    match = _XID.search(message)
    if match is None:
        raise MalformedRecord(f"Xid line without address and number: {message!r}")
    return XidFinding(_pci(match["address"], message), int(match["xid"]), message.strip())


def _off_bus(message: str) -> GpuOffBusFinding:
    match = _OFF_BUS_ADDRESS.search(message)
    if match is None:
        raise MalformedRecord(f"fallen-off-the-bus line without a GPU address: {message!r}")
    return GpuOffBusFinding(_pci(match["address"].rstrip(":"), message), message.strip())


def _sxid(message: str) -> SxidFinding:
    match = _SXID.search(message)
    if match is None:
        raise MalformedRecord(f"SXid line without address and number: {message!r}")
    detail = match["detail"] or ""
    severity: SxidSeverity | None = None
    if detail.startswith("Fatal,"):
        severity = "fatal"
    elif detail.startswith("Non-fatal,"):
        severity = "non-fatal"
    return SxidFinding(
        device=match["device"] or "",
        pci_bus_id=_pci(match["address"], message),
        sxid=int(match["sxid"]),
        severity=severity,
        message=message.strip(),
    )


def _machine_check(message: str) -> MachineCheckFinding | None:
    match = _MCE.search(message)
    if match is not None:
        status = int(match["status"], 16) if match["status"] else None
        fatal = bool(status & _MCI_STATUS_UC) if status is not None else match["path"] == " Exception"
        return MachineCheckFinding(fatal, int(match["cpu"]), int(match["bank"]), status)
    old = _MCE_OLD_BANK.fullmatch(message)
    if old is not None:
        status = int(old["status"], 16)
        return MachineCheckFinding(bool(status & _MCI_STATUS_UC), None, int(old["bank"]), status)
    return None


def classify(message: str) -> Finding | None:
    """What one kernel message says about the hardware, or None when it says nothing we count.

    Raises :class:`MalformedRecord` when the message is one of ours (an Xid, an SXid, a GPU
    off the bus) but its PCI address or number cannot be parsed.
    """
    if "NVRM: Xid (" in message:
        return _xid(message)
    if "fallen off the bus" in message and "NVRM:" in message:
        return _off_bus(message)
    if "SXid (" in message:
        return _sxid(message)
    if "Machine Check" in message or message.startswith("Bank "):
        machine_check = _machine_check(message)
        if machine_check is not None:
            return machine_check
    severity = _GHES_SEVERITY.search(message)
    if severity is not None:
        value = severity["severity"]
        if value == "corrected":
            return HardwareErrorFinding("corrected")
        if value == "recoverable":
            return HardwareErrorFinding("recoverable")
        if value == "fatal":
            return HardwareErrorFinding("fatal")
        return None  # "info" is not an error; "unknown" is a severity CPER does not define
    edac = _EDAC.search(message)
    if edac is not None:
        kind: EdacKind = "ce" if edac["kind"] == "CE" else "ue"
        return EdacFinding(kind, int(edac["count"] or 1), int(edac["controller"]))
    if _REMOUNT_RO.search(message):
        device = _FS_DEVICE.search(message)
        return RemountReadOnlyFinding(device["device"] if device else "unknown", message.strip())
    return None


def is_out_of_band(finding: Finding | None) -> bool:
    """True when the finding warrants a report now rather than on schedule (COL-2).

    Machine checks, hardware error records, uncorrectable EDAC errors, Xids, and a GPU off the
    bus (an Xid 79 by another name).
    """
    match finding:
        case MachineCheckFinding() | HardwareErrorFinding() | XidFinding() | GpuOffBusFinding():
            return True
        case EdacFinding(kind="ue"):
            return True
        case _:
            return False


# ---------------------------------------------------------------------------- tally


@dataclass(slots=True)
class _XidCount:
    count: int
    last_at: datetime
    last_message: str
    stood_in: bool = False
    """Counted from a fallen-off-the-bus line; the Xid 79 line of the same event takes its place."""


@dataclass(slots=True)
class _SxidCount:
    count: int
    last_message: str


def _bus_key(bus_id: str) -> str:
    try:
        return normalize(bus_id)
    except ValueError:
        return bus_id.strip().lower()


class TallyState(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Everything a :class:`KmsgTally` counted, to carry it from one process to the next
    (``--slurm-health-check`` runs a fresh process each time, yet counts as one agent would)."""

    xid: list[tuple[str, int, _XidCount]]
    sxid: list[tuple[str, int, _SxidCount]]
    remount: dict[str, str]
    mce_corrected: int
    mce_fatal: int
    hardware_errors: dict[HardwareErrorSeverity, int]
    edac: dict[EdacKind, int]
    malformed: int


class KmsgTally:
    """Everything counted from the ring buffer since the agent started (a floor, COL-5)."""

    def __init__(self, *, kernel_only: bool = True) -> None:
        self._kernel_only = kernel_only
        self._xid: dict[tuple[str, int], _XidCount] = {}
        self._sxid: dict[tuple[str, int], _SxidCount] = {}
        self._remount: dict[str, str] = {}
        self._mce_corrected = 0
        self._mce_fatal = 0
        self._hardware_errors: dict[HardwareErrorSeverity, int] = {
            "corrected": 0, "recoverable": 0, "fatal": 0,
        }
        self._edac: dict[EdacKind, int] = {"ce": 0, "ue": 0}
        self._malformed = 0

    @property
    def malformed_records(self) -> int:
        return self._malformed

    def state(self) -> TallyState:
        return TallyState(
            xid=[(bus, xid, replace(entry)) for (bus, xid), entry in sorted(self._xid.items())],
            sxid=[(bus, sxid, replace(entry)) for (bus, sxid), entry in sorted(self._sxid.items())],
            remount=dict(self._remount), mce_corrected=self._mce_corrected, mce_fatal=self._mce_fatal,
            hardware_errors=dict(self._hardware_errors), edac=dict(self._edac), malformed=self._malformed,
        )

    @classmethod
    def from_state(cls, state: TallyState, *, kernel_only: bool = True) -> KmsgTally:
        """A tally that goes on counting from ``state``."""
        tally = cls(kernel_only=kernel_only)
        tally._xid = {(bus, xid): replace(entry) for bus, xid, entry in state.xid}
        tally._sxid = {(bus, sxid): replace(entry) for bus, sxid, entry in state.sxid}
        tally._remount = dict(state.remount)
        tally._mce_corrected, tally._mce_fatal = state.mce_corrected, state.mce_fatal
        tally._hardware_errors.update(state.hardware_errors)
        tally._edac.update(state.edac)
        tally._malformed = state.malformed
        return tally

    def add(self, record: KmsgRecord, at: datetime) -> Finding | None:
        """Fold one record seen at wall time ``at``; returns what it said, if anything.

        A message that is ours but unparsable is counted as malformed and skipped (COL-12).
        """
        if self._kernel_only and record.facility != KERNEL_FACILITY:
            return None
        try:
            finding = classify(record.message)
        except MalformedRecord:
            self._malformed += 1
            return None
        if finding is not None:
            self.add_finding(finding, at)
        return finding

    def add_malformed(self) -> None:
        """Count a record :func:`parse_record` refused."""
        self._malformed += 1

    def add_finding(self, finding: Finding, at: datetime) -> None:
        match finding:
            case XidFinding(pci_bus_id=bus, xid=xid, message=message):
                entry = self._xid.get((bus, xid))
                if entry is None:
                    self._xid[bus, xid] = _XidCount(1, at, message)
                    return
                if entry.stood_in:
                    entry.stood_in = False
                else:
                    entry.count += 1
                entry.last_at, entry.last_message = at, message
            case GpuOffBusFinding(pci_bus_id=bus, message=message):
                if (bus, XID_FALLEN_OFF_THE_BUS) not in self._xid:
                    self._xid[bus, XID_FALLEN_OFF_THE_BUS] = _XidCount(1, at, message, True)
            case SxidFinding(severity=None):
                pass
            case SxidFinding(pci_bus_id=bus, sxid=sxid, message=message):
                sxid_entry = self._sxid.get((bus, sxid))
                if sxid_entry is None:
                    self._sxid[bus, sxid] = _SxidCount(1, message)
                else:
                    sxid_entry.count += 1
                    sxid_entry.last_message = message
            case MachineCheckFinding(fatal=True):
                self._mce_fatal += 1
            case MachineCheckFinding():
                self._mce_corrected += 1
            case HardwareErrorFinding(severity=severity):
                self._hardware_errors[severity] += 1
            case EdacFinding(kind=kind, count=count):
                self._edac[kind] += count
            case RemountReadOnlyFinding(device=device, message=message):
                self._remount[device] = message

    def signal(
        self, gpus_by_pci: Mapping[str, int], backlog_skipped: bool | None
    ) -> wire.KmsgSignal:
        """The ``kmsg`` signal: every Xid listed, matched to ``gpus_by_pci`` when it can be (COL-7).

        ``gpus_by_pci`` maps a GPU's PCI bus id (any form :func:`normalize` reads) to its index.
        """
        index_by_bus = {_bus_key(bus): index for bus, index in gpus_by_pci.items()}
        return wire.KmsgSignal(
            status="ok",
            xid=[
                wire.XidEntry(
                    pci_bus_id=bus,
                    gpu_index=index_by_bus.get(bus),
                    xid=xid,
                    count=entry.count,
                    last_at=entry.last_at,
                    last_message=entry.last_message,
                )
                for (bus, xid), entry in sorted(self._xid.items())
            ],
            sxid=[
                wire.SxidEntry(
                    device=bus, sxid=sxid, count=entry.count, last_message=entry.last_message
                )
                for (bus, sxid), entry in sorted(self._sxid.items())
            ],
            machine_checks=wire.MachineChecks(
                corrected=self._mce_corrected, fatal=self._mce_fatal
            ),
            hardware_errors=wire.HardwareErrorRecords(
                corrected=self._hardware_errors["corrected"],
                recoverable=self._hardware_errors["recoverable"],
                fatal=self._hardware_errors["fatal"],
            ),
            edac=wire.KernelEdacCounts(ce=self._edac["ce"], ue=self._edac["ue"]),
            remount_read_only=[
                wire.RemountReadOnly(device=device, last_message=message)
                for device, message in sorted(self._remount.items())
            ],
            backlog_skipped=backlog_skipped,
            malformed_records=self._malformed,
        )
