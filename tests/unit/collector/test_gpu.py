"""NVIDIA GPU health: ``nvidia-smi -q -x`` against every XML layout of FORMATS.md §8, the NVML
rules of §7 as pure functions, and both adapters (COL-3, COL-4, COL-8, COL-9, COL-10, COL-12)."""

from __future__ import annotations

import ctypes
import shlex
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pynvml
import pytest

from healthplane.contracts import wire
from healthplane_collector.gpu_nvml import (
    CLOCK_EVENT_REASONS,
    clock_event_reason_names,
    ecc_reading,
    nvml_ecc_counts,
    nvml_ecc_mode,
    throttle_from_mask,
    throttle_from_reasons,
)
from healthplane_collector.gpu_smi import GpuSmiParseError, parse_nvidia_smi_xml, run_outcome
from healthplane_collector.probe import NvmlUnavailable, read_gpu_nvml, read_gpu_smi

FIXTURES = Path(__file__).parents[2] / "fixtures" / "collector" / "nvidia_smi"
L4 = "l4_555_event_reasons.xml"
A100 = "a100_535_mig.xml"
T4 = "t4_515_throttle_reasons.xml"
P4 = "p4_vgpu_513_na.xml"

ZERO = wire.EccCounts(corrected=0, uncorrected=0)
MIB = 1 << 20
ECC_ZERO = wire.GpuEcc(status="ok", volatile=ZERO, aggregate=ZERO)


def xml_fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def edited(name: str, values: Mapping[str, str]) -> str:
    """The fixture with element texts replaced; paths are relative to its first ``<gpu>``."""
    root = ET.fromstring(xml_fixture(name))
    gpu = root.find("gpu")
    assert gpu is not None
    for path, text in values.items():
        element = gpu.find(path)
        assert element is not None, path
        element.text = text
    return ET.tostring(root, encoding="unicode")


def only_device(xml: str) -> wire.GpuDevice:
    (device,) = parse_nvidia_smi_xml(xml).devices
    return device


# ---------------------------------------------------------------------------- layouts


@pytest.mark.parametrize(
    ("name", "driver_version", "expected"),
    [
        (
            L4,
            "555.42.06",
            wire.GpuDevice(
                index=0,
                pci_bus_id="0000:01:00.0",
                uuid="GPU-c5533cd4-5a60-059e-348d-b6d7466932e4",
                serial=None,
                name="NVIDIA L4",
                memory_bytes=None,  # the FORMATS excerpt has no fb_memory_usage
                ecc=ECC_ZERO,
                throttle=wire.GpuThrottle(reasons=["GpuIdle"], thermal=False, power_brake=False),
                row_remap=wire.GpuRowRemap(
                    correctable=0, uncorrectable=0, pending=False, failed=False
                ),
                temperature_c=45,
            ),
        ),
        (
            A100,
            "535.54.03",
            wire.GpuDevice(
                index=0,
                pci_bus_id="0000:01:00.0",
                uuid="GPU-513536b6-7d19-9063-b049-1e69664bb298",
                serial="1650522003820",
                name="NVIDIA A100-SXM4-80GB",
                memory_bytes=81920 * MIB,  # the GPU's, not a MIG device's 19968 MiB
                ecc=ECC_ZERO,
                throttle=wire.GpuThrottle(),
                row_remap=None,  # N/A while MIG is enabled
                temperature_c=27,
            ),
        ),
        (
            T4,
            "515.105.01",
            wire.GpuDevice(
                index=0,
                pci_bus_id="0000:00:1e.0",  # from 00000000:00:1E.0
                uuid="GPU-d37e67a5-91dd-3774-a5cb-99096249601a",
                serial="0000000000000",
                name="Tesla T4",
                memory_bytes=15360 * MIB,
                ecc=ECC_ZERO,
                throttle=wire.GpuThrottle(),
                row_remap=None,  # pre-Ampere: page retirement, no row remapping
                temperature_c=40,
            ),
        ),
        (
            P4,
            "513.46",
            wire.GpuDevice(
                index=0,
                pci_bus_id="0000:00:0b.0",
                uuid="GPU-1b1ea7c7-1c4b-ed49-1c72-26c65f2dd207",
                serial=None,  # N/A
                name="GRID P4-1Q",
                memory_bytes=1024 * MIB,  # the vGPU's share
                ecc=wire.GpuEcc(status="unavailable", reason="ECC not supported"),
                throttle=wire.GpuThrottle(),  # the whole reasons block is N/A
                row_remap=None,
                temperature_c=0,
            ),
        ),
    ],
)
def test_every_formats_layout_parses(
    name: str, driver_version: str, expected: wire.GpuDevice
) -> None:
    """COL-3: every nvidia-smi -q -x layout of FORMATS §8 gives the same wire record."""
    log = parse_nvidia_smi_xml((FIXTURES / name).read_bytes())
    assert log.driver_version == driver_version
    assert log.devices == [expected]


