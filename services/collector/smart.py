"""SMART via ``smartctl -j`` (COL-3, COL-4, COL-12; FORMATS.md §5).

smartctl's exit status is a bitmask of findings, not an error code: a failing disk exits
non-zero with perfectly good JSON. Only the probe itself going wrong (no JSON, the device
could not be opened, the SMART health command failed, a hang) fails the signal.

Pure parsers first (``parse_smartctl``, ``scan_devices``), then the asyncio adapter
``read_smart`` that runs the binary.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from healthplane import wire
from healthplane_collector.probe import TimedOut, run_probe

# Bit number -> name; ``smartctl.8`` EXIT STATUS and the FAIL* constants of ``smartctl.h``.
EXIT_STATUS_BITS: Final[Mapping[int, str]] = {
    0: "command_line_did_not_parse",  # FAILCMD
    1: "device_open_failed",  # FAILDEV / FAILID (also: device in a low-power mode with -n)
    2: "smart_command_failed",  # FAILSMART (or a SMART data checksum error)
    3: "disk_failing",  # FAILSTATUS: SMART status "DISK FAILING"; NVMe critical_warning != 0
    4: "prefail_attributes_failing",  # FAILATTR: prefail attribute <= threshold now
    5: "attributes_failed_in_past",  # FAILAGE: some attribute <= threshold in the past
    6: "error_log_has_errors",  # FAILERR
    7: "self_test_log_has_errors",  # FAILLOG
}

_WHEN_FAILED: Final[Mapping[str, Literal["now", "past", ""]]] = {
    "now": "now",
    "past": "past",
    "": "",
}

# Disks probed at once: enough for a JBOD to finish in a report interval, few enough not to
# queue dozens of pass-through commands on one HBA.
MAX_CONCURRENT_PROBES: Final = 8

_FAILCMD: Final = 1 << 0
_FAILDEV: Final = 1 << 1
_FAILSMART: Final = 1 << 2


class SmartParseError(ValueError):
    """smartctl printed something that is not the JSON we know; names the device."""

    def __init__(self, device: str, detail: str) -> None:
        super().__init__(f"{device}: {detail}")
        self.device = device
        self.detail = detail


def decode_exit_status(exit_status: int) -> list[str]:
    """The names of the bits set in smartctl's exit status, lowest bit first."""
    return [name for bit, name in EXIT_STATUS_BITS.items() if exit_status & (1 << bit)]


# ---------------------------------------------------------------------------- parsing


def _load_object(device: str, stdout: bytes) -> dict[str, Any]:
    try:
        document = json.loads(stdout)
    except (UnicodeDecodeError, ValueError) as exc:
        excerpt = stdout[:80].decode("utf-8", "replace").strip()
        raise SmartParseError(device, f"smartctl output is not JSON ({exc}): {excerpt!r}") from exc
    if not isinstance(document, dict):
        raise SmartParseError(
            device, f"smartctl JSON is a {type(document).__name__}, not an object"
        )
    if "json_format_version" not in document and "smartctl" not in document:
        raise SmartParseError(
            device, "JSON without json_format_version/smartctl: not smartctl -j output"
        )
    return document


