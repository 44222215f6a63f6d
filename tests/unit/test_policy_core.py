"""The policy's pure core: modes, episodes, guardrails, replace (POL-1..POL-4), breaker and
observe in the fold (POL-6), replay determinism (REL-1)."""

from __future__ import annotations

import typing
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthplane.contracts import wire
from healthplane_policy import breaker, rules
from healthplane_policy.rules import PolicyState
from tests.support.policy import (
    Driver,
    allocation,
    at,
    condition,
    config,
    event,
    fleet,
    hold,
    only,
    refold_after_crash,
    registered,
    score,
    termination,
    view,
)

# ---------------------------------------------------------------------------- POL-1 modes


@pytest.mark.parametrize(("mode", "value", "kind", "action", "verbs"), [
    ("observe", 55, "POLICY_RECOMMENDED", "ACTION_CORDON", []),
    ("observe", 30, "POLICY_RECOMMENDED", "ACTION_DRAIN", []),
    ("cordon", 55, "POLICY_ACTED", "ACTION_CORDON", ["cordon"]),
    ("cordon", 30, "POLICY_ACTED", "ACTION_CORDON", ["cordon"]),  # cordon mode never drains
    ("drain", 55, "POLICY_ACTED", "ACTION_CORDON", ["cordon"]),
    ("drain", 45, "POLICY_ACTED", "ACTION_CORDON", ["cordon"]),  # 45 is not below drainBelow 45
    ("drain", 30, "POLICY_ACTED", "ACTION_DRAIN", ["drain"]),
    ("replace", 55, "POLICY_ACTED", "ACTION_CORDON", ["cordon"]),
    ("replace", 30, "POLICY_ACTED", "ACTION_DRAIN", ["drain"]),
    ("cordon", 60, None, None, []),  # at cordonBelow: nothing
])
def test_pol1_each_mode_acts_as_the_reference_says(mode: str, value: int, kind: str | None, action: str | None,
                                                    verbs: list[str]) -> None:
    drive = Driver(config({"mode": mode, "maxUnavailablePercent": 100}), *fleet(2), echo=False)
    drive.feed(score("n0", value, 100, at(1)))
    policy_events = drive.events()
    if kind is None:
        assert policy_events == [] and drive.commands() == []
        return
    found = only(policy_events)
    assert (found.type, found.action, found.policy_mode, found.score, found.actor) == (kind, action, mode, value, "policy")
    assert found.message == f"{action.removeprefix('ACTION_').lower()}: score {value}"
    assert [c.verb for c in drive.commands()] == verbs
    for command in drive.commands():
        assert command.actor == "policy" and command.active is False  # an automated drain is always passive


def test_pol1_a_definitions_mode_replaces_the_clusters() -> None:
    drive = Driver(config({"mode": "observe"}, {"gpu-pool": {"mode": "cordon", "maxUnavailablePercent": 100}}),
                   *fleet(2, "gpu-pool"), *fleet(2, "cpu-pool", prefix="c"), echo=False)
    drive.feed(score("n0", 50, 100, at(1)), score("c0", 50, 100, at(1)))
    assert [(e.node_id, e.type, e.policy_mode) for e in drive.events()] == [
        ("n0", "POLICY_ACTED", "cordon"), ("c0", "POLICY_RECOMMENDED", "observe")]
    assert [c.node_id for c in drive.commands()] == ["n0"]


def test_pol1_thresholds_come_from_the_config() -> None:
    drive = Driver(config({"mode": "cordon", "cordonBelow": 80, "drainBelow": 40, "maxUnavailablePercent": 100}),
                   *fleet(1))
    drive.feed(score("n0", 75, 100, at(1)))
    assert only(drive.commands()).reason == "score 75 below cordonBelow 80"


# ---------------------------------------------------------------------------- POL-2 episodes