def test_index_is_position_and_every_bus_id_is_normalised() -> None:
    root = ET.fromstring(xml_fixture(T4))
    first = root.find("gpu")
    assert first is not None
    second = ET.fromstring(ET.tostring(first))
    second.set("id", "00000000:3B:00.0")
    pci_bus_id = second.find("pci/pci_bus_id")
    assert pci_bus_id is not None
    pci_bus_id.text = "00000000:3B:00.0"
    root.append(second)
    devices = parse_nvidia_smi_xml(ET.tostring(root)).devices
    assert [(d.index, d.pci_bus_id) for d in devices] == [(0, "0000:00:1e.0"), (1, "0000:3b:00.0")]


def test_bus_id_falls_back_to_the_gpu_id_attribute() -> None:
    root = ET.fromstring(xml_fixture(L4))
    pci = root.find("gpu/pci")
    gpu = root.find("gpu")
    assert pci is not None and gpu is not None
    gpu.remove(pci)
    assert only_device(ET.tostring(root, encoding="unicode")).pci_bus_id == "0000:01:00.0"


# ---------------------------------------------------------------------------- COL-9 throttle


REASON_CASES = [
    # (xml reason, NVML name, thermal, power brake)
    ("gpu_idle", "GpuIdle", False, False),
    ("applications_clocks_setting", "ApplicationsClocksSetting", False, False),
    ("sw_power_cap", "SwPowerCap", False, False),
    ("sync_boost", "SyncBoost", False, False),
    ("display_clocks_setting", "DisplayClockSetting", False, False),
    ("hw_slowdown", "HwSlowdown", True, False),
    ("sw_thermal_slowdown", "SwThermalSlowdown", True, False),
    ("hw_thermal_slowdown", "HwThermalSlowdown", True, False),
    ("hw_power_brake_slowdown", "HwPowerBrakeSlowdown", False, True),
]


@pytest.mark.parametrize(("name", "prefix"), [(L4, "event"), (A100, "event"), (T4, "throttle")])
@pytest.mark.parametrize(("reason", "nvml_name", "thermal", "power_brake"), REASON_CASES)
def test_col9_only_thermal_and_power_brake_count_under_both_namings(
    name: str, prefix: str, reason: str, nvml_name: str, thermal: bool, power_brake: bool
) -> None:
    """COL-9: every active reason is listed by its NVML name, but only SW/HW thermal, HW
    slowdown and HW power brake set thermal/powerBrake; idle, app clocks, SW power cap and
    sync boost never do. Same for clocks_event_reasons and clocks_throttle_reasons."""
    block = f"clocks_{prefix}_reasons"
    values = {f"{block}/clocks_{prefix}_reason_{r}": "Not Active" for r, *_ in REASON_CASES}
    values[f"{block}/clocks_{prefix}_reason_{reason}"] = "Active"
    throttle = only_device(edited(name, values)).throttle
    assert throttle == wire.GpuThrottle(
        reasons=[nvml_name], thermal=thermal, power_brake=power_brake
    )


def test_col9_several_reasons_listed_in_nvml_bit_order() -> None:
    values = {
        "clocks_event_reasons/clocks_event_reason_gpu_idle": "Not Active",
        "clocks_event_reasons/clocks_event_reason_hw_power_brake_slowdown": "Active",
        "clocks_event_reasons/clocks_event_reason_hw_slowdown": "Active",
        "clocks_event_reasons/clocks_event_reason_sw_power_cap": "Active",
    }
    assert only_device(edited(L4, values)).throttle == wire.GpuThrottle(
        reasons=["SwPowerCap", "HwSlowdown", "HwPowerBrakeSlowdown"],
        thermal=True,
        power_brake=True,
    )


def test_throttle_encodes_to_the_report_shape() -> None:
    """Shapes other programs rely on: throttle = {reasons, thermal, powerBrake}."""
    values = {"clocks_event_reasons/clocks_event_reason_hw_thermal_slowdown": "Active"}
    encoded = msgspec.json.decode(wire.encode(only_device(edited(L4, values))))
    assert encoded["throttle"] == {
        "reasons": ["GpuIdle", "HwThermalSlowdown"],
        "thermal": True,
        "powerBrake": False,
    }
    assert encoded["pciBusId"] == "0000:01:00.0"


