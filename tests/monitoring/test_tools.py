"""`just test` brings the real Prometheus tools itself (OBS-2's `promtool test rules` runs
on a clean CI machine), and says nothing when they are already there."""

from __future__ import annotations

import re
import subprocess

from tests.support.monitoring import ROOT, tool


def test_obs2_ensure_prometheus_is_silent_when_the_tools_are_installed() -> None:
    for name in ("promtool", "prometheus", "amtool", "prometheus-alertmanager"):
        tool(name)
    result = subprocess.run(["sh", str(ROOT / "tools" / "ensure-prometheus")], capture_output=True, text=True,
                            timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_obs2_the_test_recipe_installs_the_tools_before_pytest() -> None:
    recipe = re.search(r"^test \*ARGS:.*?\n((?:    .*\n)+)", (ROOT / "justfile").read_text(), re.M)
    assert recipe, "no test recipe in the justfile"
    lines = [line.strip() for line in recipe.group(1).splitlines()]
    assert lines.index("sh tools/ensure-prometheus") < next(i for i, line in enumerate(lines) if "pytest" in line)