def test_pol2_observe_gives_one_recommendation_per_episode() -> None:
    # 55 and 50 are one cordon episode, 30 escalates it, 100 ends it, 55 starts a new one; the
    # repeated views (one per report) add nothing.
    drive = Driver(config({"mode": "observe"}), *fleet(1))
    previous = 100
    for minute, value in enumerate([55, 50, 58, 30, 25, 100, 55, 55], 1):
        drive.feed(score("n0", value, previous, at(minute)), view("n0", value, at(minute, 10)))
        previous = value
    assert [e.message for e in drive.events("POLICY_RECOMMENDED")] == [
        "cordon: score 55", "drain: score 30", "cordon: score 55"]
    assert drive.events("POLICY_ACTED") == [] and drive.commands() == []


def test_pol2_a_guardrail_that_stops_blocking_is_a_new_event() -> None:
    # 5 nodes at 20 %: one may be out. n1 is halted while n0 is out; once an operator has put
    # n0 back (suppressing it) the next report of n1 acts: HALTED, then ACTED, each once.
    drive = Driver(config({"mode": "cordon"}), *fleet(5))
    drive.feed(score("n0", 50, 100, at(1)), score("n1", 50, 100, at(2)), view("n1", 50, at(3)), view("n1", 50, at(4)))
    assert [(e.node_id, e.type) for e in drive.events()] == [("n0", "POLICY_ACTED"), ("n1", "POLICY_HALTED")]
    cordon = only(drive.commands())
    drive.feed(hold("n0", "HOLD_RELEASED", f"h-{cordon.id}", "alice", at(5)),
               event("n0", "NODE_UNCORDONED", at(5), actor="alice"), view("n1", 50, at(6)), view("n1", 50, at(7)))
    assert [(e.node_id, e.type) for e in drive.events()][2:] == [("n1", "POLICY_ACTED")]


# ---------------------------------------------------------------------------- POL-3 guardrails


def test_pol3_the_ceiling_counts_operator_cordons_and_halts_naming_the_limit() -> None:
    drive = Driver(config({"mode": "cordon"}), *fleet(10))
    drive.feed(hold("n0", "HOLD_CREATED", "op-1", "alice"), hold("n1", "HOLD_CREATED", "op-2", "bob"))
    drive.feed(score("n2", 50, 100, at(1)))
    halted = only(drive.events())
    assert halted.type == "POLICY_HALTED" and drive.commands() == []
    assert "2 of 10 nodes of gpu-pool are out of service" in halted.message
    assert "maxUnavailablePercent 20%" in halted.message


def test_pol3_the_ceiling_is_per_definition() -> None:
    drive = Driver(config({"mode": "cordon"}), *fleet(5, "a"), *fleet(5, "b", prefix="m"))
    drive.feed(score("n0", 50, 100, at(1)), score("m0", 50, 100, at(1)), score("n1", 50, 100, at(1)))
    assert [(e.node_id, e.type) for e in drive.events()] == [
        ("n0", "POLICY_ACTED"), ("m0", "POLICY_ACTED"), ("n1", "POLICY_HALTED")]


def test_pol3_a_manual_uncordon_wins_for_cordon_suppression_minutes() -> None:
    drive = Driver(config({"mode": "cordon", "maxUnavailablePercent": 100}), *fleet(2))
    drive.feed(score("n0", 50, 100, at(1)))
    cordon = only(drive.commands())
    drive.feed(hold("n0", "HOLD_RELEASED", f"h-{cordon.id}", "alice", at(2)),
               event("n0", "NODE_UNCORDONED", at(2), actor="alice"))
    drive.feed(view("n0", 50, at(12)), view("n0", 50, at(31)))
    assert len(drive.commands()) == 1  # left alone for 30 minutes
    drive.feed(view("n0", 50, at(32, 1)))
    assert [c.verb for c in drive.commands()] == ["cordon", "cordon"]
    assert [e.type for e in drive.events()] == ["POLICY_ACTED", "POLICY_ACTED"]


