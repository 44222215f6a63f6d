"""Everything the collector does to the machine: runs a probe process (smartctl, nvidia-smi)
under a hard timeout, calls the NVIDIA driver through NVML, and reads host files under
``--root``. What the output means is decided by the pure parsers it hands it to (``smart``,
``gpu_smi``, ``gpu_nvml``, ``edac``, ``ioerr``, ``mounts``, ``inventory``), which never run a
process or open a file themselves.

At its timeout a probe's whole process group is killed, so a hung tool can never stall the
agent (COL-12).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import signal
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from healthplane.contracts import wire
from healthplane_collector import edac, gpu_smi, inventory, ioerr, mounts, smart
from healthplane_collector.gpu_nvml import (
    ecc_reading,
    fabric_of_struct,
    nvml_ecc_counts,
    nvml_ecc_mode,
    throttle_from_mask,
)
from healthplane_collector.pci import normalize
from healthplane_collector.sysfs import SysfsError

# Disks probed at once: enough for a JBOD to finish in a report interval, few enough not to
# queue dozens of pass-through commands on one HBA.
MAX_CONCURRENT_PROBES: Final = 8
# What a remediation command's run (``run_probe(keep_bytes=…)``) keeps of each output stream, and the size of its reads.
OUTPUT_KEPT_BYTES: Final = 64 * 1024
READ_CHUNK: Final = 64 * 1024


# ---------------------------------------------------------------------------- processes


@dataclass(frozen=True, slots=True)
class Completed:
    returncode: int
    stdout: bytes
    stderr: bytes


class TimedOut(Exception):
    pass


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    # The group outlives its leader while any member lives (and its id is not reused until
    # then), so this also reaches a child that still holds the pipes after the leader exited.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def run_probe(argv: Sequence[str], timeout_s: float, keep_bytes: int | None = None) -> Completed:
    """Run ``argv``; at ``timeout_s`` kill its whole process group and raise ``TimedOut``.
    With ``keep_bytes`` (a command whose output only explains a failure: a GPU reset, a
    reboot) only the last ``keep_bytes`` of stdout and of stderr are kept, the rest read and
    dropped."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own group, so a hung child dies with it
        env={**os.environ, "LC_ALL": "C"},
    )
    try:
        async with asyncio.timeout(timeout_s):
            if keep_bytes is None:
                stdout, stderr = await proc.communicate()
            else:
                stdout, stderr = await asyncio.gather(_tail(proc.stdout, keep_bytes), _tail(proc.stderr, keep_bytes))
                await proc.wait()
    except TimeoutError:
        _kill_group(proc)
        await proc.wait()
        raise TimedOut from None
    except BaseException:
        _kill_group(proc)
        await proc.wait()
        raise
    return Completed(proc.returncode if proc.returncode is not None else -1, stdout, stderr)


async def _tail(stream: asyncio.StreamReader | None, keep: int) -> bytes:
    """Read ``stream`` to its end, keeping only its last ``keep`` bytes: the pipe is drained
    (a child never blocks on it) while a tool that floods it costs us ``keep`` bytes."""
    kept = bytearray()
    if stream is None:
        return b""
    while chunk := await stream.read(READ_CHUNK):
        kept += chunk
        if len(kept) > keep:
            del kept[:-keep]
    return bytes(kept)


async def read_smart(smartctl: str | None = None, timeout_s: float = 10.0) -> wire.SmartSignal:
    """The SMART signal: scan, then ``smartctl -j -a`` every disk concurrently (COL-3/4/12).

    unavailable: no smartctl, or no disk it can address. failed: the scan or any disk's
    probe went wrong (timeout, garbage, open failure); ``reason`` names each such disk and
    ``devices`` still lists every disk, the unread ones with ``passed`` null and ``error``.
    """
    binary = shutil.which(smartctl or "smartctl")
    if binary is None:
        return smart.not_found(smartctl)
    try:
        scan = await run_probe([binary, "-j", "--scan"], timeout_s)
    except TimedOut:
        return wire.SmartSignal(
            status="failed", reason=f"smartctl --scan timed out after {timeout_s:g}s and was killed"
        )
    except OSError as exc:
        return wire.SmartSignal(status="failed", reason=f"cannot run {binary}: {exc}")
    scanned = smart.scan_outcome(scan.returncode, scan.stdout)
    if isinstance(scanned, wire.SmartSignal):
        return scanned

    slots = asyncio.Semaphore(MAX_CONCURRENT_PROBES)

    async def probe(device: smart.ScannedDevice) -> smart.DeviceOutcome:
        unopened = smart.open_failure(device)
        if unopened is not None:
            return unopened
        async with slots:
            try:
                completed = await run_probe(smart.device_argv(binary, device), timeout_s)
            except TimedOut:
                return smart.unread(
                    device, f"smartctl -a {device.label} timed out after {timeout_s:g}s and was killed"
                )
            except OSError as exc:
                return smart.unread(device, f"cannot run {binary} for {device.label}: {exc}")
        return smart.device_outcome(device, completed.returncode, completed.stdout, completed.stderr)

    return smart.smart_signal(await asyncio.gather(*(probe(device) for device in scanned)))


