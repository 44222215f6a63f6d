"""Node series (SCO-6), published by the lease holder only: computed from the scorer's state
at scrape time, so a node that leaves the state leaves the series, and a replica that loses
the lease stops exporting at once.

Rendered here rather than through prometheus_client's families (runtime.metrics.Rendered):
a node has 15 samples (score, 10 conditions, 3 health states, failures), and 100,000 nodes'
1.5 million samples formatted one by one took longer than a scrape's timeout while the fold
starved. Most nodes have no condition, and their condition block differs from another
cluster-mate's only by the node id: it is a per-cluster template with the id put in, as is
each health block. The text is what prometheus_client would write (sorted labels, values as
floats), family by family, a chunk of nodes at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final, NamedTuple

from healthplane import wire
from healthplane.runtime.metrics import label_value
from healthplane_scorer.fold import NodeScore, ScorerState, node_health

HEALTH_STATES = ("healthy", "degraded", "unknown")
CHUNK_NODES: Final = 2000
_NODE: Final = "\x00"  # where a template takes the node id (never in an escaped label value)


def _family(name: str, kind: str, help_text: str) -> str:
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"


SCORE_FAMILY: Final = _family("healthplane_node_reliability_score", "gauge",
                              "Reliability score 0-100; absent while the node is unscored")
CONDITION_FAMILY: Final = _family("healthplane_node_condition", "gauge",
                                  "Condition severity (1 info, 2 warning, 3 critical; 0 clear)")
HEALTH_FAMILY: Final = _family("healthplane_node_health", "gauge", "1 for the node's current health state")
FAILURES_FAMILY: Final = _family("healthplane_node_attributed_failures_total", "counter",
                                 "Job failures attributed to the node")
ATTENTION_FAMILY: Final = _family("healthplane_node_needs_attention", "gauge",
                                  "1 while the node stopped at NODE_NEEDS_ATTENTION (REM-1), until service; "
                                  "absent otherwise")


def _condition_line(cluster: str, condition: str, node: str, level: int) -> str:
    return f'healthplane_node_condition{{cluster="{cluster}",condition="{condition}",node_id="{node}"}} {level}.0\n'


def _health_line(cluster: str, node: str, state: str, current: str) -> str:
    return f'healthplane_node_health{{cluster="{cluster}",node_id="{node}",state="{state}"}} ' \
           f'{1 if state == current else 0}.0\n'


class NodeSeries:
    def __init__(self, states: Callable[[], list[ScorerState]]) -> None:
        # The states of the partitions this replica leads (one unpartitioned, none on a
        # standby: lifecycle.run_processor_service); each node is in exactly one.
        self._states = states
        self._clear: dict[str, str] = {}  # cluster label -> every condition at 0, node id to fill in
        self._health: dict[tuple[str, str], str] = {}  # (cluster label, current state) -> block

    def render(self) -> Iterator[bytes]:
        # One copy of each state's nodes: the event loop changes the dict while we read. Each
        # node's labels are escaped once here, not once per family (0.8 million calls at 100,000).
        clusters: dict[str, str] = {}
        nodes = [_Labelled(node, state.config.degraded_at_or_below,
                           clusters.get(node.cluster) or clusters.setdefault(node.cluster, label_value(node.cluster)),
                           label_value(node.node_id))
                 for state in self._states() for node in list(state.nodes.values())]
        for family, block in ((SCORE_FAMILY, _score), (CONDITION_FAMILY, self._conditions),
                              (HEALTH_FAMILY, self._health_block), (FAILURES_FAMILY, _failures),
                              (ATTENTION_FAMILY, _attention)):
            yield family.encode()
            for start in range(0, len(nodes), CHUNK_NODES):
                yield "".join([block(node) for node in nodes[start:start + CHUNK_NODES]]).encode()

    def _conditions(self, labelled: _Labelled) -> str:
        node, cluster = labelled.node, labelled.cluster
        if not node.assessed:  # every condition type gets a series once a node reports
            return ""
        if not node.conditions:
            template = self._clear.get(cluster)
            if template is None:
                template = self._clear[cluster] = "".join(
                    _condition_line(cluster, t, _NODE, 0) for t in wire.CONDITION_TYPES)
            return template.replace(_NODE, labelled.node_id)
        active: dict[str, int] = {c.type: wire.SEVERITY_LEVEL[c.severity] for c in node.conditions}
        return "".join(_condition_line(cluster, t, labelled.node_id, active.get(t, 0)) for t in wire.CONDITION_TYPES)

    def _health_block(self, labelled: _Labelled) -> str:
        current = node_health(labelled.node, labelled.degraded_at_or_below).lower()
        template = self._health.get((labelled.cluster, current))
        if template is None:
            template = self._health[(labelled.cluster, current)] = "".join(
                _health_line(labelled.cluster, _NODE, state, current) for state in HEALTH_STATES)
        return template.replace(_NODE, labelled.node_id)


class _Labelled(NamedTuple):
    node: NodeScore
    degraded_at_or_below: int
    cluster: str  # label values, escaped
    node_id: str


def _score(labelled: _Labelled) -> str:
    if labelled.node.score is None:
        return ""
    return (f'healthplane_node_reliability_score{{cluster="{labelled.cluster}",'
            f'node_id="{labelled.node_id}"}} {labelled.node.score}.0\n')


def _failures(labelled: _Labelled) -> str:
    return (f'healthplane_node_attributed_failures_total{{cluster="{labelled.cluster}",'
            f'node_id="{labelled.node_id}"}} {labelled.node.tally.count}.0\n')


def _attention(labelled: _Labelled) -> str:
    if labelled.node.attention is None:
        return ""
    return (f'healthplane_node_needs_attention{{cluster="{labelled.cluster}",'
            f'node_id="{labelled.node_id}"}} 1.0\n')