@pytest.mark.parametrize("blind", ["heartbeat_missed", "telemetry_stale", "collector_failed"])
def test_pol3_a_node_that_cannot_be_seen_gets_no_action_and_no_event(blind: str) -> None:
    drive = Driver(config({"mode": "drain", "maxUnavailablePercent": 100}), *fleet(1))
    drive.feed(condition("n0", "CONDITION_RAISED", blind, at(1)), score("n0", 30, 100, at(2)),
               view("n0", 30, at(3)))
    assert drive.outputs == []
    drive.feed(condition("n0", "CONDITION_CLEARED", blind, at(4)), view("n0", 30, at(5)))
    assert [e.type for e in drive.events()] == ["POLICY_ACTED"]


def test_pol3_a_first_score_never_acts_the_second_report_does() -> None:
    drive = Driver(config({"mode": "cordon", "maxUnavailablePercent": 100}), registered("n0"))
    drive.feed(score("n0", 30, None, at(1)), view("n0", 30, at(1)))
    assert drive.outputs == []
    drive.feed(view("n0", 30, at(2)))  # the same score from a second report
    assert [c.verb for c in drive.commands()] == ["cordon"]


def test_pol3_a_view_whose_score_is_not_yet_known_decides_nothing() -> None:
    # The scorer's view of report 2 can arrive before its SCORE_CHANGED: the policy waits
    # for the score instead of acting on the one before it.
    drive = Driver(config({"mode": "cordon", "maxUnavailablePercent": 100}), registered("n0"))
    drive.feed(score("n0", 30, None, at(1)), view("n0", 30, at(1)), view("n0", 100, at(2)))
    assert drive.outputs == []
    drive.feed(score("n0", 100, 30, at(2)))
    assert drive.outputs == []


def test_pol1_automation_never_uncordons_even_when_the_score_recovers() -> None:
    drive = Driver(config({"mode": "drain", "maxUnavailablePercent": 100}), *fleet(1))
    drive.feed(score("n0", 30, 100, at(1)), score("n0", 100, 30, at(2)), view("n0", 100, at(3)))
    assert [c.verb for c in drive.commands()] == ["drain"]


# ---------------------------------------------------------------------------- POL-4 replace


def _replace_pool(limit: int = 3, nodes: int = 3) -> Driver:
    return Driver(config({"mode": "replace", "maxUnavailablePercent": 100, "maxReplacementsPerHour": limit,
                          "circuitBreaker": {"enabled": False}}), *fleet(nodes, provisioned=True))


def test_pol4_replace_drains_waits_naming_the_allocations_then_terminates_once_empty() -> None:
    drive = _replace_pool()
    drive.feed(allocation("n0", "a1", "started"), allocation("n0", "a2", "placed"))
    drive.feed(score("n0", 30, 100, at(1)))
    assert [c.verb for c in drive.commands()] == ["drain"]
    assert only(drive.events()).message == "drain: score 30; waiting for 2 allocation(s) to finish before replacing"
    drive.feed(view("n0", 30, at(2)), allocation("n0", "a1", "finished", at(3)))
    assert [c.verb for c in drive.commands()] == ["drain"]
    drive.feed(allocation("n0", "a2", "failed", at(4)))
    assert [c.verb for c in drive.commands()] == ["drain", "replace"]
    assert drive.events()[-1].message == "replace: score 30"
    drive.feed(termination("n0", True, at(5)), event("n0", "NODE_REPLACED", at(5), actor="policy"))
    assert "n0" not in {n.node_id for n in drive.state.nodes.values()}
    drive.feed(score("n0", 30, 30, at(6)))  # a late record about the replaced instance
    assert len(drive.commands()) == 2


def test_pol4_the_hourly_budget_halts_naming_the_count_and_is_rolling() -> None:
    drive = _replace_pool(limit=1)
    drive.feed(score("n0", 30, 100, at(1)))
    drive.feed(termination("n0", True, at(2)), event("n0", "NODE_REPLACED", at(2), actor="policy"))
    drive.feed(score("n1", 30, 100, at(10)))
    halted = drive.events()[-1]
    assert halted.type == "POLICY_HALTED" and halted.action == "ACTION_REPLACE"
    assert "maxReplacementsPerHour 1 reached for gpu-pool (1 replacement(s) in the last hour)" in halted.message
    drive.feed(view("n1", 30, at(30)))
    assert [c.verb for c in drive.commands()].count("replace") == 1
    drive.feed(view("n1", 30, at(62, 1)))  # an hour after the first replacement
    assert [c.verb for c in drive.commands()].count("replace") == 2


