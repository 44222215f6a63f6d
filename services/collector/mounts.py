"""Read-only block-device-backed filesystems from ``/proc/mounts`` (COL-3, ING-7, COL-12).

A line is ``device mountpoint fstype options 0 0`` (FORMATS.md §9.1). ``/proc/mounts`` says
``ro`` both for a mount made read-only and for a superblock the kernel forced read-only after
an error (ext4 ``errors=remount-ro``), which is the case this signal exists to catch.

A mount is reported when all of these hold:

* its options include ``ro``;
* it is block-device backed: the device field is a ``/dev/...`` path (``/dev/sda1``,
  ``/dev/mapper/vg-root``, ``/dev/nvme0n1p2``, ``/dev/root``, a ``/dev/loop<N>`` image).
  Network filesystems (``server:/export``, ``//server/share``) and anything whose device is
  a name (``proc``, ``tmpfs``, ``overlay``) are not;
* its type is not a pseudo filesystem (``PSEUDO_FS_TYPES``: proc, sysfs, tmpfs, devtmpfs,
  cgroup, cgroup2, overlay, … and every ``fuse.*`` userspace type), even if its device field
  looks like a path. ``overlay`` counts as pseudo: it has no device of its own and a
  read-only container root (``readOnlyRootFilesystem``) is intentional;
* its type is not read-only by nature (``READ_ONLY_BY_NATURE``: squashfs, iso9660, erofs,
  cramfs, udf; snaps, live media and optical discs);
* its mount point (octal escapes ``\\040`` etc. decoded) matches none of the
  ``expected_read_only`` globs (``fnmatch``, case-sensitive; ``*`` also matches ``/``).

When several lines share a mount point, the last one is the mount that is visible there,
so only it is considered. An unreadable, empty or malformed ``/proc/mounts`` → ``failed``
naming the file (and the line).

Pure: ``parse_mounts`` takes the file's bytes; ``probe.read_mounts`` reads them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Final

from healthplane.contracts import wire
from healthplane_collector.sysfs import SysfsError

MOUNTS_FILE: Final = Path("proc/mounts")

READ_ONLY_BY_NATURE: Final[frozenset[str]] = frozenset(
    {"squashfs", "iso9660", "erofs", "cramfs", "udf"}
)
PSEUDO_FS_TYPES: Final[frozenset[str]] = frozenset(
    {
        "autofs",
        "binfmt_misc",
        "bpf",
        "cgroup",
        "cgroup2",
        "configfs",
        "debugfs",
        "devpts",
        "devtmpfs",
        "efivarfs",
        "fuse",
        "fusectl",
        "hugetlbfs",
        "mqueue",
        "nsfs",
        "overlay",
        "proc",
        "pstore",
        "ramfs",
        "rpc_pipefs",
        "securityfs",
        "selinuxfs",
        "sysfs",
        "tmpfs",
        "tracefs",
    }
)
_OCTAL: Final = re.compile(rb"\\([0-7]{3})")


def parse_mounts(path: Path, content: bytes, expected_read_only: Sequence[str] = ()) -> wire.MountsSignal:
    """Unexpected read-only block-device filesystems in ``content``, the ``/proc/mounts`` read
    at ``path`` (named in every failure)."""
    try:
        mounts = _candidates(path, content)
    except SysfsError as exc:
        return wire.MountsSignal(status="failed", reason=str(exc))
    read_only = [
        mount
        for mount in mounts.values()
        if not any(fnmatchcase(mount.mount_point, glob) for glob in expected_read_only)
    ]
    return wire.MountsSignal(status="ok", read_only=read_only)


def decode_octal(field: bytes) -> str:
    """``/mnt/my\\040disk`` → ``/mnt/my disk`` (the kernel escapes space, tab, newline, ``\\``)."""
    raw = _OCTAL.sub(lambda m: bytes([int(m.group(1), 8) & 0xFF]), field)
    return raw.decode("utf-8", errors="replace")


def _candidates(path: Path, content: bytes) -> dict[str, wire.ReadOnlyMount]:
    """Read-only candidates by mount point, the last line for a mount point winning."""
    candidates: dict[str, wire.ReadOnlyMount | None] = {}
    for number, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) < 4:
            raise SysfsError(f"{path}: line {number} is malformed: {line[:80]!r}")
        device, mount_point = decode_octal(fields[0]), decode_octal(fields[1])
        fs_type, options = decode_octal(fields[2]), fields[3].decode("ascii", errors="replace")
        candidates.pop(mount_point, None)  # keeps insertion order = the order now visible
        candidates[mount_point] = (
            wire.ReadOnlyMount(mount_point=mount_point, device=device, fs_type=fs_type)
            if _counts(device, fs_type, options)
            else None
        )
    if not candidates:
        raise SysfsError(f"{path}: lists no filesystems")
    return {point: mount for point, mount in candidates.items() if mount is not None}


def _counts(device: str, fs_type: str, options: str) -> bool:
    return (
        "ro" in options.split(",")
        and device.startswith("/dev/")
        and fs_type not in PSEUDO_FS_TYPES
        and not fs_type.startswith("fuse.")
        and fs_type not in READ_ONLY_BY_NATURE
    )
