"""Node series (SCO-6), published by the lease holder only: computed from the scorer's state
at scrape time, so a node that leaves the state leaves the series, and a replica that loses
the lease stops exporting at once."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from healthplane import wire
from healthplane_scorer.fold import ScorerState, node_health

HEALTH_STATES = ("healthy", "degraded", "unknown")


class NodeSeries(Collector):
    def __init__(self, states: Callable[[], list[ScorerState]]) -> None:
        # The states of the partitions this replica leads (one unpartitioned, none on a
        # standby: lifecycle.run_processor_service); each node is in exactly one.
        self._states = states

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        # One atomic copy of each: the event loop mutates the dicts.
        nodes = [(node, state.config.degraded_at_or_below) for state in self._states() for node in list(state.nodes.values())]
        score = GaugeMetricFamily("healthplane_node_reliability_score",
                                  "Reliability score 0-100; absent while the node is unscored",
                                  labels=["node_id", "cluster"])
        condition = GaugeMetricFamily("healthplane_node_condition",
                                      "Condition severity (1 info, 2 warning, 3 critical; 0 clear)",
                                      labels=["node_id", "cluster", "condition"])
        health = GaugeMetricFamily("healthplane_node_health", "1 for the node's current health state",
                                   labels=["node_id", "cluster", "state"])
        failures = CounterMetricFamily("healthplane_node_attributed_failures",
                                       "Job failures attributed to the node", labels=["node_id", "cluster"])
        for node, degraded_at_or_below in nodes:
            labels = [node.node_id, node.cluster]
            if node.score is not None:
                score.add_metric(labels, node.score)
            if node.assessed:  # every condition type gets a series once a node reports
                active: dict[str, int] = {c.type: wire.SEVERITY_LEVEL[c.severity] for c in node.conditions}
                for condition_type in wire.CONDITION_TYPES:
                    condition.add_metric([*labels, condition_type], active.get(condition_type, 0))
            current = node_health(node, degraded_at_or_below).lower()
            for state_name in HEALTH_STATES:
                health.add_metric([*labels, state_name], 1 if state_name == current else 0)
            failures.add_metric(labels, node.tally.count)
        yield score
        yield condition
        yield health
        yield failures
