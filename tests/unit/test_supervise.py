"""`healthplane up` supervises its services like systemd's Restart=on-failure (issue 15.6)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from healthplane.stack.supervise import (
    GiveUp,
    LeaveStopped,
    Restart,
    RestartPolicy,
    after_exit,
    exit_reason,
)

POLICY = RestartPolicy()


def test_a_crash_is_restarted_with_a_growing_delay() -> None:
    failures: list[float] = []
    delays = []
    for now in (0.0, 2.0, 5.0, 10.0):
        decision = after_exit(POLICY, -9, failures, now)
        assert isinstance(decision, Restart)
        delays.append(decision.delay_s)
        failures.append(now)
    assert delays == [1.0, 2.0, 4.0, 8.0]


def test_repeated_fast_failures_give_up_with_a_reason() -> None:
    decision = after_exit(POLICY, 1, [0.0, 2.0, 5.0, 10.0], 19.0)
    assert decision == GiveUp("failed 5 times within 60s")


def test_failures_long_ago_do_not_count() -> None:
    # A service that crashed once an hour is restarted promptly every time.
    assert after_exit(POLICY, 1, [0.0, 3600.0, 7200.0, 10800.0], 14400.0) == Restart(1.0)


def test_a_clean_exit_is_left_stopped() -> None:
    assert isinstance(after_exit(POLICY, 0, [], 0.0), LeaveStopped)


def test_exit_reasons_in_words() -> None:
    assert exit_reason(-9) == "killed by SIGKILL" and exit_reason(2) == "exited with 2"


@given(st.lists(st.floats(min_value=0, max_value=1e6), max_size=20), st.floats(min_value=0, max_value=1e6),
       st.integers(min_value=-64, max_value=255).filter(lambda c: c != 0))
def test_the_delay_is_bounded_and_the_limit_holds(history: list[float], now: float, code: int) -> None:
    earlier = sorted(t for t in history if t <= now)
    decision = after_exit(POLICY, code, earlier, now)
    recent = sum(1 for t in earlier if now - t < POLICY.window_s) + 1
    if recent >= POLICY.burst:
        assert isinstance(decision, GiveUp)
    else:
        assert isinstance(decision, Restart) and POLICY.base_delay_s <= decision.delay_s <= POLICY.max_delay_s
