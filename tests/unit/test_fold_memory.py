"""Issue 25 (at most 2 KB a node in every fold at 100,000 nodes): what a healthy node holds in
the state of health-ingest, the scorer and policy, by tracemalloc, each fold fed what the
pipeline feeds it for a fleet of simulated nodes (a resource report, then reports every 30 s).

These are the bytes of the state alone; a process's RSS per node (the state, the allocator's
slack and what does not grow with nodes) is measured by tests/bench/test_fleet.py and written
in docs/benchmarks.md. Measured here before counters were packed and empty fields shared: a
node held 1,316 B in health-ingest, 720 B in the scorer and 1,162 B in policy; after, 624, 480 and
714 (node keys not counted, below). The limits sit between, so that either change undone fails."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from healthplane.contracts import subjects, wire
from healthplane.runtime.fold import Emit, Inbound
from healthplane_collector.agent import Collector, Settings
from healthplane_collector.sim import SimNode
from healthplane_health_ingest.fold import IngestCore
from healthplane_policy.fold import PolicyCore
from healthplane_scorer.fold import ScorerCore

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
NODES = 2_000
REPORTS = 3

Fed = list[tuple[str, str, bytes, datetime]]  # stream, subject, payload, stream time


async def _fleet() -> tuple[Fed, Fed, Fed]:
    """What health-ingest, the scorer and policy fold for NODES healthy nodes."""
    node = SimNode("n0")
    collector = Collector(Settings(node_id="n0", cluster="c", interval_s=30), node, node.kmsg)
    collector.refresh_inventory()
    report = await collector.collect("scheduled", T0)
    resources = collector.resource_report(True, T0)
    ingest_in: Fed = []
    for i in range(NODES):
        node_id = f"node-{i:06d}"
        ingest_in.append(("HP_RESOURCES", subjects.resource("c", node_id),
                          wire.encode(msgspec.structs.replace(resources, node_id=node_id)), T0))
    for k in range(REPORTS):
        at = T0 + timedelta(seconds=30 * k)
        ingest_in += [("HP_REPORTS", subjects.report("c", f"node-{i:06d}"), wire.encode(msgspec.structs.replace(
            report, node_id=f"node-{i:06d}", sent_at=at)), at) for i in range(NODES)]
    resources_in = ingest_in[:NODES]
    assessments = _outputs(IngestCore([]), ingest_in, "hp.assess")
    scorer_in = resources_in + assessments
    views = _outputs(ScorerCore(), scorer_in, "hp.node.")
    return ingest_in, scorer_in, resources_in + views


def _outputs(core: Any, fed: Fed, prefix: str) -> Fed:
    stream = {"hp.assess": "HP_ASSESSMENTS", "hp.node.": "HP_NODES"}[prefix]
    state, out = core.initial_state(), []
    for seq, (stream_in, subject, data, at) in enumerate(fed, 1):
        state, emits, _ = core.step(state, Inbound(stream_in, seq, subject, data, {}, at, True))
        out += [(stream, e.subject, e.payload, at) for e in emits if e.subject.startswith(prefix)]
    return out


def _bytes_per_node(core: Any, fed: Fed, nodes: Callable[[Any], int]) -> float:
    # The folds key nodes by interned strings, and the interpreter's table of those is rebuilt
    # larger when it fills: a rebuild inside the measurement would count megabytes that this
    # test run's history decides (seen: 2,465-2,701 B a node in a full run, 542-778 alone).
    # So a first fold, kept alive and not measured, interns every string the second one uses
    # and fills the module-level caches; the second is measured. A node's key string (one a
    # node, shared by every record of it in the process) is therefore not counted.
    first = core.initial_state()
    for seq, (stream, subject, data, at) in enumerate(fed, 1):
        first, _, _ = core.step(first, Inbound(stream, seq, subject, data, {}, at, False))
    state = core.initial_state()
    emits: list[Emit] = []
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for seq, (stream, subject, data, at) in enumerate(fed, 1):
            state, emits, _ = core.step(state, Inbound(stream, seq, subject, data, {}, at, False))
        del emits
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert nodes(state) == nodes(first) == NODES
    return held / NODES


@pytest.fixture(scope="module")
def fleet() -> tuple[Fed, Fed, Fed]:
    import asyncio
    return asyncio.run(_fleet())


@pytest.mark.parametrize(("fold", "limit"), [("health-ingest", 900), ("scorer", 600), ("policy", 950)])
def test_issue25_a_healthy_node_costs_each_fold_under_a_kilobyte_of_state(
        fleet: tuple[Fed, Fed, Fed], fold: str, limit: int) -> None:
    ingest_in, scorer_in, policy_in = fleet
    core, fed = {"health-ingest": (IngestCore([]), ingest_in), "scorer": (ScorerCore(), scorer_in),
                 "policy": (PolicyCore(), policy_in)}[fold]
    per_node = _bytes_per_node(core, fed, lambda state: len(state.nodes))
    assert per_node < limit, f"{fold} holds {per_node:.0f} B a healthy node"
