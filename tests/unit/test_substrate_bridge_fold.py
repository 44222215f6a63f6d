"""The bridge's fold: given these inputs, these registrations and puts, and the same state
for an input folded twice (a put that waited, BRG-2) (BRG-1, BRG-3)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthplane.contracts import subjects, wire
from healthplane.runtime.fold import IdentityMismatch, Inbound
from healthplane_substrate_bridge import fold
from healthplane_substrate_bridge.rules import CapDecision, decide_cap, registration_event_id
from tests.support.records import resource_report

MIB = 1024 * 1024
AT = datetime(2026, 11, 30, 8, 0, 5, tzinfo=UTC)
CORE = fold.BridgeCore()


def _report(seq: int, node_id: str, *, wants_output: bool = True, **fields: object) -> Inbound:
    report = resource_report(node_id, **fields)  # type: ignore[arg-type]
    return Inbound("HP_RESOURCES", seq, subjects.resource("default", node_id), wire.encode(report), {}, AT, True,
                   wants_output)


def _registered(seq: int, node_id: str) -> Inbound:
    event = wire.NodeEvent(id=registration_event_id("default", node_id), node_id=node_id, cluster="default",
                           type="NODE_REGISTERED", occurred_at=AT, message="registered", actor="substrate-bridge")
    return Inbound("HP_NODE_EVENTS", seq, subjects.event("default", node_id, "NODE_REGISTERED"), wire.encode(event),
                   {}, AT, True)


def _key(node_id: str) -> str:
    return subjects.kv_node_key("default", node_id)


def _fold(*inbounds: Inbound) -> tuple[fold.BridgeState, list[list[str]]]:
    state, subjects_out = CORE.initial_state(), []
    for inbound in inbounds:
        state, emits, _ = CORE.step(state, inbound)
        subjects_out.append([e.subject for e in emits])
    return state, subjects_out


def test_brg3_a_newcomer_is_registered_before_its_put() -> None:
    inbound = _report(1, "cn-1")
    state, emits, _ = CORE.step(CORE.initial_state(), inbound)
    register, put = emits
    assert register.subject == subjects.event("default", "cn-1", "NODE_REGISTERED")
    assert register.msg_id == registration_event_id("default", "cn-1")  # a repeat is de-duplicated
    event = wire.decode(wire.NodeEvent, register.payload)
    assert (event.type, event.occurred_at, event.actor) == ("NODE_REGISTERED", AT, "substrate-bridge")
    assert put.subject == f"$KV.substrate-nodes.{_key('cn-1')}" and put.payload == inbound.data  # byte for byte
    assert put.may_wait and not register.may_wait  # BRG-2: only the put waits for room
    assert state.registered == {_key("cn-1")}


def test_brg3_a_registered_node_is_only_put_and_its_own_registration_is_folded() -> None:
    _, out = _fold(_registered(1, "cn-1"), _report(1, "cn-1"), _report(2, "cn-1", cores=96))
    assert out == [[], [f"$KV.substrate-nodes.{_key('cn-1')}"], [f"$KV.substrate-nodes.{_key('cn-1')}"]]


def test_brg1_a_report_back_after_a_newer_one_puts_nothing() -> None:
    """BRG-1 with BRG-2: the bucket holds the latest report; one that waited never overwrites
    a newer one of its node that went out meanwhile."""
    state, out = _fold(_report(1, "cn-1"), _report(2, "cn-1", cores=96), _report(1, "cn-1"))
    assert out[2] == [] and state.newest == {_key("cn-1"): 2}


def test_brg3_a_refold_of_an_emitted_input_emits_nothing_but_keeps_its_state() -> None:
    state, out = _fold(_report(1, "cn-1", wants_output=False))
    assert out == [[]] and state.registered == {_key("cn-1")}


def test_sec7_another_nodes_report_on_a_subject_is_refused() -> None:
    forged = Inbound("HP_RESOURCES", 1, subjects.resource("default", "cn-1"), wire.encode(resource_report("cn-2")),
                     {}, AT, True)
    with pytest.raises(IdentityMismatch):
        CORE.step(CORE.initial_state(), forged)


@given(st.lists(st.tuples(st.integers(1, 40), st.sampled_from(["a", "b", "c"])), max_size=30), st.data())
def test_brg2_a_waiting_input_folded_again_gives_the_same_state(inputs: list[tuple[int, str]], data: st.DataObject) -> None:
    """BRG-2: a put that waited brings its report back; the state after folding it again is
    the state without the repeat, so a refused put changes nothing but timing."""
    inbounds = [_report(seq, node) for seq, node in sorted(set(inputs))]
    once, _ = _fold(*inbounds)
    repeated = list(inbounds)
    for inbound in data.draw(st.lists(st.sampled_from(inbounds), max_size=5)) if inbounds else []:
        repeated.insert(data.draw(st.integers(repeated.index(inbound) + 1, len(repeated))), inbound)
    twice, _ = _fold(*repeated)
    assert twice == once
    assert once.registered == {_key(node) for _, node in inputs}


def test_brg1_cap_unset_kept_out_of_range_clamped() -> None:
    assert decide_cap(None) == CapDecision(None, None, False)
    assert decide_cap(1024) == CapDecision(64 * MIB, 1024, True)
    assert decide_cap(128 * MIB) == CapDecision(128 * MIB, 128 * MIB, False)
