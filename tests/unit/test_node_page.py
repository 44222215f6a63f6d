"""UI-4: the node page's pure parts: the trend's time axis, the remediation and validation
timeline, the attributed failures, the Grafana links (checked against the dashboard
deploy/grafana builds) and the commands the API takes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthplane.contracts import wire
from healthplane_api import openapi, pages

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards" / "node-reliability.json"


def _event(kind: str, minutes_ago: float, **fields: object) -> wire.NodeEvent:
    return wire.NodeEvent(id=f"{kind}-{minutes_ago}", node_id="n1", cluster="a", type=kind,  # type: ignore[arg-type]
                          occurred_at=NOW - timedelta(minutes=minutes_ago), message=f"{kind} said", actor="eviction",
                          **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("span", "labels"), [
    (timedelta(minutes=10), ["11:50", "11:52", "11:54", "11:56", "11:58", "12:00"]),
    (timedelta(hours=5), ["07:00", "08:00", "09:00", "10:00", "11:00", "12:00"]),
    (timedelta(days=3), ["11-30", "12-01", "12-02"]),  # midnights: the date
    (timedelta(days=40), ["10-29", "11-05", "11-12", "11-19", "11-26"]),  # weeks, from the epoch's
])
def test_ui4_the_trend_has_round_utc_times_on_its_axis(span: timedelta, labels: list[str]) -> None:
    changes = [_event("SCORE_CHANGED", span.total_seconds() / 60, score=100),
               _event("SCORE_CHANGED", 1, score=55)]
    drawn = pages.trend(changes, NOW)
    assert [t["label"] for t in drawn["ticks"]] == labels
    xs = [t["x"] for t in drawn["ticks"]]
    assert xs == sorted(xs) and all(8 <= x <= drawn["width"] - 8 for x in xs)
    assert drawn["ticks"][-1]["at"] <= pages.when(NOW) and drawn["drawn_height"] > drawn["height"]
    assert [level["score"] for level in drawn["levels"]] == [100, 50, 0]


@given(st.integers(1, 400 * 24 * 60 * 60))
def test_ui4_the_axis_has_two_to_six_ticks_and_each_lies_inside_the_span(seconds: int) -> None:
    start = NOW - timedelta(seconds=seconds)
    ticks = pages.time_ticks(start, NOW)
    assert 2 <= len(ticks) <= pages.TICKS_MAX and all(start <= at <= NOW for at, _ in ticks)


def test_ui4_a_span_too_short_for_two_round_minutes_is_labelled_at_its_ends_to_the_second() -> None:
    ticks = pages.time_ticks(NOW - timedelta(seconds=40), NOW)
    assert [pages.label_at(at, step) for at, step in ticks] == ["11:59:20", "12:00:00"]


def test_ui4_the_timeline_is_remediation_and_validation_newest_first_with_their_facts() -> None:
    events = [
        _event("VALIDATION_STARTED", 30, validation=wire.ValidationRecord(suite="gpu-diag", job="v-1")),
        _event("VALIDATION_FAILED", 20, validation=wire.ValidationRecord(suite="gpu-diag", job="v-1",
                                                                        duration_seconds=61.5, reason="GPU 5")),
        _event("REMEDIATION_STARTED", 15, remediation=wire.RemediationRecord(action="gpu-reset", attempt=1)),
        _event("REMEDIATION_FAILED", 10, remediation=wire.RemediationRecord(action="gpu-reset", attempt=1)),
        _event("NODE_NEEDS_ATTENTION", 5),
        _event("SCORE_CHANGED", 4, score=40),  # not on the timeline
        _event("JOB_FAILURE_ATTRIBUTED", 3, fault_class="GPU_XID_ERRORS", allocation_id="j7.0.0"),
    ]
    line = pages.timeline(events)
    assert [(t["kind"], t["how"]) for t in line] == [
        ("attention", "needs attention"), ("remediation", "failed"), ("remediation", "started"),
        ("validation", "failed"), ("validation", "started")]
    assert line[3]["facts"] == ["suite gpu-diag", "job v-1", "61.5 s"]
    assert line[1]["facts"] == ["gpu-reset", "attempt 1"]
    [attributed] = pages.attributions(events)
    assert (attributed["fault"], attributed["allocation"], attributed["message"]) == (
        "GPU_XID_ERRORS", "j7.0.0", "JOB_FAILURE_ATTRIBUTED said")


def test_ui4_grafana_links_open_the_nodes_panels_of_the_dashboard_deploy_grafana_builds() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    uid, _ = pages.GRAFANA_DASHBOARD
    assert dashboard["uid"] == uid
    panels = {p["id"]: p["title"] for p in dashboard["panels"]}
    for panel, title in pages.GRAFANA_PANELS:
        assert panels[panel].startswith(title), (panel, panels[panel])
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"cluster", "node"} <= variables

    assert pages.grafana_links(None, "a", "n1") == [] and pages.grafana_links("", "a", "n1") == []
    links = pages.grafana_links("https://grafana.example/", "a", "10.0.0.42/9100")
    assert links[0]["url"].startswith("https://grafana.example/d/healthplane-node-reliability/node-reliability?")
    query = parse_qs(urlsplit(links[1]["url"]).query)
    assert query == {"var-cluster": ["a"], "var-node": ["10.0.0.42/9100"], "viewPanel": ["6"]}


def test_ui4_validate_remediate_and_isolate_are_api_commands_in_the_openapi_document() -> None:
    assert {"validate", "remediate", "isolate"} <= set(openapi.VERBS)
    document = openapi.document()
    for verb in ("validate", "remediate", "isolate"):
        post = document["paths"][f"/api/v1/nodes/{{nodeId}}/{verb}"]["post"]
        assert post["responses"]["403"] and verb in post["summary"]
    body = document["components"]["schemas"]["CommandBody"]["properties"]
    assert {"suite", "job"} <= set(body)
