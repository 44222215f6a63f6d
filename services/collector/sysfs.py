"""Reading one sysfs/procfs value strictly: a missing, unreadable or garbage file is an error
that names the file (COL-12), never a silent zero (COL-4).

Every reader prefixes host paths with a ``root`` (``/`` on a node, a fixture tree in tests), so
the paths in messages are the paths actually read.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

_DECIMAL: Final = re.compile(r"[0-9]+")
_HEX: Final = re.compile(r"0[xX][0-9a-fA-F]+")


class SysfsError(Exception):
    """A host file that should hold a value could not be read, or held garbage."""


def present(path: Path) -> bool:
    """True when anything is at ``path``, a dangling symlink included (a file that vanished)."""
    return os.path.lexists(path)


def read_text(path: Path) -> str:
    """The file's text; every way of not getting it becomes a ``SysfsError`` naming the file."""
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise SysfsError(f"{path}: missing or vanished while reading") from None
    except IsADirectoryError:
        raise SysfsError(f"{path}: is a directory where a file was expected") from None
    except PermissionError:
        raise SysfsError(f"{path}: permission denied") from None
    except UnicodeDecodeError:
        raise SysfsError(f"{path}: not text (undecodable bytes)") from None
    except OSError as exc:
        raise SysfsError(f"{path}: cannot read ({exc.strerror or exc})") from None


def read_decimal(path: Path) -> int:
    """A non-negative decimal counter as sysfs prints it (``"%d\\n"`` / ``"%u\\n"``)."""
    text = read_text(path).strip()
    if not _DECIMAL.fullmatch(text):
        raise SysfsError(f"{path}: expected a decimal count, found {text[:40]!r}")
    return int(text)


def read_hex(path: Path) -> int:
    """A ``0x``-prefixed hex value (``ioerr_cnt``, PCI ``vendor``/``class``)."""
    text = read_text(path).strip()
    if not _HEX.fullmatch(text):
        raise SysfsError(f"{path}: expected a 0x-prefixed hex value, found {text[:40]!r}")
    return int(text, 16)


def list_dir(path: Path) -> list[Path]:
    """The entries of a directory that exists; unreadable → ``SysfsError`` naming it."""
    try:
        return list(path.iterdir())
    except FileNotFoundError:
        raise SysfsError(f"{path}: missing or vanished while reading") from None
    except NotADirectoryError:
        raise SysfsError(f"{path}: is a file where a directory was expected") from None
    except PermissionError:
        raise SysfsError(f"{path}: permission denied") from None
    except OSError as exc:
        raise SysfsError(f"{path}: cannot list ({exc.strerror or exc})") from None