def test_pol4_a_rejected_termination_does_not_count_and_is_tried_again() -> None:
    drive = _replace_pool(limit=1)
    drive.feed(score("n0", 30, 100, at(1)))
    drive.feed(termination("n0", False, at(2), "InsufficientInstanceCapacity"))
    drive.feed(score("n1", 30, 100, at(3)))  # the rejected one spent nothing: n1 may go
    assert [(c.node_id, c.verb) for c in drive.commands() if c.verb == "replace"] == [("n0", "replace"), ("n1", "replace")]
    drive.feed(termination("n1", True, at(4)), event("n1", "NODE_REPLACED", at(4), actor="policy"))
    drive.feed(view("n0", 30, at(10)))  # retry due, but the hour's budget is now spent
    assert drive.events()[-1].type == "POLICY_HALTED"
    drive.feed(view("n0", 30, at(65)))
    retry = drive.events()[-1]
    assert retry.message == ("replace: score 30 (attempt 2; the provider rejected the last: "
                             "InsufficientInstanceCapacity)")


def test_pol4_owned_hardware_is_drained_and_left_cordoned() -> None:
    drive = Driver(config({"mode": "replace", "maxUnavailablePercent": 100}), *fleet(2, provisioned=False))
    drive.feed(score("n0", 30, 100, at(1)), view("n0", 30, at(2)), view("n0", 30, at(3)))
    assert [c.verb for c in drive.commands()] == ["drain"]


def test_pol4_a_manual_cordon_is_halted_never_terminated() -> None:
    drive = _replace_pool()
    drive.feed(hold("n0", "HOLD_CREATED", "op-1", "alice"), score("n0", 30, 100, at(1)), view("n0", 30, at(2)))
    assert drive.commands() == []
    halted = only(drive.events())
    assert halted.type == "POLICY_HALTED" and "alice took the node out of service by hand" in halted.message


def test_pol4_a_fault_evicted_provisioned_node_is_replaced_not_halted() -> None:
    """Fault eviction's cordon (actor ``eviction``, EVI-5) is automation's: in replace mode the
    instance is drained and replaced as reference 000 describes, never halted as manual."""
    drive = _replace_pool()
    drive.feed(hold("n0", "HOLD_CREATED", "fault-1", "eviction"), score("n0", 30, 100, at(1)))
    assert [c.verb for c in drive.commands()] == ["drain", "replace"]
    assert not [e for e in drive.events() if e.type == "POLICY_HALTED"]


def test_rem1_evi5_a_remediate_refused_on_a_node_eviction_holds_is_not_asked_again() -> None:
    """REM-1 with EVI-5 (issue 41): fault eviction cordoned the node and climbs its ladder; the
    policy's remediate is refused ("being remediated already") and the score changes after
    it do not ask again — until automation's hold is gone, when a fault still there is."""
    drive = Driver(config({"mode": "drain", "maxUnavailablePercent": 100}, remediation=LADDERS), *fleet(2),
                   echo=False)
    drive.feed(hold("n0", "HOLD_CREATED", "fault-1", "eviction"),
               condition("n0", "CONDITION_RAISED", "gpu_xid_errors", at(1), severity="critical"),
               score("n0", 55, 100, at(1)))
    [first] = drive.commands("remediate")
    drive.feed(wire.CommandOutcome(command_id=first.id, cluster=first.cluster, node_id="n0", verb="remediate",
                                   result="refused", message="n0 is being remediated already", decided_at=at(2)))
    drive.feed(score("n0", 40, 55, at(3)), score("n0", 35, 40, at(4)))
    assert len(drive.commands("remediate")) == 1
    drive.feed(hold("n0", "HOLD_RELEASED", "fault-1", "eviction", at(5)), score("n0", 30, 35, at(6)))
    assert len(drive.commands("remediate")) == 2


