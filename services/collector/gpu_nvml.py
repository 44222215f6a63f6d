"""NVIDIA GPU health via NVML (``nvidia-ml-py``, imported as ``pynvml``; FORMATS.md §7).

The rules both GPU sources share live here as pure functions: clock-event reason names
and the throttling rule (COL-9), and what an ECC reading is when the card does not expose
one (COL-10). ``read_gpu_nvml`` is the blocking adapter; run it in a thread.

No driver → ``NvmlUnavailable`` so the caller can fall back to ``nvidia-smi``; a driver that
answers but cannot read a device (``GPU is lost``) → signal ``failed`` naming it (COL-8).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Literal

from healthplane import wire
from healthplane_collector.pci import normalize

# nvmlClocksEventReason* / nvmlClocksThrottleReason* bits (pynvml 13.615.71, verbatim values),
# named as NVML names them without the prefix.
CLOCK_EVENT_REASONS: Final[Mapping[int, str]] = {
    0x0000000000000001: "GpuIdle",
    0x0000000000000002: "ApplicationsClocksSetting",
    0x0000000000000004: "SwPowerCap",
    0x0000000000000008: "HwSlowdown",
    0x0000000000000010: "SyncBoost",
    0x0000000000000020: "SwThermalSlowdown",
    0x0000000000000040: "HwThermalSlowdown",
    0x0000000000000080: "HwPowerBrakeSlowdown",
    0x0000000000000100: "DisplayClockSetting",
    0x0000000000000200: "BoardLimit",  # deprecated throttle-only name
    0x0000000000000400: "Reliability",  # deprecated throttle-only name
}
_REASON_ORDER: Final[Mapping[str, int]] = {
    name: position for position, name in enumerate(CLOCK_EVENT_REASONS.values())
}

# COL-9: only these mean the hardware is protecting itself. Idle, application clocks, the
# software power cap, sync boost and display clocks are normal operation.
THERMAL_REASONS: Final = frozenset({"SwThermalSlowdown", "HwThermalSlowdown", "HwSlowdown"})
POWER_BRAKE_REASONS: Final = frozenset({"HwPowerBrakeSlowdown"})

EccMode = Literal["enabled", "disabled", "unsupported"]

ECC_DISABLED_REASON: Final = "ECC disabled"
ECC_UNSUPPORTED_REASON: Final = "ECC not supported"
ECC_NO_COUNTERS_REASON: Final = "ECC enabled but no error counters reported"

# pynvml constants (FORMATS.md §7), repeated so the pure parts need no pynvml import.
_NVML_FEATURE_DISABLED: Final = 0
_NVML_MEMORY_ERROR_TYPE_CORRECTED: Final = 0
_NVML_MEMORY_ERROR_TYPE_UNCORRECTED: Final = 1
_NVML_VOLATILE_ECC: Final = 0
_NVML_AGGREGATE_ECC: Final = 1
_NVML_TEMPERATURE_GPU: Final = 0
_NVML_ERROR_NOT_SUPPORTED: Final = 3
_NVML_ERROR_DRIVER_NOT_LOADED: Final = 9
_NVML_ERROR_LIBRARY_NOT_FOUND: Final = 12
_NVML_ERROR_FUNCTION_NOT_FOUND: Final = 13
_NVML_ERROR_GPU_IS_LOST: Final = 15


class NvmlUnavailable(Exception):
    """No NVML to talk to (library or driver missing); ``reason`` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# ---------------------------------------------------------------------------- pure rules


def clock_event_reason_names(mask: int) -> list[str]:
    """Active reasons of an NVML clocks-event bitmask, lowest bit first; unknown bits as hex."""
    names: list[str] = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            names.append(CLOCK_EVENT_REASONS.get(bit, f"0x{bit:x}"))
        bit <<= 1
    return names


def throttle_from_reasons(reasons: Iterable[str]) -> wire.GpuThrottle:
    """Every active reason, in NVML bit order; thermal / powerBrake by the COL-9 rule."""
    active = sorted(
        set(reasons), key=lambda name: (_REASON_ORDER.get(name, len(_REASON_ORDER)), name)
    )
    return wire.GpuThrottle(
        reasons=active,
        thermal=any(name in THERMAL_REASONS for name in active),
        power_brake=any(name in POWER_BRAKE_REASONS for name in active),
    )


