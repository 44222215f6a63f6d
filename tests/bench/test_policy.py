"""policy: a correlated fault on 30 % of a 10,000-node fleet at once (decisions/s against the raw
pull baseline; the breaker trips at exactly its bound, no node beyond it cordoned), and CEL
evaluations/s for a 20-rule set against the same rules as plain Python."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import parse_cluster_config
from healthplane.runtime.processor import Processor
from healthplane.runtime.replay import replay
from healthplane_policy import rulesets
from healthplane_policy.fold import INPUTS, OUTPUTS, PolicyCore
from healthplane_policy.rules import PolicyState, policy_config
from tests.bench import harness
from tests.bench.bus import processor_rate, publish_all, raw_consume_rate

# In-process services run as the test's own identity: on an open server, as the other
# component benches (what identities cost is tests/bench/test_auth_pipeline.py's).
pytestmark = pytest.mark.insecure

FLEET = 10_000
FAULTY = 3_000  # 30 %
BREAKER_PERCENT = 5  # 5 % of 10,000: 500 automated cordons, then TRIPPED
T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def _event(node: str, kind: str, when: datetime, **fields: object) -> tuple[str, bytes]:
    record = wire.NodeEvent(id=f"{kind}:{node}:{when.timestamp()}", node_id=node, cluster="bench", type=kind,  # type: ignore[arg-type]
                            occurred_at=when, message=kind.lower(), actor="bench", **fields)  # type: ignore[arg-type]
    return subjects.event("bench", node, kind), wire.encode(record)


def _processor(nc, js: JetStreamContext) -> Processor[PolicyState]:  # type: ignore[no-untyped-def]
    return Processor(nc=nc, js=js, service="policy-bench", core=PolicyCore(), state_type=PolicyState, inputs=INPUTS,
                     outputs=OUTPUTS, batch=512, snapshot_every_inputs=10**9, snapshot_every_s=10**9)


async def test_policy_correlated_fault_on_30_percent_of_10k_nodes(nc, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    nodes = [f"gpu-{i:05d}" for i in range(FLEET)]
    fleet = []
    for node in nodes:
        fleet.append(_event(node, "NODE_REGISTERED", T0, definition="gpu-pool", provisioned=False, hostname=node))
        fleet.append(_event(node, "SCORE_CHANGED", T0, score=100))
    await publish_all(nc, fleet)
    config = policy_config(parse_cluster_config({"cluster": "bench", "nodeHealth": {
        "mode": "cordon", "circuitBreaker": {"percentage": BREAKER_PERCENT, "duration": "10m"}}}), 1)

    # The fleet as it stood before the fault: folded, then snapshotted by a clean stop.
    before = _processor(nc, js)
    await before.start()
    before.state = PolicyState(config=config)
    await processor_rate(before, "HP_NODE_EVENTS", len(fleet))

    # A rack-wide fault: 3,000 nodes drop to 55 within the same second.
    burst = [_event(node, "SCORE_CHANGED", T0 + timedelta(seconds=30), score=55, previous_score=100)
             for node in nodes[:FAULTY]]
    await publish_all(nc, burst)
    raw = await raw_consume_rate(nc, js, "HP_NODE_EVENTS", len(fleet) + FAULTY)
    after = _processor(nc, js)
    await after.start()
    started = time.perf_counter()
    await processor_rate(after, "HP_NODE_EVENTS", len(fleet) + FAULTY)
    decisions_per_s = FAULTY / (time.perf_counter() - started)
    harness.record("policy.decisions_per_s_30pct_of_10k", decisions_per_s, "decisions/s", baseline=raw,
                   target="ratio >= 0.1")

    cordons = [wire.decode(wire.Command, m.data) async for m in replay(js, "HP_COMMANDS", "hp.cmd.>")]
    events = [wire.decode(wire.NodeEvent, m.data) async for m in replay(js, "HP_NODE_EVENTS", "hp.event.>")
              if b'"POLICY_' in m.data]
    bound = -(-BREAKER_PERCENT * FLEET // 100)
    assert len(cordons) == bound == len({c.node_id for c in cordons})
    assert sum(e.type == "POLICY_ACTED" for e in events) == bound
    assert sum(e.type == "POLICY_HALTED" for e in events) == FAULTY - bound
    breaker = after.state.breakers["bench"]
    assert breaker.tripped and breaker.tripped_by is not None and breaker.tripped_by.nodes == bound
    harness.record("policy.breaker_cordons_at_bound_500", len(cordons), "nodes", target=f"value <= {bound}")


RULE_COUNT = 20


def _rule_sets() -> list[rulesets.RuleSetSpec]:
    out = []
    for i in range(RULE_COUNT):
        out.append(rulesets.RuleSetSpec(
            name=f"r{i}", order=i, priority=i,
            all=(rulesets.RuleExpressionSpec("HealthEvent", f"event.type == 'CONDITION_RAISED' && event.condition.type "
                                                         f"== 'gpu_xid_errors' && event.isFatal && event.score < {40 + i}"),
                 rulesets.RuleExpressionSpec("Node", "!('healthplane.dev/unmanaged' in node.metadata.annotations) && "
                                                  f"node.allocatable.gpu >= {i % 9}")),
            label_key="gpu-fault", label_value=f"r{i}"))
    return out


def _python_rules() -> list[object]:
    def make(i: int):  # type: ignore[no-untyped-def]
        def rule(event: dict[str, object], node: dict[str, object]) -> bool:
            condition = event["condition"]
            return (event["type"] == "CONDITION_RAISED" and condition["type"] == "gpu_xid_errors"  # type: ignore[index]
                    and bool(event["isFatal"]) and event["score"] < 40 + i  # type: ignore[operator]
                    and "healthplane.dev/unmanaged" not in node["metadata"]["annotations"]  # type: ignore[index]
                    and node["allocatable"]["gpu"] >= i % 9)  # type: ignore[index]
        return rule
    return [make(i) for i in range(RULE_COUNT)]


def test_cel_evaluations_per_second_for_a_20_rule_set() -> None:
    from tests.support.records import resource_report

    report = resource_report("gpu-14", cluster="bench")
    node = rulesets.node_object(node_id="gpu-14", cluster="bench", hostname="gpu-14", definition="gpu-pool",
                             provisioned=False, ready=True, labels={}, annotations=report.annotations, taints=[],
                             allocatable={"cpu": 192, "memory": report.memory_bytes, "gpu": 8},
                             conditions={"gpu_xid_errors": {"type": "gpu_xid_errors", "severity": "critical"}},
                             score=55, holds=[])
    event = rulesets.event_object(wire.NodeEvent(
        id="e1", node_id="gpu-14", cluster="bench", type="CONDITION_RAISED", occurred_at=T0, message="Xid 79",
        actor="health-ingest", score=55, condition=wire.ConditionChange(
            type="gpu_xid_errors", reason="GpuXidHardware", severity="critical", message="Xid 79 on GPU 0")))
    rule_sets = _rule_sets()
    rulesets.compile_all(rule_sets)  # compile once, outside the timing
    native = _python_rules()

    def rate(evaluate) -> tuple[float, int]:  # type: ignore[no-untyped-def]
        rounds, started = 0, time.perf_counter()
        while time.perf_counter() - started < 2.0:
            matched = evaluate()
            rounds += 1
        return rounds * RULE_COUNT / (time.perf_counter() - started), matched

    # Each round converts the event and node once and evaluates every rule set against them,
    # exactly as the policy does for one health event.
    cel_rate, cel_matched = rate(lambda: len(rulesets.matching(rule_sets, event, node)))
    py_rate, py_matched = rate(lambda: sum(1 for r in native if r(event, node)))  # type: ignore[operator]
    assert cel_matched == py_matched == 4  # r16..r19 (55 < 40 + i)
    harness.record("policy.cel_rule_evaluations_per_s_20_rules", cel_rate, "rule evaluations/s", baseline=py_rate,
                   target="ratio >= 0.01")