# ---------------------------------------------------------------------------- COL-10 ECC


def test_col10_ecc_disabled_is_unavailable_never_zeros() -> None:
    """COL-10: ECC disabled → unavailable with reason; counts null, never zero."""
    device = only_device(edited(L4, {"ecc_mode/current_ecc": "Disabled"}))
    assert device.ecc == wire.GpuEcc(status="unavailable", reason="ECC disabled")
    encoded = msgspec.json.decode(wire.encode(device))["ecc"]
    assert encoded == {
        "status": "unavailable",
        "reason": "ECC disabled",
        "volatile": None,
        "aggregate": None,
    }


def test_col10_ecc_disabled_with_na_counters_like_driver_590() -> None:
    counters = [
        f"ecc_errors/{kind}/{loc}"
        for kind in ("volatile", "aggregate")
        for loc in (
            "sram_correctable",
            "sram_uncorrectable_parity",
            "sram_uncorrectable_secded",
            "dram_correctable",
            "dram_uncorrectable",
        )
    ]
    values = {"ecc_mode/current_ecc": "Disabled", **dict.fromkeys(counters, "N/A")}
    assert only_device(edited(L4, values)).ecc.status == "unavailable"


def test_col10_ecc_enabled_but_every_counter_na_is_unavailable() -> None:
    values = {
        f"ecc_errors/{kind}/{loc}": "N/A"
        for kind in ("volatile", "aggregate")
        for loc in (
            "sram_correctable",
            "sram_uncorrectable",
            "dram_correctable",
            "dram_uncorrectable",
        )
    }
    assert only_device(edited(A100, values)).ecc == wire.GpuEcc(
        status="unavailable", reason="ECC enabled but no error counters reported"
    )


def test_ecc_sums_every_location_with_split_sram_uncorrectable() -> None:
    """Summed over every memory location: SRAM parity + SECDED + DRAM (driver 555 layout)."""
    values = {
        "ecc_errors/volatile/sram_correctable": "1",
        "ecc_errors/volatile/dram_correctable": "4",
        "ecc_errors/volatile/sram_uncorrectable_parity": "2",
        "ecc_errors/volatile/sram_uncorrectable_secded": "3",
        "ecc_errors/volatile/dram_uncorrectable": "5",
        "ecc_errors/aggregate/sram_correctable": "10",
        "ecc_errors/aggregate/dram_correctable": "90",
        "ecc_errors/aggregate/dram_uncorrectable": "1",
    }
    assert only_device(edited(L4, values)).ecc == wire.GpuEcc(
        status="ok",
        volatile=wire.EccCounts(corrected=5, uncorrected=10),
        aggregate=wire.EccCounts(corrected=100, uncorrected=1),
    )


def test_ecc_single_sram_uncorrectable_layout_and_mig_counts_are_not_the_gpus() -> None:
    values = {
        "ecc_errors/volatile/sram_uncorrectable": "2",
        "ecc_errors/volatile/dram_correctable": "4",
        "mig_devices/mig_device/ecc_error_count/volatile_count/sram_uncorrectable": "7",
    }
    ecc = only_device(edited(A100, values)).ecc
    assert ecc.volatile == wire.EccCounts(corrected=4, uncorrected=2)
    assert ecc.aggregate == ZERO


def test_ecc_partly_na_sums_what_is_counted() -> None:
    values = {
        "ecc_errors/volatile/sram_correctable": "N/A",
        "ecc_errors/volatile/sram_uncorrectable": "N/A",
        "ecc_errors/volatile/dram_correctable": "3",
        "ecc_errors/volatile/dram_uncorrectable": "1",
    }
    assert only_device(edited(T4, values)).ecc.volatile == wire.EccCounts(
        corrected=3, uncorrected=1
    )


def _old_layout(volatile: Mapping[str, str]) -> str:
    values = {"ecc_mode/current_ecc": "Enabled"}
    for kind in ("volatile", "aggregate"):
        for bits in ("single_bit", "double_bit"):
            values[f"ecc_errors/{kind}/{bits}/device_memory"] = "0"
            values[f"ecc_errors/{kind}/{bits}/total"] = "0"
    values.update(volatile)
    return edited(P4, values)


