"""The monitoring files under deploy/, read the way Prometheus and Grafana read them, and
the real tools that check them (Debian's prometheus and prometheus-alertmanager packages,
installed by `sh tools/ensure-prometheus`, which `just test` runs first)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules" / "healthplane.yml"
RULE_TESTS = sorted((ROOT / "deploy" / "prometheus" / "rules" / "tests").glob("*.yml"))
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
ALERTMANAGER = ROOT / "deploy" / "alertmanager"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "node-reliability.json"

NODE_SERIES = re.compile(r"\bhealthplane_node_\w+")
# What Grafana puts in place of the dashboard's variables when "All" is selected.
GRAFANA_VARIABLES = {"$cluster": ".*", "$node": ".*", "$__rate_interval": "1m"}


def tool(name: str) -> str:
    """The path of a real tool; a missing one fails the test (it is part of the contract)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: run `sh tools/ensure-prometheus` (as root it "
                    f"installs Debian's prometheus and prometheus-alertmanager packages)")
    return path


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())  # type: ignore[no-any-return]


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL expression as Grafana writes it) for every panel target."""
    return [(panel["title"], target["expr"])
            for panel in dashboard()["panels"] for target in panel.get("targets", [])]


def as_promql(grafana_expr: str) -> str:
    """A dashboard expression with its variables expanded as Grafana does for "All"."""
    expr = grafana_expr
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unexpanded variable in {grafana_expr!r}"
    return expr
