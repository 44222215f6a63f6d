"""The pure cores behind the API and the web UI: the nodes table's index (API-3), the
dashboard's summary and words (API-3, reference 000), "why is automation not acting?"
(API-4), the score trend (API-3) and the node routes' raw-path matching (UI-1)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Final

import httpx
import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse

from healthplane.client import reads
from healthplane.contracts import automation, views, wire
from healthplane.contracts.config import NodeHealth
from healthplane_api import fold, pages
from healthplane_api.app import NodeRoute

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)

rows = st.lists(st.builds(
    views.ListRow, node_id=st.from_regex(r"n[0-9]{1,3}", fullmatch=True), cluster=st.sampled_from(["a", "b", "c"]),
    hostname=st.none() | st.just("h"), status=st.sampled_from(["READY", "CORDONED", "OFFLINE"]),
    health=st.sampled_from(["HEALTHY", "DEGRADED", "UNKNOWN"]), score=st.none() | st.integers(0, 100),
    jobs=st.integers(0, 3), last_reported_at=st.just(NOW), report_interval_seconds=st.just(30)),
    max_size=40, unique_by=lambda r: (r.cluster, r.node_id))


def _index(found: list[views.ListRow]) -> fold.ViewIndex:
    index = fold.ViewIndex()
    for row in found:
        index.apply(msgspec.json.encode(row))
    return index


@given(rows, st.sampled_from(fold.SORTS), st.booleans(), st.integers(1, 7), st.none() | st.sampled_from(["a", "b"]),
       st.lists(st.sampled_from(["HEALTHY", "DEGRADED", "UNKNOWN"]), max_size=2))
def test_api3_paging_the_nodes_table_shows_every_matching_node_once_in_order(
        found: list[views.ListRow], sort: str, descending: bool, size: int, cluster: str | None,
        health: list[str]) -> None:
    index = _index(found)
    key = f"-{sort}" if descending else sort
    whole = index.page(cluster=cluster, health=health, sort=key, page_size=None)
    seen: list[views.ListRow] = []
    token = None
    while True:
        page = index.page(cluster=cluster, health=health, sort=key, page_size=size, token=token)
        assert page.total == whole.total and len(page.rows) <= size
        seen += page.rows
        token = page.next_page_token
        if token is None:
            break
    assert seen == whole.rows
    expected = {(r.cluster, r.node_id) for r in found if (cluster is None or r.cluster == cluster)
                and (not health or r.health in health)}
    assert {(r.cluster, r.node_id) for r in seen} == expected and len(seen) == len(expected)


def test_api3_the_score_sort_puts_the_lowest_first_and_unscored_last() -> None:
    found = [views.ListRow("n1", "a", None, "READY", "HEALTHY", 100), views.ListRow("n2", "a", None, "READY",
             "DEGRADED", 40), views.ListRow("n3", "a", None, "READY", "UNKNOWN", None)]
    assert [r.node_id for r in _index(found).page(sort="score").rows] == ["n2", "n1", "n3"]


def test_api3_a_view_that_only_moved_its_report_time_changes_no_page() -> None:
    index = fold.ViewIndex()
    row = views.ListRow("n1", "a", None, "READY", "HEALTHY", 100, last_reported_at=NOW)
    assert index.apply(msgspec.json.encode(row)) is not None
    later = msgspec.structs.replace(row, last_reported_at=NOW + timedelta(seconds=30))
    assert index.apply(msgspec.json.encode(later)) is None
    worse = msgspec.structs.replace(later, score=55, health="DEGRADED")
    assert index.apply(msgspec.json.encode(worse)) == worse
    assert index.apply(b"not a view") is None and index.skipped == 1 and len(index.rows) == 1


def test_api3_a_token_the_api_did_not_give_is_one_clear_line() -> None:
    with pytest.raises(fold.PageError, match="pageToken 'bogus' is not a token this API gave"):
        fold.ViewIndex().page(token="bogus")


@pytest.mark.parametrize(("counts", "worst", "label"), [
    ({"healthy": 10}, None, "All healthy"),
    ({"healthy": 8, "degraded": 2}, 40, "2 degraded, worst 40"),
    ({"healthy": 9, "unknown": 1}, None, "1 unknown"),
    ({"degraded": 1, "unknown": 1}, 55, "1 unknown; 1 degraded, worst 55"),
    ({}, None, "No nodes"),
])
def test_api3_a_cluster_row_says_the_worst_state_present(counts: dict[str, int], worst: int | None,
                                                          label: str) -> None:
    assert reads.cluster_label(counts, worst) == label


def test_api3_the_summary_counts_a_stale_view_as_unknown_not_its_last_answer() -> None:
    fresh = views.ListRow("n1", "a", None, "READY", "DEGRADED", 40, last_reported_at=NOW, report_interval_seconds=30)
    stale = views.ListRow("n2", "a", None, "READY", "HEALTHY", 100, last_reported_at=NOW - timedelta(minutes=5),
                          report_interval_seconds=30)
    other = views.ListRow("n3", "b", None, "READY", "HEALTHY", 100, last_reported_at=NOW, report_interval_seconds=30)
    summary = reads.summarize([fresh, stale, other], NOW)
    assert [(c["cluster"], c["health"], c["worstScore"], c["label"]) for c in summary["clusters"]] == [
        ("a", {"healthy": 0, "degraded": 1, "unknown": 1}, 40, "1 unknown; 1 degraded, worst 40"),
        ("b", {"healthy": 1, "degraded": 0, "unknown": 0}, None, "All healthy")]
    assert summary["fleet"] == {"nodes": 3, "healthy": 1, "healthyPercent": 33.3}


@pytest.mark.parametrize(("healthy", "nodes", "shown"), [
    (99_997, 100_000, 99.997), (99_979, 100_000, 99.98), (1, 100_000, 0.001), (100_000, 100_000, 100),
    (0, 7, 0), (2, 3, 66.7)])
def test_ui2_the_summary_never_rounds_a_fault_away(healthy: int, nodes: int, shown: float) -> None:
    """UI-2 (issue 44): 99,997 of 100,000 healthy is 99.997 in ``/api/v1/summary`` and
    ``node summary``, never 100.0 — the dashboard's rule, one arithmetic."""
    rows = [views.ListRow(f"n{i}", "a", None, "READY", "HEALTHY" if i < healthy else "DEGRADED", 100,
                          last_reported_at=NOW, report_interval_seconds=30) for i in range(nodes)]
    fleet = reads.summarize(rows, NOW)["fleet"]
    assert fleet["healthyPercent"] == shown
    assert (fleet["healthyPercent"] == 100) is (healthy == nodes)