# ---------------------------------------------------------------------------- POL-6 in the fold


def test_pol6_the_breaker_lets_exactly_its_bound_through_and_stays_tripped_until_reset() -> None:
    drive = Driver(config({"mode": "cordon", "maxUnavailablePercent": 100,
                           "circuitBreaker": {"percentage": 0, "maxNodes": 3, "duration": "5m"}}), *fleet(10))
    for i in range(6):
        drive.feed(score(f"n{i}", 50, 100, at(0, i)))
    assert len(drive.commands("cordon")) == 3
    halted = drive.events("POLICY_HALTED")
    assert len(halted) == 3 and "circuit breaker TRIPPED (3 automated cordon(s) against maxNodes 3 node(s))" in halted[0].message
    drive.feed(score("n6", 50, 100, at(60)))  # long after the window: still tripped
    assert len(drive.commands("cordon")) == 3
    drive.feed(wire.PolicyCommand(id="r1", cluster="lab", action="breaker-reset", actor="alice", issued_at=at(61)))
    drive.feed(view("n6", 50, at(62)))
    assert len(drive.commands("cordon")) == 4


def test_pol6_rel1_a_trip_outlives_a_crash_after_its_window_and_a_reset_before_it_stays() -> None:
    """POL-6, REL-1: a restart with no snapshot refolds the facts and reads its own events back;
    a trip holds until reset even once the cordons that tripped it slid out of the window (found
    by hypothesis: after such a crash the breaker was closed and the next node was cordoned),
    and a trip an operator reset before the crash is not tripped again by reading it back."""
    setup = [config({"mode": "cordon", "maxUnavailablePercent": 100,
                     "circuitBreaker": {"percentage": 0, "maxNodes": 3, "duration": "5m"}}), *fleet(10)]
    tripping = [score(f"n{i}", 50, 100, at(0, i)) for i in range(5)]
    late = [score("n6", 50, 100, at(60))]  # long after the window
    uninterrupted, restarted = refold_after_crash(setup, [*tripping, *late], len(tripping))
    assert restarted == uninterrupted
    assert not [i for i in restarted if i.startswith("policy:lab:n6:") and i != "policy:lab:n6:1"]  # halted only
    reset = wire.PolicyCommand(id="r1", cluster="lab", action="breaker-reset", actor="alice", issued_at=at(61))
    uninterrupted, restarted = refold_after_crash(setup, [*tripping, reset, *late], len(tripping) + 1)
    assert restarted == uninterrupted
    assert "policy:lab:n6:2" in restarted  # the reset stood: n6 cordoned (its event and its command)


def test_pol6_observe_is_never_counted_by_the_breaker() -> None:
    drive = Driver(config({"mode": "observe", "circuitBreaker": {"percentage": 0, "maxNodes": 1}}), *fleet(5))
    for i in range(5):
        drive.feed(score(f"n{i}", 50, 100, at(1)))
    assert len(drive.events("POLICY_RECOMMENDED")) == 5
    assert drive.state.breakers.get("lab") is None or not drive.state.breakers["lab"].recent
    drive.feed(config({"mode": "cordon", "maxUnavailablePercent": 100,
                       "circuitBreaker": {"percentage": 0, "maxNodes": 1}}, version=2))
    drive.feed(view("n0", 50, at(2)))
    assert len(drive.commands("cordon")) == 1  # nothing carried over from observe


def test_pol6_the_standing_bound_counts_only_automations_own_cordons() -> None:
    drive = Driver(config({"mode": "cordon", "maxUnavailablePercent": 100,
                           "circuitBreaker": {"percentage": 0, "maxCordonedNodes": 2}}), *fleet(10))
    drive.feed(hold("n9", "HOLD_CREATED", "op", "alice"))  # an operator's cordon is not counted
    for i in range(4):
        drive.feed(score(f"n{i}", 50, 100, at(i * 10)))
    assert len(drive.commands("cordon")) == 2
    assert "maxCordonedNodes 2" in drive.events("POLICY_HALTED")[0].message


