"""UI-5: a federation hub's history of each member's reachability and lag, folded from the
hub's looks at its members (``healthplane_api.members``, pure)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from healthplane.client.federation import Member
from healthplane_api import members

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
THRESHOLD = 10.0


def _look(name: str, at: datetime, heard_ago_s: float | None, lag: int = 0) -> Member:
    return Member(name, None if heard_ago_s is None else at - timedelta(seconds=heard_ago_s), lag)


def test_ui5_an_outage_is_recorded_unreachable_since_the_last_word_then_reachable_since_its_return() -> None:
    history = members.History()
    looks = [(0, 1.0), (2, 1.0), (30, 25.0), (60, 55.0), (62, 0.5), (64, 0.5)]  # (seconds in, heard ago)
    for seconds, heard_ago in looks:
        at = T0 + timedelta(seconds=seconds)
        history = members.observe(history, [_look("a", at, heard_ago, lag=seconds)], at, THRESHOLD)
    kept = history.members["a"]
    assert [(t.reachable, t.at, t.first) for t in kept.transitions] == [
        (True, T0, True),  # as found when the watch began
        (False, T0 + timedelta(seconds=5), False),  # last heard at 30 - 25 s: the server's own figure
        (True, T0 + timedelta(seconds=62), False),  # back: when the hub saw it
    ]
    assert kept.transitions[1].reason == "cluster a unreachable since 2026-12-02T12:00:05Z"
    assert history.watched_since == T0

    now = T0 + timedelta(seconds=64)
    shown = members.to_builtins(history, _look("a", now, 0.5, lag=3), now, THRESHOLD)
    assert shown["reachable"] is True and shown["since"] == "2026-12-02T12:01:02Z"
    assert [(h["reachable"], h["at"]) for h in shown["history"]] == [
        (True, "2026-12-02T12:01:02Z"), (False, "2026-12-02T12:00:05Z"), (True, "2026-12-02T12:00:00Z")]
    # Lag sampled at most every 20 s: at 0, 30 and 60 s.
    assert [(s["at"], s["lag"]) for s in shown["lagTrend"]] == [
        ("2026-12-02T12:00:00Z", 0), ("2026-12-02T12:00:30Z", 30), ("2026-12-02T12:01:00Z", 60)]
    down = T0 + timedelta(seconds=100)
    gone = members.to_builtins(history, _look("a", down, 38.0), down, THRESHOLD)
    assert gone["reachable"] is False and gone["since"] == "2026-12-02T12:01:02Z"


def test_ui5_a_member_never_heard_from_and_one_detached() -> None:
    history = members.observe(members.History(), [_look("a", T0, None), _look("b", T0, 1.0)], T0, THRESHOLD)
    [never] = history.members["a"].transitions
    assert (never.reachable, never.at, never.reason) == (False, None, "cluster a has not connected to the hub yet")
    assert members.to_builtins(history, _look("a", T0, None), T0, THRESHOLD)["since"] is None
    # b was reachable when the watch began: since when is not known, and not made up.
    assert members.to_builtins(history, _look("b", T0, 1.0), T0, THRESHOLD)["since"] is None
    later = T0 + timedelta(seconds=2)
    assert set(members.observe(history, [_look("a", later, None)], later, THRESHOLD).members) == {"a"}


@given(st.lists(st.tuples(st.floats(0.5, 30.0), st.none() | st.floats(0, 60), st.integers(0, 10_000)),
                max_size=400))
def test_ui5_the_history_stays_bounded_and_its_transitions_alternate(
        looks: list[tuple[float, float | None, int]]) -> None:
    """UI-5: however often a member flaps, at most TRANSITIONS_KEPT changes and
    LAG_SAMPLES_KEPT samples are kept, each change the opposite of the one before."""
    history, at = members.History(), T0
    for step_s, heard_ago, lag in looks:
        at += timedelta(seconds=step_s)
        history = members.observe(history, [_look("a", at, heard_ago, lag)], at, THRESHOLD)
    if not looks:
        assert history.members == {}
        return
    kept = history.members["a"]
    assert 1 <= len(kept.transitions) <= members.TRANSITIONS_KEPT
    assert len(kept.lag) <= members.LAG_SAMPLES_KEPT
    assert all(a.reachable is not b.reachable for a, b in zip(kept.transitions, kept.transitions[1:], strict=False))
    samples = [s.at for s in kept.lag]
    assert samples == sorted(samples)
    assert all(b - a >= members.LAG_SAMPLE_EVERY for a, b in itertools.pairwise(samples))


def test_ui5_the_lag_trend_is_drawn_scaled_to_its_largest_lag() -> None:
    samples = [members.LagSample(T0 + timedelta(seconds=20 * i), lag, None) for i, lag in enumerate([0, 50, 100])]
    line = members.sparkline(samples, width=104, height=44)
    assert line["points"] == "2.0,42.0 52.0,22.0 102.0,2.0" and line["top"] == 100
    assert members.sparkline([])["points"] == ""