def test_ecc_oldest_single_double_bit_layout_uses_totals() -> None:
    xml = _old_layout(
        {
            "ecc_errors/volatile/single_bit/device_memory": "6",
            "ecc_errors/volatile/single_bit/l2_cache": "1",
            "ecc_errors/volatile/single_bit/total": "7",
            "ecc_errors/volatile/double_bit/total": "2",
        }
    )
    assert only_device(xml).ecc == wire.GpuEcc(
        status="ok", volatile=wire.EccCounts(corrected=7, uncorrected=2), aggregate=ZERO
    )


def test_ecc_oldest_layout_sums_locations_when_total_is_na() -> None:
    xml = _old_layout(
        {
            "ecc_errors/volatile/single_bit/device_memory": "6",
            "ecc_errors/volatile/single_bit/register_file": "1",
            "ecc_errors/volatile/single_bit/total": "N/A",
            "ecc_errors/volatile/double_bit/total": "0",
        }
    )
    assert only_device(xml).ecc.volatile == wire.EccCounts(corrected=7, uncorrected=0)


# ---------------------------------------------------------------------------- row remap


def test_row_remap_block_read() -> None:
    values = {
        "remapped_rows/remapped_row_corr": "2",
        "remapped_rows/remapped_row_unc": "1",
        "remapped_rows/remapped_row_pending": "Yes",
        "remapped_rows/remapped_row_failure": "No",
    }
    assert only_device(edited(L4, values)).row_remap == wire.GpuRowRemap(
        correctable=2, uncorrectable=1, pending=True, failed=False
    )


# ---------------------------------------------------------------------------- COL-12 garbage


@pytest.mark.parametrize(
    ("xml", "message"),
    [
        ("", "unparseable XML"),
        ("NVIDIA-SMI has failed", "unparseable XML"),
        (xml_fixture(L4)[:600], "unparseable XML"),
        ("<html><body>nope</body></html>", "not <nvidia_smi_log>"),
        (
            edited(L4, {"ecc_errors/volatile/dram_correctable": "Unknown Error"}),
            r"GPU 0 \(0000:01:00.0\)/volatile/dram_correctable: 'Unknown Error' is not a number",
        ),
        (
            edited(L4, {"clocks_event_reasons/clocks_event_reason_gpu_idle": "Maybe"}),
            "clocks_event_reason_gpu_idle",
        ),
        (edited(L4, {"remapped_rows/remapped_row_pending": "Perhaps"}), "neither Yes nor No"),
        (edited(L4, {"ecc_mode/current_ecc": "Sideways"}), "current_ecc"),
        (edited(L4, {"pci/pci_bus_id": "the bus"}), "not a PCI bus id"),
        (edited(T4, {"fb_memory_usage/total": "15 GB"}), "fb_memory_usage/total: '15 GB' is not an amount"),
        (edited(T4, {"fb_memory_usage/total": "lots MiB"}), "is not an amount of memory"),
    ],
)
def test_col12_garbage_raises_with_a_clear_reason(xml: str, message: str) -> None:
    with pytest.raises(GpuSmiParseError, match=message):
        parse_nvidia_smi_xml(xml)


# ---------------------------------------------------------------------------- NVML pure rules


def test_clock_event_bits_match_pynvml() -> None:
    """FORMATS §7: our bit table is the binding's, name for name."""
    for bit, name in CLOCK_EVENT_REASONS.items():
        event = getattr(pynvml, f"nvmlClocksEventReason{name}", None)
        throttle = getattr(pynvml, f"nvmlClocksThrottleReason{name}")
        assert throttle == bit
        assert event in (None, bit)


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (0x0, []),
        (0x1, ["GpuIdle"]),
        (0x6, ["ApplicationsClocksSetting", "SwPowerCap"]),
        (0x68, ["HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown"]),
        (0x80, ["HwPowerBrakeSlowdown"]),
        (0x1FF, list(CLOCK_EVENT_REASONS.values())[:9]),
        (0x800, ["0x800"]),
    ],
)
def test_clock_event_reason_names(mask: int, names: list[str]) -> None:
    assert clock_event_reason_names(mask) == names


@pytest.mark.parametrize(
    ("mask", "thermal", "power_brake"),
    [
        (0x001, False, False),  # idle
        (0x002, False, False),  # application clocks
        (0x004, False, False),  # SW power cap
        (0x010, False, False),  # sync boost
        (0x100, False, False),  # display clocks
        (0x017, False, False),  # all of the normal ones at once
        (0x008, True, False),  # HW slowdown
        (0x020, True, False),  # SW thermal
        (0x040, True, False),  # HW thermal
        (0x080, False, True),  # HW power brake
        (0x088, True, True),  # power brake engages HW slowdown too
    ],
)
def test_col9_nvml_mask(mask: int, thermal: bool, power_brake: bool) -> None:
    """COL-9 on the NVML bitmask."""
    throttle = throttle_from_mask(mask)
    assert (throttle.thermal, throttle.power_brake) == (thermal, power_brake)
    assert throttle.reasons == clock_event_reason_names(mask)