def throttle_from_mask(mask: int) -> wire.GpuThrottle:
    """``nvmlDeviceGetCurrentClocksEventReasons`` bitmask → the wire throttle record."""
    return throttle_from_reasons(clock_event_reason_names(mask))


def ecc_reading(
    mode: EccMode, volatile: wire.EccCounts | None, aggregate: wire.EccCounts | None
) -> wire.GpuEcc:
    """One GPU's ECC record; counts only when ECC is on and counted (COL-10: never zeros)."""
    if mode == "disabled":
        return wire.GpuEcc(status="unavailable", reason=ECC_DISABLED_REASON)
    if mode == "unsupported":
        return wire.GpuEcc(status="unavailable", reason=ECC_UNSUPPORTED_REASON)
    if volatile is None and aggregate is None:
        return wire.GpuEcc(status="unavailable", reason=ECC_NO_COUNTERS_REASON)
    return wire.GpuEcc(status="ok", volatile=volatile, aggregate=aggregate)


def nvml_ecc_mode(current: int | None) -> EccMode:
    """``nvmlDeviceGetEccMode(h)[0]``; None when the call said NotSupported."""
    if current is None:
        return "unsupported"
    return "disabled" if current == _NVML_FEATURE_DISABLED else "enabled"


def nvml_ecc_counts(corrected: int | None, uncorrected: int | None) -> wire.EccCounts | None:
    """Two ``nvmlDeviceGetTotalEccErrors`` totals (already summed over memory locations)."""
    if corrected is None or uncorrected is None:
        return None
    return wire.EccCounts(corrected=corrected, uncorrected=uncorrected)


# ---------------------------------------------------------------------------- adapter


class _DeviceFailed(Exception):
    def __init__(self, index: int, bus_id: str | None, what: str, error: Exception) -> None:
        where = f"GPU {index}" + (f" ({bus_id})" if bus_id else "")
        detail = str(error)
        if getattr(error, "value", None) == _NVML_ERROR_GPU_IS_LOST:
            detail += " (fallen off the bus or otherwise inaccessible)"
        super().__init__(f"{where}: {what} failed: {detail}")


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _not_supported(error: Exception) -> bool:
    return getattr(error, "value", None) == _NVML_ERROR_NOT_SUPPORTED


