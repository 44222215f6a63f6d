"""The bridge's fold: given what the bucket and the event stream hold, when these reports
arrive, then these registrations and puts (BRG-3)."""

from __future__ import annotations

from datetime import UTC, datetime

from healthplane.contracts import subjects
from healthplane_substrate_bridge import fold
from healthplane_substrate_bridge.rules import CapDecision, decide_cap, registration_event_id
from tests.support.records import resource_report

MIB = 1024 * 1024
AT_NS = int(datetime(2026, 11, 30, 8, 0, 5, tzinfo=UTC).timestamp() * 1e9)


def _reports(*node_ids: str, cores: int = 192) -> list[fold.Report]:
    return [fold.Report(seq, AT_NS, resource_report(node_id, cores=cores)) for seq, node_id in enumerate(node_ids, 1)]


def _key(node_id: str) -> str:
    return subjects.kv_node_key("default", node_id)


def _subject(node_id: str) -> str:
    return subjects.event("default", node_id, "NODE_REGISTERED")


def test_a_newcomer_is_registered_before_its_put() -> None:
    plan = fold.decide(fold.initial_state([], []), _reports("cn-1"))
    [register] = plan.registrations
    assert register.subject == _subject("cn-1") and register.seq == 1
    assert register.event.id == registration_event_id("default", "cn-1") and register.event.type == "NODE_REGISTERED"
    assert register.event.occurred_at == datetime(2026, 11, 30, 8, 0, 5, tzinfo=UTC)
    assert plan.puts == (fold.Put(0, _key("cn-1"), newcomer=True),) and plan.skipped == ()


def test_a_node_in_the_bucket_is_only_put() -> None:
    plan = fold.decide(fold.initial_state([_key("cn-1")], [_subject("cn-1")]), _reports("cn-1"))
    assert plan.registrations == () and plan.skipped == ()
    assert plan.puts == (fold.Put(0, _key("cn-1"), newcomer=False),)


def test_a_lost_key_is_put_again_without_a_second_registration() -> None:
    plan = fold.decide(fold.initial_state([], [_subject("cn-1")]), _reports("cn-1"))
    assert plan.registrations == ()
    assert plan.skipped == (fold.Skip(_key("cn-1"), "already registered"),)
    assert plan.puts == (fold.Put(0, _key("cn-1"), newcomer=True),)


def test_one_registration_per_newcomer_in_a_batch_from_its_latest_report() -> None:
    reports = [*_reports("cn-1", "cn-2"), fold.Report(3, AT_NS, resource_report("cn-1", hostname="cn-1-renamed"))]
    plan = fold.decide(fold.initial_state([], []), reports)
    assert [(r.subject, r.seq) for r in plan.registrations] == [(_subject("cn-1"), 3), (_subject("cn-2"), 2)]
    assert plan.registrations[0].event.hostname == "cn-1-renamed"
    assert [put.at for put in plan.puts] == [0, 1, 2]


def test_registrations_not_stored_hold_back_only_the_newcomers() -> None:
    state = fold.initial_state([_key("cn-1")], [_subject("cn-1")])
    puts, waiting, skipped = fold.decide(state, _reports("cn-1", "cn-2")).without_newcomers()
    assert puts == (fold.Put(0, _key("cn-1"), newcomer=False),)
    assert waiting == (fold.Put(1, _key("cn-2"), newcomer=True),)
    assert skipped == (fold.Skip(_key("cn-2"), "registration not stored"),)


def test_the_state_moves_only_on_what_was_stored() -> None:
    state = fold.initial_state([], [])
    plan = fold.decide(state, _reports("cn-1"))
    assert state == fold.initial_state([], [])  # deciding changes nothing
    fold.evolve(state, fold.Registered(tuple(r.subject for r in plan.registrations)))
    fold.evolve(state, fold.Stored((_key("cn-1"),)))
    assert state == fold.initial_state([_key("cn-1")], [_subject("cn-1")])
    assert fold.decide(state, _reports("cn-1", cores=96)).puts == (fold.Put(0, _key("cn-1"), newcomer=False),)


def test_brg1_cap_unset_kept_out_of_range_clamped() -> None:
    assert decide_cap(None) == CapDecision(None, None, False)
    assert decide_cap(1024) == CapDecision(64 * MIB, 1024, True)
    assert decide_cap(128 * MIB) == CapDecision(128 * MIB, 128 * MIB, False)
