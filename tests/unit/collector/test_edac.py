"""EDAC sysfs reader against fixture trees laid out as FORMATS.md §4 describes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from healthplane.contracts import wire
from healthplane_collector.edac import edac_signal
from healthplane_collector.probe import read_edac
from tests.unit.collector.memory_files import MemoryFiles

MC = Path("sys/devices/system/edac/mc")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def edac_core(root: Path) -> Path:
    """What the EDAC core registers with no controller driver: ``mc/`` with power, uevent."""
    mc_dir = root / MC
    (mc_dir / "power").mkdir(parents=True)
    write(mc_dir / "uevent", "")
    return mc_dir


def controller(
    root: Path, name: str, ce: int = 0, ue: int = 0, ce_noinfo: int = 0, ue_noinfo: int = 0
) -> Path:
    path = root / MC / name
    for counter, value in (
        ("ce_count", ce),
        ("ue_count", ue),
        ("ce_noinfo_count", ce_noinfo),
        ("ue_noinfo_count", ue_noinfo),
    ):
        write(path / counter, f"{value}\n")
    write(path / "mc_name", "Skylake Socket#0 IMC#0\n")
    write(path / "size_mb", "65536\n")
    (path / "power").mkdir(exist_ok=True)
    return path


def dimm(controller_dir: Path, name: str, ce: int = 0, ue: int = 0, label: str = "") -> Path:
    path = controller_dir / name
    write(path / "dimm_ce_count", f"{ce}\n")
    write(path / "dimm_ue_count", f"{ue}\n")
    write(path / "dimm_label", f"{label}\n" if label else "")
    write(path / "dimm_edac_mode", "SECDED\n")
    return path


def test_two_controllers_with_sparse_dimms_report_every_count_COL_3(tmp_path: Path) -> None:
    edac_core(tmp_path)
    mc0 = controller(tmp_path, "mc0", ce=3, ue=0, ce_noinfo=1)
    dimm(mc0, "dimm0", ce=2, label="CPU_SrcID#0_MC#0_Chan#0_DIMM#0")
    dimm(mc0, "dimm2")
    dimm(mc0, "dimm4", ce=0)
    mc1 = controller(tmp_path, "mc1", ue=1, ue_noinfo=1)
    dimm(mc1, "dimm0", ue=1, label="CPU_SrcID#1_MC#0_Chan#0_DIMM#0")
    write(mc0 / "csrow0" / "ce_count", "3\n")  # legacy duplicate, not read

    signal = read_edac(tmp_path)

    assert signal == wire.EdacSignal(
        status="ok",
        controllers=[
            wire.EdacController(
                name="mc0",
                ce=3,
                ue=0,
                ce_noinfo=1,
                ue_noinfo=0,
                dimms=[
                    wire.DimmCounts(
                        name="dimm0", label="CPU_SrcID#0_MC#0_Chan#0_DIMM#0", ce=2, ue=0
                    ),
                    wire.DimmCounts(name="dimm2", label=None, ce=0, ue=0),
                    wire.DimmCounts(name="dimm4", label=None, ce=0, ue=0),
                ],
            ),
            wire.EdacController(
                name="mc1",
                ce=0,
                ue=1,
                ce_noinfo=0,
                ue_noinfo=1,
                dimms=[
                    wire.DimmCounts(
                        name="dimm0", label="CPU_SrcID#1_MC#0_Chan#0_DIMM#0", ce=0, ue=1
                    )
                ],
            ),
        ],
    )


def test_controllers_and_dimms_sort_by_number_not_by_name(tmp_path: Path) -> None:
    edac_core(tmp_path)
    for index in (10, 2, 0):
        mc = controller(tmp_path, f"mc{index}")
        dimm(mc, "dimm11")
        dimm(mc, "dimm3")

    signal = read_edac(tmp_path)

    assert [c.name for c in signal.controllers] == ["mc0", "mc2", "mc10"]
    assert [d.name for d in signal.controllers[0].dimms] == ["dimm3", "dimm11"]


def test_rank_directories_of_chip_select_controllers_are_dimms_COL_3(tmp_path: Path) -> None:
    edac_core(tmp_path)
    mc0 = controller(tmp_path, "mc0", ce=5)
    dimm(mc0, "rank5", ce=5, label="mc#0csrow#2channel#1")
    dimm(mc0, "rank4")

    signal = read_edac(tmp_path)

    assert signal.status == "ok"
    assert signal.controllers[0].dimms == [
        wire.DimmCounts(name="rank4", label=None, ce=0, ue=0),
        wire.DimmCounts(name="rank5", label="mc#0csrow#2channel#1", ce=5, ue=0),
    ]


def test_non_controller_entries_in_mc_are_skipped(tmp_path: Path) -> None:
    mc_dir = edac_core(tmp_path)
    (tmp_path / "sys/bus/edac").mkdir(parents=True)
    (mc_dir / "subsystem").symlink_to(tmp_path / "sys/bus/edac")
    (mc_dir / "mc").mkdir()
    (mc_dir / "mcx1").mkdir()
    controller(tmp_path, "mc0")

    signal = read_edac(tmp_path)

    assert signal.status == "ok"
    assert [c.name for c in signal.controllers] == ["mc0"]


def test_no_edac_core_is_unavailable_never_ok_with_zeros_COL_4(tmp_path: Path) -> None:
    (tmp_path / "sys/devices/system").mkdir(parents=True)

    signal = read_edac(tmp_path)

    assert signal.status == "unavailable"
    assert signal.controllers == []
    assert signal.reason is not None and "no EDAC driver loaded" in signal.reason


def test_edac_core_without_mc_dir_is_unavailable_COL_4(tmp_path: Path) -> None:
    (tmp_path / "sys/devices/system/edac").mkdir(parents=True)

    signal = read_edac(tmp_path)

    assert signal.status == "unavailable"
    assert signal.reason is not None and "mc" in signal.reason


def test_mc_dir_without_controllers_is_unavailable_COL_4(tmp_path: Path) -> None:
    """EDAC core loaded but no memory-controller driver (a VM): only power/ and uevent."""
    edac_core(tmp_path)

    signal = read_edac(tmp_path)

    assert signal.status == "unavailable"
    assert signal.controllers == []
    assert signal.reason is not None and "memory-controller driver" in signal.reason


@pytest.mark.parametrize("garbage", ["", "\n", "abc\n", "-1\n", "1.5\n", "0x10\n", "1 2\n"])
def test_garbage_counter_fails_naming_the_file_COL_12(tmp_path: Path, garbage: str) -> None:
    edac_core(tmp_path)
    controller(tmp_path, "mc0")
    mc1 = controller(tmp_path, "mc1")
    write(mc1 / "ue_count", garbage)

    signal = read_edac(tmp_path)

    assert signal.status == "failed"
    assert signal.controllers == []
    assert signal.reason is not None and str(mc1 / "ue_count") in signal.reason


def test_garbage_dimm_counter_fails_naming_the_file_COL_12(tmp_path: Path) -> None:
    edac_core(tmp_path)
    mc0 = controller(tmp_path, "mc0")
    dimm0 = dimm(mc0, "dimm0")
    write(dimm0 / "dimm_ce_count", "\x00\x00\n")

    signal = read_edac(tmp_path)

    assert signal.status == "failed"
    assert signal.reason is not None and str(dimm0 / "dimm_ce_count") in signal.reason


def test_counter_that_vanished_dangling_symlink_fails_COL_12(tmp_path: Path) -> None:
    edac_core(tmp_path)
    mc0 = controller(tmp_path, "mc0")
    (mc0 / "ce_count").unlink()
    (mc0 / "ce_count").symlink_to(tmp_path / "gone")

    signal = read_edac(tmp_path)

    assert signal.status == "failed"
    assert signal.reason is not None
    assert str(mc0 / "ce_count") in signal.reason and "vanished" in signal.reason


def test_directory_where_a_counter_should_be_fails_COL_12(tmp_path: Path) -> None:
    edac_core(tmp_path)
    mc0 = controller(tmp_path, "mc0")
    (mc0 / "ue_noinfo_count").unlink()
    (mc0 / "ue_noinfo_count").mkdir()

    signal = read_edac(tmp_path)

    assert signal.status == "failed"
    assert signal.reason is not None and str(mc0 / "ue_noinfo_count") in signal.reason


def test_controller_that_vanished_mid_listing_fails_COL_12(tmp_path: Path) -> None:
    mc_dir = edac_core(tmp_path)
    controller(tmp_path, "mc0")
    (mc_dir / "mc1").symlink_to(tmp_path / "gone")

    signal = read_edac(tmp_path)

    assert signal.status == "failed"
    assert signal.reason is not None and str(mc_dir / "mc1") in signal.reason


def test_missing_counter_fails_rather_than_reading_zero_COL_4(tmp_path: Path) -> None:
    edac_core(tmp_path)
    mc0 = controller(tmp_path, "mc0")
    (mc0 / "ce_noinfo_count").unlink()

    signal = read_edac(tmp_path)

    assert signal.status == "failed"
    assert signal.reason is not None and str(mc0 / "ce_noinfo_count") in signal.reason


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_unreadable_counter_fails_COL_12(tmp_path: Path) -> None:
    edac_core(tmp_path)
    mc0 = controller(tmp_path, "mc0")
    (mc0 / "ce_count").chmod(0)

    signal = read_edac(tmp_path)

    assert signal.status == "failed"
    assert signal.reason is not None and "permission denied" in signal.reason


def test_signal_round_trips_on_the_wire(tmp_path: Path) -> None:
    edac_core(tmp_path)
    dimm(controller(tmp_path, "mc0", ce=1), "dimm0", ce=1, label="A1")

    signal = read_edac(tmp_path)

    assert wire.decode(wire.EdacSignal, wire.encode(signal)) == signal
    assert wire.to_builtins(signal)["controllers"][0]["ceNoinfo"] == 0


MC0 = {f"{MC}/mc0/{counter}": "0\n" for counter in ("ce_count", "ue_count", "ce_noinfo_count", "ue_noinfo_count")}


@pytest.mark.parametrize(("tree", "status", "reason"), [
    ({}, "unavailable", "no EDAC driver loaded: /host/sys/devices/system/edac does not exist"),
    ({"sys/devices/system/edac/power/": ""}, "unavailable",
     "no EDAC memory controllers: /host/sys/devices/system/edac/mc does not exist"),
    ({f"{MC}/power/": "", f"{MC}/uevent": ""}, "unavailable",
     "no EDAC memory-controller driver loaded: /host/sys/devices/system/edac/mc has no mc<N> directory"),
    (MC0, "ok", None),
    ({**MC0, f"{MC}/mc0/ue_count": "lots\n"}, "failed",
     "/host/sys/devices/system/edac/mc/mc0/ue_count: expected a decimal count, found 'lots'"),
    ({**MC0, f"{MC}/mc0/dimm0/dimm_ce_count": "1\n"}, "failed",
     "/host/sys/devices/system/edac/mc/mc0/dimm0/dimm_ue_count: missing or vanished while reading"),
])
def test_edac_signal_of_a_tree(tree: dict[str, str], status: str, reason: str | None) -> None:
    """The parser alone, on a tree held in memory: every outcome FORMATS.md §4 allows."""
    signal = edac_signal(MemoryFiles(tree))
    assert (signal.status, signal.reason) == (status, reason)
