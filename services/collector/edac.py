"""EDAC memory-controller and per-DIMM error counts from sysfs (COL-3, COL-4, COL-12).

Layout (FORMATS.md §4): ``/sys/devices/system/edac/mc/mc<N>/{ce,ue,ce_noinfo,ue_noinfo}_count``
and one ``dimm<N>/`` (or ``rank<N>/`` on chip-select based controllers) per populated DIMM
with ``dimm_ce_count``, ``dimm_ue_count`` and an optional, possibly empty ``dimm_label``.

* Only ``mc<digits>`` entries are controllers; ``power``, ``subsystem``, ``uevent`` are not.
* No ``edac`` directory (no EDAC core), no ``mc`` directory, or an ``mc`` directory without
  any ``mc<N>`` (EDAC core loaded but no memory-controller driver: VMs, unsupported CPUs)
  → ``unavailable`` with that reason. Never ``ok`` with zeros (COL-4).
* Any counter that is missing, unreadable, vanishes mid-read or is not a decimal number →
  ``failed`` with a reason naming the file (COL-12).
* Legacy ``csrow<N>/`` directories (``CONFIG_EDAC_LEGACY_SYSFS``) repeat what ``dimm``/``rank``
  directories already say and are not read.

Pure: the tree is read through ``sysfs.Files`` (``probe.read_edac`` reads the machine's).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from healthplane.contracts import wire
from healthplane_collector.sysfs import Files, SysfsError, read_decimal

EDAC_DIR: Final = Path("sys/devices/system/edac")
_CONTROLLER: Final = re.compile(r"mc([0-9]+)")
_DIMM: Final = re.compile(r"(?:dimm|rank)([0-9]+)")


def edac_signal(files: Files) -> wire.EdacSignal:
    """Every memory controller in the tree's EDAC folder, or why there are none."""
    edac_dir = files.root / EDAC_DIR
    mc_dir = edac_dir / "mc"
    if not files.present(edac_dir):
        return _unavailable(f"no EDAC driver loaded: {edac_dir} does not exist")
    if not files.present(mc_dir):
        return _unavailable(f"no EDAC memory controllers: {mc_dir} does not exist")
    try:
        controller_dirs = _numbered(files.list_dir(mc_dir), _CONTROLLER)
        if not controller_dirs:
            return _unavailable(
                f"no EDAC memory-controller driver loaded: {mc_dir} has no mc<N> directory"
            )
        controllers = [_controller(files, path) for path in controller_dirs]
    except SysfsError as exc:
        return wire.EdacSignal(status="failed", reason=str(exc))
    return wire.EdacSignal(status="ok", controllers=controllers)


def _unavailable(reason: str) -> wire.EdacSignal:
    return wire.EdacSignal(status="unavailable", reason=reason)


def _numbered(entries: list[Path], pattern: re.Pattern[str]) -> list[Path]:
    """Entries whose whole name matches ``pattern``, by their number (``mc2`` before ``mc10``)."""
    matched = [(m, path) for path in entries if (m := pattern.fullmatch(path.name))]
    return [path for m, path in sorted(matched, key=lambda pair: int(pair[0].group(1)))]


def _controller(files: Files, path: Path) -> wire.EdacController:
    dimms = [_dimm(files, dimm_dir) for dimm_dir in _numbered(files.list_dir(path), _DIMM)]
    return wire.EdacController(
        name=path.name,
        ce=read_decimal(files, path / "ce_count"),
        ue=read_decimal(files, path / "ue_count"),
        ce_noinfo=read_decimal(files, path / "ce_noinfo_count"),
        ue_noinfo=read_decimal(files, path / "ue_noinfo_count"),
        dimms=dimms,
    )


def _dimm(files: Files, path: Path) -> wire.DimmCounts:
    label_path = path / "dimm_label"
    label = files.read_text(label_path).strip() if files.present(label_path) else ""
    return wire.DimmCounts(
        name=path.name,
        label=label or None,
        ce=read_decimal(files, path / "dimm_ce_count"),
        ue=read_decimal(files, path / "dimm_ue_count"),
    )