# ---------------------------------------------------------------------------- invariants

NODES = [f"n{i}" for i in range(6)]


def _random_records() -> st.SearchStrategy[list[Any]]:
    minute = st.integers(min_value=0, max_value=240)
    node = st.sampled_from(NODES)
    records = st.one_of(
        st.builds(lambda n, v, p, m: score(n, v, p, at(m)), node, st.integers(0, 100),
                  st.one_of(st.none(), st.integers(0, 100)), minute),
        st.builds(lambda n, v, m: view(n, v, at(m)), node, st.integers(0, 100), minute),
        st.builds(lambda n, t, m: condition(n, "CONDITION_RAISED", t, at(m)), node,
                  st.sampled_from(["heartbeat_missed", "gpu_xid_errors"]), minute),
        st.builds(lambda n, t, m: condition(n, "CONDITION_CLEARED", t, at(m)), node,
                  st.sampled_from(["heartbeat_missed", "gpu_xid_errors"]), minute),
        st.builds(lambda n, m: hold(n, "HOLD_CREATED", f"op-{n}", "alice", at(m)), node, minute),
        st.builds(lambda n, m: hold(n, "HOLD_RELEASED", f"op-{n}", "alice", at(m)), node, minute),
        st.builds(lambda n, m: event(n, "NODE_UNCORDONED", at(m), actor="alice"), node, minute),
        st.builds(lambda n, a, s, m: allocation(n, a, s, at(m)), node, st.sampled_from(["a", "b"]),
                  st.sampled_from(["started", "finished"]), minute),
        st.builds(lambda n, ok, m: termination(n, ok, at(m)), node, st.booleans(), minute),
    )
    return st.lists(records, max_size=60).map(lambda rs: sorted(rs, key=_when))


def _when(record: Any) -> Any:
    return getattr(record, "occurred_at", None) or getattr(record, "last_reported_at", None) or record.at


@settings(max_examples=150, deadline=None)
@given(records=_random_records(), mode=st.sampled_from(["observe", "cordon", "drain", "replace"]),
       max_nodes=st.integers(1, 4))
def test_pol6_rel1_breaker_bound_holds_automation_never_uncordons_and_replay_is_identical(
        records: list[Any], mode: str, max_nodes: int) -> None:
    setup = [config({"mode": mode, "maxUnavailablePercent": 100,
                     "circuitBreaker": {"percentage": 0, "maxNodes": max_nodes, "duration": "10m"}}),
             *fleet(len(NODES), provisioned=True)]
    first = Driver(*setup, *records)
    cordons = [c for c in first.commands() if c.verb in ("cordon", "drain")]
    # Never more nodes cordoned by automation inside any window than the bound (never reset
    # here). Nodes, not commands: a node the policy drains again (it recovered and fell back
    # within the window) is out of service once (found by hypothesis: two drains of n0).
    for start in sorted(c.issued_at for c in cordons):
        inside = {c.node_id for c in cordons if 0 <= (c.issued_at - start).total_seconds() < 600}
        assert len(inside) <= max_nodes
    assert all(c.verb != "uncordon" and c.actor == "policy" and not c.active for c in first.commands())
    if mode == "observe":
        assert cordons == []
    # The same inputs give the same state and outputs; so does a fold resumed from a snapshot.
    second = Driver(*setup, *records)
    assert first.state == second.state and first.outputs == second.outputs
    half = len(records) // 2
    resumed = Driver(*setup, *records[:half])
    resumed.state = msgspec.json.decode(msgspec.json.encode(resumed.state), type=PolicyState)
    resumed.feed(*records[half:])
    assert resumed.state == first.state and resumed.outputs == first.outputs


