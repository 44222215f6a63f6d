"""XID-2: a collector failure that a fatal fault of the same device explains is evidence, not
blindness. A GPU that fell off the bus (Xid 79) cannot be read: health-ingest names the
failure explained, the policy acts on the node, and "why is automation not acting?" says which
case applies; an unexplained collector failure stays POL-3 blind."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from healthplane.contracts import automation, wire
from healthplane.contracts.config import NodeHealth
from tests.support.policy import Driver, condition, config, fleet, score
from tests.unit.test_health_ingest_core import Scenario

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


async def test_xid2_a_gpu_that_fell_off_the_bus_is_explained_not_unseen() -> None:
    s = Scenario()
    await s.report("xid:79", gpu=0)
    failed = s.conditions["collector_failed"]
    assert failed.reason == automation.EXPLAINED and "explained by Xid 79 on" in failed.message
    assert s.conditions["gpu_xid_errors"].recommended_action == "RESTART_BM"
    assert automation.blinding((c.type, c.reason) for c in s.conditions.values()) == []


async def test_xid2_a_plain_collector_failure_stays_blind() -> None:
    s = Scenario()
    await s.report("collector-failed:smart")
    assert s.conditions["collector_failed"].reason == "CollectorFailed"
    assert automation.blinding((c.type, c.reason) for c in s.conditions.values()) == ["collector_failed"]


async def test_xid2_an_application_xid_does_not_explain_a_lost_gpu() -> None:
    # Xid 13 (an application's fault) says nothing of why the GPU cannot be read.
    s = Scenario()
    s.node.hardware.gpus[0].lost = True
    await s.report("xid:13", gpu=0)
    assert s.conditions["collector_failed"].reason == "CollectorFailed"
    assert automation.blinding((c.type, c.reason) for c in s.conditions.values()) == ["collector_failed"]


def test_xid2_the_policy_acts_on_an_explained_node_and_not_on_a_blind_one() -> None:
    for reason, acted in ((automation.EXPLAINED, ["drain"]), ("CollectorFailed", [])):
        drive = Driver(config({"mode": "drain"}), *fleet(10))
        drive.feed(condition("n1", "CONDITION_RAISED", "collector_failed", T0, reason=reason))
        drive.feed(condition("n1", "CONDITION_RAISED", "gpu_xid_errors", T0, severity="critical"))
        drive.feed(score("n1", 40, 100, T0 + timedelta(seconds=30)))
        assert [c.verb for c in drive.commands()] == acted, reason


def _view(*conditions: wire.Condition, score: int = 40) -> wire.NodeView:
    return wire.NodeView(node_id="n1", cluster="c", hostname="n1", status="READY", health="DEGRADED",
                         last_reported_at=T0, score=score, score_explanation=None, conditions=list(conditions),
                         attributed_failures=wire.AttributedFailures(), holds=[])


def _condition(kind: str, reason: str, message: str = "m") -> wire.Condition:
    return wire.Condition(type=kind, reason=reason, severity="warning", message=message, first_seen=T0)  # type: ignore[arg-type]


def test_xid2_why_automation_acts_says_which_case_applies() -> None:
    health = NodeHealth.model_validate({"mode": "drain"})
    explained = _view(_condition("collector_failed", automation.EXPLAINED,
                                 "collector failed (gpu: GPU is lost), explained by Xid 79 on 0000:3b:00.0"),
                      _condition("gpu_xid_errors", "GpuXidHardware"))
    said = automation.explain(explained, health, last_policy=None, last_uncordon=None, last_score=None,
                              now=T0 + timedelta(minutes=1))
    assert said.startswith("not blind: collector failed (gpu: GPU is lost), explained by Xid 79") and "(XID-2)" in said
    assert "blind" not in said.removeprefix("not blind")
    unexplained = _view(_condition("collector_failed", "CollectorFailed"))
    assert automation.explain(unexplained, health, last_policy=None, last_uncordon=None, last_score=None,
                              now=T0).startswith("blind: Collector Failed")
