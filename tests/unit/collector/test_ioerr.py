"""SCSI ``ioerr_cnt`` reader against fixture ``/sys/block`` trees (FORMATS.md §6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from healthplane.contracts import wire
from healthplane_collector.ioerr import ioerr_signal
from healthplane_collector.probe import read_ioerr
from tests.unit.collector.memory_files import MemoryFiles

BLOCK = Path("sys/block")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def scsi_disk(root: Path, name: str, ioerr_cnt: str) -> Path:
    """A SCSI disk: ``device`` is the scsi_device with its iostat counters."""
    device = root / BLOCK / name / "device"
    write(device / "ioerr_cnt", ioerr_cnt)
    write(device / "iodone_cnt", "0x1a3f\n")
    write(device / "iorequest_cnt", "0x1a3f\n")
    write(root / BLOCK / name / "size", "1953525168\n")
    return device / "ioerr_cnt"


def counterless_disk(root: Path, name: str, with_device: bool = True) -> None:
    """NVMe namespaces and virtio disks have a ``device`` link but no ``ioerr_cnt``; loop and
    zram devices have no ``device`` at all."""
    write(root / BLOCK / name / "size", "0\n")
    if with_device:
        write(root / BLOCK / name / "device" / "model", "Virtual disk\n")


@pytest.mark.parametrize(
    ("text", "count"),
    [("0x0\n", 0), ("0x2\n", 2), ("0x1a3f\n", 0x1A3F), ("0xffffffffffffffff\n", 2**64 - 1)],
)
def test_ioerr_cnt_is_hex_COL_3(tmp_path: Path, text: str, count: int) -> None:
    scsi_disk(tmp_path, "sda", text)

    assert read_ioerr(tmp_path) == wire.IoerrSignal(
        status="ok", devices=[wire.IoErrorCount(name="sda", count=count)]
    )


def test_only_scsi_disks_are_listed_nvme_and_virtio_left_out_COL_3(tmp_path: Path) -> None:
    scsi_disk(tmp_path, "sdb", "0x2\n")
    scsi_disk(tmp_path, "sda", "0x0\n")
    counterless_disk(tmp_path, "nvme0n1")
    counterless_disk(tmp_path, "vda")
    counterless_disk(tmp_path, "loop0", with_device=False)

    signal = read_ioerr(tmp_path)

    assert signal.status == "ok"
    assert signal.devices == [
        wire.IoErrorCount(name="sda", count=0),
        wire.IoErrorCount(name="sdb", count=2),
    ]


def test_only_counterless_disks_is_unavailable_not_zero_COL_4(tmp_path: Path) -> None:
    counterless_disk(tmp_path, "nvme0n1")
    counterless_disk(tmp_path, "vda")
    counterless_disk(tmp_path, "zram0", with_device=False)

    signal = read_ioerr(tmp_path)

    assert signal.status == "unavailable"
    assert signal.devices == []
    assert signal.reason is not None
    assert "no SCSI disks" in signal.reason and "nvme0n1" in signal.reason


def test_no_block_devices_is_unavailable_COL_4(tmp_path: Path) -> None:
    (tmp_path / BLOCK).mkdir(parents=True)

    signal = read_ioerr(tmp_path)

    assert signal.status == "unavailable"
    assert signal.reason is not None and "no block devices" in signal.reason


def test_no_sys_block_is_unavailable_COL_4(tmp_path: Path) -> None:
    signal = read_ioerr(tmp_path)

    assert signal.status == "unavailable"
    assert signal.devices == []


@pytest.mark.parametrize("garbage", ["", "2\n", "0x\n", "0xzz\n", "-0x1\n", "lots\n"])
def test_garbage_counter_fails_naming_the_file_COL_12(tmp_path: Path, garbage: str) -> None:
    scsi_disk(tmp_path, "sda", "0x0\n")
    bad = scsi_disk(tmp_path, "sdb", garbage)

    signal = read_ioerr(tmp_path)

    assert signal.status == "failed"
    assert signal.devices == []
    assert signal.reason is not None and str(bad) in signal.reason


def test_counter_that_vanished_fails_COL_12(tmp_path: Path) -> None:
    counter = scsi_disk(tmp_path, "sda", "0x0\n")
    counter.unlink()
    counter.symlink_to(tmp_path / "gone")

    signal = read_ioerr(tmp_path)

    assert signal.status == "failed"
    assert signal.reason is not None and str(counter) in signal.reason


def test_directory_where_the_counter_should_be_fails_COL_12(tmp_path: Path) -> None:
    counter = scsi_disk(tmp_path, "sda", "0x0\n")
    counter.unlink()
    counter.mkdir()

    signal = read_ioerr(tmp_path)

    assert signal.status == "failed"
    assert signal.reason is not None and str(counter) in signal.reason


@pytest.mark.parametrize(("tree", "expected"), [
    ({}, wire.IoerrSignal(status="unavailable", reason="no block devices: /host/sys/block does not exist")),
    ({"sys/block/": ""}, wire.IoerrSignal(status="unavailable", reason="no block devices in /host/sys/block")),
    ({"sys/block/sdb/device/ioerr_cnt": "0x10\n", "sys/block/nvme0n1/size": "0\n"},
     wire.IoerrSignal(status="ok", devices=[wire.IoErrorCount(name="sdb", count=16)])),
    ({"sys/block/sda/device/ioerr_cnt": "16\n"},
     wire.IoerrSignal(status="failed",
                      reason="/host/sys/block/sda/device/ioerr_cnt: expected a 0x-prefixed hex value, found '16'")),
])
def test_ioerr_signal_of_a_tree(tree: dict[str, str], expected: wire.IoerrSignal) -> None:
    """The parser alone, on a tree held in memory (FORMATS.md §6)."""
    assert ioerr_signal(MemoryFiles(tree)) == expected
