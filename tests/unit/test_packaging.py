"""What `pip install .` ships (the Docker image's wheel): every package of the source tree.

An editable install maps whole folders, so a subpackage missing from pyproject's package
list works in every test and is absent from the image (`healthplane --help` failed there
with `No module named healthplane.cli`)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_in_the_wheel() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    folders = {name: ROOT / path for name, path in setuptools["package-dir"].items()}
    found = set()
    for name, folder in folders.items():
        for init in folder.rglob("__init__.py"):
            relative = init.parent.relative_to(folder).parts
            found.add(".".join((name, *relative)))
    # The UI's data folders are listed as packages of their own (no __init__.py), so that
    # setuptools ships their files without a warning (UI-5).
    data_only = {name for name in listed if name not in found and name in setuptools["package-data"]}
    assert found - listed == set(), "packages the wheel would leave out"
    assert listed - found - data_only == set(), "packages listed that do not exist"


def test_dev_installs_the_locked_versions() -> None:
    # The tests run on the dependency versions the image installs (requirements.lock).
    dev = (ROOT / "dev").read_text()
    assert "requirements.lock" in dev and "-c .cache/constraints.txt" in dev