def _read_device(nvml: Any, index: int) -> wire.GpuDevice:
    bus_id: str | None = None

    def call(what: str, fn: Callable[..., Any], *args: Any, optional: bool = False) -> Any:
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            if optional and _not_supported(exc):
                return None
            raise _DeviceFailed(index, bus_id, what, exc) from exc

    handle = call("nvmlDeviceGetHandleByIndex", nvml.nvmlDeviceGetHandleByIndex, index)
    raw_bus_id = _text(call("nvmlDeviceGetPciInfo", nvml.nvmlDeviceGetPciInfo, handle).busId)
    try:
        bus_id = normalize(raw_bus_id)
    except ValueError as exc:
        raise _DeviceFailed(index, None, "PCI bus id", exc) from exc

    uuid = call("nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID, handle, optional=True)
    serial = call("nvmlDeviceGetSerial", nvml.nvmlDeviceGetSerial, handle, optional=True)
    name = call("nvmlDeviceGetName", nvml.nvmlDeviceGetName, handle, optional=True)
    memory = call("nvmlDeviceGetMemoryInfo", nvml.nvmlDeviceGetMemoryInfo, handle, optional=True)

    ecc_mode = call("nvmlDeviceGetEccMode", nvml.nvmlDeviceGetEccMode, handle, optional=True)
    mode = nvml_ecc_mode(None if ecc_mode is None else int(ecc_mode[0]))
    volatile = aggregate = None
    if mode == "enabled":
        totals = {
            (error_type, counter): call(
                "nvmlDeviceGetTotalEccErrors",
                nvml.nvmlDeviceGetTotalEccErrors,
                handle,
                error_type,
                counter,
                optional=True,
            )
            for error_type in (
                _NVML_MEMORY_ERROR_TYPE_CORRECTED,
                _NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            )
            for counter in (_NVML_VOLATILE_ECC, _NVML_AGGREGATE_ECC)
        }
        volatile = nvml_ecc_counts(
            totals[(_NVML_MEMORY_ERROR_TYPE_CORRECTED, _NVML_VOLATILE_ECC)],
            totals[(_NVML_MEMORY_ERROR_TYPE_UNCORRECTED, _NVML_VOLATILE_ECC)],
        )
        aggregate = nvml_ecc_counts(
            totals[(_NVML_MEMORY_ERROR_TYPE_CORRECTED, _NVML_AGGREGATE_ECC)],
            totals[(_NVML_MEMORY_ERROR_TYPE_UNCORRECTED, _NVML_AGGREGATE_ECC)],
        )

    try:
        mask = nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) == _NVML_ERROR_FUNCTION_NOT_FOUND:
            # A driver older than R535 knows only the deprecated name.
            mask = call(
                "nvmlDeviceGetCurrentClocksThrottleReasons",
                nvml.nvmlDeviceGetCurrentClocksThrottleReasons,
                handle,
                optional=True,
            )
        elif _not_supported(exc):
            mask = None
        else:
            raise _DeviceFailed(
                index, bus_id, "nvmlDeviceGetCurrentClocksEventReasons", exc
            ) from exc

    remapped = call(
        "nvmlDeviceGetRemappedRows", nvml.nvmlDeviceGetRemappedRows, handle, optional=True
    )
    row_remap = None
    if remapped is not None:
        correctable, uncorrectable, pending, failure = remapped
        row_remap = wire.GpuRowRemap(
            correctable=int(correctable),
            uncorrectable=int(uncorrectable),
            pending=bool(pending),
            failed=bool(failure),
        )

    temperature = call(
        "nvmlDeviceGetTemperature",
        nvml.nvmlDeviceGetTemperature,
        handle,
        _NVML_TEMPERATURE_GPU,
        optional=True,
    )
    return wire.GpuDevice(
        index=index,
        pci_bus_id=bus_id,
        uuid=None if uuid is None else _text(uuid),
        serial=None if serial is None else _text(serial),
        name=None if name is None else _text(name),
        memory_bytes=None if memory is None else int(memory.total),
        ecc=ecc_reading(mode, volatile, aggregate),
        throttle=wire.GpuThrottle() if mask is None else throttle_from_mask(int(mask)),
        row_remap=row_remap,
        temperature_c=None if temperature is None else int(temperature),
    )


def read_gpu_nvml() -> wire.GpuSignal:
    """Every NVIDIA GPU through NVML (blocking; call it from a thread).

    Raises ``NvmlUnavailable`` when there is no NVML library or no loaded driver. Any other
    NVML error fails the signal; a device that cannot be read (``GPU is lost``) fails it
    naming that device, while the devices that could be read are still listed (COL-8).
    """
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
        raise NvmlUnavailable(f"nvidia-ml-py not installed ({exc})") from exc

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        if exc.value == _NVML_ERROR_LIBRARY_NOT_FOUND:
            raise NvmlUnavailable(f"no NVIDIA driver (NVML: {exc})") from exc
        if exc.value == _NVML_ERROR_DRIVER_NOT_LOADED:
            raise NvmlUnavailable(f"NVIDIA driver not loaded (NVML: {exc})") from exc
        return wire.GpuSignal(status="failed", reason=f"nvmlInit failed: {exc}", source="nvml")

    try:
        try:
            driver_version: str | None = _text(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError:
            driver_version = None
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            return wire.GpuSignal(
                status="failed",
                reason=f"nvmlDeviceGetCount failed: {exc}",
                source="nvml",
                driver_version=driver_version,
            )
        if count == 0:
            return wire.GpuSignal(
                status="unavailable",
                reason="no NVIDIA GPU (NVML lists none)",
                source="nvml",
                driver_version=driver_version,
            )
        devices: list[wire.GpuDevice] = []
        problems: list[str] = []
        for index in range(count):
            try:
                devices.append(_read_device(pynvml, index))
            except _DeviceFailed as exc:
                problems.append(str(exc))
        if problems:
            return wire.GpuSignal(
                status="failed",
                reason="; ".join(problems),
                source="nvml",
                driver_version=driver_version,
                devices=devices,
            )
        return wire.GpuSignal(
            status="ok", source="nvml", driver_version=driver_version, devices=devices
        )
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
