"""The alert rules (OBS-2), checked and unit-tested by the real promtool."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import yaml

from healthplane.contracts.config import ClusterConfig
from tests.support.monitoring import (
    NODE_SERIES,
    PROMETHEUS_CONFIG,
    ROOT,
    RULE_TESTS,
    RULES,
    alert_rules,
    tool,
)

ABSENCE_ALERTS = {"HealthplaneNodeHealthMetricsAbsent", "HealthplaneSubstrateBucketMetricsAbsent"}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True, timeout=60)


def test_obs2_promtool_accepts_the_rules() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_obs2_promtool_unit_tests_pass() -> None:
    assert RULE_TESTS, "no promtool unit tests under deploy/prometheus/rules/tests"
    result = _promtool("test", "rules", *map(str, RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_obs2_promtool_accepts_the_prometheus_config() -> None:
    result = _promtool("check", "config", "--syntax-only", str(PROMETHEUS_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr


def _alert_tests() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                cases.append({**case, "series": [s["series"] for s in test.get("input_series", [])]})
    return cases


def test_obs2_every_alert_is_tested_firing_and_quiet() -> None:
    # Fires: some case expects it. Resolves or stays quiet: some case expects nothing.
    cases = _alert_tests()
    for rule in alert_rules():
        name = rule["alert"]
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c.get("exp_alerts") for c in mine), f"{name}: no unit test where it fires"
        assert any(not c.get("exp_alerts") for c in mine), f"{name}: no unit test where it is quiet"


def test_obs2_every_alert_but_the_absence_ones_is_tested_without_its_series() -> None:
    # A missing series is not healthy and not zero: only the *Absent rules may fire on it.
    cases = _alert_tests()
    for rule in alert_rules():
        name = rule["alert"]
        if name in ABSENCE_ALERTS:
            continue
        metrics = set(re.findall(r"\b(healthplane_\w+|up)\b", rule["expr"]))
        quiet_without = [c for c in cases if c["alertname"] == name and not c.get("exp_alerts")
                         and not any(s.split("{")[0] in metrics for s in c["series"])]
        assert quiet_without, f"{name}: no unit test showing it stays quiet when {metrics} are missing"


def test_obs2_node_series_are_always_taken_by_max_by_node() -> None:
    # Two scorer replicas can serve one node during a failover: max, never sum.
    for rule in alert_rules():
        expr = " ".join(rule["expr"].split())
        for metric in NODE_SERIES.findall(expr):
            if expr.startswith(f"absent({metric}"):
                continue
            assert re.search(rf"max by \(cluster, node_id(, \w+)*\) \({metric}\b", expr), (
                f"{rule['alert']}: {metric} is not aggregated with max by (cluster, node_id)")


def test_obs2_score_thresholds_equal_the_policy_defaults_and_the_deployed_config() -> None:
    by_name = {rule["alert"]: rule for rule in alert_rules()}
    defaults = ClusterConfig().node_health
    deployed = yaml.safe_load((ROOT / "deploy" / "config" / "cluster.yaml").read_text())["nodeHealth"]
    for alert, default, key in (("HealthplaneNodeScoreBelowCordon", defaults.cordon_below, "cordonBelow"),
                                ("HealthplaneNodeScoreBelowDrain", defaults.drain_below, "drainBelow")):
        threshold = re.fullmatch(r".*healthplane_node_reliability_score\) < (\d+)", by_name[alert]["expr"].strip())
        assert threshold, by_name[alert]["expr"]
        assert int(threshold.group(1)) == default == deployed[key], f"{alert} disagrees with {key}"
        assert f"({default})" in by_name[alert]["annotations"]["summary"]


def test_obs2_every_alert_says_how_bad_and_what_happened() -> None:
    for rule in alert_rules():
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        assert rule["alert"].startswith("Healthplane"), rule["alert"]
