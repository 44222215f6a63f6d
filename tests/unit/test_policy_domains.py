"""Failure domains in the policy (DOM-2, DOM-3): the pure core (the membership index, the budget,
the share-in-window rule) under hypothesis, and the policy's fold with domains in the views."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import ConfigError, parse_cluster_config
from healthplane.contracts.domains import MIN_FAILING
from healthplane_policy import domains
from healthplane_policy.domains import Domain, FaultSettings, LimitSettings, MemberFacts
from tests.support.policy import (
    CLUSTER,
    Driver,
    at,
    condition,
    config,
    fleet,
    only,
    refold_after_crash,
    score,
)

# ---------------------------------------------------------------------------- the index (pure)

KINDS = ("rack", "nvlink")
VALUES = ("a", "b", "c")
T = datetime(2026, 11, 30, 9, 0).astimezone()


@st.composite
def _placements(draw: st.DrawFn) -> list[tuple[int, dict[str, str], MemberFacts]]:
    """A sequence of (node, its domains now, its facts now): each replaces the node's last."""
    node = st.integers(0, 7)
    placed = st.dictionaries(st.sampled_from(KINDS), st.sampled_from(VALUES), max_size=2)
    facts = st.builds(MemberFacts, out_of_service=st.booleans(),
                      failing_since=st.one_of(st.none(), st.integers(0, 30).map(lambda m: T + timedelta(minutes=m))),
                      silent=st.booleans())
    return draw(st.lists(st.tuples(node, placed, facts), max_size=40))


@settings(max_examples=200, deadline=None)
@given(placements=_placements())
def test_dom2_dom3_the_membership_index_is_what_the_nodes_say(
        placements: list[tuple[int, dict[str, str], MemberFacts]]) -> None:
    """Leave-then-join around every change keeps the index equal to one built from scratch."""
    index: dict[str, Domain] = {}
    current: dict[str, tuple[dict[str, str], MemberFacts]] = {}
    for number, placed, facts in placements:
        key = subjects.node_key(CLUSTER, f"n{number}")
        if key in current:
            domains.leave(index, CLUSTER, key, current[key][0])
        domains.join(index, CLUSTER, key, placed, facts)
        current[key] = (placed, facts)
    fresh: dict[str, Domain] = {}
    for key, (placed, facts) in current.items():
        domains.join(fresh, CLUSTER, key, placed, facts)
    assert {k: d for k, d in index.items() if d.members} == fresh
    for domain in index.values():
        assert domain.unavailable <= domain.members and set(domain.failing) <= domain.members
        assert domain.silent <= set(domain.failing)


# ---------------------------------------------------------------------------- the budget (pure)


@settings(max_examples=300, deadline=None)
@given(absolute=st.one_of(st.none(), st.integers(0, 20)), percent=st.one_of(st.none(), st.integers(0, 100)),
       members=st.integers(1, 80), unavailable=st.integers(0, 80))
