"""The node page's reads over a large HP_NODE_EVENTS (issue 44, UI-4): at 100,000 nodes under
the whole pipeline the page did not load within 60 s (docs/benchmarks.md) — it read its node's
history, score trend and timeline with three ``latest`` reads, each a binary search over the
stream's pending counts, one request per event type per step (eleven types for the timeline).
It now reads the node's newest NODE_PAGE_READ events once and picks all three from them.

HEALTHPLANE_BENCH_NODE_PAGE_NODES (default 20,000) nodes with EVENTS_PER_NODE events each,
plus one busy node with more events than the one read covers (its timeline read on its own);
both ways timed in the same run on a real nats-server, the old way the baseline. The server
is otherwise idle here: the figure is the page's own reads, not a busy server's queueing
(which multiplies the old way's ~250 sequential requests).

The second pass (API-4, API-1): the automation line took ~12 requests of its own (the config,
then the newest event of each kind, a get per type and per domain), and a page of
``GET /api/v1/nodes`` a get per view. Now the page takes the line's inputs from the events it
read, the config from the api's followed copy and its domains' events in one multi-subject
direct get, and an API page its views in one. Timed through the app (in-process), each route
loaded the old way (the old reads put back) and the new, with the requests each load sends
(every request the app's connection publishes): on a server saturated by reports every request
queues (~1 s each at 100,000 nodes under the pipeline), so the count is what the cockpit's load
time follows. Then again with FLOODERS processes storing reports as fast as they can: a busy
server, though far from that queue (the pipeline of 100,000 nodes is not played here)."""

from __future__ import annotations

import asyncio
import html
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from healthplane.client import reads
from healthplane.contracts import automation, streams, subjects, wire
from healthplane.contracts.config import NodeHealth
from healthplane.runtime import configstore
from healthplane.runtime.connect import connect
from healthplane.stack.natsserver import NatsServer
from healthplane_api import app, auth, live, pages
from tests.bench import harness
from tests.support.secure import creds_for, env_for

NODES = int(os.environ.get("HEALTHPLANE_BENCH_NODE_PAGE_NODES", "20000"))
EVENTS_PER_NODE = 10
KINDS = ("SCORE_CHANGED", "CONDITION_RAISED", "SCORE_CHANGED", "VALIDATION_STARTED", "VALIDATION_PASSED",
         "SCORE_CHANGED", "CONDITION_CLEARED", "SCORE_CHANGED", "NODE_CORDONED", "NODE_UNCORDONED")
T0 = datetime(2026, 12, 1, tzinfo=UTC)
REPEATS = 5
PAGE_NODES = 1000  # one page of GET /api/v1/nodes (app.TABLE_PAGE_MAX)
DOMAINS = {"rack": "r0", "nvlink": "nvl-0", "power": "feed-a"}  # the automation line reads each one's newest event


def _view(node_id: str) -> wire.NodeView:
    return wire.NodeView(node_id=node_id, cluster="default", hostname=node_id, status="READY", health="HEALTHY",
                         last_reported_at=T0, score=100, conditions=[], holds=[],
                         score_explanation=wire.ScoreExplanation(penalties="cluster", contributions=[]),
                         attributed_failures=wire.AttributedFailures(), domains=DOMAINS)


