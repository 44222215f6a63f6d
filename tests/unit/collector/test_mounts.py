"""Read-only mount detection from fixture ``/proc/mounts`` files (FORMATS.md §9, ING-7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from healthplane.contracts import wire
from healthplane_collector.mounts import decode_octal, parse_mounts
from healthplane_collector.probe import read_mounts

HEALTHY = """\
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
devtmpfs /dev devtmpfs rw,nosuid,size=12334432k,nr_inodes=3083608,mode=755 0 0
/dev/nvme0n1p2 / ext4 rw,relatime,errors=remount-ro 0 0
/dev/nvme0n1p1 /boot/efi vfat rw,relatime,fmask=0077,dmask=0077 0 0
tmpfs /run tmpfs rw,nosuid,nodev,size=3283144k,mode=755 0 0
cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0
"""


def proc_mounts(root: Path, text: str) -> Path:
    path = root / "proc" / "mounts"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_healthy_node_reports_nothing_ok(tmp_path: Path) -> None:
    proc_mounts(tmp_path, HEALTHY)

    assert read_mounts(tmp_path) == wire.MountsSignal(status="ok", read_only=[])


def test_ext4_forced_read_only_is_reported_ING_7(tmp_path: Path) -> None:
    proc_mounts(
        tmp_path,
        HEALTHY + "/dev/sdb1 /data ext4 ro,relatime,errors=remount-ro 0 0\n"
        "/dev/mapper/vg-scratch /scratch xfs ro,noatime 0 0\n",
    )

    signal = read_mounts(tmp_path)

    assert signal == wire.MountsSignal(
        status="ok",
        read_only=[
            wire.ReadOnlyMount(mount_point="/data", device="/dev/sdb1", fs_type="ext4"),
            wire.ReadOnlyMount(
                mount_point="/scratch", device="/dev/mapper/vg-scratch", fs_type="xfs"
            ),
        ],
    )
    assert wire.to_builtins(signal)["readOnly"][0] == {
        "mountPoint": "/data",
        "device": "/dev/sdb1",
        "fsType": "ext4",
    }


def test_octal_escapes_in_mount_point_and_device_are_decoded_ING_7(tmp_path: Path) -> None:
    proc_mounts(tmp_path, "/dev/sdc1 /mnt/my\\040disk\\011tab\\134x ext4 ro,relatime 0 0\n")

    signal = read_mounts(tmp_path)

    assert signal.read_only == [
        wire.ReadOnlyMount(mount_point="/mnt/my disk\ttab\\x", device="/dev/sdc1", fs_type="ext4")
    ]


@pytest.mark.parametrize(
    ("field", "decoded"),
    [
        (b"/plain", "/plain"),
        (b"/a\\040b", "/a b"),
        (b"/nl\\012x", "/nl\nx"),
        (b"/back\\134slash", "/back\\slash"),
        (b"/not\\08escape", "/not\\08escape"),
        ("/d\u00e9j\u00e0\\040vu".encode(), "/d\u00e9j\u00e0 vu"),
    ],
)
def test_decode_octal(field: bytes, decoded: str) -> None:
    assert decode_octal(field) == decoded


@pytest.mark.parametrize("fs_type", ["squashfs", "iso9660", "erofs", "cramfs", "udf"])
def test_filesystems_read_only_by_nature_are_ignored_ING_7(tmp_path: Path, fs_type: str) -> None:
    proc_mounts(
        tmp_path, HEALTHY + f"/dev/loop3 /snap/core22/1380 {fs_type} ro,nodev,relatime 0 0\n"
    )

    assert read_mounts(tmp_path) == wire.MountsSignal(status="ok", read_only=[])


@pytest.mark.parametrize(
    "line",
    [
        "tmpfs /sys/fs/cgroup tmpfs ro,nosuid,nodev,noexec,mode=755 0 0",
        "proc /proc/sys proc ro,relatime 0 0",
        "sysfs /sys sysfs ro,nosuid,nodev,noexec,relatime 0 0",
        "cgroup /sys/fs/cgroup/cpu cgroup ro,relatime,cpu 0 0",
        "cgroup2 /sys/fs/cgroup cgroup2 ro,relatime 0 0",
        "overlay / overlay ro,relatime,lowerdir=/l,upperdir=/u,workdir=/w 0 0",
        "devtmpfs /dev devtmpfs ro,relatime 0 0",
        "/dev/fuse /run/x fuse ro,relatime 0 0",
        "sshfs#me@host: /mnt/remote fuse.sshfs ro,relatime 0 0",
        "server:/export /mnt/nfs nfs4 ro,relatime,vers=4.2 0 0",
        "//server/share /mnt/smb cifs ro,relatime 0 0",
        "tmpfs /dev/tmpfs-looks-like-a-path tmpfs ro 0 0",
    ],
)
def test_pseudo_and_network_filesystems_are_ignored_ING_7(tmp_path: Path, line: str) -> None:
    proc_mounts(tmp_path, HEALTHY + line + "\n")

    assert read_mounts(tmp_path).read_only == []


def test_expected_read_only_globs_are_ignored_ING_7(tmp_path: Path) -> None:
    proc_mounts(
        tmp_path,
        HEALTHY
        + "/dev/nvme0n1p1 /boot/efi vfat ro,relatime 0 0\n"
        + "/dev/sdd1 /mnt/golden/images ext4 ro,relatime 0 0\n"
        + "/dev/sde1 /mnt/data ext4 ro,relatime 0 0\n",
    )

    signal = read_mounts(tmp_path, expected_read_only=["/boot/efi", "/mnt/golden*"])

    assert signal.read_only == [
        wire.ReadOnlyMount(mount_point="/mnt/data", device="/dev/sde1", fs_type="ext4")
    ]


def test_glob_matches_the_decoded_mount_point_ING_7(tmp_path: Path) -> None:
    proc_mounts(tmp_path, "/dev/sdc1 /mnt/my\\040disk ext4 ro 0 0\n")

    assert read_mounts(tmp_path, expected_read_only=["/mnt/my disk"]).read_only == []


def test_the_last_mount_on_a_mount_point_is_the_visible_one(tmp_path: Path) -> None:
    proc_mounts(
        tmp_path,
        "/dev/sda1 /data ext4 ro,relatime 0 0\n"
        "/dev/sdb1 /data ext4 rw,relatime 0 0\n"
        "/dev/sdc1 /archive ext4 rw,relatime 0 0\n"
        "/dev/sdd1 /archive ext4 ro,relatime 0 0\n",
    )

    assert read_mounts(tmp_path).read_only == [
        wire.ReadOnlyMount(mount_point="/archive", device="/dev/sdd1", fs_type="ext4")
    ]


def test_ro_must_be_a_whole_option_not_a_substring(tmp_path: Path) -> None:
    proc_mounts(tmp_path, "/dev/sda1 /data ext4 rw,errors=remount-ro,rootcontext=x 0 0\n")

    assert read_mounts(tmp_path).read_only == []


def test_missing_proc_mounts_fails_COL_12(tmp_path: Path) -> None:
    signal = read_mounts(tmp_path)

    assert signal.status == "failed"
    assert signal.reason is not None and str(tmp_path / "proc/mounts") in signal.reason


def test_directory_instead_of_proc_mounts_fails_COL_12(tmp_path: Path) -> None:
    (tmp_path / "proc" / "mounts").mkdir(parents=True)

    signal = read_mounts(tmp_path)

    assert signal.status == "failed"
    assert signal.reason is not None and "proc/mounts" in signal.reason


def test_malformed_line_fails_naming_file_and_line_COL_12(tmp_path: Path) -> None:
    path = proc_mounts(tmp_path, HEALTHY + "garbage-without-fields\n")

    signal = read_mounts(tmp_path)

    assert signal.status == "failed"
    assert signal.read_only == []
    assert signal.reason is not None
    assert str(path) in signal.reason and "line 8" in signal.reason


def test_empty_proc_mounts_fails_rather_than_passing_COL_4(tmp_path: Path) -> None:
    proc_mounts(tmp_path, "")

    assert read_mounts(tmp_path).status == "failed"


@pytest.mark.parametrize(("content", "expected"), [
    (b"/dev/sdb1 /data ext4 ro,relatime 0 0\n/dev/sdb2 /golden ext4 ro 0 0\n",
     wire.MountsSignal(status="ok", read_only=[
         wire.ReadOnlyMount(mount_point="/data", device="/dev/sdb1", fs_type="ext4")])),
    (b"", wire.MountsSignal(status="failed", reason="/host/proc/mounts: lists no filesystems")),
    (b"/dev/sdb1 /data\n", wire.MountsSignal(
        status="failed", reason="/host/proc/mounts: line 1 is malformed: b'/dev/sdb1 /data'")),
])
def test_parse_mounts_of_the_file_bytes(content: bytes, expected: wire.MountsSignal) -> None:
    """The parser alone: the bytes of /proc/mounts, the path to name, the expected globs."""
    assert parse_mounts(Path("/host/proc/mounts"), content, ["/golden"]) == expected
