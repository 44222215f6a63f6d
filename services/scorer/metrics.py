"""Node series (SCO-6), published by the lease holder only: computed from the scorer's state
at scrape time, so a node that leaves the state leaves the series, and a replica that loses
the lease stops exporting at once.

Rendered here rather than through prometheus_client's families (runtime.metrics.Rendered):
a node has 15 samples (score, 10 conditions, 3 health states, failures), and 100,000 nodes'
1.5 million samples formatted one by one took longer than a scrape's timeout while the fold
starved. Most nodes have no condition, and their condition block differs from another
cluster-mate's only by the node id: it is a per-cluster template with the id put in, as is
each health block. The text is what prometheus_client would write (sorted labels, values as
floats), family by family; it is kept deflated between scrapes, a chunk of nodes at a time, and
made again only for chunks whose nodes' series changed (:class:`NodeSeries`), so that scraping a
fleet at rest costs little more than looking at it (runtime.gzipped, runtime.metrics).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Final, NamedTuple

from healthplane.contracts import wire
from healthplane.runtime import gzipped
from healthplane.runtime.metrics import label_value
from healthplane_scorer.fold import NodeScore, ScorerState, node_health

HEALTH_STATES = ("healthy", "degraded", "unknown")
# Small enough that one changed node costs 1/400 of the text at 100,000 nodes, large enough
# that the pieces compress (27x) and number few (2,000 at 100,000 nodes).
CHUNK_NODES: Final = 250
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
FAMILY_HEADERS: Final = tuple(gzipped.piece(family.encode()) for family in (
    SCORE_FAMILY, CONDITION_FAMILY, HEALTH_FAMILY, FAILURES_FAMILY, ATTENTION_FAMILY))


def _condition_line(cluster: str, condition: str, node: str, level: int) -> str:
    return f'healthplane_node_condition{{cluster="{cluster}",condition="{condition}",node_id="{node}"}} {level}.0\n'


def _health_line(cluster: str, node: str, state: str, current: str) -> str:
    return f'healthplane_node_health{{cluster="{cluster}",node_id="{node}",state="{state}"}} ' \
           f'{1 if state == current else 0}.0\n'


class _Chunk(NamedTuple):
    fingerprint: int  # hash of its nodes' samples
    pieces: tuple[gzipped.Piece | None, ...]  # one per family, None where it has no sample


class NodeSeries:
    """The node series of the partitions this replica leads, as deflated pieces kept between
    scrapes: nodes are taken CHUNK_NODES at a time, and a chunk is rendered and compressed again
    only when what its series show changed (its fingerprint). A fleet at rest costs a scrape
    0.07 s at 100,000 nodes (the samples and their fingerprints) instead of 0.6 s (the text
    made and compressed, the fold starved meanwhile), and the pieces kept cost about 55 B a
    node; a chunk with one changed node is made whole (tests/bench/test_node_series.py).
    Fingerprints are 64-bit hashes: two different chunks that hash the same (odds 2**-64 a
    change) would show the old series until the chunk changes again."""

    def __init__(self, states: Callable[[], list[ScorerState]], chunk_nodes: int = CHUNK_NODES) -> None:
        # The states of the partitions this replica leads (one unpartitioned, none on a
        # standby: lifecycle.run_processor_service); each node is in exactly one.
        self._states = states
        self._chunk_nodes = chunk_nodes
        self._clear: dict[str, bytes] = {}  # cluster label -> every condition at 0, node id to fill in
        self._health: dict[tuple[str, str], bytes] = {}  # (cluster label, current state) -> block
        self._labels: dict[str, str] = {}  # cluster -> its label value
        self._chunks: list[_Chunk] = []  # the last scrape's, in node order
        self._scraping = threading.Lock()  # two scrapers at once take turns on the chunks

    def render(self) -> Iterator[gzipped.Piece]:
        with self._scraping:
            # One copy of each state's nodes: the event loop changes the dict while we read.
            # Each chunk is rendered from its samples, never from the nodes again, so the text
            # kept under a fingerprint is the text of that fingerprint.
            samples = [_sample(node, state.config.degraded_at_or_below)
                       for state in self._states() for node in list(state.nodes.values())]
            kept, chunks = self._chunks, []
            size = self._chunk_nodes
            for index, start in enumerate(range(0, len(samples), size)):
                chunk = samples[start:start + size]
                fingerprint = hash(tuple(chunk))
                if index < len(kept) and kept[index].fingerprint == fingerprint:
                    chunks.append(kept[index])
                else:
                    labelled = self._labelled(chunk)
                    chunks.append(_Chunk(fingerprint, tuple(
                        gzipped.piece(text) if (text := b"".join(block(labelled))) else None
                        for block in (_scores, self._conditions, self._health_blocks, _failures, _attention))))
            self._chunks = chunks
        for family, header in enumerate(FAMILY_HEADERS):
            yield header
            yield from (part for chunk in chunks if (part := chunk.pieces[family]) is not None)

    def _labelled(self, samples: list[_Sample]) -> list[_Labelled]:
        # Labels escaped once a node, not once per family (0.8 million calls at 100,000 nodes).
        labels = self._labels
        return [(sample, labels.get(sample[CLUSTER]) or labels.setdefault(sample[CLUSTER], label_value(sample[CLUSTER])),
                 label_value(sample[NODE_ID])) for sample in samples]

    # The two families most of the text is in (13 of a node's 15 samples) are bytes templates
    # with the node id put in: no text to encode afterwards.

    def _conditions(self, nodes: list[_Labelled]) -> Iterator[bytes]:
        for sample, cluster, node_id in nodes:
            levels = sample[LEVELS]
            if levels is None:  # every condition type gets a series once a node reports
                continue
            if not levels:
                template = self._clear.get(cluster)
                if template is None:
                    template = self._clear[cluster] = "".join(
                        _condition_line(cluster, t, _NODE, 0) for t in wire.CONDITION_TYPES).encode()
                yield template.replace(_NODE_BYTES, node_id.encode())
                continue
            active = dict(levels)
            yield "".join(_condition_line(cluster, t, node_id, active.get(t, 0))
                          for t in wire.CONDITION_TYPES).encode()

    def _health_blocks(self, nodes: list[_Labelled]) -> Iterator[bytes]:
        templates = self._health
        for sample, cluster, node_id in nodes:
            current = sample[HEALTH]
            template = templates.get((cluster, current))
            if template is None:
                template = templates[(cluster, current)] = "".join(
                    _health_line(cluster, _NODE, state, current) for state in HEALTH_STATES).encode()
            yield template.replace(_NODE_BYTES, node_id.encode())


# What a node's series show, and nothing else (its fingerprint): a plain tuple, read by the
# positions below; a NamedTuple's constructor tripled a scrape of a fleet at rest (0.07 s ->
# 0.23 s at 100,000 nodes, same run).
_Sample = tuple[str, str, int | None, str, int, bool, tuple[tuple[str, int], ...] | None]
CLUSTER: Final = 0
NODE_ID: Final = 1
SCORE: Final = 2
HEALTH: Final = 3  # the health state's label
FAILURES: Final = 4
NEEDS_ATTENTION: Final = 5
LEVELS: Final = 6  # (type, level) of each active condition, () when none, None before assessed


def _sample(node: NodeScore, degraded_at_or_below: int) -> _Sample:
    if not node.assessed:
        levels = None
    elif node.conditions:
        levels = tuple((c.type, wire.SEVERITY_LEVEL[c.severity]) for c in node.conditions)
    else:
        levels = ()
    return (node.cluster, node.node_id, node.score, node_health(node, degraded_at_or_below).lower(),
            node.tally.count, node.attention is not None, levels)


# (what the node's series show, its cluster and node id as label values)
_Labelled = tuple[_Sample, str, str]


def _scores(nodes: list[_Labelled]) -> list[bytes]:
    return ["".join([f'healthplane_node_reliability_score{{cluster="{cluster}",node_id="{node_id}"}} {sample[SCORE]}.0\n'
                     for sample, cluster, node_id in nodes if sample[SCORE] is not None]).encode()]


def _failures(nodes: list[_Labelled]) -> list[bytes]:
    return ["".join([f'healthplane_node_attributed_failures_total{{cluster="{cluster}",node_id="{node_id}"}} '
                     f'{sample[FAILURES]}.0\n' for sample, cluster, node_id in nodes]).encode()]


def _attention(nodes: list[_Labelled]) -> list[bytes]:
    return ["".join([f'healthplane_node_needs_attention{{cluster="{cluster}",node_id="{node_id}"}} 1.0\n'
                     for sample, cluster, node_id in nodes if sample[NEEDS_ATTENTION]]).encode()]
