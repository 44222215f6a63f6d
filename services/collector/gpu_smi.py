"""NVIDIA GPU health from ``nvidia-smi -q -x``, the fallback when NVML is absent (FORMATS.md §8).

Every layout FORMATS.md §8 shows is read: ``clocks_event_reasons`` (R535+) and
``clocks_throttle_reasons`` (older), a whole reasons block of ``N/A`` (vGPU), ECC counters
per memory location as ``sram_*``/``dram_*`` (with SRAM uncorrectable split into
``_parity``/``_secded`` on newer drivers) or the oldest ``single_bit``/``double_bit`` blocks,
``remapped_rows`` as a block or ``N/A``. Values carry units (``45 C``, ``81920 MiB``), booleans
are ``Yes``/``No``, anything unsupported is ``N/A``. ``product_name`` and
``fb_memory_usage/total`` (MiB) are what the resource report's GPU entries carry (COL-11).

The COL-9 throttling rule and the COL-10 ECC rule are shared with NVML (``gpu_nvml``).

Pure: ``parse_nvidia_smi_xml`` and ``run_outcome`` (what a finished run means);
``probe.read_gpu_smi`` runs the binary, bounded by its timeout.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Final

from healthplane.contracts import wire
from healthplane_collector.gpu_nvml import EccMode, ecc_reading, throttle_from_reasons
from healthplane_collector.pci import normalize

# What nvidia-smi prints for a value it does not have.
_ABSENT: Final = frozenset(
    {"", "n/a", "[n/a]", "not supported", "[not supported]", "not available"}
)

# XML reason tag suffix -> NVML name (the bit names of gpu_nvml.CLOCK_EVENT_REASONS).
_XML_REASONS: Final = {
    "gpu_idle": "GpuIdle",
    "applications_clocks_setting": "ApplicationsClocksSetting",
    "sw_power_cap": "SwPowerCap",
    "hw_slowdown": "HwSlowdown",
    "sync_boost": "SyncBoost",
    "sw_thermal_slowdown": "SwThermalSlowdown",
    "hw_thermal_slowdown": "HwThermalSlowdown",
    "hw_power_brake_slowdown": "HwPowerBrakeSlowdown",
    "display_clocks_setting": "DisplayClockSetting",
}
_REASON_BLOCKS: Final = (
    ("clocks_event_reasons", "clocks_event_reason_"),
    ("clocks_throttle_reasons", "clocks_throttle_reason_"),
)

# Output that means a GPU dropped off the bus or cannot be reached (COL-8).
_LOST_GPU: Final = re.compile(
    r"GPU is lost|fallen off the bus|Unable to determine the device handle", re.IGNORECASE
)
_NO_DRIVER: Final = re.compile(r"couldn't communicate with the NVIDIA driver", re.IGNORECASE)
_NO_DEVICES: Final = re.compile(r"No devices were found", re.IGNORECASE)


class GpuSmiParseError(ValueError):
    """``nvidia-smi -q -x`` output we cannot read; says where."""


@dataclass(frozen=True, slots=True)
class SmiLog:
    """What one ``nvidia-smi -q -x`` run reported."""

    driver_version: str | None
    devices: list[wire.GpuDevice] = field(default_factory=list)


# ---------------------------------------------------------------------------- values


def _absent(text: str) -> bool:
    return text.strip().lower() in _ABSENT


def _opt_text(element: ET.Element, path: str) -> str | None:
    text = element.findtext(path)
    if text is None or _absent(text):
        return None
    return text.strip()


def _count(where: str, text: str | None) -> int | None:
    """``"12"`` / ``"45 C"`` / ``"96 bank(s)"`` → int; ``N/A`` → None; anything else raises."""
    if text is None or _absent(text):
        return None
    number = text.strip().split(maxsplit=1)[0]
    try:
        return int(number)
    except ValueError:
        raise GpuSmiParseError(f"{where}: {text.strip()!r} is not a number") from None


_MEMORY_UNITS: Final = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _memory_bytes(where: str, text: str | None) -> int | None:
    """``"81920 MiB"`` → bytes; ``N/A`` → None; a number without a known unit raises."""
    if text is None or _absent(text):
        return None
    parts = text.split()
    if len(parts) == 2 and parts[0].isdigit() and parts[1] in _MEMORY_UNITS:
        return int(parts[0]) * _MEMORY_UNITS[parts[1]]
    raise GpuSmiParseError(f"{where}: {text.strip()!r} is not an amount of memory")


def _yes_no(where: str, text: str | None) -> bool | None:
    if text is None or _absent(text):
        return None
    value = text.strip().lower()
    if value in ("yes", "no"):
        return value == "yes"
    raise GpuSmiParseError(f"{where}: {text.strip()!r} is neither Yes nor No")


# ---------------------------------------------------------------------------- blocks


def ecc_mode(where: str, gpu: ET.Element) -> EccMode:
    """``ecc_mode/current_ecc``: Enabled / Disabled / N/A (consumer and vGPU cards)."""
    text = _opt_text(gpu, "ecc_mode/current_ecc")
    if text is None:
        return "unsupported"
    if text.lower() == "enabled":
        return "enabled"
    if text.lower() == "disabled":
        return "disabled"
    raise GpuSmiParseError(f"{where}: ecc_mode/current_ecc {text!r}")


def sum_ecc_counts(where: str, block: ET.Element | None) -> wire.EccCounts | None:
    """``ecc_errors/volatile`` or ``/aggregate`` summed over every memory location.

    Flat layouts: ``*_correctable`` are corrected, ``*_uncorrectable*`` uncorrected (SRAM
    split into ``_parity``/``_secded`` or not). Oldest layout: ``single_bit`` corrected,
    ``double_bit`` uncorrected, each its ``total`` (or its locations summed when the total
    is N/A). Counters that are all N/A give None, never zeros (COL-10).
    """
    if block is None or len(block) == 0:
        return None
    corrected: list[int] = []
    uncorrected: list[int] = []
    for child in block:
        tag = child.tag
        path = f"{where}/{block.tag}/{tag}"
        if tag in ("single_bit", "double_bit"):
            total = _location_total(path, child)
            if total is not None:
                (corrected if tag == "single_bit" else uncorrected).append(total)
        elif "uncorrectable" in tag:
            _append(uncorrected, _count(path, child.text))
        elif tag.endswith("correctable"):
            _append(corrected, _count(path, child.text))
    if not corrected or not uncorrected:
        return None
    return wire.EccCounts(corrected=sum(corrected), uncorrected=sum(uncorrected))


def _append(into: list[int], value: int | None) -> None:
    if value is not None:
        into.append(value)


def _location_total(where: str, block: ET.Element) -> int | None:
    total = _count(f"{where}/total", block.findtext("total"))
    if total is not None:
        return total
    locations = [
        value
        for child in block
        if child.tag != "total"
        and (value := _count(f"{where}/{child.tag}", child.text)) is not None
    ]
    return sum(locations) if locations else None


def gpu_ecc(where: str, gpu: ET.Element) -> wire.GpuEcc:
    mode = ecc_mode(where, gpu)
    if mode != "enabled":
        return ecc_reading(mode, None, None)
    return ecc_reading(
        mode,
        sum_ecc_counts(where, gpu.find("ecc_errors/volatile")),
        sum_ecc_counts(where, gpu.find("ecc_errors/aggregate")),
    )


def _reason_name(suffix: str) -> str:
    return _XML_REASONS.get(suffix) or "".join(part.capitalize() for part in suffix.split("_"))


def gpu_throttle(where: str, gpu: ET.Element) -> wire.GpuThrottle:
    """Active clock event (throttle) reasons under either tag naming; N/A → none active."""
    for block_tag, prefix in _REASON_BLOCKS:
        block = gpu.find(block_tag)
        if block is None:
            continue
        active: list[str] = []
        for child in block:
            if not child.tag.startswith(prefix):
                continue
            state = (child.text or "").strip().lower()
            if state == "active":
                active.append(_reason_name(child.tag.removeprefix(prefix)))
            elif state != "not active" and not _absent(state):
                raise GpuSmiParseError(f"{where}/{block_tag}/{child.tag}: {child.text!r}")
        return throttle_from_reasons(active)
    return wire.GpuThrottle()


def gpu_row_remap(where: str, gpu: ET.Element) -> wire.GpuRowRemap | None:
    """``remapped_rows``; None when N/A (pre-Ampere, MIG enabled, consumer cards)."""
    block = gpu.find("remapped_rows")
    if block is None or len(block) == 0:
        return None
    path = f"{where}/remapped_rows"
    correctable = _count(f"{path}/remapped_row_corr", block.findtext("remapped_row_corr"))
    uncorrectable = _count(f"{path}/remapped_row_unc", block.findtext("remapped_row_unc"))
    pending = _yes_no(f"{path}/remapped_row_pending", block.findtext("remapped_row_pending"))
    failure = _yes_no(f"{path}/remapped_row_failure", block.findtext("remapped_row_failure"))
    if correctable is None or uncorrectable is None or pending is None or failure is None:
        return None
    return wire.GpuRowRemap(
        correctable=correctable, uncorrectable=uncorrectable, pending=pending, failed=failure
    )


def _gpu(index: int, gpu: ET.Element) -> wire.GpuDevice:
    raw_bus_id = _opt_text(gpu, "pci/pci_bus_id") or gpu.get("id")
    if raw_bus_id is None:
        raise GpuSmiParseError(f"gpu[{index}]: no PCI bus id")
    try:
        bus_id = normalize(raw_bus_id)
    except ValueError as exc:
        raise GpuSmiParseError(f"gpu[{index}]: {exc}") from None
    where = f"GPU {index} ({bus_id})"
    return wire.GpuDevice(
        index=index,
        pci_bus_id=bus_id,
        uuid=_opt_text(gpu, "uuid"),
        serial=_opt_text(gpu, "serial"),
        name=_opt_text(gpu, "product_name"),
        # The GPU's own block: each MIG device under mig_devices has one of its own.
        memory_bytes=_memory_bytes(
            f"{where}/fb_memory_usage/total", gpu.findtext("fb_memory_usage/total")
        ),
        ecc=gpu_ecc(where, gpu),
        throttle=gpu_throttle(where, gpu),
        row_remap=gpu_row_remap(where, gpu),
        temperature_c=_count(f"{where}/temperature/gpu_temp", gpu.findtext("temperature/gpu_temp")),
    )


def parse_nvidia_smi_xml(xml: bytes | str) -> SmiLog:
    """``nvidia-smi -q -x`` → driver version and one ``GpuDevice`` per ``<gpu>``.

    ``index`` is the ``<gpu>`` element's position, which is nvidia-smi's own GPU index
    (both enumerate in PCI bus order). Raises ``GpuSmiParseError`` for XML that is not an
    ``nvidia_smi_log`` or holds a value that should be a number and is not.
    """
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise GpuSmiParseError(f"nvidia-smi -q -x printed unparseable XML ({exc})") from None
    if root.tag != "nvidia_smi_log":
        raise GpuSmiParseError(f"nvidia-smi -q -x printed <{root.tag}>, not <nvidia_smi_log>")
    devices = [_gpu(index, gpu) for index, gpu in enumerate(root.findall("gpu"))]
    return SmiLog(driver_version=_opt_text(root, "driver_version"), devices=devices)


# ---------------------------------------------------------------------------- a run's outcome


def not_found(nvidia_smi: str | None) -> wire.GpuSignal:
    """No nvidia-smi binary at ``nvidia_smi`` (or on PATH when None)."""
    where = f"at {nvidia_smi}" if nvidia_smi else "on PATH"
    return wire.GpuSignal(
        status="unavailable",
        reason=f"no NVIDIA driver (nvidia-smi not found {where})",
        source="nvidia-smi",
    )


def run_outcome(returncode: int, stdout: bytes, stderr: bytes) -> wire.GpuSignal:
    """The GPU signal from one finished ``nvidia-smi -q -x`` run (COL-3, COL-4, COL-8).

    unavailable: a driver that is not loaded, or no GPU. failed: a lost GPU (whatever the
    exit status), a non-zero exit (negative: the signal that killed it) or output that
    cannot be read; ``reason`` says which.
    """
    output = stdout.decode("utf-8", "replace") + "\n" + stderr.decode("utf-8", "replace")
    lost = _matching_line(_LOST_GPU, output)
    if lost is not None:
        return wire.GpuSignal(
            status="failed",
            reason=f"nvidia-smi: {lost}",
            source="nvidia-smi",
            devices=_best_effort_devices(stdout),
        )
    if returncode != 0:
        if (line := _matching_line(_NO_DRIVER, output)) is not None:
            return wire.GpuSignal(
                status="unavailable",
                reason=f"no NVIDIA driver loaded (nvidia-smi: {line})",
                source="nvidia-smi",
            )
        if (line := _matching_line(_NO_DEVICES, output)) is not None:
            return wire.GpuSignal(
                status="unavailable",
                reason=f"no NVIDIA GPU (nvidia-smi: {line})",
                source="nvidia-smi",
            )
        how = (
            f"was killed by signal {-returncode}" if returncode < 0 else f"exited {returncode}"
        )
        detail = _first_line(output)
        return wire.GpuSignal(
            status="failed",
            reason=f"nvidia-smi -q -x {how}" + (f": {detail}" if detail else ""),
            source="nvidia-smi",
        )

    try:
        log = parse_nvidia_smi_xml(stdout)
    except GpuSmiParseError as exc:
        return wire.GpuSignal(status="failed", reason=str(exc), source="nvidia-smi")
    if not log.devices:
        return wire.GpuSignal(
            status="unavailable",
            reason="no NVIDIA GPU (nvidia-smi lists none)",
            source="nvidia-smi",
            driver_version=log.driver_version,
        )
    return wire.GpuSignal(
        status="ok", source="nvidia-smi", driver_version=log.driver_version, devices=log.devices
    )


def _matching_line(pattern: re.Pattern[str], text: str) -> str | None:
    for line in text.splitlines():
        if pattern.search(line):
            return line.strip()[:300]
    return None


def _first_line(text: str) -> str:
    return next((line.strip()[:300] for line in text.splitlines() if line.strip()), "")


def _best_effort_devices(stdout: bytes) -> list[wire.GpuDevice]:
    try:
        return parse_nvidia_smi_xml(stdout).devices
    except GpuSmiParseError:
        return []
