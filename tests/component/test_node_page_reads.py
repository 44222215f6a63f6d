"""UI-4 (issue 44): the node page reads its node's events once — its history, score trend and
remediation/validation timeline picked from the node's newest NODE_PAGE_READ events — on a real
nats-server, and a node with more events than that still shows its older timeline (that kind
read on its own). At 100,000 nodes under the pipeline the page's per-type binary searches did
not finish within 60 s."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane_api import app

pytestmark = pytest.mark.nats
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _view(node_id: str) -> wire.NodeView:
    return wire.NodeView(node_id=node_id, cluster="default", hostname=node_id, status="READY", health="HEALTHY",
                         last_reported_at=T0, score=100, conditions=[], holds=[],
                         score_explanation=wire.ScoreExplanation(penalties="cluster", contributions=[]),
                         attributed_failures=wire.AttributedFailures())


async def _events(js: JetStreamContext, node_id: str, kinds: list[str]) -> None:
    for i, kind in enumerate(kinds):
        event = wire.NodeEvent(id=f"{node_id}-{i}", node_id=node_id, cluster="default", type=kind,  # type: ignore[arg-type]
                               occurred_at=T0 + timedelta(seconds=i), message=f"{kind} {i}", actor="test")
        await js.publish(subjects.event("default", node_id, kind), wire.encode(event))


async def test_ui4_the_node_page_picks_history_trend_and_timeline_from_one_read(
        nc: NATS, js: JetStreamContext) -> None:
    """UI-4: a node with a few events of each kind — the newest page newest first, every score
    change, the validation timeline — and another node's events left out."""
    await js.publish(subjects.node_view("default", "n1"), wire.encode(_view("n1")))
    await _events(js, "n1", ["SCORE_CHANGED", "VALIDATION_STARTED", "SCORE_CHANGED", "VALIDATION_PASSED"] * 20)
    await _events(js, "n2", ["VALIDATION_FAILED"] * 5)
    read = await app._node_events(nc, js, _view("n1"))
    assert [e.id for e in read.history] == [f"n1-{i}" for i in range(79, 29, -1)]
    assert len(read.scores) == 40 and all(e.type == "SCORE_CHANGED" for e in read.scores)
    assert [e.type for e in read.recorded] == ["VALIDATION_STARTED", "VALIDATION_PASSED"] * 20
    assert read.complete and len(read.newest) == 80  # every event of n1: API-4's inputs need no read


async def test_ui4_a_node_busier_than_the_read_still_shows_its_older_timeline(
        nc: NATS, js: JetStreamContext) -> None:
    """UI-4: a validation, then more score changes than the page's one read covers: the
    timeline still has the validation (read on its own), the trend the newest TREND_EVENTS."""
    await js.publish(subjects.node_view("default", "n1"), wire.encode(_view("n1")))
    await _events(js, "n1", ["VALIDATION_STARTED", "VALIDATION_FAILED",
                             *["SCORE_CHANGED"] * (app.NODE_PAGE_READ + 10)])
    read = await app._node_events(nc, js, _view("n1"))
    assert [e.type for e in read.recorded] == ["VALIDATION_STARTED", "VALIDATION_FAILED"]
    assert len(read.scores) == app.TREND_EVENTS and read.scores[-1].id == f"n1-{app.NODE_PAGE_READ + 11}"
    assert len(read.history) == 50 and read.history[0].id == f"n1-{app.NODE_PAGE_READ + 11}"
    assert not read.complete and len(read.newest) == app.NODE_PAGE_READ