async def _fill(js: JetStreamContext) -> None:
    window: list[Awaitable[Any]] = []
    busy = ["VALIDATION_STARTED", "VALIDATION_FAILED", *["SCORE_CHANGED"] * (app.NODE_PAGE_READ + 500)]

    async def stored() -> None:  # each publish_async gives an ack to wait for: every record is in the stream
        await asyncio.gather(*await asyncio.gather(*window))
        window.clear()

    async def put(node_id: str, i: int, kind: str) -> None:
        event = wire.NodeEvent(id=f"{node_id}-{i}", node_id=node_id, cluster="default", type=kind,  # type: ignore[arg-type]
                               occurred_at=T0 + timedelta(seconds=i), message=kind, actor="bench")
        window.append(js.publish_async(subjects.event("default", node_id, kind), wire.encode(event)))
        if len(window) >= 4000:
            await stored()

    for node in ("busy", *(f"n-{n:06d}" for n in range(min(NODES, PAGE_NODES)))):
        window.append(js.publish_async(subjects.node_view("default", node), wire.encode(_view(node))))
    for i, (kind, value) in enumerate(DOMAINS.items()):  # the domains' own events (DOM-3)
        for j, domain_kind in enumerate(automation.DOMAIN_EVENTS):
            await put(subjects.domain_node_id(kind, value), 10 * i + j, domain_kind)
    for round_ in range(EVENTS_PER_NODE):  # interleaved, as a fleet writes them
        for n in range(NODES):
            await put(f"n-{n:06d}", round_, KINDS[round_])
        if round_ < len(busy):
            for i in range(round_ * len(busy) // EVENTS_PER_NODE, (round_ + 1) * len(busy) // EVENTS_PER_NODE):
                await put("busy", i, busy[i])
    await stored()


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
        new_s, read = await _median_s(lambda v=view: app._node_events(nc, js, v))
        new = (read.history, read.scores, read.recorded)
        assert [[e.id for e in part] for part in new] == [[e.id for e in part] for part in old]
        print(f"node page reads of {node} over {total} events: {new_s:.3f} s, the old way {old_s:.3f} s", flush=True)
        harness.record(f"node_page.event_reads_s.{node}.{total}_events", new_s, "s", baseline=old_s)


# ---------------------------------------------------------------------------- the second pass


async def _the_old_latest_event(js: JetStreamContext, cluster: str, node_id: str,
                                types: Iterable[str]) -> wire.NodeEvent | None:
    """``reads.latest_event`` as it was: a get per type and stored form, the newest that decodes."""
    found: list[tuple[int, bytes]] = []
    for event_type in types:
        for stored in streams.stored_filters("HP_NODE_EVENTS", [subjects.node_events(cluster, node_id, event_type)]):
            try:
                msg = await js.get_last_msg("HP_NODE_EVENTS", stored)
            except NotFoundError:
                continue
            if msg.data is not None and msg.seq is not None:
                found.append((msg.seq, msg.data))
    for _, data in sorted(found, reverse=True):
        try:
            return wire.decode(wire.NodeEvent, data)
        except wire.WireError:
            continue
    return None


async def _the_old_automation(js: JetStreamContext, view: wire.NodeView, now: datetime, **_: Any) -> str:
    """``reads.automation_status`` as it was: the config, then each input on its own."""
    applied = (await configstore.read(js)).in_force
    health = applied.config.node_health_for(view.definition) if applied is not None else NodeHealth()
    return automation.explain(
        view, health, now=now,
        last_policy=await _the_old_latest_event(js, view.cluster, view.node_id, automation.POLICY_EVENTS),
        last_uncordon=await _the_old_latest_event(js, view.cluster, view.node_id, ["NODE_UNCORDONED"]),
        last_score=await _the_old_latest_event(js, view.cluster, view.node_id, ["SCORE_CHANGED"]),
        domain_events=[found for kind, value in sorted(view.domains.items())
                       if (found := await _the_old_latest_event(js, view.cluster, subjects.domain_node_id(kind, value),
                                                                automation.DOMAIN_EVENTS)) is not None])


async def _the_old_views(js: JetStreamContext, nodes: Sequence[tuple[str, str]]) -> list[bytes]:
    """``reads.latest_views`` as it was: a get per view, 64 in flight."""
    gate = asyncio.Semaphore(64)

    async def one(cluster: str, node_id: str) -> bytes | None:
        async with gate:
            try:
                return (await js.get_last_msg("HP_NODES", subjects.node_view(cluster, node_id))).data
            except NotFoundError:
                return None

    return [p for p in await asyncio.gather(*(one(c, n) for c, n in nodes)) if p]


_event_page = reads.event_page


async def _the_old_event_page(*args: Any, viewed: bool = False, **kwargs: Any) -> reads.EventPage:
    """``reads.event_page`` as the node page called it: its view looked up again for its cluster."""
    return await _event_page(*args, **kwargs)


class _Requests:
    """Every request a connection sends (nats-py sends each, a JetStream API call or a direct
    get, through ``publish``), counted."""

    def __init__(self, nc: NATS, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent = 0
        publish = nc.publish

        async def counted(*args: Any, **kwargs: Any) -> None:
            self.sent += 1
            await publish(*args, **kwargs)

        monkeypatch.setattr(nc, "publish", counted)


@asynccontextmanager
async def _api(nats_server: NatsServer, nc: NATS) -> AsyncIterator[httpx.AsyncClient]:
    """The api's routes on ``nc``; its index and config followed on a connection of their own
    (their polling is not the routes' requests)."""
    following_nc = await connect(nats_server.url, name="api-feed", creds=creds_for(nats_server, "api"), give_up_after=5)
    log = structlog.get_logger("bench")
    feed = live.Feed(log)
    stopping = asyncio.Event()
    events = live.node_events(following_nc, log)
    following = asyncio.gather(feed.run(following_nc, following_nc.jetstream(), stopping, events),
                               events.run(stopping))
    try:
        await asyncio.wait_for(feed.loaded.wait(), 60)
        while feed.config is None:
            await asyncio.sleep(0.05)
        backend = app.Backend(nc, nc.jetstream(), feed, auth.Callers(None, open_bus=True), log)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app.build(backend)), base_url="http://api",
                                     timeout=60) as client:
            yield client
    finally:
        stopping.set()
        await following
        await following_nc.close()


