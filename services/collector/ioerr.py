"""SCSI I/O error counts from ``/sys/block/<dev>/device/ioerr_cnt`` (COL-3, COL-4, COL-12).

The kernel prints the counter as lowercase ``0x``-prefixed hex (FORMATS.md §6); it counts
commands that completed with a non-zero result and is reset when the disk is probed.

Decision: only disks that have an ``ioerr_cnt`` are listed. NVMe namespaces, virtio disks,
loop, zram, device-mapper and md devices have no such counter; listing them with ``0`` would
report "no I/O errors" for a counter that does not exist (COL-4), so they are left out
(their health comes from SMART). When block devices exist but none of them has the counter,
the signal is ``unavailable`` and the reason names the disks without it; no ``/sys/block``
entries at all is ``unavailable`` too. A counter that is unreadable, vanishes mid-read or
is not ``0x`` hex → ``failed`` naming the file.

Pure: the tree is read through ``sysfs.Files`` (``probe.read_ioerr`` reads the machine's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from healthplane.contracts import wire
from healthplane_collector.sysfs import Files, SysfsError, read_hex

BLOCK_DIR: Final = Path("sys/block")
_NAMES_IN_REASON: Final = 8


def ioerr_signal(files: Files) -> wire.IoerrSignal:
    """``ioerr_cnt`` of every SCSI disk in the tree, or why there is none."""
    block_dir = files.root / BLOCK_DIR
    if not files.present(block_dir):
        return wire.IoerrSignal(
            status="unavailable", reason=f"no block devices: {block_dir} does not exist"
        )
    try:
        disks = sorted(files.list_dir(block_dir), key=lambda path: path.name)
        if not disks:
            return wire.IoerrSignal(status="unavailable", reason=f"no block devices in {block_dir}")
        counters = [(disk.name, disk / "device" / "ioerr_cnt") for disk in disks]
        devices = [
            wire.IoErrorCount(name=name, count=read_hex(files, counter))
            for name, counter in counters
            if files.present(counter)
        ]
    except SysfsError as exc:
        return wire.IoerrSignal(status="failed", reason=str(exc))
    if not devices:
        names = [disk.name for disk in disks]
        shown = ", ".join(names[:_NAMES_IN_REASON]) + (
            ", …" if len(names) > _NAMES_IN_REASON else ""
        )
        return wire.IoerrSignal(
            status="unavailable",
            reason=f"no SCSI disks: none of {shown} has device/ioerr_cnt (NVMe, virtio and "
            "virtual block devices have no such counter)",
        )
    return wire.IoerrSignal(status="ok", devices=devices)
