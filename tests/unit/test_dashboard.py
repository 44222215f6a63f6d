"""UI-2, the fleet dashboard's pure cores: percentages that never round a fault away, the one
pass over every node's row (against a count by hand, and at 100,000 nodes), each count's link
selecting exactly the nodes it counts in the nodes table's own index, the 24 h fold of node
events (order-free, bounded), the guardrails' arithmetic (the policy's own), the control
plane's problems, the needs-attention queue, and the page rendering all of it."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthplane.client import reads
from healthplane.contracts import automation, subjects, views, wire
from healthplane.contracts.config import ClusterConfig
from healthplane_api import dashboard, fold, pages, plane, timeline
from healthplane_policy import breaker, domains

NOW = datetime(2026, 12, 2, 12, 30, tzinfo=UTC)
STALE = NOW - timedelta(minutes=10)


# ---------------------------------------------------------------------------- percentages


@pytest.mark.parametrize(("part", "whole", "shown"), [
    (99_997, 100_000, "99.997 %"), (1, 100_000, "0.001 %"), (999_999, 1_000_000, "99.9999 %"),
    (1, 3, "33.3 %"), (2, 3, "66.7 %"), (50, 100, "50.0 %"), (100_000, 100_000, "100 %"), (0, 7, "0 %"),
    (0, 0, None),
])
def test_ui2_a_percentage_says_how_many_short_of_all(part: int, whole: int, shown: str | None) -> None:
    assert dashboard.percent(part, whole) == shown


@given(st.integers(1, 10**9), st.data())
def test_ui2_a_percentage_never_rounds_a_fault_away(whole: int, data: st.DataObject) -> None:
    """UI-2: 100 % only when all are, 0 % only when none is; otherwise the fewest decimals (one
    at least) that keep it strictly between, and within half a unit of the last decimal."""
    part = data.draw(st.integers(0, whole))
    shown = dashboard.percent(part, whole)
    assert shown is not None and shown.endswith(" %")
    if part == whole:
        assert shown == "100 %"
        return
    if part == 0:
        assert shown == "0 %"
        return
    number = shown.removesuffix(" %")
    decimals = len(number.partition(".")[2])
    value, exact = Fraction(Decimal(number)), Fraction(100 * part, whole)
    assert decimals >= 1 and 0 < value < 100
    assert abs(value - exact) <= Fraction(1, 2 * 10**decimals)
    if decimals > 1:  # one decimal fewer would have read as none or all
        fewer = round(exact * 10 ** (decimals - 1))
        assert fewer in (0, 100 * 10 ** (decimals - 1))


# ---------------------------------------------------------------------------- the pass over the rows


CONDITIONS = ("gpu_xid_errors", "memory_errors", "collector_failed", "heartbeat_missed", "disk_degraded")
conditions = st.lists(st.builds(views.ConditionRow, type=st.sampled_from(CONDITIONS),
                                severity=st.sampled_from(["warning", "critical"]),
                                reason=st.sampled_from(["R", automation.EXPLAINED])), max_size=2)
holds = st.lists(st.builds(views.HoldRow, effect=st.sampled_from(["cordon", "evict", "deprovision"]),
                           actor=st.sampled_from(["policy", "eviction", "alice"])), max_size=2)
rows = st.lists(st.builds(
    views.ListRow, node_id=st.from_regex(r"n[0-9]{1,3}", fullmatch=True), cluster=st.sampled_from(["a", "b"]),
    hostname=st.none(), status=st.sampled_from(dashboard.STATUSES), health=st.sampled_from(dashboard.HEALTHS),
    score=st.none() | st.integers(0, 100), jobs=st.integers(0, 2), conditions=conditions, holds=holds,
    last_reported_at=st.sampled_from([NOW, STALE, None]), report_interval_seconds=st.just(30),
    domains=st.dictionaries(st.sampled_from(["rack", "nvlink"]), st.sampled_from(["r1", "r2", "r3"]), max_size=2),
    definition=st.sampled_from([None, "gpu"]),
    needs_attention=st.none() | st.builds(views.NeedsAttentionRow, since=st.just(NOW), reason=st.just("ladder"))),
    max_size=30, unique_by=lambda r: (r.cluster, r.node_id))


def _shown(row: views.ListRow) -> str:
    return reads.shown_health(row, NOW).upper()


@given(rows)
def test_ui2_one_pass_counts_what_a_count_by_hand_counts(found: list[views.ListRow]) -> None:
    counted = dashboard.tally(found, NOW)
    for name in {r.cluster for r in found}:
        mine = [r for r in found if r.cluster == name]
        scope = counted.clusters[name]
        assert scope.nodes == len(mine)
        assert scope.health == Counter(_shown(r) for r in mine)
        assert scope.status == Counter(r.status for r in mine)
        assert scope.stale == sum(1 for r in mine if reads.stale_for(r, NOW) is not None)
        assert scope.unscored == sum(1 for r in mine if r.score is None)
        for (low, high), count in zip(dashboard.BINS, scope.bins, strict=True):
            assert count == sum(1 for r in mine if r.score is not None and low <= r.score <= high)
        assert scope.conditions == Counter(t for r in mine for t in {c.type for c in r.conditions})
        assert scope.out_of_service == sum(1 for r in mine if r.holds)
        assert scope.replacing == sum(1 for r in mine if any(h.effect == "deprovision" for h in r.holds))
        assert scope.draining == sum(1 for r in mine if r.holds and r.jobs
                                     and not any(h.effect == "deprovision" for h in r.holds))
        assert scope.automated == sum(1 for r in mine if any(h.actor in automation.AUTOMATION for h in r.holds))
        for kind, values in scope.cells.items():
            for value, cell in values.items():
                assert sum(cell[:4]) == sum(1 for r in mine if r.domains.get(kind) == value)
    assert {(f.row.cluster, f.row.node_id) for f in counted.attention.values()} == {
        (r.cluster, r.node_id) for r in found if r.needs_attention is not None}
    assert {(f.row.cluster, f.row.node_id) for f in counted.blind.values()} == {
        (r.cluster, r.node_id) for r in found if _shown(r) == "UNKNOWN" or r.status == "OFFLINE"
        or automation.blinding((c.type, c.reason) for c in r.conditions)}


def _same_counts(kept: dashboard.Tally, fresh: dashboard.Tally, rows: Any = None, now: datetime = NOW) -> None:
    if rows is not None:  # the summary from the kept counts is the summary of the rows
        assert dashboard.summary(kept) == reads.summarize(rows, now)
    assert kept.clusters == fresh.clusters
    assert kept.pools == fresh.pools
    assert kept.blind == fresh.blind
    assert kept.attention == fresh.attention


# An index's life: a row changed (any way), rewritten with only its report time moved, removed,
# or time passing (views going stale by time alone, or a rewrite bringing one back).
steps = st.lists(st.one_of(
    st.tuples(st.just("change"), st.integers(0, 29), rows.map(lambda r: r[0] if r else None)),
    st.tuples(st.just("rewrite"), st.integers(0, 29), st.integers(0, 300)),
    st.tuples(st.just("remove"), st.integers(0, 29), st.none()),
    st.tuples(st.just("wait"), st.integers(1, 400), st.none())), max_size=25)


@given(rows, steps, st.integers(1, 4))
def test_ui2_counts_kept_as_the_index_changes_equal_a_count_from_scratch(
        found: list[views.ListRow], life: list[tuple[str, int, Any]], every: int) -> None:
    """UI-2 (issue 44, the api's CPU with a dashboard open): the dashboard's counts follow the
    index — only the rows applied since are re-marked, and the views gone stale since by time
    alone — and after any run of changes, rewrites, removals and time passing they equal a
    count of every row from scratch, looked at after every ``every`` steps."""
    index = _index(found)
    now = NOW
    counts = dashboard.Counts(index.rows, now)
    index.follow()
    for n, (step, which, what) in enumerate(life, start=1):
        keys = sorted(index.rows)
        if step == "wait":
            now += timedelta(seconds=which)
        elif step == "change" and what is not None:
            index.apply(msgspec.json.encode(msgspec.structs.replace(what, last_reported_at=now)))
        elif step == "rewrite" and keys:
            row = index.rows[keys[which % len(keys)]]
            index.apply(msgspec.json.encode(msgspec.structs.replace(
                row, last_reported_at=now - timedelta(seconds=what))))
        elif step == "remove" and keys:
            row = index.rows[keys[which % len(keys)]]
            index.remove(row.cluster, row.node_id, now)
        if n % every == 0:
            changed, rewritten = index.take()
            counts.refresh(index.rows, changed, rewritten, now)
            _same_counts(counts.tally, dashboard.tally(index.rows.values(), now), index.rows.values(), now)
    changed, rewritten = index.take()
    counts.refresh(index.rows, changed, rewritten, now + timedelta(hours=1))
    later = now + timedelta(hours=1)
    _same_counts(counts.tally, dashboard.tally(index.rows.values(), later), index.rows.values(), later)
    assert index.clusters() == sorted({r.cluster for r in index.rows.values()})


def _index(found: list[views.ListRow]) -> fold.ViewIndex:
    index = fold.ViewIndex()
    for row in found:
        index.apply(msgspec.json.encode(row))
    return index


def _listed(index: fold.ViewIndex, url: str) -> int:
    """How many nodes the nodes table lists at ``url`` (its own filters, UI-3)."""
    query = parse_qs(urlsplit(url).query)
    assert urlsplit(url).path == "/nodes"
    numbers = {"scoreMin": "score_min", "scoreMax": "score_max"}
    lists = {"status", "health", "condition", "hold", "domain"}
    given_: dict[str, Any] = {}
    for name, values in query.items():
        if name in numbers:
            given_[numbers[name]] = int(values[0])
        elif name in lists:
            given_[name] = values
        else:
            given_[name] = values[0]
    total: int = index.page(**given_, page_size=None).total
    return total


@given(rows.map(lambda found: [msgspec.structs.replace(r, last_reported_at=NOW) for r in found]),
       st.sampled_from([None, "a", "b"]))
def test_ui2_every_count_links_to_a_table_that_lists_exactly_those_nodes(found: list[views.ListRow],
                                                                       cluster: str | None) -> None:
    """UI-2: each tile, bin, condition and heatmap cell is a link to the nodes table filtered to
    the nodes it counts (fresh views: a stale one is counted unknown, which no filter selects)."""
    index = _index(found)
    board = dashboard.board(dashboard.tally(found, NOW), dashboard.Inputs(timeline.Timeline()), NOW, cluster)
    assert _listed(index, board["link"]) == board["nodes"]
    counted = [*board["health"], *board["status"], board["outOfService"],
               *(b for b in board["scores"] if b["bin"] != "unscored"),
               *({"count": c["nodes"], "link": c["link"]} for c in board["conditions"]["top"]),
               *({"count": c["nodes"], "link": c["link"]} for kind in board["domains"] for c in kind["cells"]),
               *(a for a in board["automation"] if a["kind"] == "replacing")]
    for figure in counted:
        assert _listed(index, figure["link"]) == figure["count"], figure


def test_ui2_100000_nodes_are_counted_exactly_in_one_pass() -> None:
    """UI-2 at fleet size: 100,000 rows in 4 clusters, racks of 32 and NVLink domains of 4;
    every 7th degraded with an Xid condition, every 50th held by the policy, every 1000th
    stale, every 10,000th never scored. The aggregate is exact (not a timing test)."""
    found = []
    for i in range(100_000):
        found.append(views.ListRow(
            node_id=f"n{i:06d}", cluster=f"c{i % 4}", hostname=None,
            status="CORDONED" if i % 50 == 0 else "READY", health="DEGRADED" if i % 7 == 0 else "HEALTHY",
            score=None if i % 10_000 == 0 else (55 if i % 7 == 0 else 100), jobs=i % 3,
            conditions=[views.ConditionRow("gpu_xid_errors", "critical")] if i % 7 == 0 else [],
            holds=[views.HoldRow("cordon", "policy")] if i % 50 == 0 else [],
            last_reported_at=STALE if i % 1000 == 0 else NOW, report_interval_seconds=30,
            domains={"rack": f"r{i // 32:04d}", "nvlink": f"nv{i // 4:05d}"}))
    counted = dashboard.tally(found, NOW)
    board = dashboard.board(counted, dashboard.Inputs(timeline.Timeline()), NOW)
    stale = 100
    degraded = sum(1 for i in range(100_000) if i % 7 == 0 and i % 1000)  # a stale view counts unknown
    health = {h["health"]: h["count"] for h in board["health"]}
    assert board["nodes"] == 100_000 and board["stale"] == stale
    assert health == {"UNKNOWN": stale, "DEGRADED": degraded, "HEALTHY": 100_000 - stale - degraded}
    assert board["healthyPercent"] == dashboard.percent(100_000 - stale - degraded, 100_000)
    assert {s["status"]: s["count"] for s in board["status"]} == {"READY": 98_000, "CORDONED": 2000,
                                                                 "NOT_READY": 0, "OFFLINE": 0}
    bins = {b["bin"]: b["count"] for b in board["scores"]}
    unscored = 10
    xid = sum(1 for i in range(100_000) if i % 7 == 0 and i % 10_000)
    assert bins["unscored"] == unscored and bins["50-59"] == xid and bins["90-100"] == 100_000 - unscored - xid
    assert board["conditions"]["top"] == [{"type": "gpu_xid_errors", "title": "GPU Xid Errors", "nodes": 14_286,
                                           "link": "/nodes?condition=gpu_xid_errors"}]
    assert board["outOfService"]["count"] == 2000
    draining = sum(1 for i in range(0, 100_000, 50) if i % 3)
    assert {a["kind"]: a["count"] for a in board["automation"]} == {"draining": draining, "remediating": 0,
                                                                      "validating": 0, "replacing": 0}
    racks, nvlink = (next(k for k in board["domains"] if k["kind"] == kind) for kind in ("rack", "nvlink"))
    # 3,125 racks, each in all 4 clusters (32 consecutive ids are 4 clusters' 8 each): 12,500 cells
    assert racks["total"] == 3125 * 4 and len(racks["cells"]) == dashboard.CELLS_PER_KIND
    assert racks["more"] == racks["total"] - dashboard.CELLS_PER_KIND
    assert nvlink["total"] == 100_000 and racks["cells"][0]["worst"] == "unknown"
    assert sum(c["nodes"] for c in board["clusters"]) == 100_000
    guard = next(g for g in board["guardrails"] if g["name"] == "maxUnavailablePercent" and g["cluster"] == "c0")
    # Every 50th is even, so c0 and c2 hold them: 1,000 each of 25,000; 20 % allows 5,000.
    assert (guard["used"], guard["limit"], guard["headroom"]) == (1000, 5000, 4000)
    assert board["needsAttention"]["total"] == stale
    assert len(board["needsAttention"]["items"]) == dashboard.QUEUE_SHOWN


# ---------------------------------------------------------------------------- the 24 h of events


def _event(kind: str, node: str = "n1", at: datetime = NOW, cluster: str = "a", message: str = "",
           actor: str = "policy", definition: str | None = None) -> wire.NodeEvent:
    return wire.NodeEvent(id=f"{kind}-{node}-{at.isoformat()}", node_id=node, cluster=cluster,
                          type=kind,  # type: ignore[arg-type]
                          occurred_at=at, message=message or kind.lower(), actor=actor, definition=definition)


events = st.lists(st.tuples(st.sampled_from(timeline.WANTED), st.sampled_from(["n1", "n2", "n3"]),
                            st.integers(0, 30 * 60), st.sampled_from(["policy", "alice"]),
                            st.sampled_from(["", "halted: circuit breaker TRIPPED (3 …)"])), max_size=40)


def _fold(recorded: list[tuple[int, wire.NodeEvent]]) -> timeline.Timeline:
    state = timeline.Timeline()
    for seq, event in recorded:
        timeline.apply(state, event, seq)
    return state


@settings(max_examples=200)
@given(events, st.randoms(use_true_random=False))
def test_ui2_the_events_fold_is_the_same_in_any_order(drawn: list[tuple[str, str, int, str, str]],
                                                      shuffler: random.Random) -> None:
    """UI-2: one tail per event type delivers a node's events out of order; the newest event by
    stream sequence decides what is open, counters add up, so any order folds the same."""
    recorded = [(seq, _event(kind, node, NOW - timedelta(minutes=minutes), message=message, actor=actor))
                for seq, (kind, node, minutes, actor, message) in enumerate(drawn, start=1)]
    in_order = _fold(recorded)
    shuffled = list(recorded)
    shuffler.shuffle(shuffled)
    other = _fold(shuffled)
    for name in ("hours", "marks", "breaker_halts", "automated", "replaced"):
        assert getattr(other, name) == getattr(in_order, name), name
    counted = timeline.hourly(in_order, NOW)
    first = timeline.hour_of(NOW) - timeline.WINDOW_HOURS  # the current hour and the 23 before it
    for kind, action in timeline.ACTIONS.items():
        assert sum(counted.counts[action]) == sum(
            1 for k, _, minutes, *_ in drawn if k == kind and timeline.hour_of(NOW - timedelta(minutes=minutes)) > first)
    for group, opening in timeline.OPENS.items():
        newest: dict[str, str] = {}
        for kind, node, *_ in drawn:
            if kind in opening or kind in timeline.CLOSES[group]:
                newest[node] = kind
        assert {m.node_id for m in timeline.open_marks(in_order, group)} == {
            node for node, kind in newest.items() if kind in opening}


def test_ui2_validation_and_remediation_are_in_progress_until_their_end() -> None:
    state = timeline.Timeline()
    for seq, event in enumerate([
            _event("VALIDATION_STARTED", "n1"), _event("REMEDIATION_STARTED", "n2"),
            _event("REMEDIATION_FAILED", "n2"),  # a failed step: the ladder goes on
            _event("VALIDATION_STARTED", "n3"), _event("VALIDATION_PASSED", "n3"),
            _event("REMEDIATION_STARTED", "n4"), _event("NODE_NEEDS_ATTENTION", "n4")], start=1):
        timeline.apply(state, event, seq)
    assert [m.node_id for m in timeline.open_marks(state, "validating")] == ["n1"]
    assert [m.node_id for m in timeline.open_marks(state, "remediating")] == ["n2"]
    timeline.apply(state, _event("NODE_REPLACED", "n2"), 9)
    assert timeline.open_marks(state, "remediating") == []


def test_ui2_the_timeline_keeps_24_hours_and_forgets_closed_marks_once_caught_up() -> None:
    state = timeline.Timeline()
    timeline.apply(state, _event("NODE_CORDONED", at=NOW - timedelta(hours=30)), 1)
    timeline.apply(state, _event("NODE_CORDONED", at=NOW - timedelta(hours=2)), 2)
    timeline.apply(state, _event("NODE_DRAINED", at=NOW), 3)
    timeline.apply(state, _event("VALIDATION_STARTED", "n2", at=NOW - timedelta(hours=3)), 4)
    timeline.apply(state, _event("VALIDATION_PASSED", "n2", at=NOW - timedelta(hours=2)), 5)
    timeline.apply(state, _event("HOLD_CREATED", "n3", at=NOW - timedelta(hours=25)), 6)
    counted = timeline.hourly(state, NOW)
    assert len(counted.hours) == 24 and counted.hours[-1] == NOW.replace(minute=0)
    assert counted.counts["cordon"][-3] == 1 and counted.counts["drain"][-1] == 1 and sum(counted.counts["cordon"]) == 1
    timeline.trim(state, NOW, caught_up=False)
    assert sorted(state.hours) == [timeline.hour_of(NOW - timedelta(hours=h)) for h in (3, 2, 0)]
    assert state.automated == {"a": {}}
    assert ("a", "n2") in state.marks["validating"]  # a tail behind could still bring its older STARTED
    timeline.trim(state, NOW, caught_up=True)
    assert state.marks["validating"] == {}
    timeline.apply(state, _event("VALIDATION_STARTED", "n2", at=NOW - timedelta(hours=3)), 4)
    assert [m.node_id for m in timeline.open_marks(state, "validating")] == ["n2"]  # what a tombstone is for


# ---------------------------------------------------------------------------- the guardrails' arithmetic


@given(st.integers(0, 100), st.integers(0, 60), st.integers(0, 60), st.integers(0, 100), st.integers(1, 500))
def test_ui2_the_breakers_headroom_is_the_policys_own_arithmetic(percentage: int, max_nodes: int,
                                                                 max_cordoned: int, max_cordoned_percentage: int,
                                                                 fleet: int) -> None:
    """UI-2 / POL-6: the dashboard computes the thresholds the policy service enforces."""
    settings_ = breaker.BreakerSettings(percentage=percentage, max_nodes=max_nodes, max_cordoned_nodes=max_cordoned,
                                        max_cordoned_percentage=max_cordoned_percentage)
    window, standing = breaker.window_threshold(settings_, fleet), breaker.standing_threshold(settings_, fleet)
    mine_window = dashboard.window_bound(percentage, max_nodes, fleet)
    mine_standing = dashboard.standing_bound(max_cordoned, max_cordoned_percentage, fleet)
    assert (mine_window[0] if mine_window else None) == (window.nodes if window else None)
    assert (mine_standing[0] if mine_standing else None) == (standing.nodes if standing else None)


@given(st.none() | st.integers(0, 20), st.none() | st.integers(0, 100), st.integers(0, 200), st.integers(0, 100),
       st.integers(0, 100))
def test_ui2_domain_and_pool_headroom_is_the_policys_own_arithmetic(max_unavailable: int | None,
                                                                    max_percent: int | None, members: int,
                                                                    ceiling_percent: int, unavailable: int) -> None:
    """UI-2 / DOM-2 / POL-3: a domain's budget and a pool's maxUnavailablePercent ceiling."""
    limit = domains.LimitSettings(kind="rack", max_unavailable=max_unavailable, max_unavailable_percent=max_percent)
    theirs = domains.budget(limit, members)
    mine = dashboard.domain_budget(max_unavailable, max_percent, members)
    assert (mine[0] if mine else None) == (theirs.allowed if theirs else None)
    # The policy halts when (unavailable + 1) * 100 > percent * members: no headroom left.
    halts = (unavailable + 1) * 100 > ceiling_percent * members
    assert halts == (dashboard.ceiling(ceiling_percent, members) - unavailable <= 0)


def _rows_with(**changes: Any) -> list[views.ListRow]:
    base = [views.ListRow(f"n{i}", "a", None, "READY", "HEALTHY", 100, last_reported_at=NOW,
                          report_interval_seconds=30, domains={"rack": f"r{i // 4}"}) for i in range(8)]
    return [msgspec.structs.replace(r, **changes.get(r.node_id, {})) for r in base]


def test_ui2_guardrails_show_their_numbers_and_the_breaker_tripped_until_reset() -> None:
    config = ClusterConfig.model_validate({"cluster": "a", "nodeHealth": {
        "mode": "cordon", "maxUnavailablePercent": 25,
        "circuitBreaker": {"percentage": 50, "maxCordonedNodes": 3, "duration": "10m"},
        "domainLimits": [{"kind": "rack", "maxUnavailable": 1}]}})
    held = [views.HoldRow("cordon", "policy")]
    found = _rows_with(n0={"holds": held, "status": "CORDONED"}, n1={"holds": held, "status": "CORDONED"})
    state = timeline.Timeline()
    timeline.apply(state, _event("HOLD_CREATED", "n0", at=NOW - timedelta(minutes=5)), 1)
    timeline.apply(state, _event("HOLD_CREATED", "n1", at=NOW - timedelta(minutes=20)), 2)  # out of the window
    halted = "cordon: score 40; halted: circuit breaker TRIPPED (4 automated cordon(s) against percentage 4 node(s))"
    timeline.apply(state, _event("POLICY_HALTED", "n5", at=NOW - timedelta(minutes=1), message=halted), 3)
    index = {(r.cluster, r.node_id): r for r in found}
    inputs = dashboard.Inputs(state, True, lambda c, n: index.get((c, n)), config=config)
    guards = {(g["name"], g["scope"]): g for g in dashboard.guardrails("a", dashboard.tally(found, NOW), inputs, NOW)}
    assert guards[("circuit breaker", "cluster a")]["state"] == "tripped"
    assert "healthplane policy breaker reset --cluster a" in guards[("circuit breaker", "cluster a")]["words"]
    window = guards[("circuit breaker window", "cluster a")]
    assert (window["used"], window["limit"], window["headroom"]) == (1, 4, 3)
    assert window["words"] == ("1 automated cordon(s) in the last 10m against percentage 50 % of 8 = 4; "
                               "room for 3 more")
    standing = guards[("circuit breaker standing", "cluster a")]
    assert (standing["used"], standing["limit"], standing["headroom"], standing["state"]) == (2, 3, 1, "ok")
    ceiling = guards[("maxUnavailablePercent", "cluster a (no definition)")]
    assert (ceiling["used"], ceiling["limit"], ceiling["headroom"], ceiling["state"]) == (2, 2, 0, "full")
    assert ceiling["words"].endswith("no room: automation halts")
    rack = guards[("domainLimits rack", "rack=r0")]
    assert (rack["used"], rack["limit"], rack["state"]) == (2, 1, "full")
    assert rack["link"] == "/nodes?cluster=a&domain=rack%3Dr0&hold=any"
    assert guards[("domainLimits rack", "rack=r1")]["headroom"] == 1
    reset = dashboard.Inputs(state, True, inputs.row_of, config=config, breaker_resets={"a": NOW})
    assert all(g["state"] != "tripped" for g in dashboard.guardrails("a", dashboard.tally(found, NOW), reset, NOW))


# ---------------------------------------------------------------------------- the queue and the control plane


def test_ui2_the_control_planes_own_problems_name_their_fix() -> None:
    found = plane.judge([plane.Consumer("HP_REPORTS", "health-ingest_0-HP_REPORTS", 12_000),
                         plane.Consumer("HP_ASSESSMENTS", "scorer_3-HP_ASSESSMENTS", 9_999),
                         plane.Consumer("HP_NODE_EVENTS", "webhook-dispatcher_7-HP_NODE_EVENTS", 50_000)],
                        plane.Bucket(used=60 * 2**20, capacity=64 * 2**20), dead_letters=3, fleet=100)
    assert [p.kind for p in found] == ["consumer-behind", "consumer-behind", "bucket-full", "dead-letters"]
    assert found[0].message == "health-ingest's consumer health-ingest_0-HP_REPORTS is 12,000 records behind HP_REPORTS"
    assert "health-ingest runs" in found[0].fix and "webhooks list" in found[1].fix
    assert "substrate.nodesBucketMaxBytes" in found[2].fix and "(94 %)" in found[2].message
    assert "dead-letters list" in found[3].fix
    # A fleet of 100,000 is one record per node behind before a consumer counts as far behind.
    assert plane.judge([plane.Consumer("HP_REPORTS", "health-ingest_0-HP_REPORTS", 50_000)], None, 0, 100_000) == []
    assert plane.judge([], plane.Bucket(used=10, capacity=0), 0, 1) == []
    assert plane.service_of("scorer_12-HP_ASSESSMENTS") == "scorer" and plane.service_of("hub") == "hub"


def test_ui2_the_queue_lists_oldest_first_with_the_fix_and_drops_what_ended() -> None:
    found = _rows_with(
        n0={"needs_attention": views.NeedsAttentionRow(NOW - timedelta(hours=50), "gpu_reset failed 3 times")},
        n1={"conditions": [views.ConditionRow("collector_failed", "warning")],
            "last_reported_at": NOW - timedelta(seconds=20)},
        n2={"health": "UNKNOWN", "last_reported_at": None},
        n3={"score": 40, "health": "DEGRADED"}, n4={"score": 80, "health": "DEGRADED"})
    state = timeline.Timeline()
    policy_halt = "cordon: score 40; halted: 2 of 8 nodes of cluster a are out of service and one more would pass"
    timeline.apply(state, _event("POLICY_HALTED", "n3", at=NOW - timedelta(hours=1), message=policy_halt), 1)
    timeline.apply(state, _event("POLICY_HALTED", "n4", at=NOW - timedelta(hours=2), message="recovered since"), 2)
    rack = subjects.domain_node_id("rack", "r1")
    timeline.apply(state, _event("DOMAIN_DEGRADED", rack, at=NOW - timedelta(hours=3), message="3 of 4 silent"), 3)
    timeline.apply(state, _event("DOMAIN_DEGRADED", subjects.domain_node_id("rack", "r9"), message="x"), 4)
    timeline.apply(state, _event("DOMAIN_RECOVERED", subjects.domain_node_id("rack", "r9"), message="ok"), 5)
    index = {(r.cluster, r.node_id): r for r in found}
    problem = plane.Problem("dead-letters", "dead-letters", "3 input(s) set aside in HP_DEAD_LETTERS", "fix it")
    inputs = dashboard.Inputs(state, True, lambda c, n: index.get((c, n)), [(problem, NOW - timedelta(hours=5))])
    queue = dashboard.needs_attention(dashboard.tally(found, NOW), inputs, NOW, None)
    assert [(i["kind"], i["nodeId"] or i.get("domain")) for i in queue["items"]] == [
        ("blind", "n2"), ("needs-attention", "n0"), ("dead-letters", None), ("domain-degraded", "rack=r1"),
        ("policy-halted", "n3"), ("blind", "n1")]
    assert queue["total"] == 6 and queue["byKind"]["blind"] == 2
    first_node = queue["items"][1]
    assert first_node["message"] == "needs attention: gpu_reset failed 3 times"
    assert "healthplane node service n0" in first_node["fix"] and first_node["link"] == "/nodes/n0?cluster=a"
    assert queue["items"][3]["link"] == "/nodes?cluster=a&domain=rack%3Dr1"
    assert queue["items"][5]["message"] == "blind: Collector Failed"
    assert dashboard.needs_attention(dashboard.tally(found, NOW), inputs, NOW, "b")["total"] == 1  # the problem


def test_ui2_a_silent_rack_is_one_item_in_the_queue_not_a_page_of_its_nodes() -> None:
    """UI-2 with DOM-3 (issue 44): a rack whose 100 nodes went silent is one DOMAIN_DEGRADED item
    — its blind members counted in it, dated by the first of them — ahead of a blind node
    elsewhere; none of its members is an item of its own."""
    silent = [views.ListRow(f"r5-{i:03d}", "a", None, "OFFLINE", "UNKNOWN", None,
                            last_reported_at=NOW - timedelta(minutes=10, seconds=-i), report_interval_seconds=30,
                            domains={"rack": "r5"}) for i in range(100)]
    elsewhere = views.ListRow("n9", "a", None, "READY", "HEALTHY", 100, last_reported_at=NOW,
                              report_interval_seconds=30, domains={"rack": "r6"},
                              conditions=[views.ConditionRow("collector_failed", "warning")])
    state = timeline.Timeline()
    timeline.apply(state, _event("DOMAIN_DEGRADED", subjects.domain_node_id("rack", "r5"),
                                 at=NOW - timedelta(minutes=9), message="100 of 100 silent"), 1)
    rows = {(r.cluster, r.node_id): r for r in [*silent, elsewhere]}
    inputs = dashboard.Inputs(state, True, lambda c, n: rows.get((c, n)))
    queue = dashboard.needs_attention(dashboard.tally(rows.values(), NOW), inputs, NOW, None)
    assert [(i["kind"], i["nodeId"] or i.get("domain")) for i in queue["items"]] == [
        ("domain-degraded", "rack=r5"), ("blind", "n9")]
    rack = queue["items"][0]
    assert rack["blindMembers"] == 100 and rack["since"] == wire.rfc3339(NOW - timedelta(minutes=10))
    assert rack["message"] == "DOMAIN_DEGRADED: 100 of 100 silent (100 of its nodes blind, counted here)"
    assert queue["total"] == 2 and queue["byKind"] == {"domain-degraded": 1, "blind": 1}


# ---------------------------------------------------------------------------- the page


def _render(board: dict[str, Any]) -> str:
    return str(pages.environment().get_template("dashboard.html").render(
        caller=None, open_bus=False, csrf="", readable=board.get("readable", True), unreadable_since=None,
        unreadable_reason="", now=NOW, fragment=True, node_path=pages.node_path, notice=None, failed=None,
        summary=reads.summarize([], NOW), hub=False, board=board))


@given(rows, st.sampled_from([None, "a"]))
@settings(max_examples=30, deadline=None)
def test_ui2_the_page_renders_every_figure_it_is_given(found: list[views.ListRow], cluster: str | None) -> None:
    state = timeline.Timeline()
    timeline.apply(state, _event("NODE_CORDONED", at=NOW - timedelta(hours=1)), 1)
    board = {"readable": True, **dashboard.board(dashboard.tally(found, NOW), dashboard.Inputs(state), NOW, cluster)}
    html = _render(board)
    assert 'id="fleet-tile"' in html and 'id="attention"' in html and 'id="timeline"' in html
    assert f'data-count="{board["status"][0]["count"]}"' in html
    assert ('class="heatmap"' in html) == bool(board["domains"])
    assert 'data-action="cordon"' in html


def test_ui2_a_board_that_cannot_be_read_shows_no_figures() -> None:
    html = _render({"readable": False, "scope": None, "clusters": []})
    assert 'id="fleet-tile"' in html and 'id="attention"' not in html
