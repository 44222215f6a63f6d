"""The Grafana "Node Reliability" dashboard and provisioning (OBS-3). The queries
themselves run against a live Prometheus in tests/e2e/test_prometheus.py."""

from __future__ import annotations

import importlib.util
import re
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import Any

import yaml

from healthplane.contracts import breakfix, wire
from healthplane.contracts.config import ClusterConfig
from healthplane_api.metrics import BreakfixSeries
from tests.support.monitoring import DASHBOARD, GRAFANA, NODE_SERIES, dashboard, dashboard_queries


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("node_reliability", GRAFANA / "node_reliability.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_obs3_committed_dashboard_is_what_the_generator_builds() -> None:
    generator = _generator()
    assert generator.OUTPUT == DASHBOARD
    assert DASHBOARD.read_text(encoding="utf-8") == generator.render(), (
        "deploy/grafana/dashboards/node-reliability.json is stale: run "
        "`.venv/bin/python deploy/grafana/node_reliability.py`")


def test_obs3_dashboard_thresholds_equal_the_policy_defaults() -> None:
    generator = _generator()
    defaults = ClusterConfig().node_health
    assert (generator.CORDON_BELOW, generator.DRAIN_BELOW) == (defaults.cordon_below, defaults.drain_below)


def _panel(title: str) -> dict[str, Any]:
    panels: list[dict[str, Any]] = [p for p in dashboard()["panels"] if p["title"] == title]
    [panel] = panels
    return panel


def test_obs3_node_reliability_has_the_panels_an_operator_needs() -> None:
    board = dashboard()
    assert board["title"] == "Node Reliability" and board["uid"] == "healthplane-node-reliability"
    queries = dashboard_queries()
    wanted = {
        "Nodes by health state": "healthplane_node_health",
        "Lowest score in the fleet": "healthplane_node_reliability_score",
        "Score history per node": "healthplane_node_reliability_score",
        "Active conditions": "healthplane_node_condition",
        "Job failures attributed per node": "healthplane_node_attributed_failures_total",
        "substrate-nodes bucket": "healthplane_substrate_nodes_bucket_bytes_used",
        "Consumer lag": "healthplane_consumer_lag_messages",
    }
    for title, metric in wanted.items():
        assert any(t == title and metric in expr for t, expr in queries), f"no {title!r} panel over {metric}"
    assert 'node_id=~"$node"' in _panel("Score history per node")["targets"][0]["expr"]
    assert _panel("Active conditions")["type"] == "table"
    assert _panel("Active conditions")["targets"][0]["format"] == "table"  # labels become columns
    for panel in board["panels"]:
        if panel["type"] == "bargauge":  # one bar per series, named by its legend
            assert all(t["instant"] and t.get("format") != "table" for t in panel["targets"]), panel["title"]


def test_obs3_dashboard_variables_pick_data_source_cluster_and_node() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name, label in (("cluster", "cluster"), ("node", "node_id")):
        assert variables[name]["type"] == "query" and variables[name]["multi"] and variables[name]["includeAll"]
        assert re.fullmatch(rf"label_values\(healthplane_node_health(\{{.*\}})?, {label}\)", variables[name]["query"])
    for panel in dashboard()["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def test_obs3_dashboard_takes_node_series_by_max_per_node() -> None:
    # As the alert rules: a scorer failover must not count a node twice.
    for title, expr in dashboard_queries():
        for metric in NODE_SERIES.findall(expr):
            assert re.search(rf"max by \(cluster, node_id(, \w+)*\) \({metric}\b", expr), f"{title}: {expr}"


def test_obs3_grafana_provisions_prometheus_as_default_and_the_dashboard_folder() -> None:
    [source] = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    assert source["url"] == "http://prometheus:9090"
    [provider] = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "healthplane.yml").read_text())["providers"]
    assert provider["type"] == "file" and provider["options"]["path"] == "/etc/grafana/dashboards/healthplane"


def test_breakfix_panels_query_series_the_api_exports() -> None:
    """Issue 41.5 (SPEC RUL, "Breakfix figures"): every breakfix series the dashboard names is one
    the api's collector exports, with the labels the query takes, and the panels exist."""
    class Read:
        state = breakfix.Breakfix()
        caught_up = True

    at = datetime(2026, 12, 1, tzinfo=UTC)
    Read.state.fold(wire.NodeEvent(id="e1", node_id="n1", cluster="c", type="CONDITION_RAISED", occurred_at=at,
                                   message="raised", actor="health-ingest", condition=wire.Condition(
                                       type="gpu_xid_errors", severity="critical", reason="GpuXid", message="Xid 79",
                                       first_seen=at)))
    Read.state.fold(wire.NodeEvent(id="e2", node_id="n1", cluster="c", type="HOLD_CREATED",
                                   occurred_at=at + timedelta(seconds=5), message="hold", actor="eviction",
                                   hold=wire.Hold(id="h1", effect="cordon", reason="fault", actor="eviction",
                                                  created_at=at)))
    exported = {sample.name: set(sample.labels) for family in BreakfixSeries(Read()).collect()
                for sample in family.samples}
    named = {(title, name) for title, expr in dashboard_queries()
             for name in re.findall(r"\bhealthplane_breakfix_\w+", expr)}
    assert {title for title, _ in named} == {"Breakfix: mean time per stage", "Breakfix: incidents per fault class"}
    for title, name in named:
        assert name in exported, f"{title}: {name} is not exported (exported: {sorted(exported)})"
        expr = next(e for t, e in dashboard_queries() if t == title)
        grouped = re.search(rf"max by \(([\w, ]+)\) \({name}\b", expr)
        assert grouped is not None and set(grouped.group(1).split(", ")) <= exported[name], (title, expr)