def test_throttle_from_reasons_dedupes_and_orders() -> None:
    assert throttle_from_reasons(["HwPowerBrakeSlowdown", "GpuIdle", "GpuIdle"]).reasons == [
        "GpuIdle",
        "HwPowerBrakeSlowdown",
    ]


@pytest.mark.parametrize(
    ("current", "volatile", "aggregate", "expected"),
    [
        (None, (0, 0), (0, 0), wire.GpuEcc(status="unavailable", reason="ECC not supported")),
        (0, (0, 0), (0, 0), wire.GpuEcc(status="unavailable", reason="ECC disabled")),
        (
            1,
            (None, None),
            (None, None),
            wire.GpuEcc(status="unavailable", reason="ECC enabled but no error counters reported"),
        ),
        (
            1,
            (4, 0),
            (90, 1),
            wire.GpuEcc(
                status="ok",
                volatile=wire.EccCounts(corrected=4, uncorrected=0),
                aggregate=wire.EccCounts(corrected=90, uncorrected=1),
            ),
        ),
        (
            1,
            (4, None),
            (90, 1),
            wire.GpuEcc(
                status="ok", volatile=None, aggregate=wire.EccCounts(corrected=90, uncorrected=1)
            ),
        ),
    ],
)
def test_col10_nvml_ecc(
    current: int | None,
    volatile: tuple[int | None, int | None],
    aggregate: tuple[int | None, int | None],
    expected: wire.GpuEcc,
) -> None:
    """COL-10: NVML ECC mode + totals → the record; disabled / not supported never zeros."""
    mode = nvml_ecc_mode(current)
    counts = (
        (nvml_ecc_counts(*volatile), nvml_ecc_counts(*aggregate))
        if mode == "enabled"
        else (
            None,
            None,
        )
    )
    assert ecc_reading(mode, *counts) == expected


# ---------------------------------------------------------------------------- NVML adapter


def _nvml_library_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_nvml_library_present(), reason="this machine has an NVIDIA driver")
def test_read_gpu_nvml_without_driver_raises_nvml_unavailable() -> None:
    """COL-4: no driver → NvmlUnavailable (the caller falls back to nvidia-smi)."""
    with pytest.raises(NvmlUnavailable) as caught:
        read_gpu_nvml()
    assert caught.value.reason == "no NVIDIA driver (NVML: NVML Shared Library Not Found)"


def nvml_error(code: int) -> pynvml.NVMLError:
    error: pynvml.NVMLError = pynvml.NVMLError(code)
    return error


@dataclass
class FakeGpu:
    bus_id: str
    ecc_mode: tuple[int, int] | int = (1, 1)
    totals: dict[tuple[int, int], int] = field(default_factory=dict)
    reasons: int | Callable[[], int] = 0x1
    remapped: tuple[int, int, int, int] | int = (0, 0, 0, 0)
    lost_on: str | None = None  # the call that raises GPU is lost
    memory_total: int | None = 85_520_809_984  # an H100 80GB HBM3's, in bytes; None: NotSupported