def _object(device: str, parent: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = parent.get(key, {})
    if not isinstance(value, dict):
        raise SmartParseError(device, f"{key!r} is {type(value).__name__}, expected an object")
    return value


def _opt_int(device: str, parent: Mapping[str, Any], key: str) -> int | None:
    value = parent.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SmartParseError(device, f"{key!r} is {value!r}, expected an integer")
    return value


def _opt_bool(device: str, parent: Mapping[str, Any], key: str) -> bool | None:
    value = parent.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise SmartParseError(device, f"{key!r} is {value!r}, expected true/false")


def _opt_str(device: str, parent: Mapping[str, Any], key: str) -> str | None:
    value = parent.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise SmartParseError(device, f"{key!r} is {value!r}, expected a string")
    return value.strip() or None


def _attribute(device: str, entry: Any) -> wire.SmartAttribute:
    if not isinstance(entry, dict):
        raise SmartParseError(device, f"ata_smart_attributes.table entry is {entry!r}")
    attr_id = _opt_int(device, entry, "id")
    if attr_id is None:
        raise SmartParseError(device, f"ATA attribute without an id: {entry!r}")
    raw_when_failed = _opt_str(device, entry, "when_failed") or ""
    when_failed = _WHEN_FAILED.get(raw_when_failed)
    if when_failed is None:
        raise SmartParseError(device, f"attribute {attr_id} when_failed={raw_when_failed!r}")
    return wire.SmartAttribute(
        id=attr_id,
        name=_opt_str(device, entry, "name") or f"Unknown_Attribute_{attr_id}",
        value=_opt_int(device, entry, "value"),
        worst=_opt_int(device, entry, "worst"),
        thresh=_opt_int(device, entry, "thresh"),
        raw=_opt_int(device, _object(device, entry, "raw"), "value"),
        when_failed=when_failed,
    )


def _error_messages(device: str, document: Mapping[str, Any]) -> str | None:
    messages = _object(device, document, "smartctl").get("messages", [])
    if not isinstance(messages, list):
        raise SmartParseError(device, "smartctl.messages is not a list")
    errors = [
        str(item.get("string", "")).strip()
        for item in messages
        if isinstance(item, dict) and item.get("severity") == "error"
    ]
    return "; ".join(e for e in errors if e) or None


def parse_smartctl(name: str, exit_status: int, stdout: bytes) -> wire.SmartDevice:
    """One ``smartctl -j -a`` run → the device's SMART reading (ATA, NVMe, SCSI).

    ``exit_status`` is the process's return code: a bitmask of findings (§5.1), kept
    decoded beside the reading. Raises ``SmartParseError`` naming ``name`` for output that
    is not smartctl JSON (COL-12).
    """
    return _parse(name, exit_status, stdout)[0]


def _parse(name: str, exit_status: int, stdout: bytes) -> tuple[wire.SmartDevice, bool | None]:
    """The reading, and ``smart_support.available`` (None when smartctl did not say)."""
    document = _load_object(name, stdout)
    device_info = _object(name, document, "device")
    smart_status = _object(name, document, "smart_status")
    nvme_log = _object(name, document, "nvme_smart_health_information_log")

    critical_warning = _opt_int(name, nvme_log, "critical_warning")
    if critical_warning is None:
        critical_warning = _opt_int(name, _object(name, smart_status, "nvme"), "value")

    passed = _opt_bool(name, smart_status, "passed")
    if passed is None and critical_warning is not None:
        # nvmeprint.cpp derives "passed" as exactly !critical_warning.
        passed = critical_warning == 0

    table = _object(name, document, "ata_smart_attributes").get("table", [])
    if not isinstance(table, list):
        raise SmartParseError(name, "ata_smart_attributes.table is not a list")
    attributes = [_attribute(name, entry) for entry in table]

    reading = wire.SmartDevice(
        name=name,
        protocol=_opt_str(name, device_info, "protocol"),
        model=_opt_str(name, document, "model_name") or _opt_str(name, document, "scsi_model_name"),
        serial=_opt_str(name, document, "serial_number"),
        passed=passed,
        exit_status=exit_status,
        exit_status_bits=decode_exit_status(exit_status),
        critical_warning=critical_warning,
        failing_now=[a for a in attributes if a.when_failed == "now"],
        failed_in_past=[a for a in attributes if a.when_failed == "past"],
        error=_error_messages(name, document),
    )
    return reading, _opt_bool(name, _object(name, document, "smart_support"), "available")


def probe_failure(device: wire.SmartDevice, smart_available: bool | None = None) -> str | None:
    """Why this reading is not a reading (the probe failed), or None when it is one.

    A rejected command line and an open failure are probe failures. A failed SMART command
    is one only when no health verdict came back from a device that does not say it lacks
    SMART (a USB stick or virtual disk without SMART is not a broken sensor).
    """
    detail = f": {device.error}" if device.error else ""
    if device.exit_status & _FAILCMD:
        return f"smartctl rejected its command line for {device.name}{detail}"
    if device.exit_status & _FAILDEV:
        return f"smartctl could not open {device.name}{detail}"
    if device.exit_status & _FAILSMART and device.passed is None and smart_available is not False:
        return f"SMART health command failed on {device.name}{detail}"
    return None


@dataclass(frozen=True, slots=True)
class ScannedDevice:
    """One entry of ``smartctl --scan[-open] -j``: what to pass back as ``-d TYPE NAME``."""

    name: str
    type: str | None = None
    protocol: str | None = None
    open_error: str | None = None  # only --scan-open
    label: str = ""  # the device's name in reports: ``name`` unless shared (scan_devices)

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.name)


