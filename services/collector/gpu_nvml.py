"""NVIDIA GPU health rules for NVML (``nvidia-ml-py``; FORMATS.md §7) and ``nvidia-smi``.

The rules both GPU sources share live here as pure functions: clock-event reason names
and the throttling rule (COL-9), what an ECC reading is when the card does not expose
one (COL-10), and what NVML's GPU fabric info says of the GPU's NVLink domain (DOM-1).
``probe.read_gpu_nvml`` is the blocking adapter that calls the driver.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal

from healthplane.contracts import wire

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

# NVML_FEATURE_DISABLED (FORMATS.md §7), repeated so the rules need no pynvml import.
_NVML_FEATURE_DISABLED: Final = 0


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


# ---------------------------------------------------------------------------- fabric (DOM-1)

# nvmlGpuFabricState_t (pynvml 13.615.71, verbatim values).
_NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: Final = 0
_FABRIC_STATES: Final[Mapping[int, wire.GpuFabricState]] = {
    1: "not-started",  # NVML_GPU_FABRIC_STATE_NOT_STARTED
    2: "in-progress",  # NVML_GPU_FABRIC_STATE_IN_PROGRESS
    3: "completed",  # NVML_GPU_FABRIC_STATE_COMPLETED
}
_NVML_SUCCESS: Final = 0
NVML_GPU_FABRIC_UUID_LEN: Final = 16


def fabric_info(cluster_uuid: bytes | Sequence[int], clique_id: int, state: int,
                status: int) -> wire.GpuFabric | None:
    """One ``nvmlGpuFabricInfo*_t`` (its ``clusterUuid`` bytes, ``cliqueId``, ``state`` and
    ``status``, the nvmlReturn_t of the GPU's fabric registration) as the report's record.

    None when the GPU has no fabric (state NOT_SUPPORTED, or a state NVML did not have when
    this was written). A registration that completed with an error status is ``failed``."""
    if state == _NVML_GPU_FABRIC_STATE_NOT_SUPPORTED or state not in _FABRIC_STATES:
        return None
    raw = bytes(cluster_uuid)
    if len(raw) != NVML_GPU_FABRIC_UUID_LEN:
        return None
    named = _FABRIC_STATES[state]
    if named == "completed" and status != _NVML_SUCCESS:
        named = "failed"
    return wire.GpuFabric(cluster_uuid=str(uuid.UUID(bytes=raw)), clique_id=int(clique_id), state=named)


def fabric_of_struct(info: Any) -> wire.GpuFabric | None:
    """A filled ``c_nvmlGpuFabricInfo_t`` / ``c_nvmlGpuFabricInfo_v2_t`` (or anything with the
    same fields) → :func:`fabric_info`."""
    return fabric_info(bytes(info.clusterUuid), int(info.cliqueId), int(info.state), int(info.status))
