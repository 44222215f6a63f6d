"""A host tree held in memory: what the pure tree parsers read in table tests."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from healthplane_collector.sysfs import SysfsError


@dataclass(frozen=True)
class MemoryFiles:
    """``sysfs.Files`` over ``files``: each file's path below ``root`` and its text. Every
    folder above a file exists; a key ending in ``/`` is a folder (an empty one)."""

    files: Mapping[str, str]
    root: Path = Path("/host")

    def _relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def _is_dir(self, relative: str) -> bool:
        prefix = "" if relative == "." else relative + "/"
        return any(key.startswith(prefix) for key in self.files)

    def present(self, path: Path) -> bool:
        relative = self._relative(path)
        return relative in self.files or self._is_dir(relative)

    def read_text(self, path: Path) -> str:
        relative = self._relative(path)
        if relative in self.files:
            return self.files[relative]
        if self._is_dir(relative):
            raise SysfsError(f"{path}: is a directory where a file was expected")
        raise SysfsError(f"{path}: missing or vanished while reading")

    def list_dir(self, path: Path) -> list[Path]:
        relative = self._relative(path)
        if relative in self.files:
            raise SysfsError(f"{path}: is a file where a directory was expected")
        if not self._is_dir(relative):
            raise SysfsError(f"{path}: missing or vanished while reading")
        prefix = "" if relative == "." else relative + "/"
        names = {key[len(prefix):].split("/")[0] for key in self.files if key.startswith(prefix)}
        return [path / name for name in sorted(names - {""})]

    def write_to(self, root: Path) -> None:
        """The same tree on disk under ``root``."""
        for relative, text in self.files.items():
            target = root / relative
            if relative.endswith("/"):
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
