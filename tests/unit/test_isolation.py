"""VAL-3: adaptive fault isolation names exactly the faulty nodes, within ⌈log2 n⌉ rounds for
one, never more validations at once than the cap, and clears every other suspect."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthplane_eviction import isolation


def _isolate(nodes: list[str], faulty: set[str], cap: int = 8) -> tuple[isolation.Isolation, int]:
    """Run an isolation to its end against a perfect validation: a group fails when it holds a
    faulty node. Returns the end state and the most validations that ran at once."""
    state = isolation.start("job-1", nodes, max_concurrent=cap)
    widest = 0
    while not state.done:
        state, started = isolation.launch(state)
        widest = max(widest, len(state.running))
        # every validation started ends before the next wave starts (the worst case for rounds)
        for step in started:
            state = isolation.on_result(state, step.nodes, passed=not (set(step.nodes) & faulty))
    return state, widest


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[str], set[str], int]:
    n = draw(st.integers(min_value=1, max_value=64))
    nodes = [f"n{i:02d}" for i in range(n)]
    faulty = set(draw(st.lists(st.sampled_from(nodes), max_size=n, unique=True)))
    return nodes, faulty, draw(st.integers(min_value=1, max_value=16))


@given(fleets())
def test_val3_isolation_names_exactly_the_faulty_nodes_and_clears_the_others(fleet: tuple[list[str], set[str], int]) -> None:
    nodes, faulty, cap = fleet
    state, widest = _isolate(nodes, faulty, cap)
    assert state.faulty == faulty
    assert state.cleared == set(nodes) - faulty
    assert widest <= cap


@given(n=st.integers(min_value=2, max_value=256), data=st.data())
def test_val3_one_faulty_node_among_n_takes_at_most_log2_n_rounds(n: int, data: st.DataObject) -> None:
    nodes = [f"n{i:03d}" for i in range(n)]
    bad = data.draw(st.sampled_from(nodes))
    state, _ = _isolate(nodes, {bad}, cap=2)
    assert state.faulty == {bad}
    assert state.rounds <= math.ceil(math.log2(n))
    assert state.validations <= 2 * math.ceil(math.log2(n))


def test_val3_a_16_node_job_with_one_silent_fault_is_isolated_in_4_rounds() -> None:
    nodes = [f"gpu-{i:02d}" for i in range(16)]
    state, _ = _isolate(nodes, {"gpu-11"})
    assert (state.faulty, state.rounds, state.validations) == ({"gpu-11"}, 4, 8)


def test_val3_two_faults_in_different_halves_are_both_found() -> None:
    nodes = [f"gpu-{i:02d}" for i in range(16)]
    state, _ = _isolate(nodes, {"gpu-02", "gpu-13"})
    assert state.faulty == {"gpu-02", "gpu-13"} and state.rounds == 4


def test_val3_no_faulty_node_clears_everyone_in_the_first_round() -> None:
    state, _ = _isolate([f"n{i}" for i in range(10)], set())
    assert (state.faulty, state.rounds, state.validations) == (frozenset(), 1, 2)


def test_val3_a_result_for_a_group_not_under_validation_is_refused() -> None:
    state, _ = isolation.launch(isolation.start("job-1", ["a", "b"]))
    with pytest.raises(isolation.IsolationError, match="no validation of c is running"):
        isolation.on_result(state, ("c",), passed=True)
    with pytest.raises(isolation.IsolationError, match="no suspects"):
        isolation.start("job-2", [])


@st.composite
def domained(draw: st.DrawFn) -> tuple[list[str], list[tuple[str, ...]], set[str]]:
    n = draw(st.integers(min_value=2, max_value=40))
    nodes = [f"n{i:02d}" for i in range(n)]
    size = draw(st.integers(min_value=2, max_value=8))
    shuffled = draw(st.permutations(nodes))
    together = [tuple(sorted(shuffled[i:i + size])) for i in range(0, draw(st.integers(0, n)), size)]
    together = [g for g in together if len(g) > 1]
    faulty = set(draw(st.lists(st.sampled_from(nodes), max_size=3, unique=True)))
    return nodes, together, faulty


@given(domained())
def test_dom4_a_domains_members_are_never_split_and_a_failing_domain_is_named_whole(
        case: tuple[list[str], list[tuple[str, ...]], set[str]]) -> None:
    """DOM-4: suspects sharing an NVLink domain are validated together in every round; a
    validation fails when it holds a faulty node; the names are the faulty nodes, widened to
    their whole domain where one is faulty, and everyone else is cleared."""
    nodes, together, faulty = case
    state = isolation.start("job-1", nodes, together=together)
    unit = {n: set(g) for g in together for n in g}
    while not state.done:
        state, started = isolation.launch(state)
        for step in started:
            for node in step.nodes:  # a validation holds a node's whole unit, or none of it
                assert unit.get(node, {node}) <= set(step.nodes)
            state = isolation.on_result(state, step.nodes, passed=not (set(step.nodes) & faulty))
    expected = set().union(*(unit.get(n, {n}) for n in faulty)) if faulty else set()
    assert state.faulty == expected and state.cleared == set(nodes) - expected


def test_dom4_without_domains_isolation_is_unchanged() -> None:
    assert isolation.halves([f"n{i}" for i in range(7)]) == (("n0", "n1", "n2", "n3"), ("n4", "n5", "n6"))
    first = isolation.start("j", ["a", "b", "c", "d"], together=[("a", "b", "c", "d")])
    assert [s.nodes for s in first.waiting] == [("a", "b", "c", "d")]  # one domain: validated as one
