"""Breakfix figures (issue 41.5, RUL section of SPEC): an incident's stages from node events,
counted by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from healthplane.contracts import breakfix, wire

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def event(node: str, minutes: float, kind: str, *, condition: str = "gpu_xid_errors", severity: str = "critical",
          hold: str = "h1") -> wire.NodeEvent:
    fields: dict[str, object] = {}
    if kind.startswith("CONDITION_"):
        fields["condition"] = wire.ConditionChange(type=condition, reason="R", severity=severity,  # type: ignore[arg-type]
                                                   message="m")
    if kind.startswith("HOLD_"):
        fields["hold"] = wire.Hold(id=hold, effect="cordon", reason="r", actor="policy", created_at=T0)
    return wire.NodeEvent(id=f"{node}:{minutes}:{kind}", node_id=node, cluster="c", type=kind,  # type: ignore[arg-type]
                          occurred_at=T0 + timedelta(minutes=minutes), message="m", actor="t", **fields)  # type: ignore[arg-type]


def _fold(*events: wire.NodeEvent) -> list[dict[str, object]]:
    found = breakfix.Breakfix()
    for e in events:
        found.fold(e)
    return found.report()


def test_breakfix_one_incident_through_every_stage_and_the_next_one() -> None:
    [row] = _fold(
        event("n1", 0, "CONDITION_RAISED"),
        event("n1", 2, "HOLD_CREATED", hold="cordon"),
        event("n1", 3, "HOLD_CREATED", hold="drain"),   # a second hold: still out since minute 2
        event("n1", 30, "REMEDIATION_SUCCEEDED"),
        event("n1", 40, "HOLD_RELEASED", hold="drain"),
        event("n1", 45, "HOLD_RELEASED", hold="cordon"),  # the last: back in service
        event("n1", 45, "CONDITION_CLEARED"),
        event("n1", 600, "CONDITION_RAISED"),            # ten hours later, the next incident
    )
    assert row["incidents"] == 2
    assert row["outOfService"] == {"count": 1, "meanSeconds": 120.0}
    assert row["remediated"] == {"count": 1, "meanSeconds": 1800.0}
    assert row["backInService"] == {"count": 1, "meanSeconds": 2700.0}   # MTTR: 45 minutes
    assert row["betweenIncidents"] == {"count": 1, "meanSeconds": 36000.0}


def test_breakfix_not_a_fault_and_a_fault_that_cleared_by_itself() -> None:
    assert _fold(event("n1", 0, "CONDITION_RAISED", condition="heartbeat_missed"),
                 event("n1", 0, "CONDITION_RAISED", severity="warning")) == []
    [row] = _fold(event("n1", 0, "CONDITION_RAISED"), event("n1", 5, "CONDITION_CLEARED"),
                  event("n1", 9, "HOLD_CREATED"))  # a hold after it cleared is no stage of it
    assert row["incidents"] == 1 and row["outOfService"] == {"count": 0, "meanSeconds": None}


def test_breakfix_a_fault_on_a_node_already_cordoned_is_out_of_service_at_once() -> None:
    """Found by the property below in a CI run: a node cordoned by hand before its fault is
    out of service from the fault on (0 s), and back when the cordon goes."""
    [row] = _fold(event("n1", 0, "HOLD_CREATED"), event("n1", 10, "CONDITION_RAISED"),
                  event("n1", 25, "HOLD_RELEASED"))
    assert row["outOfService"] == {"count": 1, "meanSeconds": 0.0}
    assert row["backInService"] == {"count": 1, "meanSeconds": 900.0}


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(breakfix.EVENT_TYPES),
                          st.sampled_from(["h1", "h2"])), max_size=60))
def test_breakfix_state_stays_bounded_and_stages_never_exceed_incidents(steps: list[tuple[str, str, str]]) -> None:
    found = breakfix.Breakfix()
    for minute, (node, kind, hold) in enumerate(steps):
        found.fold(event(node, minute, kind, hold=hold))
    for figures in found.figures.values():
        assert figures.out_of_service.count <= figures.incidents
        assert figures.back_in_service.count <= figures.out_of_service.count
        assert figures.remediated.count <= figures.incidents
    assert all(len(track.holds) <= len(steps) for track in found.nodes.values())