@settings(max_examples=100, deadline=None)
@given(records=_random_records(), mode=st.sampled_from(["cordon", "drain", "replace"]))
def test_rel1_a_refold_after_a_crash_repeats_no_decision(records: list[Any], mode: str) -> None:
    # A crash after the first half: the restart refolds those inputs as facts only (their
    # outputs are in the streams) and reads its own events back; the second half then decides
    # exactly what an uninterrupted run decided, with the same ids.
    setup = [config({"mode": mode, "maxUnavailablePercent": 50,
                     "circuitBreaker": {"percentage": 0, "maxNodes": 3, "duration": "10m"}}),
             *fleet(len(NODES), provisioned=True)]
    uninterrupted, restarted = refold_after_crash(setup, records, len(records) // 2)
    assert restarted == uninterrupted


# ---------------------------------------------------------------------------- REM-1

LADDERS = {"ladders": [{"faultClass": "GPU_XID_ERRORS", "steps": [{"action": "gpu-reset"}, {"action": "reboot"},
                                                                  {"action": "needs-attention"}]}]}


@pytest.mark.parametrize(("mode", "verbs"), [
    ("observe", []), ("cordon", ["cordon"]), ("drain", ["remediate"]), ("replace", ["remediate"])])
def test_rem1_a_fault_with_a_ladder_is_remediated_in_the_modes_that_take_work_off(mode: str,
                                                                                 verbs: list[str]) -> None:
    drive = Driver(config({"mode": mode, "maxUnavailablePercent": 100}, remediation=LADDERS), *fleet(2), echo=False)
    drive.feed(condition("n0", "CONDITION_RAISED", "gpu_xid_errors", at(1), severity="critical"),
               score("n0", 55, 100, at(1)))
    assert [c.verb for c in drive.commands()] == verbs
    if verbs == ["remediate"]:
        [acted] = drive.events("POLICY_ACTED")
        assert acted.action == "ACTION_REMEDIATE" and acted.message == "remediate: score 55"
        assert drive.commands()[0].reason == "score 55: gpu_xid_errors: remediation ladder"


def test_rem1_a_fault_without_a_ladder_is_handled_as_before() -> None:
    drive = Driver(config({"mode": "drain", "maxUnavailablePercent": 100}, remediation=LADDERS), *fleet(2),
                   echo=False)
    drive.feed(condition("n0", "CONDITION_RAISED", "memory_errors", at(1), severity="critical"),
               score("n0", 55, 100, at(1)))
    assert [c.verb for c in drive.commands()] == ["cordon"]


def test_rem1_the_breaker_counts_remediations_like_cordons_and_halts_the_sixth_at_bound_5() -> None:
    drive = Driver(config({"mode": "drain", "maxUnavailablePercent": 100,
                           "circuitBreaker": {"percentage": 0, "maxNodes": 5, "duration": "5m"}},
                          remediation=LADDERS), *fleet(10))
    for i in range(6):
        drive.feed(condition(f"n{i}", "CONDITION_RAISED", "gpu_xid_errors", at(0, i), severity="critical"),
                   score(f"n{i}", 55, 100, at(0, i)))
    assert len(drive.commands("remediate")) == 5
    [halted] = drive.events("POLICY_HALTED")
    assert halted.node_id == "n5" and "circuit breaker TRIPPED (5 automated cordon(s) against maxNodes 5 node(s))" \
        in halted.message


@given(count=st.integers(0, 10**6), bound=st.sampled_from([None, *typing.get_args(breaker.Bound)]),
       nodes=st.integers(0, 10**6))
def test_pol6_rel1_a_trip_in_words_reads_back_as_the_same_trip(count: int, bound: str | None, nodes: int) -> None:
    """The halted event's words are what a restart rebuilds the trip from: any count and bound
    worded reads back as itself (a change to the wording that the reading misses fails here)."""
    threshold = breaker.Threshold(nodes, bound) if bound is not None else None  # type: ignore[arg-type]
    found = rules._TRIPPED.search(f"drain: score 20; halted: {rules._tripped(count, threshold)}; reset with …")
    assert found is not None
    assert found.groups() == (str(count), bound, None if bound is None else str(nodes))
