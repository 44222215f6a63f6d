"""Sysfs/procfs values read strictly: a missing, unreadable or garbage file is an error that
names the file (COL-12), never a silent zero (COL-4).

The tree parsers (``edac``, ``ioerr``, ``inventory``) walk a host tree through :class:`Files`
and never open a file themselves: ``probe.HostFiles`` reads the machine under ``--root``, a
test may hand them a tree held in memory. Every path they pass is prefixed with
``files.root`` (``/`` on a node, a fixture tree in tests), so the paths in messages are the
paths actually read.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final, Protocol

_DECIMAL: Final = re.compile(r"[0-9]+")
_HEX: Final = re.compile(r"0[xX][0-9a-fA-F]+")


class SysfsError(Exception):
    """A host file that should hold a value could not be read, or held garbage."""


class Files(Protocol):
    """A host tree, read only. Each way of not getting a value is a ``SysfsError`` naming the
    path (missing, vanished while reading, a directory where a file belongs, no permission)."""

    @property
    def root(self) -> Path: ...

    def present(self, path: Path) -> bool:
        """True when anything is at ``path``, a dangling symlink included (a file that vanished)."""
        ...

    def read_text(self, path: Path) -> str: ...

    def list_dir(self, path: Path) -> list[Path]:
        """The entries of a directory that exists, as paths under it."""
        ...


def parse_decimal(path: Path, text: str) -> int:
    """A non-negative decimal counter as sysfs prints it (``"%d\\n"`` / ``"%u\\n"``)."""
    value = text.strip()
    if not _DECIMAL.fullmatch(value):
        raise SysfsError(f"{path}: expected a decimal count, found {value[:40]!r}")
    return int(value)


def parse_hex(path: Path, text: str) -> int:
    """A ``0x``-prefixed hex value (``ioerr_cnt``, PCI ``vendor``/``class``)."""
    value = text.strip()
    if not _HEX.fullmatch(value):
        raise SysfsError(f"{path}: expected a 0x-prefixed hex value, found {value[:40]!r}")
    return int(value, 16)


def read_decimal(files: Files, path: Path) -> int:
    return parse_decimal(path, files.read_text(path))


def read_hex(files: Files, path: Path) -> int:
    return parse_hex(path, files.read_text(path))
