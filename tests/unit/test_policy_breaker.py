"""The circuit breaker on its own (POL-6): every parameter of reference 004 and its numbers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthplane.contracts.config import ConfigError, parse_cluster_config
from healthplane_policy.breaker import (
    BreakerSettings,
    BreakerState,
    Threshold,
    admit,
    record,
    reported_threshold,
    reset,
    share_of,
    standing_threshold,
    utilization,
    window_threshold,
)

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(("percent", "fleet", "nodes"), [
    (1, 288, 3),   # "1 on a 288-node cluster is 3 nodes, not 2"
    (25, 12, 3),   # "25 on a 12-node cluster is 3 nodes"
    (25, 16, 4),
    (50, 1, 1),
    (10, 100, 10),
])
def test_pol6_percentages_round_up(percent: int, fleet: int, nodes: int) -> None:
    assert share_of(percent, fleet) == nodes


@pytest.mark.parametrize(("cb", "fleet", "expected"), [
    (BreakerSettings(percentage=1), 288, Threshold(3, "percentage")),
    (BreakerSettings(percentage=10, max_nodes=20), 100, Threshold(10, "percentage")),  # the lower binds
    (BreakerSettings(percentage=10, max_nodes=20), 300, Threshold(20, "maxNodes")),
    (BreakerSettings(percentage=0, max_nodes=2), 5000, Threshold(2, "maxNodes")),
    (BreakerSettings(percentage=0, max_nodes=500), 300, Threshold(300, "fleetSize")),  # window clamped
    (BreakerSettings(percentage=0, max_nodes=0, max_cordoned_nodes=5), 300, None),
])
def test_pol6_window_threshold_lower_binds_and_clamps_to_the_fleet(cb: BreakerSettings, fleet: int,
                                                                  expected: Threshold | None) -> None:
    assert window_threshold(cb, fleet) == expected


def test_pol6_standing_bounds_bind_low_and_are_never_clamped() -> None:
    assert standing_threshold(BreakerSettings(max_cordoned_nodes=500), 300) == Threshold(500, "maxCordonedNodes")
    both = BreakerSettings(max_cordoned_nodes=20, max_cordoned_percentage=25)
    assert standing_threshold(both, 40) == Threshold(10, "maxCordonedPercentage")
    assert standing_threshold(both, 400) == Threshold(20, "maxCordonedNodes")
    assert standing_threshold(BreakerSettings(), 300) is None


def test_pol6_resizing_12_to_16_nodes_keeps_a_percentage_standing_bound_a_quarter() -> None:
    # "maxCordonedNodes: 3 is a quarter of a 12-node cluster and 19% once it grows to 16"
    absolute = BreakerSettings(percentage=0, max_nodes=5, max_cordoned_nodes=3)
    share = BreakerSettings(percentage=0, max_nodes=5, max_cordoned_percentage=25)
    assert [standing_threshold(absolute, n) for n in (12, 16)] == [Threshold(3, "maxCordonedNodes")] * 2
    assert [standing_threshold(share, n) for n in (12, 16)] == [
        Threshold(3, "maxCordonedPercentage"), Threshold(4, "maxCordonedPercentage")]


def test_pol6_a_rate_bound_alone_reaches_the_whole_fleet_a_standing_bound_stops_it() -> None:
    # 300 nodes, maxNodes 5 per 5 minutes: 4 cordons every window never trip it and take the
    # whole fleet in about six hours; maxCordonedNodes 20 trips at 20 nodes held.
    def run(cb: BreakerSettings) -> tuple[int, BreakerState]:
        state, cordoned, minute = BreakerState(), 0, 0
        while cordoned < 300:
            for _ in range(4):
                if not admit(state, cb, node_id=f"n{cordoned}", fleet=300, standing=cordoned,
                             now=T0 + timedelta(minutes=minute)).allowed:
                    return cordoned, state
                record(state, f"n{cordoned}", T0 + timedelta(minutes=minute))
                cordoned += 1
            minute += 5
        return cordoned, state

    rate_only, state = run(BreakerSettings(percentage=0, max_nodes=5, duration_s=300))
    assert rate_only == 300 and not state.tripped
    standing, state = run(BreakerSettings(percentage=0, max_nodes=5, max_cordoned_nodes=20, duration_s=300))
    assert standing == 20 and state.tripped and state.tripped_by == Threshold(20, "maxCordonedNodes")
    assert reported_threshold(state, BreakerSettings(percentage=0, max_nodes=5, max_cordoned_nodes=20), 300) == \
        Threshold(20, "maxCordonedNodes")


def test_pol6_trips_at_exactly_the_bound_persists_and_resets() -> None:
    cb = BreakerSettings(percentage=0, max_nodes=3, duration_s=300)
    state = BreakerState()
    allowed = []
    for i in range(5):
        verdict = admit(state, cb, node_id=f"n{i}", fleet=100, standing=0, now=T0)
        if verdict.allowed:
            record(state, f"n{i}", T0)
            allowed.append(i)
    assert allowed == [0, 1, 2] and state.tripped
    assert not admit(state, cb, node_id="n9", fleet=100, standing=0, now=T0 + timedelta(days=1)).allowed
    reset(state)
    assert admit(state, cb, node_id="n9", fleet=100, standing=0, now=T0 + timedelta(days=1)).allowed


def test_pol6_the_window_slides_and_counts_unique_nodes() -> None:
    cb = BreakerSettings(percentage=0, max_nodes=2, duration_s=60)
    state = BreakerState()
    for when, node in [(0, "a"), (10, "a"), (20, "b")]:  # a twice is one node
        assert admit(state, cb, node_id=node, fleet=10, standing=0, now=T0 + timedelta(seconds=when)).allowed
        record(state, node, T0 + timedelta(seconds=when))
    assert admit(state, cb, node_id="c", fleet=10, standing=0, now=T0 + timedelta(seconds=71)).allowed  # a slid out
    assert utilization(state, cb, 10, T0 + timedelta(seconds=71)) == pytest.approx(0.1)


def test_pol6_a_day_long_window_costs_one_entry_per_cordoned_node() -> None:
    # The reference's one-bucket-per-second ring holds 86,400 buckets for 24h; this holds what
    # was cordoned, and advancing it touches only what expired.
    cb = BreakerSettings(percentage=0, max_nodes=10, duration_s=86_400)
    state = BreakerState()
    record(state, "n1", T0)
    assert admit(state, cb, node_id="n2", fleet=100, standing=1, now=T0 + timedelta(hours=23)).allowed
    assert len(state.recent) == 1


def test_pol6_disabled_never_blocks() -> None:
    state = BreakerState()
    assert all(admit(state, BreakerSettings(enabled=False, percentage=1), node_id=f"n{i}", fleet=10, standing=i,
                     now=T0).allowed for i in range(10))


@pytest.mark.parametrize(("breaker", "message"), [
    ({"percentage": 0}, "could never trip"),
    ({"percentage": 0, "maxNodes": 0, "maxCordonedNodes": 0, "maxCordonedPercentage": 0}, "could never trip"),
    ({"maxNodes": -1}, "circuitBreaker.maxNodes: Input should be greater than or equal to 0"),
    ({"percentage": -5}, "circuitBreaker.percentage: Input should be greater than or equal to 0"),
    ({"maxCordonedNodes": -2}, "circuitBreaker.maxCordonedNodes"),
])
def test_pol6_validation_refuses_a_breaker_that_cannot_trip_and_negatives(breaker: dict[str, int],
                                                                        message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        parse_cluster_config({"nodeHealth": {"circuitBreaker": breaker}})


def test_pol6_validation_accepts_the_references_examples() -> None:
    for breaker in ({"percentage": 20, "duration": "10m"}, {"percentage": 0, "maxNodes": 2},
                    {"percentage": 10, "maxNodes": 20}, {"percentage": 0, "maxNodes": 5, "maxCordonedNodes": 20},
                    {"percentage": 0, "maxNodes": 5, "maxCordonedPercentage": 25},
                    {"enabled": False, "percentage": 0}):
        parse_cluster_config({"nodeHealth": {"circuitBreaker": breaker}})


@settings(max_examples=200, deadline=None)
@given(bound=st.integers(1, 6), gaps=st.lists(st.integers(0, 120), min_size=1, max_size=40),
       duration=st.integers(30, 600))
def test_pol6_never_more_than_the_bound_inside_any_window(bound: int, gaps: list[int], duration: int) -> None:
    cb = BreakerSettings(percentage=0, max_nodes=bound, duration_s=duration)
    state, now, admitted = BreakerState(), T0, []
    for i, gap in enumerate(gaps):
        now += timedelta(seconds=gap)
        if admit(state, cb, node_id=f"n{i}", fleet=1000, standing=0, now=now).allowed:
            record(state, f"n{i}", now)
            admitted.append(now)
    for i, start in enumerate(admitted):
        assert sum(1 for t in admitted[i:] if (t - start).total_seconds() < duration) <= bound
