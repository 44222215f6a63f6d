"""``subjects.matcher`` (the api's node-event tail, UI-2: a follower of nineteen event types
tests every record of a fleet's events) answers as ``subjects.matches`` over its patterns, on
any patterns and subjects."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from healthplane.contracts import subjects

_token = st.sampled_from(["hp", "event", "default", "n1", "10~2e0~2e0~2e42", "NODE_CORDONED", "SCORE_CHANGED", "0", "3"])
_subject = st.lists(_token, min_size=1, max_size=6).map(".".join)
_pattern = st.lists(_token | st.just("*"), min_size=0, max_size=5).flatmap(
    lambda head: st.sampled_from(["", "*", ">"]).map(lambda last: ".".join([*head, last] if last else head) or ">"))


@given(st.lists(_pattern, max_size=6), _subject)
def test_ui2_a_matcher_of_many_patterns_answers_as_each_pattern_does(patterns: list[str], subject: str) -> None:
    assert subjects.matcher(patterns)(subject) == any(subjects.matches(p, subject) for p in patterns)


def test_ui2_a_matcher_of_event_types_selects_only_those_types_in_both_stored_forms() -> None:
    selects = subjects.matcher([*subjects.event_type_filters(["NODE_CORDONED"]), "hp.event.*.*.NODE_CORDONED.*"])
    assert selects("hp.event.default.n1.NODE_CORDONED") and selects("hp.event.default.n1.NODE_CORDONED.3")
    assert not selects("hp.event.default.n1.SCORE_CHANGED") and not selects("hp.event.default.NODE_CORDONED")