@dataclass
class FakeNvml:
    gpus: list[FakeGpu]
    shutdowns: int = 0
    init_error: int | None = None

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def device_call(name: str, result: Callable[[FakeGpu], Any]) -> Callable[..., Any]:
            def call(handle: FakeGpu, *args: Any) -> Any:
                if handle.lost_on == name:
                    raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
                value = result(handle) if not args else result_with(handle, args)
                if isinstance(value, int) and value < 0:
                    raise nvml_error(-value)
                return value

            def result_with(handle: FakeGpu, args: tuple[Any, ...]) -> Any:
                return result(handle)(*args)

            return call

        def init() -> None:
            if self.init_error is not None:
                raise nvml_error(self.init_error)

        def shutdown() -> None:
            self.shutdowns += 1

        def handle(index: int) -> FakeGpu:
            return self.gpus[index]

        def ecc_mode(g: FakeGpu) -> Any:
            return list(g.ecc_mode) if isinstance(g.ecc_mode, tuple) else -g.ecc_mode

        def reasons(g: FakeGpu) -> Any:
            return g.reasons() if callable(g.reasons) else g.reasons

        def remapped(g: FakeGpu) -> Any:
            return g.remapped if isinstance(g.remapped, tuple) else -g.remapped

        def memory_info(g: FakeGpu) -> Any:
            if g.memory_total is None:
                return -pynvml.NVML_ERROR_NOT_SUPPORTED
            memory = pynvml.c_nvmlMemory_t()
            memory.total, memory.free, memory.used = g.memory_total, g.memory_total, 0
            return memory

        patches: dict[str, Any] = {
            "nvmlInit": init,
            "nvmlShutdown": shutdown,
            "nvmlSystemGetDriverVersion": lambda: "550.54.15",
            "nvmlDeviceGetCount": lambda: len(self.gpus),
            "nvmlDeviceGetHandleByIndex": handle,
            "nvmlDeviceGetPciInfo": device_call(
                "nvmlDeviceGetPciInfo", lambda g: type("Pci", (), {"busId": g.bus_id})()
            ),
            "nvmlDeviceGetUUID": device_call("nvmlDeviceGetUUID", lambda g: f"GPU-{g.bus_id}"),
            "nvmlDeviceGetSerial": device_call(
                "nvmlDeviceGetSerial", lambda g: -pynvml.NVML_ERROR_NOT_SUPPORTED
            ),
            "nvmlDeviceGetName": device_call(
                "nvmlDeviceGetName", lambda g: b"NVIDIA H100 80GB HBM3"
            ),
            "nvmlDeviceGetMemoryInfo": device_call("nvmlDeviceGetMemoryInfo", memory_info),
            "nvmlDeviceGetEccMode": device_call("nvmlDeviceGetEccMode", ecc_mode),
            "nvmlDeviceGetTotalEccErrors": device_call(
                "nvmlDeviceGetTotalEccErrors",
                lambda g: lambda error_type, counter: g.totals.get((error_type, counter), 0),
            ),
            "nvmlDeviceGetCurrentClocksEventReasons": device_call(
                "nvmlDeviceGetCurrentClocksEventReasons", reasons
            ),
            "nvmlDeviceGetCurrentClocksThrottleReasons": device_call(
                "nvmlDeviceGetCurrentClocksThrottleReasons", lambda g: 0x40
            ),
            "nvmlDeviceGetRemappedRows": device_call("nvmlDeviceGetRemappedRows", remapped),
            "nvmlDeviceGetTemperature": device_call(
                "nvmlDeviceGetTemperature", lambda g: lambda sensor: 41
            ),
        }
        for name, value in patches.items():
            monkeypatch.setattr(pynvml, name, value)


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., FakeNvml]]:
    def make(*gpus: FakeGpu, init_error: int | None = None) -> FakeNvml:
        nvml = FakeNvml(list(gpus), init_error=init_error)
        nvml.install(monkeypatch)
        return nvml

    yield make


CORR, UNC = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
VOL, AGG = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC


def test_nvml_reads_every_device(fake_nvml: Callable[..., FakeNvml]) -> None:
    """COL-3 through the pynvml calls (patched: there is no GPU here)."""
    nvml = fake_nvml(
        FakeGpu(
            "00000000:3B:00.0",
            totals={(CORR, VOL): 4, (UNC, VOL): 0, (CORR, AGG): 90, (UNC, AGG): 1},
            reasons=0x48,
            remapped=(2, 1, 1, 0),
        ),
        FakeGpu("00000000:86:00.0", ecc_mode=(0, 0), remapped=pynvml.NVML_ERROR_NOT_SUPPORTED,
                memory_total=None),
    )
    signal = read_gpu_nvml()
    assert signal.status == "ok"
    assert (signal.source, signal.driver_version) == ("nvml", "550.54.15")
    first, second = signal.devices
    assert first == wire.GpuDevice(
        index=0,
        pci_bus_id="0000:3b:00.0",
        uuid="GPU-00000000:3B:00.0",
        serial=None,
        name="NVIDIA H100 80GB HBM3",
        memory_bytes=85_520_809_984,
        ecc=wire.GpuEcc(
            status="ok",
            volatile=wire.EccCounts(corrected=4, uncorrected=0),
            aggregate=wire.EccCounts(corrected=90, uncorrected=1),
        ),
        throttle=wire.GpuThrottle(
            reasons=["HwSlowdown", "HwThermalSlowdown"], thermal=True, power_brake=False
        ),
        row_remap=wire.GpuRowRemap(correctable=2, uncorrectable=1, pending=True, failed=False),
        temperature_c=41,
    )
    assert (second.index, second.pci_bus_id, second.row_remap) == (1, "0000:86:00.0", None)
    assert second.memory_bytes is None  # COL-11: not read, so not claimed
    assert second.ecc == wire.GpuEcc(status="unavailable", reason="ECC disabled")
    assert nvml.shutdowns == 1