async def read_gpu_smi(nvidia_smi: str | None = None, timeout_s: float = 10.0) -> wire.GpuSignal:
    """The GPU signal from ``nvidia-smi -q -x`` (COL-3, COL-4, COL-8): unavailable without
    nvidia-smi, failed when it hangs (killed at ``timeout_s``) or cannot be run; otherwise
    what its output says (``gpu_smi.run_outcome``)."""
    binary = shutil.which(nvidia_smi or "nvidia-smi")
    if binary is None:
        return gpu_smi.not_found(nvidia_smi)
    try:
        completed = await run_probe([binary, "-q", "-x"], timeout_s)
    except TimedOut:
        return wire.GpuSignal(
            status="failed",
            reason=f"nvidia-smi -q -x timed out after {timeout_s:g}s and was killed",
            source="nvidia-smi",
        )
    except OSError as exc:
        return wire.GpuSignal(
            status="failed", reason=f"cannot run {binary}: {exc}", source="nvidia-smi"
        )
    return gpu_smi.run_outcome(completed.returncode, completed.stdout, completed.stderr)


# ---------------------------------------------------------------------------- host files


@dataclass(frozen=True, slots=True)
class HostFiles:
    """The machine's files under ``root`` (``sysfs.Files``); every failure names the path."""

    root: Path

    def present(self, path: Path) -> bool:
        return os.path.lexists(path)

    def read_bytes(self, path: Path) -> bytes:
        with _as_sysfs_error(path, "read"):
            return path.read_bytes()

    def read_text(self, path: Path) -> str:
        try:
            return self.read_bytes(path).decode("utf-8")
        except UnicodeDecodeError:
            raise SysfsError(f"{path}: not text (undecodable bytes)") from None

    def list_dir(self, path: Path) -> list[Path]:
        with _as_sysfs_error(path, "list"):
            return list(path.iterdir())


@contextmanager
def _as_sysfs_error(path: Path, verb: Literal["read", "list"]) -> Iterator[None]:
    """A file or directory that is not what a reader expected, as one ``SysfsError`` naming it."""
    try:
        yield
    except FileNotFoundError:
        raise SysfsError(f"{path}: missing or vanished while reading") from None
    except IsADirectoryError:
        raise SysfsError(f"{path}: is a directory where a file was expected") from None
    except NotADirectoryError:
        raise SysfsError(f"{path}: is a file where a directory was expected") from None
    except PermissionError:
        raise SysfsError(f"{path}: permission denied") from None
    except OSError as exc:
        raise SysfsError(f"{path}: cannot {verb} ({exc.strerror or exc})") from None


def read_edac(root: Path) -> wire.EdacSignal:
    """Every EDAC memory controller of the machine under ``root`` (``edac``)."""
    return edac.edac_signal(HostFiles(root))


def read_ioerr(root: Path) -> wire.IoerrSignal:
    """``ioerr_cnt`` of every SCSI disk of the machine under ``root`` (``ioerr``)."""
    return ioerr.ioerr_signal(HostFiles(root))


def read_mounts(root: Path, expected_read_only: Sequence[str] = ()) -> wire.MountsSignal:
    """Unexpected read-only filesystems in ``root``'s ``/proc/mounts`` (``mounts``)."""
    path = root / mounts.MOUNTS_FILE
    try:
        content = HostFiles(root).read_bytes(path)
    except SysfsError as exc:
        return wire.MountsSignal(status="failed", reason=str(exc))
    return mounts.parse_mounts(path, content, expected_read_only)


def read_inventory(root: Path) -> inventory.Inventory:
    """The machine under ``root`` as the resource report describes it (``inventory``)."""
    return inventory.inventory_of(HostFiles(root))


# ---------------------------------------------------------------------------- NVML

# pynvml constants (FORMATS.md §7), repeated so that this module imports pynvml only when
# it reads the GPUs.
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
    """No NVML to talk to (library or driver missing); ``reason`` says which, and the caller
    falls back to ``nvidia-smi``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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
    fabric = read_fabric(nvml, handle)
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
        fabric=fabric,
    )


def read_fabric(nvml: Any, handle: Any) -> wire.GpuFabric | None:
    """DOM-1: the GPU's fabric info (its NVLink domain), ``nvmlDeviceGetGpuFabricInfoV``, or the
    older ``nvmlDeviceGetGpuFabricInfo`` on a driver without it; the decode is
    ``gpu_nvml.fabric_of_struct``. None when the GPU has no fabric (NOT_SUPPORTED: PCIe cards,
    boards without multi-node NVLink), the driver knows neither call, or the call fails: the
    domain is topology, not health, so it never fails the GPU signal."""
    try:
        info = nvml.c_nvmlGpuFabricInfo_v2_t()
        nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) != _NVML_ERROR_FUNCTION_NOT_FOUND:
            return None
        try:
            info = nvml.c_nvmlGpuFabricInfo_t()
            nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
        except nvml.NVMLError:
            return None
    except AttributeError:  # an nvidia-ml-py older than the fabric calls
        return None
    return fabric_of_struct(info)


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
