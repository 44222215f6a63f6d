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
from typing import Final

from healthplane import wire
from healthplane.runtime.metrics import label_value
from healthplane_scorer.fold import NodeScore, ScorerState, node_health

HEALTH_STATES = ("healthy", "degraded", "unknown")
CHUNK_NODES: Final = 2000
_NODE: Final = "\x00"  # where a template takes the node id (never in an escaped label value)
_NODE_BYTES: Final = _NODE.encode()


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
        self._clear: dict[str, bytes] = {}  # cluster label -> every condition at 0, node id to fill in
        self._health: dict[tuple[str, str], bytes] = {}  # (cluster label, current state) -> block

    def render(self) -> Iterator[bytes]:
        # One copy of each state's nodes: the event loop changes the dict while we read. Each
        # node's labels are escaped once here, not once per family (0.8 million calls at 100,000),
        # and each family is one comprehension over plain tuples: at 100,000 nodes every call
        # per node and family is a tenth of a second.
        clusters: dict[str, str] = {}
        nodes = [(node, clusters.get(node.cluster) or clusters.setdefault(node.cluster, label_value(node.cluster)),
                  label_value(node.node_id), node_health(node, state.config.degraded_at_or_below).lower())
                 for state in self._states() for node in list(state.nodes.values())]
        for family, block in ((SCORE_FAMILY, _scores), (CONDITION_FAMILY, self._conditions),
                              (HEALTH_FAMILY, self._health_blocks), (FAILURES_FAMILY, _failures),
                              (ATTENTION_FAMILY, _attention)):
            yield family.encode()
            for start in range(0, len(nodes), CHUNK_NODES):
                yield b"".join(block(nodes[start:start + CHUNK_NODES]))

    # The two families most of the text is in (13 of a node's 15 samples) are bytes templates
    # with the node id put in: no text to encode afterwards.

    def _conditions(self, nodes: list[_Labelled]) -> Iterator[bytes]:
        for node, cluster, node_id, _ in nodes:
            if not node.assessed:  # every condition type gets a series once a node reports
                continue
            if not node.conditions:
                template = self._clear.get(cluster)
                if template is None:
                    template = self._clear[cluster] = "".join(
                        _condition_line(cluster, t, _NODE, 0) for t in wire.CONDITION_TYPES).encode()
                yield template.replace(_NODE_BYTES, node_id.encode())
                continue
            active: dict[str, int] = {c.type: wire.SEVERITY_LEVEL[c.severity] for c in node.conditions}
            yield "".join(_condition_line(cluster, t, node_id, active.get(t, 0))
                          for t in wire.CONDITION_TYPES).encode()

    def _health_blocks(self, nodes: list[_Labelled]) -> Iterator[bytes]:
        templates = self._health
        for _, cluster, node_id, current in nodes:
            template = templates.get((cluster, current))
            if template is None:
                template = templates[(cluster, current)] = "".join(
                    _health_line(cluster, _NODE, state, current) for state in HEALTH_STATES).encode()
            yield template.replace(_NODE_BYTES, node_id.encode())


# (the node, its cluster and node id as label values, its health state's label)
_Labelled = tuple[NodeScore, str, str, str]


def _scores(nodes: list[_Labelled]) -> list[bytes]:
    return ["".join([f'healthplane_node_reliability_score{{cluster="{cluster}",node_id="{node_id}"}} {node.score}.0\n'
                     for node, cluster, node_id, _ in nodes if node.score is not None]).encode()]


def _failures(nodes: list[_Labelled]) -> list[bytes]:
    return ["".join([f'healthplane_node_attributed_failures_total{{cluster="{cluster}",node_id="{node_id}"}} '
                     f'{node.tally.count}.0\n' for node, cluster, node_id, _ in nodes]).encode()]


def _attention(nodes: list[_Labelled]) -> list[bytes]:
    return ["".join([f'healthplane_node_needs_attention{{cluster="{cluster}",node_id="{node_id}"}} 1.0\n'
                     for node, cluster, node_id, _ in nodes if node.attention is not None]).encode()]
