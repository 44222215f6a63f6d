"""Issue 25 (/metrics within 1 s at 100,000 nodes), SCO-6: the scorer's node series scraped
over HTTP from its real endpoint, 100,000 nodes (1 % with a condition), as Prometheus scrapes
(gzip) and as a plain client does. Baseline in the same run: the first scrape, which renders
and compresses every chunk (what every scrape cost before the series were kept: the render
alone, 0.33-0.5 s on this machine, and 143 MB sent). Then scrapes after 0, 100 (0.1 %) and
1,000 (1 %) nodes changed. Each figure is the median of 5 scrapes: wall time to the last byte
and the process's CPU meanwhile (the endpoint runs in this process)."""

from __future__ import annotations

import random
import statistics
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from healthplane.contracts import wire
from healthplane.runtime import metrics
from healthplane_scorer.fold import NodeScore, ScorerState
from healthplane_scorer.metrics import NodeSeries
from tests.bench import harness

# In-process services run as the test's own identity: on an open server, as the other
# component benches (what identities cost is tests/bench/test_auth_pipeline.py's).
pytestmark = pytest.mark.insecure

NODES = 100_000
T0 = datetime(2026, 12, 3, tzinfo=UTC)


def _scrape(url: str, gzip: bool) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of this process, bytes received)."""
    started, cpu = time.monotonic(), time.process_time()
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gzip else {})
    with urllib.request.urlopen(request, timeout=60) as response:
        size = 0
        while chunk := response.read(1 << 20):
            size += len(chunk)
    return time.monotonic() - started, time.process_time() - cpu, size


def _median(url: str, gzip: bool, before: Callable[[], None] = lambda: None) -> tuple[float, float, int]:
    runs = []
    for _ in range(5):
        before()
        runs.append(_scrape(url, gzip))
    return (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs), runs[-1][2])


def test_issue25_node_series_scrape_at_100000_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    ecc = (wire.Condition(type="gpu_ecc_errors", reason="GpuEccCorrectable", severity="warning", message="m",
                          first_seen=T0),)
    state = ScorerState(nodes={f"c.node-{i:06d}": NodeScore(
        cluster="c", node_id=f"node-{i:06d}", score=90 if i % 100 == 0 else 100, assessed=True, health="HEALTHY",
        conditions=ecc if i % 100 == 0 else ()) for i in range(NODES)})
    monkeypatch.setattr(metrics, "_rendered", [])  # this benchmark's series only
    registry = CollectorRegistry()
    metrics.register_series(NodeSeries(lambda: [state]), registry)
    url = metrics.serve(0, registry=registry).url
    shuffled = random.Random(25)
    keys = list(state.nodes)

    def change(count: int) -> Callable[[], None]:
        def apply() -> None:
            for key in shuffled.sample(keys, count):
                node = state.nodes[key]
                node.score = 100 if node.score != 100 else 95
        return apply

    cold_wall, cold_cpu, cold_bytes = _scrape(url, gzip=True)
    figures = {"unchanged": _median(url, True), "100_changed": _median(url, True, change(100)),
               "1000_changed": _median(url, True, change(1000)), "plain_unchanged": _median(url, False)}
    harness.record("node_series.100000.cold_scrape", cold_wall, "s")
    harness.record("node_series.100000.cold_scrape_cpu", cold_cpu, "s")
    harness.record("node_series.100000.gzip_bytes", cold_bytes / 1e6, "MB")
    harness.record("node_series.100000.plain_bytes", figures["plain_unchanged"][2] / 1e6, "MB",
                   baseline=cold_bytes / 1e6)
    for name, (wall, cpu, _) in figures.items():
        harness.record(f"node_series.100000.{name}_scrape", wall, "s", baseline=cold_wall,
                       target="value <= 1" if name != "plain_unchanged" else "")
        harness.record(f"node_series.100000.{name}_scrape_cpu", cpu, "s", baseline=cold_cpu)
    assert figures["unchanged"][0] < cold_wall
