"""The node page's reads over a large HP_NODE_EVENTS (issue 44, UI-4): at 100,000 nodes under
the whole pipeline the page did not load within 60 s (docs/benchmarks.md) — it read its node's
history, score trend and timeline with three ``latest`` reads, each a binary search over the
stream's pending counts, one request per event type per step (eleven types for the timeline).
It now reads the node's newest NODE_PAGE_READ events once and picks all three from them.

HEALTHPLANE_BENCH_NODE_PAGE_NODES (default 20,000) nodes with EVENTS_PER_NODE events each,
plus one busy node with more events than the one read covers (its timeline read on its own);
both ways timed in the same run on a real nats-server, the old way the baseline. The server
is otherwise idle here: the figure is the page's own reads, not a busy server's queueing
(which multiplies the old way's ~250 sequential requests)."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.client import reads
from healthplane.contracts import subjects, wire
from healthplane_api import app, pages
from tests.bench import harness

NODES = int(os.environ.get("HEALTHPLANE_BENCH_NODE_PAGE_NODES", "20000"))
EVENTS_PER_NODE = 10
KINDS = ("SCORE_CHANGED", "CONDITION_RAISED", "SCORE_CHANGED", "VALIDATION_STARTED", "VALIDATION_PASSED",
         "SCORE_CHANGED", "CONDITION_CLEARED", "SCORE_CHANGED", "NODE_CORDONED", "NODE_UNCORDONED")
T0 = datetime(2026, 12, 1, tzinfo=UTC)
REPEATS = 5


def _view(node_id: str) -> wire.NodeView:
    return wire.NodeView(node_id=node_id, cluster="default", hostname=node_id, status="READY", health="HEALTHY",
                         last_reported_at=T0, score=100, conditions=[], holds=[],
                         score_explanation=wire.ScoreExplanation(penalties="cluster", contributions=[]),
                         attributed_failures=wire.AttributedFailures())


async def _fill(js: JetStreamContext) -> None:
    window: list[Awaitable[Any]] = []
    busy = ["VALIDATION_STARTED", "VALIDATION_FAILED", *["SCORE_CHANGED"] * (app.NODE_PAGE_READ + 500)]

    async def put(node_id: str, i: int, kind: str) -> None:
        event = wire.NodeEvent(id=f"{node_id}-{i}", node_id=node_id, cluster="default", type=kind,  # type: ignore[arg-type]
                               occurred_at=T0 + timedelta(seconds=i), message=kind, actor="bench")
        window.append(js.publish_async(subjects.event("default", node_id, kind), wire.encode(event)))
        if len(window) >= 4000:
            await asyncio.gather(*window)
            window.clear()

    for node in ("n-000042", "busy"):
        await js.publish(subjects.node_view("default", node), wire.encode(_view(node)))
    for round_ in range(EVENTS_PER_NODE):  # interleaved, as a fleet writes them
        for n in range(NODES):
            await put(f"n-{n:06d}", round_, KINDS[round_])
        if round_ < len(busy):
            for i in range(round_ * len(busy) // EVENTS_PER_NODE, (round_ + 1) * len(busy) // EVENTS_PER_NODE):
                await put("busy", i, busy[i])
    await asyncio.gather(*window)


async def _the_old_way(nc: NATS, js: JetStreamContext, view: wire.NodeView) -> tuple[list[Any], ...]:
    history = await reads.event_page(nc, js, view.node_id, view.cluster, latest=True,
                                     page_size=reads.DEFAULT_PAGE_SIZE)
    scores = await reads.event_page(nc, js, view.node_id, view.cluster, types=["SCORE_CHANGED"], latest=True,
                                    page_size=app.TREND_EVENTS)
    recorded = await reads.event_page(nc, js, view.node_id, view.cluster,
                                      types=[*pages.TIMELINE_EVENTS, *pages.ATTRIBUTION_EVENTS], latest=True,
                                      page_size=app.NODE_PAGE_EVENTS)
    return list(reversed(history.events)), scores.events, recorded.events


async def _median_s(read: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    times, found = [], None
    for _ in range(REPEATS):
        started = time.perf_counter()
        found = await read()
        times.append(time.perf_counter() - started)
    return statistics.median(times), found


async def test_ui4_the_node_page_reads_its_events_once(nc: NATS, js: JetStreamContext) -> None:
    """UI-4: the same history, trend and timeline as the three searches, in one read."""
    await _fill(js)
    total = (await js.stream_info("HP_NODE_EVENTS")).state.messages
    for node in ("n-000042", "busy"):
        view = _view(node)
        old_s, old = await _median_s(lambda v=view: _the_old_way(nc, js, v))
        new_s, new = await _median_s(lambda v=view: app._node_events(nc, js, v))
        assert [[e.id for e in part] for part in new] == [[e.id for e in part] for part in old]
        print(f"node page reads of {node} over {total} events: {new_s:.3f} s, the old way {old_s:.3f} s", flush=True)
        harness.record(f"node_page.event_reads_s.{node}.{total}_events", new_s, "s", baseline=old_s)
