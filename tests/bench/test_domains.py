"""DOM-2/DOM-3: what failure domains cost policy's fold at fleet size — 100,000 nodes in 1,500
racks and 25,000 NVLink domains of 4, with a budget per kind (domainLimits) and a domain-fault
rule per kind (domainFaults), against the same fleet with no domains and no such config, in
the same run. Policy's pure core folds every node's view three times: registration (each
domain made once, not measured), then two steady rounds in which 1 % of the fleet degrades
and the last round's 1 % recovers, each view at its time in the round; client CPU per view of
the steady rounds, best of two runs each. The issue's goal: within 5 %."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import parse_cluster_config
from healthplane.runtime.fold import Inbound
from healthplane_policy.fold import PolicyCore
from tests.bench import harness

NODES = 100_000
RACKS = 1_500
NVLINK_SIZE = 4
T0 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
DOMAIN_CONFIG: dict[str, Any] = {
    "domainLimits": [{"kind": "nvlink", "maxUnavailable": 2}, {"kind": "rack", "maxUnavailablePercent": 25}],
    "domainFaults": [{"kind": "rack", "share": 50, "window": "10m", "action": "needs-attention"},
                     {"kind": "nvlink", "share": 50, "window": "10m", "action": "needs-attention"}],
}


def _views(with_domains: bool, round_: int) -> list[tuple[str, bytes]]:
    views = []
    at = T0 + timedelta(seconds=30 * round_)
    for i in range(NODES):
        node = f"gpu-{i:06d}"
        degraded = i % 100 == round_ % 2  # 1 % of the fleet degrades each round, the last round's recover
        domains = {"rack": f"r{i % RACKS}", "nvlink": f"nvl-{i // NVLINK_SIZE}"} if with_domains else {}
        view = wire.NodeView(node_id=node, cluster="bench", hostname=node, status="READY",
                             health="DEGRADED" if degraded else "HEALTHY", last_reported_at=at,
                             score=70 if degraded else 100, score_explanation=None, conditions=[],
                             attributed_failures=wire.AttributedFailures(), holds=[], domains=domains,
                             report_interval_seconds=30)
        views.append((subjects.node_view("bench", node), wire.encode(view)))
    return views


def _fold(with_domains: bool) -> float:
    """CPU seconds per view of policy's core over the whole fleet, twice."""
    core = PolicyCore()
    state = core.initial_state()
    health = {"mode": "observe", **(DOMAIN_CONFIG if with_domains else {})}
    config = parse_cluster_config({"cluster": "bench", "nodeHealth": health}, "bench").to_wire()
    envelope = wire.ConfigEnvelope(version=1, applied_at=T0, actor="bench", config=config)
    seq = 1
    state, _, _ = core.step(state, Inbound("HP_CONFIG", seq, subjects.CONFIG, wire.encode(envelope), {}, T0, True))
    rounds = [_views(with_domains, r) for r in range(3)]
    started = folded = 0.0
    for round_, views in enumerate(rounds):
        if round_ == 1:  # the fleet registered (each domain made once): the steady state from here
            started, folded = time.process_time(), 0
        at = T0 + timedelta(seconds=30 * round_)
        for index, (subject, payload) in enumerate(views):
            seq += 1
            # The fleet's reports arrive over 30 s: each view at its time within the round.
            state, _, _ = core.step(state, Inbound("HP_NODES", seq, subject, payload, {},
                                                   at + timedelta(seconds=index / 3_333), True))
            folded += 1
    return (time.process_time() - started) / folded


def test_dom2_dom3_domain_budgets_and_faults_cost_policy_within_5_percent() -> None:
    plain = min(_fold(False), _fold(False))
    with_domains = min(_fold(True), _fold(True))
    harness.record("domains.policy_cpu_us_per_view.100k_nodes_1500_racks_25000_nvlink", with_domains * 1e6, "us",
                   baseline=plain * 1e6, target="ratio <= 1.05")