def scan_devices(stdout: bytes) -> list[ScannedDevice]:
    """Parse ``smartctl --scan -j`` or ``--scan-open -j`` (``devices[]``, smartctl.cpp).

    A name listed more than once (``/dev/bus/0`` behind a MegaRAID controller, one entry
    per ``megaraid,N``) is labelled ``NAME [TYPE]`` so every disk keeps its own name.
    """
    where = "smartctl --scan"
    document = _load_object(where, stdout)
    entries = document.get("devices", [])
    if not isinstance(entries, list):
        raise SmartParseError(where, "devices is not a list")
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise SmartParseError(where, f"device entry without a name: {entry!r}")
    names = [entry["name"] for entry in entries]
    scanned: list[ScannedDevice] = []
    for entry in entries:
        name: str = entry["name"]
        dev_type = _opt_str(name, entry, "type")
        shared = names.count(name) > 1 and dev_type is not None
        scanned.append(
            ScannedDevice(
                name=name,
                type=dev_type,
                protocol=_opt_str(name, entry, "protocol"),
                open_error=_opt_str(name, entry, "open_error"),
                label=f"{name} [{dev_type}]" if shared else name,
            )
        )
    return scanned


# ---------------------------------------------------------------------------- adapter




def _first_line(data: bytes) -> str:
    for line in data.decode("utf-8", "replace").splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""


async def _read_device(
    smartctl: str, device: ScannedDevice, timeout_s: float
) -> tuple[wire.SmartDevice, str | None]:
    """One disk: its reading, and why the signal must fail because of it (or None).

    A disk whose probe failed still gets an entry (``passed`` null, ``error`` set), so the
    report names every disk the scan found.
    """
    problem: str | None
    if device.open_error:
        problem = f"smartctl could not open {device.label}: {device.open_error}"
        return _unread(device, problem), problem
    argv = [smartctl, "-j", "-a"]
    if device.type:
        argv += ["-d", device.type]
    argv.append(device.name)  # smartctl wants the device name last
    try:
        completed = await run_probe(argv, timeout_s)
    except TimedOut:
        problem = f"smartctl -a {device.label} timed out after {timeout_s:g}s and was killed"
        return _unread(device, problem), problem
    except OSError as exc:
        problem = f"cannot run {smartctl} for {device.label}: {exc}"
        return _unread(device, problem), problem
    if completed.returncode < 0:
        problem = f"smartctl -a {device.label} died of signal {-completed.returncode}"
        return _unread(device, problem), problem
    try:
        reading, smart_available = _parse(device.label, completed.returncode, completed.stdout)
    except SmartParseError as exc:
        stderr = _first_line(completed.stderr)
        problem = f"smartctl -a {exc}" + (f" (stderr: {stderr})" if stderr else "")
        return _unread(device, problem), problem
    problem = probe_failure(reading, smart_available)
    if problem and reading.error is None:
        reading = msgspec.structs.replace(reading, error=problem)
    return reading, problem


def _unread(device: ScannedDevice, problem: str) -> wire.SmartDevice:
    return wire.SmartDevice(name=device.label, protocol=device.protocol, error=problem)


async def read_smart(smartctl: str | None = None, timeout_s: float = 10.0) -> wire.SmartSignal:
    """The SMART signal: scan, then ``smartctl -j -a`` every disk concurrently (COL-3/4/12).

    unavailable: no smartctl, or no disk it can address. failed: the scan or any disk's
    probe went wrong (timeout, garbage, open failure); ``reason`` names each such disk and
    ``devices`` still lists every disk, the unread ones with ``passed`` null and ``error``.
    """
    binary = shutil.which(smartctl or "smartctl")
    if binary is None:
        why = (
            f"smartctl not found at {smartctl}"
            if smartctl
            else "smartctl not found on PATH (smartmontools not installed)"
        )
        return wire.SmartSignal(status="unavailable", reason=why)

    try:
        scan = await run_probe([binary, "-j", "--scan"], timeout_s)
    except TimedOut:
        return wire.SmartSignal(
            status="failed", reason=f"smartctl --scan timed out after {timeout_s:g}s and was killed"
        )
    except OSError as exc:
        return wire.SmartSignal(status="failed", reason=f"cannot run {binary}: {exc}")
    try:
        scanned = scan_devices(scan.stdout)
    except SmartParseError as exc:
        return wire.SmartSignal(status="failed", reason=str(exc))
    if not scanned:
        if scan.returncode != 0:
            return wire.SmartSignal(
                status="failed",
                reason=f"smartctl --scan exited {scan.returncode} listing no devices",
            )
        return wire.SmartSignal(
            status="unavailable", reason="smartctl --scan found no SMART-capable devices"
        )

    slots = asyncio.Semaphore(MAX_CONCURRENT_PROBES)

    async def probe(device: ScannedDevice) -> tuple[wire.SmartDevice, str | None]:
        async with slots:
            return await _read_device(binary, device, timeout_s)

    results = await asyncio.gather(*(probe(device) for device in scanned))
    devices = [reading for reading, _ in results]
    problems = [problem for _, problem in results if problem]
    if problems:
        return wire.SmartSignal(status="failed", reason="; ".join(problems), devices=devices)
    return wire.SmartSignal(status="ok", devices=devices)
