"""INT-1: what ``events watch`` and the event stream select, as one filter of HP_NODE_EVENTS."""

from __future__ import annotations

import pytest

from healthplane.client import events
from healthplane.client.errors import EXIT_USAGE, CommandFailed
from healthplane.contracts import streams, subjects


@pytest.mark.parametrize(("cluster", "node", "subject"), [
    (None, None, "hp.event.*.*.>"),
    ("lab", None, "hp.event.lab.*.>"),
    (None, "10.0.0.42/9100", "hp.event.*.10=2E0=2E0=2E42=2F9100.>"),
    ("lab", "gpu/07", "hp.event.lab.gpu=2F07.>"),
])
def test_int1_one_filter_whatever_the_install(cluster: str | None, node: str | None, subject: str) -> None:
    selection = events.select(cluster, node)
    assert selection.subject == subject
    assert streams.stored_filters("HP_NODE_EVENTS", [subject]) == (subject,)  # one ordered read, slots or not
    stored = subjects.event(cluster or "c", node or "n", "SCORE_CHANGED")
    assert subjects.matches(subject, stored) and subjects.matches(subject, stored + ".3")


def test_int1_types_in_any_case_told_apart_by_the_subject_slot_or_not() -> None:
    selection = events.select(types=["node_cordoned", "Score_Changed"])
    assert selection.types == {"NODE_CORDONED", "SCORE_CHANGED"}
    assert selection.wants("hp.event.lab.n1.NODE_CORDONED") and selection.wants("hp.event.lab.n1.SCORE_CHANGED.7")
    assert not selection.wants("hp.event.lab.n1.HOLD_CREATED") and not selection.wants("hp.event.lab.n1.HOLD_CREATED.7")
    assert events.select().wants("hp.event.lab.n1.HOLD_CREATED")


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"types": ["bogus"]}, "type 'bogus' is not an event type"),
    ({"cluster": ""}, "cluster must not be empty"),
    ({"node_id": ""}, "node must not be empty"),
])
def test_int1_a_bad_selection_is_a_usage_error(kwargs: dict[str, object], said: str) -> None:
    with pytest.raises(CommandFailed, match=said) as refused:
        events.select(**kwargs)  # type: ignore[arg-type]
    assert refused.value.code == EXIT_USAGE