# A fleet's reports into HP_REPORTS, as fast as a client gets them stored, from processes of
# their own: a server kept busy as the pipeline keeps it, each request of the api's in a queue.
FLOODERS = int(os.environ.get("HEALTHPLANE_BENCH_NODE_PAGE_FLOODERS", "2"))
_FLOOD = """
import asyncio, os
from healthplane.contracts import subjects
from healthplane.runtime.connect import connect

async def flood() -> None:
    nc = await connect(os.environ["HEALTHPLANE_NATS_URL"], name="flood", creds=os.environ.get("HEALTHPLANE_NATS_CREDS"),
                       give_up_after=5)
    js, report, sent = nc.jetstream(), b"r" * 1024, 0
    while True:
        acks = await asyncio.gather(*(js.publish_async(subjects.report("default", f"load-{(sent + k) % 100_000:06d}"),
                                                       report) for k in range(2000)))
        await asyncio.gather(*acks)
        sent += 2000

asyncio.run(flood())
"""


@contextmanager
def _reports_flooding(nats_server: NatsServer) -> Iterator[None]:
    flooders = [subprocess.Popen([sys.executable, "-c", _FLOOD], env=env_for(nats_server, "maintainer", "test"),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL) for _ in range(FLOODERS)]
    try:
        time.sleep(2)  # connected and publishing
        assert all(f.poll() is None for f in flooders), "a flooder ended"
        yield
    finally:
        for flooder in flooders:
            flooder.kill()
            flooder.wait()


def _automation_line(page: str) -> str:
    found = re.search(r'<section class="why" id="automation">.*?<p>(.*?)</p>', page, re.S)
    assert found is not None, page[:2000]
    return html.unescape(found.group(1)).strip()


async def _loads(client: httpx.AsyncClient, requests: _Requests,
                 routes: dict[str, tuple[str, dict[str, str]]]) -> dict[str, tuple[float, str, int]]:
    """Each route loaded REPEATS times: the median seconds, the answer and one load's requests."""
    found = {}
    for route, (path, query) in routes.items():
        async def load(path: str = path, query: dict[str, str] = query) -> tuple[str, int]:
            before = requests.sent
            got = await client.get(path, params=query)
            assert got.status_code == 200, got.text[:500]
            return got.text, requests.sent - before
        took, (body, sent) = await _median_s(load)
        found[route] = (took, body, sent)
    return found


async def test_api4_api1_the_node_page_and_an_api_page_in_a_few_requests(
        nats_server: NatsServer, nc: NATS, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """API-4, UI-4, API-1: the node page, ``GET /api/v1/nodes/{id}`` and a page of 1,000 of
    ``GET /api/v1/nodes``, the old reads and the new, on the idle server and a busy one: the
    same answers, timed, their requests counted."""
    await _fill(js)
    total = (await js.stream_info("HP_NODE_EVENTS")).state.messages
    api_nc = await connect(nats_server.url, name="api", creds=creds_for(nats_server, "api"), give_up_after=5)
    requests = _Requests(api_nc, monkeypatch)
    node_path = pages.node_path("n-000042")
    routes = {"page": (node_path, {}), "node_api": (f"/api/v1{node_path}", {}),
              "nodes_api": ("/api/v1/nodes", {"pageSize": str(PAGE_NODES), "sort": "node"})}
    measured: dict[str, dict[str, dict[str, tuple[float, str, int]]]] = {}
    try:
        async with _api(nats_server, api_nc) as client:
            for server in ("idle", "busy"):
                with _reports_flooding(nats_server) if server == "busy" else nullcontext():
                    with monkeypatch.context() as old_reads:
                        old_reads.setattr(reads, "automation_status", _the_old_automation)
                        old_reads.setattr(reads, "latest_views", _the_old_views)
                        old_reads.setattr(reads, "event_page", _the_old_event_page)
                        old = await _loads(client, requests, routes)
                    measured[server] = {"old": old, "new": await _loads(client, requests, routes)}
    finally:
        await api_nc.close()
    for server, ways in measured.items():
        old, new = ways["old"], ways["new"]
        assert _automation_line(new["page"][1]) == _automation_line(old["page"][1])
        assert new["node_api"][1] == old["node_api"][1]
        assert new["nodes_api"][1] == old["nodes_api"][1]  # byte for byte
        for route in routes:
            (old_s, _, old_sent), (new_s, _, new_sent) = old[route], new[route]
            print(f"{route}, {server} server ({FLOODERS if server == 'busy' else 0} flooding), {total} events: "
                  f"{new_s:.3f} s and {new_sent} requests, the old way {old_s:.3f} s and {old_sent}", flush=True)
            harness.record(f"node_page.{route}.{server}_s", new_s, "s", baseline=old_s)
            harness.record(f"node_page.{route}.{server}_requests", new_sent, "requests", baseline=old_sent)
    print(f"the automation line: {_automation_line(measured['idle']['new']['page'][1])!r}", flush=True)
