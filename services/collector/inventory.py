"""What the resource report says about the machine: hostname, cores, memory, boot id and the
GPUs on the PCI bus (COL-3, COL-11).

* hostname: ``/etc/hostname`` (first line that is not a ``#`` comment), else
  ``/proc/sys/kernel/hostname``.
* cores: ``processor`` lines of ``/proc/cpuinfo``, else the ``/sys/devices/system/cpu/online``
  range list (``0-3,5,7-8``).
* memory: ``MemTotal`` of ``/proc/meminfo`` (kB → bytes).
* boot id: ``/proc/sys/kernel/random/boot_id``; ``None`` when the file does not exist.
* GPUs: every ``/sys/bus/pci/devices/<bus id>/`` whose ``vendor`` is NVIDIA (``0x10de``) or
  AMD (``0x1002``) and whose ``class`` is a VGA (``0x0300xx``), 3D (``0x0302xx``), other
  display (``0x0380xx``, AMD Instinct MI100/MI200) or processing-accelerator (``0x1200xx``,
  AMD Instinct MI300) controller. NVSwitches (bridges) and the GPUs' HDMI audio functions are
  not GPUs. SR-IOV virtual functions (a ``physfn`` link) belong to guests and are left out.
  ``index`` counts per vendor in PCI bus order, which is NVML's default enumeration order
  and ROCm's. AMD GPUs are inventory-only (COL-3): no health signal reads them.

Unlike a signal, the inventory has no status: anything missing or unreadable that it needs
raises ``InventoryError`` naming the file, and the caller decides (COL-12).

Pure: the tree is read through ``sysfs.Files`` (``probe.read_inventory`` reads the machine's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from healthplane.contracts import wire
from healthplane_collector import pci
from healthplane_collector.sysfs import Files, SysfsError, read_hex

HOSTNAME_FILE: Final = Path("etc/hostname")
KERNEL_HOSTNAME_FILE: Final = Path("proc/sys/kernel/hostname")
CPUINFO_FILE: Final = Path("proc/cpuinfo")
CPU_ONLINE_FILE: Final = Path("sys/devices/system/cpu/online")
MEMINFO_FILE: Final = Path("proc/meminfo")
BOOT_ID_FILE: Final = Path("proc/sys/kernel/random/boot_id")
PCI_DEVICES_DIR: Final = Path("sys/bus/pci/devices")

GPU_VENDORS: Final[dict[int, Literal["nvidia", "amd"]]] = {0x10DE: "nvidia", 0x1002: "amd"}
GPU_CLASSES: Final[frozenset[int]] = frozenset({0x0300, 0x0302, 0x0380, 0x1200})

_PROCESSOR_LINE: Final = re.compile(r"^processor\s*:", re.MULTILINE)
_CPU_RANGE: Final = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_MEM_TOTAL: Final = re.compile(r"^MemTotal:\s+([0-9]+)\s+kB\s*$", re.MULTILINE)
_BOOT_ID: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class InventoryError(Exception):
    """A file the inventory needs is missing, unreadable or holds garbage; the message names it."""


@dataclass(frozen=True, slots=True)
class Inventory:
    hostname: str
    cores: int
    memory_bytes: int
    boot_id: str | None
    gpus: tuple[wire.ResourceDevice, ...]


def inventory_of(files: Files) -> Inventory:
    """The machine in the tree as the resource report describes it (COL-11)."""
    try:
        return Inventory(
            hostname=_hostname(files),
            cores=_cores(files),
            memory_bytes=_memory_bytes(files),
            boot_id=_boot_id(files),
            gpus=_gpus(files),
        )
    except SysfsError as exc:
        raise InventoryError(str(exc)) from None


def _hostname(files: Files) -> str:
    path = files.root / HOSTNAME_FILE
    if files.present(path):
        for line in files.read_text(path).splitlines():
            name = line.strip()
            if name and not name.startswith("#"):
                return name
    kernel_path = files.root / KERNEL_HOSTNAME_FILE
    name = files.read_text(kernel_path).strip()
    if not name:
        raise InventoryError(f"no hostname: {path} and {kernel_path} are empty")
    return name


def _cores(files: Files) -> int:
    cpuinfo = files.root / CPUINFO_FILE
    try:
        count = len(_PROCESSOR_LINE.findall(files.read_text(cpuinfo)))
    except SysfsError:
        count = 0  # the online range below is as good a source
    if count:
        return count
    online = files.root / CPU_ONLINE_FILE
    text = files.read_text(online).strip()
    cores = 0
    for part in text.split(","):
        match = _CPU_RANGE.fullmatch(part.strip())
        if not match or (match.group(2) and int(match.group(2)) < int(match.group(1))):
            raise InventoryError(f"{online}: expected a CPU range list, found {text[:40]!r}")
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        cores += last - first + 1
    return cores


def _memory_bytes(files: Files) -> int:
    path = files.root / MEMINFO_FILE
    match = _MEM_TOTAL.search(files.read_text(path))
    if not match:
        raise InventoryError(f"{path}: no 'MemTotal: <n> kB' line")
    return int(match.group(1)) * 1024


def _boot_id(files: Files) -> str | None:
    path = files.root / BOOT_ID_FILE
    if not files.present(path):
        return None
    boot_id = files.read_text(path).strip()
    if not _BOOT_ID.fullmatch(boot_id):
        raise InventoryError(f"{path}: expected a UUID, found {boot_id[:40]!r}")
    return boot_id


def _gpus(files: Files) -> tuple[wire.ResourceDevice, ...]:
    """NVIDIA and AMD GPUs by vendor, each vendor indexed from 0 in PCI bus order."""
    devices_dir = files.root / PCI_DEVICES_DIR
    if not files.present(devices_dir):
        return ()
    found: list[tuple[str, Literal["nvidia", "amd"]]] = []
    for device in files.list_dir(devices_dir):
        try:
            bus_id = pci.normalize(device.name)
        except ValueError:
            raise InventoryError(f"{device}: not a PCI bus id") from None
        vendor = GPU_VENDORS.get(read_hex(files, device / "vendor"))
        if vendor is None or files.present(device / "physfn"):
            continue
        if read_hex(files, device / "class") >> 8 in GPU_CLASSES:
            found.append((bus_id, vendor))
    next_index: dict[str, int] = {}
    gpus: list[wire.ResourceDevice] = []
    for bus_id, vendor in sorted(found):
        index = next_index.get(vendor, 0)
        next_index[vendor] = index + 1
        gpus.append(wire.ResourceDevice(kind="gpu", vendor=vendor, index=index, pci_bus_id=bus_id))
    return tuple(gpus)
