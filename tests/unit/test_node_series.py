"""SCO-6: the scorer's node series, rendered from templates (services/scorer/metrics.py), say
exactly what prometheus_client would have said for the same state: the same families, types,
samples and values, read back by prometheus_client's own parser. The reference rendering here
is the one the scorer used before (families built sample by sample)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from healthplane import wire
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
    rendered = b"".join(NodeSeries(lambda: [state]).render()).decode()
    assert samples(rendered) == samples(expected)


def test_a_standby_renders_empty_families_and_every_state_it_leads() -> None:
    # SCO-6 with partitions: a replica exports the nodes of every partition it leads, none on standby.
    first = ScorerState(nodes={"c.a": NodeScore(cluster="c", node_id="a", score=90, assessed=True)})
    second = ScorerState(nodes={"c.b": NodeScore(cluster="c", node_id="b", score=40, assessed=True)})
    text = b"".join(NodeSeries(lambda: [first, second]).render()).decode()
    assert 'healthplane_node_reliability_score{cluster="c",node_id="a"} 90.0' in text
    assert 'healthplane_node_reliability_score{cluster="c",node_id="b"} 40.0' in text
    assert 'healthplane_node_condition{cluster="c",condition="gpu_xid_errors",node_id="b"} 0.0' in text
    standby = b"".join(NodeSeries(lambda: []).render()).decode()
    assert all(line.startswith("#") for line in standby.splitlines())
