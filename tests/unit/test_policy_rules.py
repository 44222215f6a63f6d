"""CEL rule sets (POL-7): all/any, enabled, priority conflicts on labels and taints, cordon
through the guardrails, dry run (observe), recovery, and validation naming the rule set."""

from __future__ import annotations

from typing import Any

import pytest

from healthplane.contracts.config import ConfigError, parse_cluster_config
from tests.support.policy import Driver, at, condition, config, fleet, score

FATAL_GPU = {"kind": "HealthEvent",
             "expression": "event.type == 'CONDITION_RAISED' && event.faultClass == 'GPU_XID_ERRORS' && event.isFatal"}
MANAGED = {"kind": "Node", "expression": "!('healthplane.dev/unmanaged' in node.metadata.annotations && "
                                         "node.metadata.annotations['healthplane.dev/unmanaged'] == 'true')"}


def rule_set(name: str, *, priority: int = 0, all_: list[dict[str, str]] | None = None,
             any_: list[dict[str, str]] | None = None, **actions: Any) -> dict[str, Any]:
    match: dict[str, Any] = {}
    if all_:
        match["all"] = all_
    if any_:
        match["any"] = any_
    return {"name": name, "priority": priority, "match": match, **actions}


def drive(mode: str, *rule_sets: dict[str, Any], nodes: int = 4, percent: int = 100) -> Driver:
    return Driver(config({"mode": mode, "maxUnavailablePercent": percent, "ruleSets": list(rule_sets)}), *fleet(nodes))


def xid(node: str, minute: int = 1, severity: str = "critical") -> Any:
    return condition(node, "CONDITION_RAISED", "gpu_xid_errors", at(minute), severity=severity, reason="GpuXidHardware")


def test_pol7_all_and_any_decide_the_match() -> None:
    d = drive("cordon",
              rule_set("both", all_=[FATAL_GPU, MANAGED], label={"key": "fault", "value": "gpu"}),
              rule_set("either", any_=[{"kind": "HealthEvent", "expression": "event.condition.type == 'memory_errors'"},
                                       {"kind": "HealthEvent", "expression": "event.condition.severity == 'critical'"}],
                       taint={"key": "gpu-error", "value": "fatal", "effect": "NoSchedule"}),
              rule_set("never", all_=[{"kind": "HealthEvent", "expression": "event.condition.type == 'disk_degraded'"}],
                       cordon={"shouldCordon": True}))
    d.feed(xid("n0"))
    assert [e.message for e in d.events()] == ["rule set both: label fault=gpu",
                                               "rule set either: taint gpu-error=fatal:NoSchedule"]
    assert d.state.nodes["lab\x00n0"].labels == {"fault": "gpu"}
    assert d.state.nodes["lab\x00n0"].taints == {"gpu-error=fatal": "NoSchedule"}
    assert d.commands() == []


def test_pol7_a_disabled_rule_set_is_skipped() -> None:
    d = drive("cordon", {**rule_set("off", all_=[FATAL_GPU], cordon={"shouldCordon": True}), "enabled": False})
    d.feed(xid("n0"))
    assert d.outputs == []


def test_pol7_the_node_object_reads_annotations_allocatable_and_conditions() -> None:
    import msgspec

    from tests.support.records import resource_report

    gpu_node = {"kind": "Node", "expression": "node.allocatable.gpu >= 8 && 'gpu_xid_errors' in node.conditions"}
    d = drive("cordon", rule_set("big", all_=[FATAL_GPU, gpu_node, MANAGED], cordon={"shouldCordon": True}))
    unmanaged = resource_report("n1", cluster="lab", annotations=0)
    d.feed(resource_report("n0", cluster="lab"),
           msgspec.structs.replace(unmanaged, annotations={"healthplane.dev/unmanaged": "true"}),
           resource_report("n2", cluster="lab", gpus=4))
    d.feed(xid("n0"), xid("n1"), xid("n2"))
    assert [(c.node_id, c.verb, c.reason) for c in d.commands()] == [("n0", "cordon", "rule set big")]


@pytest.mark.parametrize(("first", "second", "label"), [
    (("low", 1, "warn"), ("high", 10, "fatal"), "fatal"),   # higher priority wins
    (("high", 10, "fatal"), ("low", 1, "warn"), "fatal"),   # a later lower priority cannot downgrade
    (("one", 5, "a"), ("two", 5, "b"), "b"),                # equal: later in config order wins
])
def test_pol7_label_priority_conflicts(first: tuple[str, int, str], second: tuple[str, int, str], label: str) -> None:
    def labelled(name: str, priority: int, value: str, severity: str) -> dict[str, Any]:
        return rule_set(name, priority=priority, label={"key": "gpu-fault", "value": value},
                        all_=[{"kind": "HealthEvent", "expression": f"event.condition.severity == '{severity}'"}])

    d = drive("cordon", labelled(*first, "warning"), labelled(*second, "critical"))
    d.feed(xid("n0", 1, "warning"), xid("n0", 2, "critical"))
    assert d.state.nodes["lab\x00n0"].labels == {"gpu-fault": label}
    # And the other way round: the session keeps the owner's priority across events.
    d2 = drive("cordon", labelled(*first, "critical"), labelled(*second, "warning"))
    d2.feed(xid("n0", 1, "critical"), xid("n0", 2, "warning"))
    owner = d2.state.nodes["lab\x00n0"].session
    assert owner is not None and owner.labels["gpu-fault"].priority == max(first[1], second[1])


