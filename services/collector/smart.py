"""SMART via ``smartctl -j`` (COL-3, COL-4, COL-12; FORMATS.md §5).

smartctl's exit status is a bitmask of findings, not an error code: a failing disk exits
non-zero with perfectly good JSON. Only the probe itself going wrong (no JSON, the device
could not be opened, the SMART health command failed, a hang) fails the signal.

Pure: the parsers (``parse_smartctl``, ``scan_devices``), then what a finished run means
(``scan_outcome``, ``device_outcome``, ``smart_signal``). ``probe.read_smart`` runs the
binary, bounded by its timeout, and hands each run to these.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from healthplane.contracts import wire

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


# ---------------------------------------------------------------------------- a run's outcome

# One disk's reading, and why the signal must fail because of it (None when it need not).
DeviceOutcome = tuple[wire.SmartDevice, str | None]


def not_found(smartctl: str | None) -> wire.SmartSignal:
    """No smartctl binary at ``smartctl`` (or on PATH when None)."""
    why = (
        f"smartctl not found at {smartctl}"
        if smartctl
        else "smartctl not found on PATH (smartmontools not installed)"
    )
    return wire.SmartSignal(status="unavailable", reason=why)


def scan_outcome(returncode: int, stdout: bytes) -> list[ScannedDevice] | wire.SmartSignal:
    """``smartctl -j --scan`` → the disks to probe, or the signal when there is none to."""
    try:
        scanned = scan_devices(stdout)
    except SmartParseError as exc:
        return wire.SmartSignal(status="failed", reason=str(exc))
    if scanned:
        return scanned
    if returncode != 0:
        return wire.SmartSignal(
            status="failed", reason=f"smartctl --scan exited {returncode} listing no devices"
        )
    return wire.SmartSignal(
        status="unavailable", reason="smartctl --scan found no SMART-capable devices"
    )


def device_argv(smartctl: str, device: ScannedDevice) -> list[str]:
    argv = [smartctl, "-j", "-a"]
    if device.type:
        argv += ["-d", device.type]
    argv.append(device.name)  # smartctl wants the device name last
    return argv


def unread(device: ScannedDevice, problem: str) -> DeviceOutcome:
    """A disk whose probe failed: still an entry (``passed`` null, ``error`` set), so the
    report names every disk the scan found."""
    return wire.SmartDevice(name=device.label, protocol=device.protocol, error=problem), problem


def open_failure(device: ScannedDevice) -> DeviceOutcome | None:
    """``--scan-open`` already could not open this disk: no need to run anything for it."""
    if not device.open_error:
        return None
    return unread(device, f"smartctl could not open {device.label}: {device.open_error}")


def device_outcome(
    device: ScannedDevice, returncode: int, stdout: bytes, stderr: bytes
) -> DeviceOutcome:
    """One finished ``smartctl -j -a`` run of ``device`` (a negative ``returncode`` is the
    signal that killed it)."""
    if returncode < 0:
        return unread(device, f"smartctl -a {device.label} died of signal {-returncode}")
    try:
        reading, smart_available = _parse(device.label, returncode, stdout)
    except SmartParseError as exc:
        first = _first_line(stderr)
        return unread(device, f"smartctl -a {exc}" + (f" (stderr: {first})" if first else ""))
    problem = probe_failure(reading, smart_available)
    if problem and reading.error is None:
        reading = msgspec.structs.replace(reading, error=problem)
    return reading, problem


def smart_signal(outcomes: Sequence[DeviceOutcome]) -> wire.SmartSignal:
    """Every disk's outcome → the signal: failed when any disk's probe went wrong, its
    ``reason`` naming each such disk, ``devices`` still listing every disk."""
    devices = [reading for reading, _ in outcomes]
    problems = [problem for _, problem in outcomes if problem]
    if problems:
        return wire.SmartSignal(status="failed", reason="; ".join(problems), devices=devices)
    return wire.SmartSignal(status="ok", devices=devices)


def _first_line(data: bytes) -> str:
    for line in data.decode("utf-8", "replace").splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""
