"""SCO-6: the scorer's node series, rendered from templates (services/scorer/metrics.py), say
exactly what prometheus_client would have said for the same state: the same families, types,
samples and values, read back by prometheus_client's own parser. The reference rendering here
is the one the scorer used before (families built sample by sample). Issue 25: the series are
kept deflated between scrapes and made again only where nodes changed; whatever changes, a
scrape says what the state says then, over HTTP gzip-encoded or not."""

from __future__ import annotations

import gzip
import urllib.request
from datetime import UTC, datetime

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from healthplane.contracts import wire
from healthplane.runtime import gzipped, metrics
from healthplane_scorer.fold import NodeScore, ScorerConfig, ScorerState, node_health
from healthplane_scorer.metrics import HEALTH_STATES, NodeSeries
from healthplane_scorer.rules import Tally

T0 = datetime(2026, 12, 2, 4, 0, tzinfo=UTC)


class Reference:
    def __init__(self, state: ScorerState) -> None:
        self._state = state

    def collect(self):  # type: ignore[no-untyped-def]
        score = GaugeMetricFamily("healthplane_node_reliability_score",
                                  "Reliability score 0-100; absent while the node is unscored", labels=["node_id", "cluster"])
        condition = GaugeMetricFamily("healthplane_node_condition",
                                      "Condition severity (1 info, 2 warning, 3 critical; 0 clear)",
                                      labels=["node_id", "cluster", "condition"])
        health = GaugeMetricFamily("healthplane_node_health", "1 for the node's current health state",
                                   labels=["node_id", "cluster", "state"])
        failures = CounterMetricFamily("healthplane_node_attributed_failures",
                                       "Job failures attributed to the node", labels=["node_id", "cluster"])
        attention = GaugeMetricFamily("healthplane_node_needs_attention",
                                      "1 while the node stopped at NODE_NEEDS_ATTENTION (REM-1), until service; "
                                      "absent otherwise", labels=["node_id", "cluster"])
        for node in self._state.nodes.values():
            labels = [node.node_id, node.cluster]
            if node.score is not None:
                score.add_metric(labels, node.score)
            if node.assessed:
                active = {c.type: wire.SEVERITY_LEVEL[c.severity] for c in node.conditions}
                for condition_type in wire.CONDITION_TYPES:
                    condition.add_metric([*labels, condition_type], active.get(condition_type, 0))
            current = node_health(node, self._state.config.degraded_at_or_below).lower()
            for state_name in HEALTH_STATES:
                health.add_metric([*labels, state_name], 1 if state_name == current else 0)
            failures.add_metric(labels, node.tally.count)
            if node.attention is not None:
                attention.add_metric(labels, 1)
        yield from (score, condition, health, failures, attention)


def text(series: NodeSeries) -> str:
    return b"".join(map(gzipped.inflate, series.render())).decode()


def samples(text: str) -> dict[str, tuple[str, set[tuple[str, tuple[tuple[str, str], ...], float]]]]:
    return {family.name: (family.type, {(s.name, tuple(sorted(s.labels.items())), s.value) for s in family.samples})
            for family in text_string_to_metric_families(text)}


ids = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
conditions = st.lists(st.builds(
    lambda t, s: wire.Condition(type=t, reason="r", severity=s, message="m", first_seen=T0),
    st.sampled_from(wire.CONDITION_TYPES), st.sampled_from(["info", "warning", "critical"])),
    max_size=3, unique_by=lambda c: c.type)
nodes = st.builds(
    lambda node_id, cluster, conds, score, assessed, health, failures, attention: NodeScore(
        cluster=cluster, node_id=node_id, conditions=conds, score=score, assessed=assessed, health=health,
        tally=Tally(count=failures),
        attention=wire.NeedsAttention(since=T0, reason="every step of its ladder was tried") if attention else None),
    ids, st.sampled_from(["default", "lab", 'we"ird\\c']), conditions, st.none() | st.integers(0, 100),
    st.booleans(), st.sampled_from(["HEALTHY", "DEGRADED", "UNKNOWN"]), st.integers(0, 5), st.booleans())


@settings(max_examples=60, deadline=None)
@given(st.lists(nodes, max_size=30, unique_by=lambda n: (n.cluster, n.node_id)), st.integers(0, 100))
def test_rendered_node_series_equal_prometheus_clients(fleet: list[NodeScore], threshold: int) -> None:
    state = ScorerState(nodes={f"{n.cluster}.{n.node_id}": n for n in fleet},
                        config=ScorerConfig(degraded_at_or_below=threshold))
    registry = CollectorRegistry()
    registry.register(Reference(state))  # type: ignore[arg-type]
    expected = generate_latest(registry).decode()
    assert samples(text(NodeSeries(lambda: [state]))) == samples(expected)


