"""The parsers never touch the machine: ``probe`` does. ``sysfs.Files`` has two implementations,
the machine's (``probe.HostFiles``) and the tests' in-memory tree; one contract holds both."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from healthplane_collector.probe import HostFiles
from healthplane_collector.sysfs import Files, SysfsError
from tests.unit.collector.memory_files import MemoryFiles

COLLECTOR = Path(__file__).parents[3] / "services" / "collector"
PARSERS = ("edac", "gpu_nvml", "gpu_smi", "hotplug", "inventory", "ioerr", "kmsg", "mounts", "pci",
           "resources", "smart", "sysfs")
MACHINE_MODULES = {"asyncio", "os", "shutil", "signal", "socket", "subprocess", "pynvml", "pyudev",
                   "healthplane_collector.probe"}
MACHINE_CALLS = {"open", "iterdir", "read_bytes", "write_text", "write_bytes", "lexists", "exists", "stat",
                 "is_file", "is_dir", "glob", "which", "create_subprocess_exec", "run", "Popen"}

TREE = MemoryFiles({
    "sys/block/sda/device/ioerr_cnt": "0x2\n",
    "sys/block/sda/size": "1953525168\n",
    "sys/block/loop0/": "",
    "proc/meminfo": "MemTotal: 1 kB\n",
})


@pytest.mark.parametrize("module", PARSERS)
def test_a_parser_module_runs_nothing_and_opens_nothing(module: str) -> None:
    tree = ast.parse((COLLECTOR / f"{module}.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    called = {node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
              for node in ast.walk(tree) if isinstance(node, ast.Call)}
    assert imported & MACHINE_MODULES == set()
    assert called & MACHINE_CALLS == set()


@pytest.fixture(params=["host", "memory"])
def files(request: pytest.FixtureRequest, tmp_path: Path) -> Files:
    if request.param == "host":
        TREE.write_to(tmp_path)
        return HostFiles(tmp_path)
    return MemoryFiles(TREE.files, root=tmp_path)


def test_reads_a_file(files: Files) -> None:
    assert files.read_text(files.root / "sys/block/sda/device/ioerr_cnt") == "0x2\n"
    assert files.present(files.root / "sys/block/sda/size")


def test_lists_a_folder_even_an_empty_one(files: Files) -> None:
    block = files.root / "sys/block"
    assert sorted(files.list_dir(block)) == [block / "loop0", block / "sda"]
    assert files.list_dir(block / "loop0") == []
    assert files.present(block / "loop0")


@pytest.mark.parametrize(("relative", "read", "listing"), [
    ("sys/block/nvme0n1", "missing or vanished while reading", "missing or vanished while reading"),
    ("sys/block/sda", "is a directory where a file was expected", None),
    ("proc/meminfo", None, "is a file where a directory was expected"),
])
def test_every_failure_names_the_path(files: Files, relative: str, read: str | None,
                                      listing: str | None) -> None:
    path = files.root / relative
    for expected, attempt in ((read, files.read_text), (listing, files.list_dir)):
        if expected is None:
            continue
        with pytest.raises(SysfsError) as failure:
            attempt(path)
        assert str(failure.value) == f"{path}: {expected}"


def test_nothing_there_is_not_present(files: Files) -> None:
    assert not files.present(files.root / "sys/block/nvme0n1")