def test_pol7_taint_effect_conflict_goes_to_the_higher_priority() -> None:
    d = drive("cordon",
              rule_set("hard", priority=50, all_=[FATAL_GPU], taint={"key": "gpu", "value": "bad", "effect": "NoExecute"}),
              rule_set("soft", priority=1, all_=[FATAL_GPU], taint={"key": "gpu", "value": "bad",
                                                                   "effect": "PreferNoSchedule"}))
    d.feed(xid("n0"))
    assert d.state.nodes["lab\x00n0"].taints == {"gpu=bad": "NoExecute"}


def test_pol7_a_rule_cordon_goes_through_the_ceiling_and_the_breaker() -> None:
    d = Driver(config({"mode": "cordon", "maxUnavailablePercent": 100,
                       "circuitBreaker": {"percentage": 0, "maxNodes": 2},
                       "ruleSets": [rule_set("fatal", all_=[FATAL_GPU], cordon={"shouldCordon": True})]}), *fleet(6))
    for i in range(4):
        d.feed(xid(f"n{i}", i), xid(f"n{i}", i + 1))  # a repeat on the same node changes nothing
    assert [c.node_id for c in d.commands("cordon")] == ["n0", "n1"]
    assert [e.type for e in d.events()] == ["POLICY_ACTED", "POLICY_ACTED", "POLICY_HALTED", "POLICY_HALTED"]
    assert "circuit breaker TRIPPED" in d.events()[-1].message


def test_pol7_dry_run_records_what_would_happen_and_changes_nothing() -> None:
    d = drive("observe", rule_set("fatal", all_=[FATAL_GPU], cordon={"shouldCordon": True},
                                  label={"key": "gpu-fault", "value": "active"}))
    d.feed(xid("n0"))
    assert [(e.type, e.message) for e in d.events()] == [
        ("POLICY_RECOMMENDED", "rule set fatal: label gpu-fault=active"),
        ("POLICY_RECOMMENDED", "rule set fatal: cordon")]
    assert d.commands() == [] and d.state.nodes["lab\x00n0"].labels == {}
    assert not d.state.breakers.get("lab") or not d.state.breakers["lab"].recent


def test_pol7_labels_go_when_every_tracked_fault_recovered_the_cordon_stays() -> None:
    memory = {"kind": "HealthEvent", "expression": "event.condition.type == 'memory_errors'"}
    d = drive("cordon", rule_set("any-fault", any_=[FATAL_GPU, memory], cordon={"shouldCordon": True},
                                 label={"key": "fault", "value": "yes"}))
    d.feed(xid("n0"), condition("n0", "CONDITION_RAISED", "memory_errors", at(2)))
    d.feed(condition("n0", "CONDITION_CLEARED", "gpu_xid_errors", at(3)))
    assert d.state.nodes["lab\x00n0"].labels == {"fault": "yes"}  # memory_errors still active
    d.feed(condition("n0", "CONDITION_CLEARED", "memory_errors", at(4)))
    assert d.state.nodes["lab\x00n0"].labels == {}
    assert d.events()[-1].message == "rule sets: every tracked fault recovered; removed label fault"
    assert [c.verb for c in d.commands()] == ["cordon"]


def test_pol7_a_score_rule_matches_score_changes() -> None:
    low = {"kind": "HealthEvent", "expression": "event.type == 'SCORE_CHANGED' && event.score < 50"}
    d = drive("cordon", rule_set("low-score", all_=[low], label={"key": "low", "value": "true"}))
    d.feed(score("n0", 40, 100, at(1)), score("n0", 90, 40, at(2)))
    assert [e.message for e in d.events() if e.action == "ACTION_LABEL"] == [
        "rule set low-score: label low=true", "rule sets: every tracked fault recovered; removed label low"]


@pytest.mark.parametrize(("expression", "kind", "why"), [
    ("event.condition.type ==", "HealthEvent", "Syntax error"),
    ("evnt.type == 'X'", "HealthEvent", "unknown variable 'evnt'"),
    ("node.labels.size() > 0", "HealthEvent", "unknown variable 'node'"),
    ("event.type == 'X'", "Node", "unknown variable 'event'"),
    ("lookup(event.type)", "HealthEvent", "unknown function 'lookup'"),
])
def test_pol7_config_validate_refuses_a_bad_expression_naming_the_rule_set(expression: str, kind: str,
                                                                         why: str) -> None:
    data = {"nodeHealth": {"ruleSets": [rule_set("gpu-fatal", all_=[{"kind": kind, "expression": expression}],
                                                 cordon={"shouldCordon": True})]}}
    with pytest.raises(ConfigError) as error:
        parse_cluster_config(data)
    assert "nodeHealth.ruleSets[0]: rule set 'gpu-fatal', match.all[0]" in str(error.value)
    assert why in str(error.value)


def test_pol7_the_references_expressions_compile() -> None:
    parse_cluster_config({"nodeHealth": {"ruleSets": [rule_set("syslog", all_=[
        {"kind": "HealthEvent", "expression": "event.agent == 'syslog-health-monitor' && event.isFatal == true && "
                                              "(event.errorCode == null || !event.errorCode.exists(e, e == '45'))"},
        {"kind": "Node", "expression": "!('k8saas.nvidia.com/ManagedByNVSentinel' in node.metadata.labels && "
                                       "node.metadata.labels['k8saas.nvidia.com/ManagedByNVSentinel'] == \"false\")"},
    ], cordon={"shouldCordon": True})]}})