def test_a_standby_renders_empty_families_and_every_state_it_leads() -> None:
    # SCO-6 with partitions: a replica exports the nodes of every partition it leads, none on standby.
    first = ScorerState(nodes={"c.a": NodeScore(cluster="c", node_id="a", score=90, assessed=True)})
    second = ScorerState(nodes={"c.b": NodeScore(cluster="c", node_id="b", score=40, assessed=True)})
    both = text(NodeSeries(lambda: [first, second]))
    assert 'healthplane_node_reliability_score{cluster="c",node_id="a"} 90.0' in both
    assert 'healthplane_node_reliability_score{cluster="c",node_id="b"} 40.0' in both
    assert 'healthplane_node_condition{cluster="c",condition="gpu_xid_errors",node_id="b"} 0.0' in both
    standby = text(NodeSeries(lambda: []))
    assert all(line.startswith("#") for line in standby.splitlines())


def reference_samples(state: ScorerState) -> dict[str, tuple[str, set[tuple[str, tuple[tuple[str, str], ...], float]]]]:
    registry = CollectorRegistry()
    registry.register(Reference(state))  # type: ignore[arg-type]
    return samples(generate_latest(registry).decode())


# One change to a node between scrapes: (node index, what changes, the new value's seed).
changes = st.lists(st.tuples(st.integers(0, 59), st.sampled_from(
    ["score", "conditions", "health", "failures", "attention", "assessed", "remove", "add"]), st.integers(0, 100)),
    max_size=12)


@settings(max_examples=25, deadline=None)
@given(st.lists(changes, min_size=1, max_size=6), st.integers(1, 7))
def test_issue25_kept_series_say_what_the_state_says_after_any_changes(
        rounds: list[list[tuple[int, str, int]]], chunk_nodes: int) -> None:
    """One NodeSeries scraped between rounds of changes (some nodes changed, removed, added;
    chunks as small as one node, so that kept and remade chunks mix) says what a reference
    rendering of the state says at each scrape, and so what a fresh NodeSeries says."""
    state = ScorerState(nodes={f"c.n{i}": NodeScore(cluster="c", node_id=f"n{i}", score=100, assessed=True,
                                                    health="HEALTHY") for i in range(40)})
    series = NodeSeries(lambda: [state], chunk_nodes=chunk_nodes)
    assert samples(text(series)) == reference_samples(state)
    added = 40
    for round_ in rounds:
        for index, change, seed in round_:
            keys = list(state.nodes)
            if change == "add":
                state.nodes[f"c.n{added}"] = NodeScore(cluster="c", node_id=f"n{added}", assessed=True, score=seed)
                added += 1
                continue
            if not keys:
                continue
            key = keys[index % len(keys)]
            node = state.nodes[key]
            if change == "remove":
                del state.nodes[key]
            elif change == "score":
                node.score = None if seed == 0 else seed
            elif change == "conditions":
                node.conditions = tuple(wire.Condition(
                    type=wire.CONDITION_TYPES[(seed + k) % len(wire.CONDITION_TYPES)], reason="r",
                    severity=("info", "warning", "critical")[(seed + k) % 3], message="m", first_seen=T0)
                    for k in range(seed % 3))
            elif change == "health":
                node.health = ("HEALTHY", "DEGRADED", "UNKNOWN")[seed % 3]
            elif change == "failures":
                node.tally = Tally(count=seed % 6)
            elif change == "attention":
                node.attention = wire.NeedsAttention(since=T0, reason="ladder tried") if seed % 2 else None
            else:
                node.assessed = bool(seed % 2)
        scraped = text(series)
        assert samples(scraped) == reference_samples(state)
        assert scraped == text(NodeSeries(lambda: [state], chunk_nodes=chunk_nodes))


def test_issue25_metrics_are_gzip_encoded_for_a_scraper_that_asks_plain_text_otherwise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Prometheus asks for gzip: it gets one gzip stream, which a client that reads only a
    response's first gzip member (httpx) reads whole; a scraper that does not ask gets the same
    text plain. A real HTTP server on loopback."""
    state = ScorerState(nodes={f"c.n{i}": NodeScore(cluster="c", node_id=f"n{i}", score=i % 101, assessed=True)
                               for i in range(1200)})
    monkeypatch.setattr(metrics, "_rendered", [])  # this test's series only
    registry = CollectorRegistry()
    metrics.register_series(NodeSeries(lambda: [state]), registry)
    url = metrics.serve(0, registry=registry).url
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Encoding"] == "gzip"
        encoded = response.read()
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers.get("Content-Encoding") is None
        plain = response.read().decode()
    through_httpx = httpx.get(url, headers={"Accept-Encoding": "gzip"}, timeout=10)
    assert through_httpx.headers["Content-Encoding"] == "gzip"
    assert through_httpx.text == gzip.decompress(encoded).decode() == plain
    assert samples(plain) == reference_samples(state) | samples(generate_latest(registry).decode())
    assert len(encoded) < len(plain) / 10
