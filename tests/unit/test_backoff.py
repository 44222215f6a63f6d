"""The one backoff (issue 17): doubling to a cap, jitter around the nominal, reset."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from healthplane.runtime.backoff import Backoff


def test_doubles_to_the_cap_and_resets() -> None:
    backoff = Backoff(0.2, 1.0)
    assert [backoff.next() for _ in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    backoff.reset()
    assert backoff.next() == 0.2


@given(st.floats(min_value=0, max_value=1), st.integers(min_value=0, max_value=20))
def test_jitter_stays_around_the_nominal(draw: float, steps: int) -> None:
    backoff = Backoff(0.1, 5.0, jitter=0.2, draw=lambda: draw)
    for _ in range(steps):
        backoff.next()
    nominal = backoff.current_s
    assert 0.8 * nominal - 1e-9 <= backoff.next() <= 1.2 * nominal + 1e-9


@given(st.integers(min_value=1, max_value=40), st.floats(min_value=0, max_value=1))
def test_after_n_failures_equals_the_nth_delay_of_a_fresh_backoff(failures: int, draw: float) -> None:
    # Issue 25 (BRG-2): the bridge's redelivery delay from a delivery's own count: the same
    # sequence as next(), without state, so a full bucket's reports back off to a minute.
    fresh = Backoff(2.0, 60.0, jitter=0.2, draw=lambda: draw)
    for _ in range(failures - 1):
        fresh.next()
    assert Backoff(2.0, 60.0, jitter=0.2, draw=lambda: draw).after(failures) == fresh.next()