def test_nvml_ecc_not_supported_is_unavailable(fake_nvml: Callable[..., FakeNvml]) -> None:
    """COL-10: a card without ECC reports it unavailable, never zero."""
    fake_nvml(FakeGpu("00000000:01:00.0", ecc_mode=pynvml.NVML_ERROR_NOT_SUPPORTED))
    (device,) = read_gpu_nvml().devices
    assert device.ecc == wire.GpuEcc(status="unavailable", reason="ECC not supported")


def test_nvml_old_driver_falls_back_to_throttle_reasons(
    fake_nvml: Callable[..., FakeNvml],
) -> None:
    def missing() -> int:
        raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    fake_nvml(FakeGpu("00000000:01:00.0", reasons=missing))
    (device,) = read_gpu_nvml().devices
    assert device.throttle == wire.GpuThrottle(
        reasons=["HwThermalSlowdown"], thermal=True, power_brake=False
    )


@pytest.mark.parametrize(
    "lost_on",
    [
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetTemperature",
    ],
)
def test_col8_gpu_lost_fails_the_signal_naming_the_device(
    fake_nvml: Callable[..., FakeNvml], lost_on: str
) -> None:
    """COL-8: GPU off the bus → signal failed naming it; the healthy GPU is still listed."""
    nvml = fake_nvml(FakeGpu("00000000:3B:00.0"), FakeGpu("00000000:86:00.0", lost_on=lost_on))
    signal = read_gpu_nvml()
    assert signal.status == "failed"
    assert signal.reason is not None
    assert signal.reason.startswith("GPU 1")
    assert f"{lost_on} failed: GPU is lost (fallen off the bus" in signal.reason
    if lost_on != "nvmlDeviceGetPciInfo":
        assert signal.reason.startswith("GPU 1 (0000:86:00.0):")
    assert [d.pci_bus_id for d in signal.devices] == ["0000:3b:00.0"]
    assert nvml.shutdowns == 1


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (
            pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
            "no NVIDIA driver (NVML: NVML Shared Library Not Found)",
        ),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVIDIA driver not loaded (NVML: Driver Not Loaded)"),
    ],
)
def test_nvml_no_driver_raises_unavailable(
    fake_nvml: Callable[..., FakeNvml], code: int, reason: str
) -> None:
    fake_nvml(init_error=code)
    with pytest.raises(NvmlUnavailable) as caught:
        read_gpu_nvml()
    assert caught.value.reason == reason


