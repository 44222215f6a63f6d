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
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from healthplane import wire
from healthplane_collector.sysfs import SysfsError, list_dir, present, read_decimal, read_text

EDAC_DIR: Final = Path("sys/devices/system/edac")
_CONTROLLER: Final = re.compile(r"mc([0-9]+)")
_DIMM: Final = re.compile(r"(?:dimm|rank)([0-9]+)")


def read_edac(root: Path) -> wire.EdacSignal:
    """Every memory controller under ``root``'s EDAC tree, or why there are none."""
    edac_dir = root / EDAC_DIR
    mc_dir = edac_dir / "mc"
    if not present(edac_dir):
        return _unavailable(f"no EDAC driver loaded: {edac_dir} does not exist")
    if not present(mc_dir):
        return _unavailable(f"no EDAC memory controllers: {mc_dir} does not exist")
    try:
        controller_dirs = _numbered(list_dir(mc_dir), _CONTROLLER)
        if not controller_dirs:
            return _unavailable(
                f"no EDAC memory-controller driver loaded: {mc_dir} has no mc<N> directory"
            )
        controllers = [_read_controller(path) for path in controller_dirs]
    except SysfsError as exc:
        return wire.EdacSignal(status="failed", reason=str(exc))
    return wire.EdacSignal(status="ok", controllers=controllers)


def _unavailable(reason: str) -> wire.EdacSignal:
    return wire.EdacSignal(status="unavailable", reason=reason)


def _numbered(entries: list[Path], pattern: re.Pattern[str]) -> list[Path]:
    """Entries whose whole name matches ``pattern``, by their number (``mc2`` before ``mc10``)."""
    matched = [(m, path) for path in entries if (m := pattern.fullmatch(path.name))]
    return [path for m, path in sorted(matched, key=lambda pair: int(pair[0].group(1)))]


def _read_controller(path: Path) -> wire.EdacController:
    dimms = [_read_dimm(dimm_dir) for dimm_dir in _numbered(list_dir(path), _DIMM)]
    return wire.EdacController(
        name=path.name,
        ce=read_decimal(path / "ce_count"),
        ue=read_decimal(path / "ue_count"),
        ce_noinfo=read_decimal(path / "ce_noinfo_count"),
        ue_noinfo=read_decimal(path / "ue_noinfo_count"),
        dimms=dimms,
    )


def _read_dimm(path: Path) -> wire.DimmCounts:
    label_path = path / "dimm_label"
    label = read_text(label_path).strip() if present(label_path) else ""
    return wire.DimmCounts(
        name=path.name,
        label=label or None,
        ce=read_decimal(path / "dimm_ce_count"),
        ue=read_decimal(path / "dimm_ue_count"),
    )