def test_dom2_the_lower_bound_binds_and_a_refusal_names_the_domain_and_its_numbers(
        absolute: int | None, percent: int | None, members: int, unavailable: int) -> None:
    unavailable = min(unavailable, members - 1)
    limit = LimitSettings(kind="nvlink", max_unavailable=absolute, max_unavailable_percent=percent)
    domain = Domain(cluster=CLUSTER, kind="nvlink", value="nvl-1",
                    members={f"m{i}" for i in range(members - 1)} | {"candidate"},
                    unavailable={f"m{i}" for i in range(unavailable)})
    found = domains.budget(limit, members)
    bounds = [b for b in (absolute, None if percent is None else percent * members // 100) if b is not None]
    if not bounds:
        assert found is None and domains.over_budget(limit, domain, "candidate") is None
        return
    assert found is not None and found.allowed == min(bounds)
    why = domains.over_budget(limit, domain, "candidate")
    assert (why is None) == (unavailable + 1 <= min(bounds))
    if why is not None:
        assert f"{unavailable} of {members} nodes of domain nvlink=nvl-1 are out of service" in why
        assert found.words in why


def test_dom2_percent_rounds_down_as_the_definitions_ceiling() -> None:
    assert domains.budget(LimitSettings(kind="rack", max_unavailable_percent=25), 10) == domains.Budget(
        2, "maxUnavailablePercent 25% of 10 = 2")
    both = LimitSettings(kind="rack", max_unavailable=3, max_unavailable_percent=25)
    assert domains.budget(both, 16) == domains.Budget(3, "maxUnavailable 3")  # 25 % of 16 is 4: 3 binds
    assert domains.budget(both, 8) == domains.Budget(2, "maxUnavailablePercent 25% of 8 = 2")


# ---------------------------------------------------------------------------- the share in a window (pure)


@settings(max_examples=300, deadline=None)
@given(share=st.integers(1, 100), members=st.integers(0, 500))
def test_dom3_the_threshold_is_the_share_rounded_up_and_never_one_node(share: int, members: int) -> None:
    need = domains.threshold(FaultSettings(kind="rack", share=share), members)
    assert need >= MIN_FAILING
    assert need * 100 >= share * members  # the share is reached
    assert need == MIN_FAILING or (need - 1) * 100 < share * members  # and no more is asked


@settings(max_examples=300, deadline=None)
@given(starts=st.lists(st.integers(0, 40), max_size=12), members=st.integers(2, 12),
       share=st.integers(1, 100), window=st.integers(1, 20), min_members=st.integers(2, 12),
       now=st.integers(0, 40))
def test_dom3_a_domain_is_one_fault_exactly_when_the_share_began_failing_within_the_window(
        starts: list[int], members: int, share: int, window: int, min_members: int, now: int) -> None:
    starts = starts[:members]
    rule = FaultSettings(kind="rack", share=share, window_s=window * 60, min_members=min_members)
    domain = Domain(cluster=CLUSTER, kind="rack", value="r1", members={f"m{i}" for i in range(members)},
                    failing={f"m{i}": T + timedelta(minutes=m) for i, m in enumerate(starts) if m <= now})
    recent = sum(1 for m in starts if now - window <= m <= now)
    expected = members >= min_members and recent >= max(2, -(-share * members // 100))
    assert (domains.assess(domain, rule, T + timedelta(minutes=now)) == "degraded") == expected


def test_dom3_a_degraded_domain_recovers_only_after_recover_after_below_the_threshold() -> None:
    rule = FaultSettings(kind="rack", share=50, window_s=600, min_members=4, recover_after_s=300)
    domain = Domain(cluster=CLUSTER, kind="rack", value="r1", members={f"m{i}" for i in range(8)},
                    failing={f"m{i}": T for i in range(4)}, degraded_since=T)
    domains.track(domain, rule, T)
    assert domain.below_since is None and domains.assess(domain, rule, T + timedelta(hours=1)) is None
    del domain.failing["m0"]
    domains.track(domain, rule, T + timedelta(minutes=2))
    assert domains.assess(domain, rule, T + timedelta(minutes=6)) is None  # 4 minutes below
    domain.failing["m0"] = T + timedelta(minutes=6)  # back at the threshold: the clock starts over
    domains.track(domain, rule, T + timedelta(minutes=6))
    del domain.failing["m0"]
    domains.track(domain, rule, T + timedelta(minutes=7))
    assert domains.assess(domain, rule, T + timedelta(minutes=11)) is None
    assert domains.assess(domain, rule, T + timedelta(minutes=12)) == "recovered"


# ---------------------------------------------------------------------------- config


@pytest.mark.parametrize(("section", "line"), [
    ({"domainLimits": [{"kind": "nvlink"}]},
     "nodeHealth.domainLimits[0]: domain limit for kind 'nvlink' needs maxUnavailable, maxUnavailablePercent or both"),
    ({"domainLimits": [{"kind": "rack", "maxUnavailablePercent": 120}]},
     "nodeHealth.domainLimits[0].maxUnavailablePercent: Input should be less than or equal to 100 (got 120)"),
    ({"domainLimits": [{"kind": "rack", "maxUnavailable": 1}, {"kind": "rack", "maxUnavailable": 2}]},
     "nodeHealth.domainLimits: a domain limit for kind 'rack' is given more than once; one entry per kind"),
    ({"domainFaults": [{"kind": "rack", "window": "ten"}]},
     "nodeHealth.domainFaults[0].window: 'ten' is not a duration like 30s, 5m, 2h or 1d (got 'ten')"),
    ({"domainFaults": [{"kind": "rack", "action": "reboot"}]},
     "nodeHealth.domainFaults[0].action: Input should be 'needs-attention' or 'drain' (got 'reboot')"),
    ({"domainFaults": [{"kind": "Rack"}]},
     "nodeHealth.domainFaults[0].kind: kind 'Rack': a lower-case name"),
])
def test_dom2_dom3_config_apply_refuses_a_bad_entry_in_one_line_naming_the_field(section: dict[str, Any],
                                                                                line: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_cluster_config({"nodeHealth": section}, "cluster.yaml")
    assert str(refused.value).startswith(f"cluster.yaml: {line}")
    assert "\n" not in str(refused.value)


# ---------------------------------------------------------------------------- the policy's fold


def placed(node: str, value: int | None, reported: datetime, domains_of: dict[str, str],
           definition: str | None = "gpu-pool") -> wire.NodeView:
    """The scorer's view of a node with its domains (DOM-1)."""
    return wire.NodeView(node_id=node, cluster=CLUSTER, hostname=node, status="READY", health="HEALTHY",
                         last_reported_at=reported, score=value, score_explanation=None, conditions=[],
                         attributed_failures=wire.AttributedFailures(), holds=[], definition=definition,
                         domains=domains_of)


def racks(count: int, size: int, *, nvlink: int = 0) -> list[Any]:
    """``count * size`` nodes n0.. in racks r0.. of ``size`` (and NVLink domains of ``nvlink``)."""
    records: list[Any] = [*fleet(count * size)]
    for i in range(count * size):
        placed_in = {"rack": f"r{i // size}"} | ({"nvlink": f"nvl-{i // nvlink}"} if nvlink else {})
        records.append(placed(f"n{i}", 100, at(0, seconds=i), placed_in))
    return records


def silent(node: str, minute: float) -> wire.NodeEvent:
    return condition(node, "CONDITION_RAISED", "heartbeat_missed", at(minute), reason="HeartbeatMissed")


def resumed(node: str, minute: float) -> wire.NodeEvent:
    return condition(node, "CONDITION_CLEARED", "heartbeat_missed", at(minute), reason="HeartbeatMissed")


def test_dom2_a_limit_of_2_for_an_nvlink_domain_halts_the_third_while_the_cluster_has_room() -> None:
    driver = Driver(config({"mode": "drain", "maxUnavailablePercent": 50,
                            "domainLimits": [{"kind": "nvlink", "maxUnavailable": 2}]}),
                    *racks(4, 4, nvlink=4))
    driver.feed(*[score(f"n{i}", 30, 100, at(1 + i)) for i in range(3)])
    assert [c.node_id for c in driver.commands("drain")] == ["n0", "n1"]
    halted = only(driver.events("POLICY_HALTED"))
    assert halted.node_id == "n2"
    assert halted.message == ("drain: score 30; halted: 2 of 4 nodes of domain nvlink=nvl-0 are out of service and "
                              "one more would pass domainLimits nvlink maxUnavailable 2")
    # Another NVLink domain has its own budget: the cluster's ceiling (8 of 16) still has room.
    driver.feed(score("n4", 30, 100, at(5)))
    assert [c.node_id for c in driver.commands("drain")] == ["n0", "n1", "n4"]


def test_dom2_the_lower_bound_binds_percent_of_a_rack_before_the_clusters_ceiling() -> None:
    driver = Driver(config({"mode": "cordon", "maxUnavailablePercent": 100,
                            "domainLimits": [{"kind": "rack", "maxUnavailable": 5, "maxUnavailablePercent": 25}]}),
                    *racks(2, 8))
    driver.feed(*[score(f"n{i}", 50, 100, at(1 + i)) for i in range(3)])
    assert [c.node_id for c in driver.commands("cordon")] == ["n0", "n1"]
    assert only(driver.events("POLICY_HALTED")).message.endswith(
        "2 of 8 nodes of domain rack=r0 are out of service and one more would pass domainLimits rack "
        "maxUnavailablePercent 25% of 8 = 2")


RACK_POWER = {"mode": "drain", "maxUnavailablePercent": 100,
              "domainFaults": [{"kind": "rack", "share": 50, "window": "10m", "minMembers": 4,
                                "recoverAfter": "5m"}]}


def test_dom3_a_rack_losing_power_is_one_domain_degraded_no_node_drains_then_recovered() -> None:
    driver = Driver(config(RACK_POWER), *racks(2, 8))
    driver.feed(*[silent(f"n{i}", 1 + i / 10) for i in range(5)])
    degraded = only(driver.events("DOMAIN_DEGRADED"))
    assert degraded.node_id == "domain:rack=r0" and degraded.actor == "policy"
    assert degraded.domain is not None
    assert (degraded.domain.failing, degraded.domain.member_count, degraded.domain.threshold) == (
        ["n0", "n1", "n2", "n3"], 8, 4)
    assert degraded.domain.conditions == {"heartbeat_missed": 4} and degraded.domain.action == "needs-attention"
    assert "needs attention" in degraded.message and "4 of 8 members silent or degraded within 10m" in degraded.message
    # Held: a member that scores badly is not drained on its own while the rack is one fault.
    driver.feed(score("n6", 20, 100, at(2)), score("n6", 15, 20, at(3)))
    assert driver.commands() == [] and driver.events("POLICY_ACTED") == []
    driver.feed(*[resumed(f"n{i}", 4) for i in range(5)])
    driver.feed(score("n7", 100, 100, at(8)))
    assert driver.events("DOMAIN_RECOVERED") == []  # below the threshold for 4 minutes only
    driver.feed(score("n7", 99, 100, at(9)))
    recovered = only(driver.events("DOMAIN_RECOVERED"))
    assert recovered.node_id == "domain:rack=r0" and "below 4 for 5m" in recovered.message
    # Per-node automation resumes with the member's next report.
    driver.feed(placed("n6", 15, at(10), {"rack": "r0"}))
    assert [(c.node_id, c.verb) for c in driver.commands()] == [("n6", "drain")]


def test_dom3_configured_to_drain_every_member_is_drained_passively_at_once() -> None:
    rule = {**RACK_POWER, "domainFaults": [{"kind": "rack", "share": 50, "action": "drain"}]}
    driver = Driver(config(rule), *racks(2, 8))
    driver.feed(*[silent(f"n{i}", 1) for i in range(4)])
    degraded = only(driver.events("DOMAIN_DEGRADED"))
    drains = driver.commands("drain")
    assert sorted(c.node_id for c in drains) == [f"n{i}" for i in range(8)]
    assert all(not c.active and c.actor == "policy" for c in drains)
    assert degraded.domain is not None and degraded.domain.drained == [f"n{i}" for i in range(8)]
    assert driver.outputs[0] == degraded  # the domain's event before its members' drains


def test_dom3_a_single_bad_node_in_a_healthy_rack_takes_the_ordinary_path() -> None:
    driver = Driver(config(RACK_POWER), *racks(2, 8))
    driver.feed(silent("n3", 1), score("n5", 30, 100, at(2)))
    assert driver.events("DOMAIN_DEGRADED") == []
    assert [(c.node_id, c.verb) for c in driver.commands()] == [("n5", "drain")]


def test_dom3_a_slow_attrition_is_not_a_domain_fault() -> None:
    driver = Driver(config(RACK_POWER), *racks(1, 8))
    driver.feed(*[silent(f"n{i}", 15 * i) for i in range(6)])  # one every 15 minutes: never 4 in 10
    assert driver.events("DOMAIN_DEGRADED") == []


def _episode() -> list[Any]:
    return [*[silent(f"n{i}", 1) for i in range(4)], score("n6", 20, 100, at(2)),
            *[resumed(f"n{i}", 3) for i in range(4)], score("n7", 99, 100, at(7)), score("n7", 98, 99, at(9)),
            score("n6", 20, 20, at(10)), *[silent(f"n{i}", 20) for i in range(8, 12)],
            score("n15", 50, 100, at(21))]


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(0, len(_episode())), action=st.sampled_from(["needs-attention", "drain"]))
def test_dom3_rel1_a_restart_in_the_middle_of_a_domain_episode_repeats_no_event(cut: int, action: str) -> None:
    """kill -9 anywhere in an episode: the restart refolds what is in the streams as facts only,
    reads its own events back, and then decides what an uninterrupted run decided, same ids."""
    setup = [config({**RACK_POWER, "domainFaults": [{"kind": "rack", "share": 50, "action": action}]}),
             *racks(2, 8)]
    records = _episode()
    whole = Driver(*setup, *records)
    assert len(whole.events("DOMAIN_DEGRADED")) == 2 and len(whole.events("DOMAIN_RECOVERED")) == 1
    uninterrupted, restarted = refold_after_crash(setup, records, cut, snapshot=True)
    assert restarted == uninterrupted


@settings(max_examples=120, deadline=None)
@given(scores=st.lists(st.tuples(st.integers(0, 15), st.integers(0, 100)), max_size=40),
       limit=st.integers(0, 4), mode=st.sampled_from(["cordon", "drain", "replace"]))
def test_dom2_automation_never_takes_more_of_a_domain_out_than_its_budget(
        scores: list[tuple[int, int]], limit: int, mode: str) -> None:
    driver = Driver(config({"mode": mode, "maxUnavailablePercent": 100, "circuitBreaker": {"enabled": False},
                            "domainLimits": [{"kind": "nvlink", "maxUnavailable": limit}]}),
                    *racks(4, 4, nvlink=4))
    last: dict[int, int] = {}
    for minute, (number, value) in enumerate(scores, start=1):
        driver.feed(score(f"n{number}", value, last.get(number, 100), at(minute)))
        last[number] = value
    taken = {c.node_id for c in driver.commands() if c.verb in ("cordon", "drain")}
    for domain in range(4):
        assert len({f"n{i}" for i in range(4 * domain, 4 * domain + 4)} & taken) <= limit


@settings(max_examples=120, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 15), st.sampled_from(["silent", "resumed", "bad", "good"])),
                      max_size=40),
       action=st.sampled_from(["needs-attention", "drain"]), cut=st.integers(0, 40))
# Found by hypothesis: the rack's drains trip the breaker, n8 is halted; after a crash the trip
# was lost (its cordons out of the window by then) and n8 was drained.
@example(steps=[(0, "silent"), (1, "silent"), (2, "silent"), (3, "silent"), (8, "bad"), (0, "silent"),
                (0, "silent"), (0, "silent"), (8, "bad")], action="drain", cut=5)
def test_dom3_rel1_members_are_held_while_degraded_and_a_refold_repeats_nothing(
        steps: list[tuple[int, str]], action: str, cut: int) -> None:
    setup = [config({**RACK_POWER, "domainFaults": [{"kind": "rack", "share": 50, "window": "5m", "action": action,
                                                     "recoverAfter": "3m"}]}), *racks(2, 8)]
    records: list[Any] = []
    for minute, (number, what) in enumerate(steps, start=1):
        node = f"n{number}"
        if what in ("silent", "resumed"):
            records.append((silent if what == "silent" else resumed)(node, minute))
        else:
            records.append(score(node, 20 if what == "bad" else 100, 100, at(minute)))
    whole = Driver(*setup, *records)
    degraded: set[str] = set()
    for output in whole.outputs:  # per-node commands only with the DOMAIN_DEGRADED that drains
        if isinstance(output, wire.NodeEvent) and output.type in ("DOMAIN_DEGRADED", "DOMAIN_RECOVERED"):
            rack = output.node_id.rpartition("=")[2]
            (degraded.add if output.type == "DOMAIN_DEGRADED" else degraded.discard)(rack)
        elif isinstance(output, wire.Command):
            rack = f"r{int(output.node_id[1:]) // 8}"
            assert rack not in degraded or output.reason == f"domain rack={rack} degraded (DOM-3)"
    uninterrupted, restarted = refold_after_crash(setup, records, min(cut, len(records)))
    assert restarted == uninterrupted


def test_dom2_dom3_why_is_automation_not_acting_names_the_domain_and_its_numbers() -> None:
    """``node show``'s automation line (API-4): a degraded domain holds the node; a domain's
    budget is the POLICY_HALTED that names it."""
    from healthplane.contracts import automation
    from healthplane.contracts.config import NodeHealth

    health = NodeHealth(mode="drain")
    view = placed("n2", 30, at(3), {"nvlink": "nvl-0", "rack": "r0"})
    driver = Driver(config({"mode": "drain", "maxUnavailablePercent": 100,
                            "domainLimits": [{"kind": "nvlink", "maxUnavailable": 2}]}), *racks(4, 4, nvlink=4))
    driver.feed(*[score(f"n{i}", 30, 100, at(1 + i)) for i in range(3)])
    halted = only(driver.events("POLICY_HALTED"))
    said = automation.explain(view, health, last_policy=halted, last_uncordon=None, last_score=None, now=at(4))
    assert said.startswith("drain: score 30; halted: 2 of 4 nodes of domain nvlink=nvl-0 are out of service and "
                           "one more would pass domainLimits nvlink maxUnavailable 2 (since ")
    power = Driver(config(RACK_POWER), *racks(2, 8))
    power.feed(*[silent(f"n{i}", 1) for i in range(4)])
    degraded = only(power.events("DOMAIN_DEGRADED"))
    said = automation.explain(view, health, last_policy=None, last_uncordon=None, last_score=None, now=at(4),
                              domain_events=[degraded])
    assert said.startswith("held with its domain: domain rack=r0: 4 of 8 members silent or degraded within 10m")
    assert said.endswith("per-node automation waits for DOMAIN_RECOVERED (DOM-3)")
    recovered = msgspec.structs.replace(degraded, type="DOMAIN_RECOVERED")
    assert not automation.explain(view, health, last_policy=None, last_uncordon=None, last_score=None, now=at(4),
                                  domain_events=[recovered]).startswith("held")


def test_dom3_rel1_a_refold_that_takes_the_views_last_still_holds_the_members() -> None:
    """After a crash the views (HP_NODES, which carry the domains) may be refolded after the
    node events: the DOMAIN_DEGRADED read back names the members, which are held at once, and
    the recovery comes when it would have come (found by the component test)."""
    setup = [config(RACK_POWER), *fleet(16)]
    views = [r for r in racks(2, 8) if isinstance(r, wire.NodeView)]
    first = Driver(*setup, *views, *[silent(f"n{i}", 1) for i in range(4)])
    degraded = only(first.events("DOMAIN_DEGRADED"))
    restarted = Driver(*setup)
    restarted.feed(*[silent(f"n{i}", 1) for i in range(4)], act=False)
    restarted.feed(degraded)
    restarted.feed(score("n5", 20, 100, at(2)), score("n5", 15, 20, at(2.5)))
    restarted.feed(*views)
    assert restarted.commands() == [] and restarted.events() == []
    restarted.feed(*[resumed(f"n{i}", 4) for i in range(4)], score("n7", 99, 100, at(8)))
    assert restarted.events() == []
    restarted.feed(score("n7", 98, 99, at(9)))
    assert [e.type for e in restarted.events()] == ["DOMAIN_RECOVERED"]


def test_dom3_webhooks_deliver_domain_events_as_cloudevents() -> None:
    """The dispatcher's filters pass a domain event (every type, a list naming it, a CEL filter
    over its ``domain``), as ``io.healthplane.node.DOMAIN_DEGRADED`` with the domain's id as subject."""
    from healthplane_webhook_dispatcher import rules as webhooks

    power = Driver(config(RACK_POWER), *racks(2, 8))
    power.feed(*[silent(f"n{i}", 1) for i in range(4)])
    event = only(power.events("DOMAIN_DEGRADED"))
    subject = subjects.event(event.cluster, event.node_id, event.type)
    hooks = parse_cluster_config({"cluster": CLUSTER, "nodeEventWebhooks": [
        {"url": "http://all.example/", "secretEnv": "S"},
        {"url": "http://typed.example/", "secretEnv": "S", "events": ["DOMAIN_DEGRADED", "DOMAIN_RECOVERED"]},
        {"url": "http://cel.example/", "secretEnv": "S", "filter": "event.domain.kind == 'rack'"}]})
    endpoints, unresolved = webhooks.endpoints_from_config(hooks, lambda hook: "secret")
    assert unresolved == [] and len(endpoints) == 3
    for endpoint in endpoints:
        assert endpoint.wants(event.type) and endpoint.selects(event)
        assert any(subjects.matches(f, subject) for f in endpoint.subjects)
    attributes = webhooks.cloud_event(event).get_attributes()
    assert (attributes["type"], attributes["subject"], attributes["source"]) == (
        "io.healthplane.node.DOMAIN_DEGRADED", "domain:rack=r0", "/healthplane/policy")
