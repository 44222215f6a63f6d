"""The text the node commands print (issue 15.6, 15.7): whole seconds, one spelling of each
condition, the reference's DETAIL wording, and a stale view that says so."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from healthplane.cli.node_cmd import detail, show_text
from healthplane.client.reads import staleness
from healthplane.contracts import wire

T0 = datetime(2026, 8, 11, 9, 14, 2, 734912, tzinfo=UTC)


def view(*, status: wire.NodeStatus = "READY", interval: int | None = 30,
         conditions: tuple[str, ...] = ("gpu_xid_errors",)) -> wire.NodeView:
    return wire.NodeView(
        node_id="n1", cluster="default", hostname="h1", status=status, health="DEGRADED", last_reported_at=T0,
        score=55, score_explanation=None,
        conditions=[wire.Condition(type=c, reason="GpuXidHardware", severity="critical", message="GPU 0: Xid 79",  # type: ignore[arg-type]
                                   first_seen=T0, observations=1) for c in conditions],
        attributed_failures=wire.AttributedFailures(count=1, last=T0, by_fault={"GPU_XID_ERRORS": 1}), holds=[],
        report_interval_seconds=interval)


def test_text_times_are_whole_seconds() -> None:
    # Issue 15.7: `2026-08-11T09:14:02Z` in text; JSON keeps the precision.
    text = show_text(view(), now=T0 + timedelta(seconds=5))
    assert "last reported 2026-08-11T09:14:02Z)" in text and ".734912" not in text
    assert wire.to_builtins(view())["lastReportedAt"] == "2026-08-11T09:14:02.734912Z"


@pytest.mark.parametrize(("condition_type", "title"), [
    ("gpu_xid_errors", "GPU Xid Errors"), ("GPU_XID_ERRORS", "GPU Xid Errors"), ("gpu_ecc_errors", "GPU ECC Errors"),
    ("disk_degraded", "Disk Degraded"), ("machine_check_errors", "Machine Check Errors"),
    ("collector_failed", "Collector Failed"),
])
def test_one_spelling_of_each_condition(condition_type: str, title: str) -> None:
    # Issue 15.7: `node show`, `node events` and the fault classes share one title.
    assert wire.condition_title(condition_type) == title


def test_show_and_events_spell_the_condition_the_same() -> None:
    from healthplane_health_ingest.rules import _condition_message

    change = wire.ConditionChange(type="gpu_xid_errors", reason="GpuXidHardware", severity="critical",
                                  message="GPU 0: Xid 79")
    assert _condition_message("CONDITION_RAISED", change).startswith("GPU Xid Errors [Critical]")
    shown = show_text(view(), now=T0)
    assert "  GPU Xid Errors [Critical] GPU 0: Xid 79" in shown and "  GPU Xid Errors: 1" in shown


def test_events_detail_is_worded_like_the_reference() -> None:
    # Issue 15.7: "CONDITION_RAISED | 1 uncorrectable GPU ECC error(s) on GPU 0" — what was found.
    change = wire.ConditionChange(type="gpu_ecc_errors", reason="GpuEccUncorrectable", severity="critical",
                                  message="GPU 0000:18:00.0: 1 uncorrectable ECC errors")
    raised = wire.NodeEvent(id="e", node_id="n1", cluster="default", type="CONDITION_RAISED", occurred_at=T0,
                            message="GPU ECC Errors [Critical] GPU 0000:18:00.0: 1 uncorrectable ECC errors",
                            actor="health-ingest", condition=change)
    assert detail(raised) == "GPU 0000:18:00.0: 1 uncorrectable ECC errors"
    scored = wire.NodeEvent(id="s", node_id="n1", cluster="default", type="SCORE_CHANGED", occurred_at=T0,
                            message="score 90 -> 55", actor="scorer")
    assert detail(scored) == "score 90 -> 55"


@pytest.mark.parametrize(("age_s", "status", "interval", "stale"), [
    (95, "READY", 30, False),        # a quiet node's view is rewritten every third report
    (121, "READY", 30, True),        # four intervals passed and nobody made it OFFLINE
    (121, "CORDONED", 30, True),
    (3600, "OFFLINE", 30, False),    # the heartbeat rule already says so
    (1000, "READY", 300, False),
    (10, "READY", 2, False),         # the 15 s floor
    (150, "READY", None, True),      # an old view without the interval: the default 30 s
])
def test_a_stale_view_says_so(age_s: int, status: wire.NodeStatus, interval: int | None, stale: bool) -> None:
    # Issue 15.6: health-ingest down under `up`: `node show` must not keep saying Healthy quietly.
    found = staleness(view(status=status, interval=interval), T0 + timedelta(seconds=age_s))
    assert (found is not None) == stale
    text = show_text(view(status=status, interval=interval), now=T0 + timedelta(seconds=age_s))
    assert ("Stale:" in text) == stale


def test_xid3_node_show_says_what_nvidia_recommends() -> None:
    shown = view()
    xid = msgspec.structs.replace(shown.conditions[0], recommended_action="RESTART_BM")
    text = show_text(msgspec.structs.replace(shown, conditions=[xid]), now=T0)
    assert "GPU 0: Xid 79\n    recommended action: RESTART_BM" in text
    assert "recommended action" not in show_text(view(), now=T0)  # none without an Xid's action
