"""The monitoring stack against a live `healthplane up` (OBS-1, OBS-2, OBS-3): a real
Prometheus (Debian's package) scrapes every service on loopback, evaluates the alert
rules and sends what fires to a real Alertmanager started by deploy/alertmanager's
entrypoint without a webhook. Every PromQL expression of the dashboard and of the rules
must be valid, and the key ones must show an injected fault."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from healthplane.stack.natsserver import free_port
from tests.support.monitoring import (
    ALERTMANAGER,
    RULES,
    alert_rules,
    as_promql,
    dashboard,
    dashboard_queries,
    tool,
)

pytestmark = [pytest.mark.slow, pytest.mark.nats]

AGENTS = {"sim", "collector"}  # scraped as job healthplane-agent, as in deploy/prometheus


def _wait(what: str, probe: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except (httpx.HTTPError, OSError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}; last saw {last!r}")


def _stop(process: subprocess.Popen[bytes] | subprocess.Popen[str], how: signal.Signals = signal.SIGTERM) -> None:
    if process.poll() is None:
        process.send_signal(how)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """`healthplane up --nodes 3`; the bridge samples its bucket every second."""
    env = {**os.environ, "HEALTHPLANE_BUCKET_SAMPLE_SECONDS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "healthplane.cli", "up", "--nodes", "3", "--nats-port", "0",
         "--data-dir", str(tmp_path / "hp")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    stack_file = tmp_path / "hp" / "stack.json"
    try:
        def started() -> dict[str, Any] | None:
            if process.poll() is not None:
                raise AssertionError(f"up exited early: {process.stderr.read() if process.stderr else ''}")
            return json.loads(stack_file.read_text()) if stack_file.exists() else None

        yield _wait("stack.json", started, 60)
    finally:
        _stop(process, signal.SIGINT)  # Ctrl-C, as a user stops `up`
    assert process.returncode == 0


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    """deploy/alertmanager/entrypoint.sh with HEALTHPLANE_ALERT_WEBHOOK_URL unset."""
    storage = tmp_path / "alertmanager"
    storage.mkdir()
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key != "HEALTHPLANE_ALERT_WEBHOOK_URL"}
    env |= {"ALERTMANAGER_BIN": tool("prometheus-alertmanager"), "ALERTMANAGER_CONFIG_DIR": str(ALERTMANAGER),
            "ALERTMANAGER_STORAGE": str(storage)}
    log = (tmp_path / "alertmanager.log").open("wb")
    process = subprocess.Popen(
        ["sh", str(ALERTMANAGER / "entrypoint.sh"), f"--web.listen-address=127.0.0.1:{port}",
         "--cluster.listen-address="],  # no HA gossip port
        env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait("alertmanager ready", lambda: httpx.get(f"{url}/-/ready", timeout=2).status_code == 200, 30)
        yield url
    finally:
        _stop(process)
        log.close()


def _prometheus_config(stack: dict[str, Any], rules: Path, alertmanager: str) -> dict[str, Any]:
    jobs: dict[str, list[str]] = {"healthplane": [], "healthplane-agent": []}
    for service in stack["services"]:
        job = "healthplane-agent" if service["name"] in AGENTS else "healthplane"
        jobs[job].append(urlsplit(service["metricsUrl"]).netloc)
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [urlsplit(alertmanager).netloc]}]}]},
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}
                           for job, targets in jobs.items() if targets],
    }


@pytest.fixture
def prometheus(tmp_path: Path, stack: dict[str, Any], alertmanager: str) -> Iterator[str]:
    # The deployed rules with every `for` cut to zero, so what fires reaches Alertmanager
    # within this test; the expressions are the deployed ones.
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(_prometheus_config(stack, tmp_path / "rules.yml", alertmanager)))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait("prometheus ready", lambda: httpx.get(f"{url}/-/ready", timeout=2).status_code == 200, 30)
        yield url
    finally:
        _stop(process)
        log.close()


def _query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10)
    body = answer.json()
    assert answer.status_code == 200 and body["status"] == "success", f"{expr!r}: {body.get('error')}"
    return body["data"]["result"]  # type: ignore[no-any-return]


def _by(result: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(r["metric"].get(label, "") for label in labels): float(r["value"][1]) for r in result}


def test_obs_dashboard_and_rules_answer_on_a_live_stack_with_an_injected_fault(
        stack: dict[str, Any], prometheus: str, alertmanager: str) -> None:
    score = "max by (cluster, node_id) (healthplane_node_reliability_score)"
    _wait("three scored nodes", lambda: len(_query(prometheus, score)) == 3, 40)

    injected = subprocess.run(
        [sys.executable, "-m", "healthplane.cli", "sim", "inject", "sim-001", "--fault", "xid:79", "--gpu", "0",
         "--nats-url", str(stack["natsUrl"]), "--creds", str(stack["adminCreds"])],
        capture_output=True, text=True, timeout=30)
    assert injected.returncode == 0, injected.stderr
    # A hardware Xid is critical: -45 (SCO-2), as `node show` says in tests/e2e/test_up.py.
    _wait("sim-001 scored 55", lambda: _by(_query(prometheus, score), "node_id").get(("sim-001",)) == 55, 30)

    # A rate needs two samples in its window: on a loaded machine scrapes can time out, so
    # wait for them rather than for a time.
    _wait("two scrapes of every service within a minute", lambda: all(
        float(r["value"][1]) >= 2 for r in _query(prometheus, "count_over_time(up[1m])")) and len(
        _query(prometheus, "count_over_time(healthplane_substrate_nodes_bucket_put_failures_total[1m]) >= 2")) == 1,
        60)
    # Every dashboard query is valid PromQL on real data ...
    answers = {title_expr: _query(prometheus, as_promql(title_expr[1])) for title_expr in dashboard_queries()}

    def panel(title: str, ref: int = 0) -> list[dict[str, Any]]:
        return [answer for (t, _), answer in answers.items() if t == title][ref]

    states = _by(panel("Nodes by health state"), "state")
    assert sum(states.values()) == 3 and states[("degraded",)] >= 1
    assert _by(panel("Lowest score in the fleet")) == {(): 55}
    assert _by(panel("Lowest-scoring nodes"), "node_id")[("sim-001",)] == 55
    assert {k[0] for k in _by(panel("Score history per node"), "node_id")} == {"sim-000", "sim-001", "sim-002"}
    conditions = _by(panel("Active conditions"), "node_id", "condition")
    assert conditions[("sim-001", "gpu_xid_errors")] == 3 and conditions[("sim-001", "collector_failed")] == 2
    # Failures are attributed only to a node carrying a real fault (EVI-7).
    assert {k[0] for k in _by(panel("Job failures attributed per node"), "node_id")} <= {"sim-001"}
    assert _by(panel("substrate-nodes bucket", 1)) == {(): 64 * 1024 * 1024}  # the default cap
    assert 0 < _by(panel("substrate-nodes bucket", 0))[()] < 64 * 1024 * 1024
    assert _by(panel("Rejected puts and messages", 0)) == {(): 0}
    lagging = {k[0] for k in _by(panel("Consumer lag"), "service")}
    running = {s["name"] for s in stack["services"]} - AGENTS
    assert {"health-ingest", "scorer", "substrate-bridge"} <= lagging <= running  # OBS-1

    # ... and so are the dashboard's variable queries (Grafana's label_values()).
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            selector, label = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"]).groups()  # type: ignore[union-attr]
            values = httpx.get(f"{prometheus}/api/v1/label/{label}/values",
                               params={"match[]": as_promql(selector)}, timeout=10).json()["data"]
            assert values == (["default"] if label == "cluster" else ["sim-000", "sim-001", "sim-002"])

    # Every rule expression is valid, and says what an operator would expect (OBS-2).
    fired = {rule["alert"]: _query(prometheus, rule["expr"]) for rule in alert_rules()}
    assert _by(fired.pop("HealthplaneNodeScoreBelowCordon"), "cluster", "node_id") == {("default", "sim-001"): 55}
    assert _by(fired.pop("HealthplaneNodeCriticalCondition"), "node_id", "condition") == {
        ("sim-001", "gpu_xid_errors"): 3}
    assert _by(fired.pop("HealthplaneNodeCollectorFailed"), "node_id") == {("sim-001",): 2}
    assert {name: answer for name, answer in fired.items() if answer} == {}, "nothing else is wrong here"

    rule_health = httpx.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
    assert all(r["health"] == "ok" for group in rule_health for r in group["rules"])

    # What fires reaches Alertmanager, which with no webhook keeps it for the UI (OBS-3).
    def received() -> set[tuple[str, str]]:
        alerts = httpx.get(f"{alertmanager}/api/v2/alerts", timeout=5).json()
        return {(a["labels"]["alertname"], a["labels"].get("node_id", "")) for a in alerts
                if [r["name"] for r in a["receivers"]] == ["ui"]}

    _wait("alerts in Alertmanager",
          lambda: {("HealthplaneNodeScoreBelowCordon", "sim-001"),
                   ("HealthplaneNodeCriticalCondition", "sim-001")} <= received(), 20)
