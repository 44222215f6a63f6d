"""Issue 39: the house drawn from the code — no import cycle, each group imports only those
below it, services never import each other, folds reach no I/O, and docs/architecture.md is
what the code draws (``python -m tests.support.house docs/architecture.md`` rewrites it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import house


@pytest.fixture(scope="module")
def found() -> dict[str, house.Module]:
    """Read when this file's tests run, not when every worker collects the suite (3 CPU-s each)."""
    return house.modules()


def test_no_import_cycle_anywhere(found: dict[str, house.Module]) -> None:
    assert house.cycles(found) == []


def test_the_cycle_finder_finds_one() -> None:
    """The check above can fail: two modules that import each other are one cycle."""
    a = house.Module("healthplane_x.a", Path("a.py"), "", {"healthplane_x.b"})
    b = house.Module("healthplane_x.b", Path("b.py"), "", {"healthplane_x.a"})
    c = house.Module("healthplane_x.c", Path("c.py"), "", {"healthplane_x.a"})
    assert house.cycles({m.name: m for m in (a, b, c)}) == [["healthplane_x.a", "healthplane_x.b"]]


def test_each_group_imports_only_those_below_it_and_services_never_each_other(found: dict[str, house.Module]) -> None:
    assert house.layer_breaches(found) == []


def test_a_service_importing_another_is_a_breach() -> None:
    here = house.Module("healthplane_scorer.fold", Path("services/scorer/fold.py"), "", {"healthplane_policy.rules"})
    there = house.Module("healthplane_policy.rules", Path("services/policy/rules.py"), "")
    assert house.layer_breaches({m.name: m for m in (here, there)}) == [
        "healthplane_scorer.fold imports healthplane_policy.rules (healthplane_scorer may import contracts, "
        "runtime, client)"]


def test_folds_and_rules_reach_no_io(found: dict[str, house.Module]) -> None:
    """A fold imports nothing that does I/O (STYLE.md, "A fold, shaped"), however indirectly."""
    assert house.fold_io(found) == {}
    folds = [m for m in found.values() if m.path.name == "fold.py"]
    assert len(folds) >= 7, [m.name for m in folds]  # every stateful service's fold was looked at


def test_the_cli_is_imported_only_by_the_cli_and_the_collectors_commands(found: dict[str, house.Module]) -> None:
    importers = {m.name for m in found.values() for t in m.imports
                 if found[t].group == "cli" and m.group != "cli"}
    assert importers <= house.SERVICE_CLI_MODULES | {"healthplane"}, sorted(importers)


def test_the_architecture_page_is_what_the_code_draws(found: dict[str, house.Module]) -> None:
    page = house.ROOT / "docs" / "architecture.md"
    assert page.read_text(encoding="utf-8") == house.render(found), (
        "docs/architecture.md is stale: run `python -m tests.support.house docs/architecture.md`")