def test_api3_a_cluster_that_cannot_be_read_reports_no_health() -> None:
    summary = reads.unreadable(["a"], "the connection to NATS is down", NOW)
    assert summary["clusters"] == [{"cluster": "a", "readable": False, "nodes": None, "health": None,
                                    "worstScore": None, "label": "No health: cannot read its data since "
                                    "2026-12-02T12:00:00Z (the connection to NATS is down)"}]


# ---------------------------------------------------------------------------- API-4


def _view(score: int | None, conditions: tuple[str, ...] = (), holds: tuple[str, ...] = ()) -> wire.NodeView:
    return wire.NodeView(
        node_id="n1", cluster="a", hostname=None, status="READY", health="DEGRADED", last_reported_at=NOW,
        score=score, score_explanation=None,
        conditions=[wire.Condition(type=c, reason="r", severity="warning", message="m", first_seen=NOW)  # type: ignore[arg-type]
                    for c in conditions],
        attributed_failures=wire.AttributedFailures(),
        holds=[wire.Hold(id=f"h-{a}", effect="cordon", reason=None, actor=a, created_at=NOW) for a in holds])


def _event(kind: str, message: str = "", actor: str = "policy", minutes_ago: float = 1,
           previous: int | None = 100) -> wire.NodeEvent:
    return wire.NodeEvent(id=kind, node_id="n1", cluster="a", type=kind, occurred_at=NOW - timedelta(minutes=minutes_ago),  # type: ignore[arg-type]
                          message=message, actor=actor, previous_score=previous)


CORDON = NodeHealth(mode="cordon")
HALTED = ("cordon: score 55; halted: 2 of 10 nodes of gpu-pool are out of service and one more would pass "
          "maxUnavailablePercent 20%")
TRIPPED = ("cordon: score 50; halted: circuit breaker TRIPPED (5 automated cordon(s) against windowBound 5 node(s)); "
           "reset with `healthplane policy breaker reset --cluster a`")


@pytest.mark.parametrize(("view", "health", "events", "said"), [
    (_view(None), CORDON, {}, "not yet scored"),
    (_view(40, conditions=("heartbeat_missed",)), CORDON, {}, "blind: Heartbeat Missed"),
    (_view(90), CORDON, {}, "nothing to do: score 90 is not below cordonBelow 60 (cordon mode)"),
    (_view(55), NodeHealth(), {"last_policy": _event("POLICY_RECOMMENDED", "cordon: score 55")},
     "observe mode: recommended cordon at 55"),
    (_view(40), NodeHealth(), {}, "observe mode: recommended drain at 40"),
    (_view(55, holds=("alice",)), CORDON, {}, "taken out of service by hand by alice"),
    (_view(55), CORDON, {"last_uncordon": _event("NODE_UNCORDONED", actor="alice", minutes_ago=5)},
     "suppressed until 2026-12-02T12:25:00Z after a manual uncordon by alice (cordonSuppressionMinutes 30)"),
    (_view(55), CORDON, {"last_uncordon": _event("NODE_UNCORDONED", actor="alice", minutes_ago=45),
                         "last_policy": _event("POLICY_HALTED", HALTED)}, HALTED),
    (_view(50), CORDON, {"last_policy": _event("POLICY_HALTED", TRIPPED)}, "circuit breaker TRIPPED"),
    (_view(55), CORDON, {"last_policy": _event("POLICY_ACTED", "cordon: score 55")},
     "automation acted: cordon: score 55"),
    (_view(55), CORDON, {"last_score": _event("SCORE_CHANGED", actor="scorer", previous=None)}, "first score"),
    (_view(55), CORDON, {"last_score": _event("SCORE_CHANGED", actor="scorer")}, "waiting for the policy's decision"),
])
def test_api4_why_automation_is_not_acting_names_the_mode_or_guardrail_with_its_numbers(
        view: wire.NodeView, health: NodeHealth, events: dict[str, wire.NodeEvent], said: str) -> None:
    found = automation.explain(view, health, now=NOW, last_policy=events.get("last_policy"),
                               last_uncordon=events.get("last_uncordon"), last_score=events.get("last_score"))
    assert said in found