def test_nvml_other_init_error_fails(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake_nvml(init_error=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    signal = read_gpu_nvml()
    assert signal.status == "failed"
    assert (signal.reason or "").startswith("nvmlInit failed: ")


def test_nvml_without_gpus_is_unavailable(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake_nvml()
    signal = read_gpu_nvml()
    assert (signal.status, signal.reason) == ("unavailable", "no NVIDIA GPU (NVML lists none)")


# ---------------------------------------------------------------------------- nvidia-smi run outcome


@pytest.mark.parametrize(
    ("returncode", "stdout", "stderr", "status", "reason"),
    [
        (-9, b"", b"", "failed", "nvidia-smi -q -x was killed by signal 9"),
        (255, b"Unknown Error\n", b"", "failed", "nvidia-smi -q -x exited 255: Unknown Error"),
        (15, b"", b"Unable to determine the device handle for GPU0000:01:00.0: GPU is lost.\n",
         "failed", "nvidia-smi: Unable to determine the device handle for GPU0000:01:00.0: GPU is lost."),
        (6, b"No devices were found\n", b"", "unavailable", "no NVIDIA GPU (nvidia-smi: No devices were found)"),
        (0, b"<nvidia_smi_log><gpu", b"", "failed", "nvidia-smi -q -x printed unparseable XML"),
    ],
)
def test_smi_run_outcome(returncode: int, stdout: bytes, stderr: bytes, status: str, reason: str) -> None:
    """A finished run, whatever ran it: its exit status and output decide (COL-4, COL-8)."""
    signal = run_outcome(returncode, stdout, stderr)
    assert (signal.status, signal.source) == (status, "nvidia-smi")
    assert (signal.reason or "").startswith(reason)


def test_smi_run_outcome_reads_the_xml() -> None:
    signal = run_outcome(0, (FIXTURES / L4).read_bytes(), b"")
    assert (signal.status, signal.driver_version) == ("ok", "555.42.06")
    assert [d.pci_bus_id for d in signal.devices] == ["0000:01:00.0"]


# ---------------------------------------------------------------------------- nvidia-smi adapter


def fake_nvidia_smi(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "nvidia-smi"
    script.write_text(
        f'#!/bin/sh\n[ "$*" = "-q -x" ] || {{ echo "bad argv $*" >&2; exit 2; }}\n{body}\n'
    )
    script.chmod(0o755)
    return script


def cat_xml(name: str) -> str:
    return f"cat {shlex.quote(str(FIXTURES / name))}"


async def test_smi_adapter_reads_the_xml(tmp_path: Path) -> None:
    signal = await read_gpu_smi(str(fake_nvidia_smi(tmp_path, cat_xml(L4))), timeout_s=5)
    assert signal.status == "ok"
    assert (signal.source, signal.driver_version) == ("nvidia-smi", "555.42.06")
    assert [d.pci_bus_id for d in signal.devices] == ["0000:01:00.0"]


async def test_smi_missing_binary_is_unavailable_no_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """COL-4: no nvidia-smi → unavailable "no NVIDIA driver", not failed."""
    monkeypatch.setenv("PATH", str(tmp_path))
    signal = await read_gpu_smi()
    assert (signal.status, signal.reason) == (
        "unavailable",
        "no NVIDIA driver (nvidia-smi not found on PATH)",
    )


async def test_smi_hang_is_killed_at_timeout_and_fails(tmp_path: Path) -> None:
    """COL-8/COL-12: a hung nvidia-smi is killed at its timeout → failed."""
    smi = fake_nvidia_smi(tmp_path, "sleep 60")
    started = time.monotonic()
    signal = await read_gpu_smi(str(smi), timeout_s=0.5)
    assert time.monotonic() - started < 5
    assert (signal.status, signal.reason) == (
        "failed",
        "nvidia-smi -q -x timed out after 0.5s and was killed",
    )


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            "echo 'Unable to determine the device handle for GPU0000:01:00.0: GPU is lost.  "
            "Reboot the system to recover this GPU'; exit 15",
            "nvidia-smi: Unable to determine the device handle for GPU0000:01:00.0: GPU is lost.  "
            "Reboot the system to recover this GPU",
        ),
        (
            "echo 'Unable to determine the device handle for GPU0000:01:00.0: "
            "GPU has fallen off the bus.' >&2; exit 0",
            "nvidia-smi: Unable to determine the device handle for GPU0000:01:00.0: "
            "GPU has fallen off the bus.",
        ),
        ("echo 'Unknown Error'; exit 255", "nvidia-smi -q -x exited 255: Unknown Error"),
        ("exit 3", "nvidia-smi -q -x exited 3"),
        ("echo '<nvidia_smi_log><gpu'; exit 0", "nvidia-smi -q -x printed unparseable XML"),
    ],
)
async def test_col8_smi_failures(tmp_path: Path, body: str, reason: str) -> None:
    """COL-8: a lost GPU (whatever the exit status), a non-zero exit or garbage → failed."""
    signal = await read_gpu_smi(str(fake_nvidia_smi(tmp_path, body)), timeout_s=5)
    assert signal.status == "failed"
    assert (signal.reason or "").startswith(reason)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            'Make sure that the latest NVIDIA driver is installed and running."; exit 9',
            "no NVIDIA driver loaded (nvidia-smi: NVIDIA-SMI has failed because it couldn't "
            "communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is "
            "installed and running.)",
        ),
        (
            "echo 'No devices were found'; exit 6",
            "no NVIDIA GPU (nvidia-smi: No devices were found)",
        ),
        (
            'echo \'<?xml version="1.0" ?><nvidia_smi_log><driver_version>550.54.15'
            "</driver_version><attached_gpus>0</attached_gpus></nvidia_smi_log>'",
            "no NVIDIA GPU (nvidia-smi lists none)",
        ),
    ],
)
async def test_smi_no_driver_or_no_gpu_is_unavailable(
    tmp_path: Path, body: str, reason: str
) -> None:
    """COL-4: driver absent or no GPU → unavailable with why."""
    signal = await read_gpu_smi(str(fake_nvidia_smi(tmp_path, body)), timeout_s=5)
    assert (signal.status, signal.reason) == ("unavailable", reason)