def test_api4_each_input_is_the_newest_event_of_its_types_in_stream_order() -> None:
    """API-4: the page (from the events it read) and ``automation_status`` (from the latest of
    each type) pick an input the same way: the last of its types in stream order."""
    stored = [_event("POLICY_HALTED", "first"), _event("SCORE_CHANGED"), _event("POLICY_ACTED", "then"),
              _event("NODE_UNCORDONED", actor="alice"), _event("SCORE_CHANGED", "newest score")]
    assert reads.newest(stored, automation.POLICY_EVENTS) == stored[2]
    assert reads.newest(stored, reads.SCORE_INPUT) == stored[4]
    assert reads.newest(stored, reads.UNCORDON_INPUT) == stored[3]
    assert reads.newest(stored, automation.DOMAIN_EVENTS) is None
    assert reads.newest([], reads.SCORE_INPUT) is None


def test_api3_the_trend_steps_through_each_score_change_and_holds_to_now() -> None:
    changes = [msgspec.structs.replace(_event("SCORE_CHANGED", actor="scorer", minutes_ago=10), score=100),
               msgspec.structs.replace(_event("SCORE_CHANGED", actor="scorer", minutes_ago=5), score=55)]
    drawn = pages.trend(changes, NOW, width=216, height=116)
    assert [(p["x"], p["y"], p["score"]) for p in drawn["points"]] == [(8.0, 8.0, 100), (108.0, 53.0, 55)]
    assert drawn["path"] == "M8.0,8.0H108.0V53.0H208.0"
    assert pages.trend([], NOW)["points"] == []


def test_api3_a_decommissioned_node_leaves_the_table_and_a_late_view_does_not_bring_it_back() -> None:
    index = fold.ViewIndex()
    row = views.ListRow("n1", "a", None, "READY", "HEALTHY", 100, last_reported_at=NOW)
    index.apply(msgspec.json.encode(row))
    assert index.remove("a", "n1", NOW + timedelta(seconds=1)) and index.rows == {}
    assert index.apply(msgspec.json.encode(row)) is None and index.rows == {}
    again = msgspec.structs.replace(row, last_reported_at=NOW + timedelta(minutes=5))
    assert index.apply(msgspec.json.encode(again)) == again and list(index.rows) == [fold.key_of("a", "n1")]


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse({"route": request.scope["route"].path, **request.path_params})


# The api's node routes, each answering with what it matched: the routing alone, in-process.
ECHO: Final = Starlette(routes=[
    NodeRoute("/api/v1/nodes/{node_id:node_id}/events", _echo),
    NodeRoute("/api/v1/nodes/{node_id:node_id}/{verb}", _echo, methods=["POST"]),
    NodeRoute("/api/v1/nodes/{node_id:node_id}", _echo),
    NodeRoute("/nodes/{node_id:node_id}", _echo),
])


def _send(method: str, path: str) -> httpx.Response:
    async def send() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=ECHO), base_url="http://hp") as client:
            return await client.request(method, path)
    return asyncio.run(send())


@given(st.text(min_size=1, max_size=40))
@example(".")  # a dot-segment, which a client folds away unless escaped
@example("..")
def test_ui1_any_id_travels_as_one_raw_segment_decoded_once(node_id: str) -> None:
    page = _send("GET", pages.node_path(node_id) + "?cluster=default")
    assert page.json() == {"route": "/nodes/{node_id:node_id}", "node_id": node_id}
    shown = _send("GET", f"/api/v1/nodes/{pages.quote_id(node_id)}/events")
    assert shown.json() == {"route": "/api/v1/nodes/{node_id:node_id}/events", "node_id": node_id}
    cordon = _send("POST", f"/api/v1/nodes/{pages.quote_id(node_id)}/cordon")
    assert cordon.json() == {"route": "/api/v1/nodes/{node_id:node_id}/{verb}", "node_id": node_id, "verb": "cordon"}


@pytest.mark.parametrize("node_id", ["10.0.0.42/9100", "10.0.0.42/cordon", "n%41", "a+b", "with space", "x#y?z=1",
                                     "gpu-ü-01"])
def test_ui1_a_get_of_an_id_with_a_slash_is_the_node_never_the_post_only_verb_route(node_id: str) -> None:
    shown = _send("GET", f"/api/v1/nodes/{pages.quote_id(node_id)}")
    assert shown.status_code == 200 and shown.json() == {"route": "/api/v1/nodes/{node_id:node_id}", "node_id": node_id}
