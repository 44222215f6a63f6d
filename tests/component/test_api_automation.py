"""API-4 / UI-4 (issue 44): "why is automation not acting?" is one line, and the node page,
``GET /api/v1/nodes/{id}`` and ``node show`` (``reads.automation_status`` reading everything
itself) say the same line for the same stored records. The page takes the node's own inputs
from the events it read for its history and reads only its domains' newest events (and an
input older than its read), in one request; the config comes from the api's followed copy.

The api runs in-process on the api's own identity (SEC-8: a multi-subject direct get is a
read it may make), ``node show``'s read on a viewer's, against a real nats-server."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.client import reads
from healthplane.contracts import subjects, wire
from healthplane.contracts.config import parse_cluster_config
from healthplane.runtime import configstore
from healthplane.runtime.connect import connect
from healthplane.stack.natsserver import NatsServer
from healthplane_api import app, auth, live, pages
from tests.support.pipeline import until
from tests.support.secure import apply_config, as_admin, creds_for

pytestmark = pytest.mark.nats
CLUSTER = "lab"
NODE = "10.0.0.5/9100"  # UI-1: an id that is not its own subject token
NOW = datetime.now(UTC).replace(microsecond=0)
HALTED = ("drain: score 30; halted: 2 of 4 nodes of domain nvlink=nvl-0 are out of service and one more would "
          "pass domainLimits nvlink maxUnavailable 2")


def _view() -> wire.NodeView:
    return wire.NodeView(node_id=NODE, cluster=CLUSTER, hostname="n5", status="READY", health="DEGRADED",
                         last_reported_at=NOW, score=30, score_explanation=None, conditions=[],
                         attributed_failures=wire.AttributedFailures(), holds=[], definition="gpu-pool",
                         domains={"rack": "r0", "nvlink": "nvl-0"})


@dataclass(frozen=True)
class Record:
    node_id: str
    kind: str
    minutes_ago: float
    actor: str = "policy"
    message: str = ""


async def _put(js: JetStreamContext, records: Sequence[Record], first: int = 0) -> None:
    for i, record in enumerate(records, start=first):
        event = wire.NodeEvent(id=f"{record.kind}-{i}", node_id=record.node_id, cluster=CLUSTER,
                               type=record.kind,  # type: ignore[arg-type]
                               occurred_at=NOW - timedelta(minutes=record.minutes_ago),
                               message=record.message or record.kind.lower(), actor=record.actor,
                               previous_score=100 if record.kind == "SCORE_CHANGED" else None,
                               score=30 if record.kind == "SCORE_CHANGED" else None)
        await js.publish(subjects.event(CLUSTER, record.node_id, record.kind), wire.encode(event))


RACK, NVLINK = "domain:rack=r0", "domain:nvlink=nvl-0"
RECOVERED = [Record(RACK, "DOMAIN_DEGRADED", 300, message="domain rack=r0: 4 of 8 members degraded"),
             Record(RACK, "DOMAIN_RECOVERED", 290), Record(NVLINK, "DOMAIN_RECOVERED", 280)]
CASES = {
    # A degraded domain holds per-node automation, whatever the node's own events say.
    "held with its rack": ([Record(NODE, "SCORE_CHANGED", 60), Record(NODE, "POLICY_HALTED", 50, message=HALTED),
                            Record(NODE, "NODE_UNCORDONED", 5, actor="alice"),
                            Record(RACK, "DOMAIN_RECOVERED", 400),
                            Record(RACK, "DOMAIN_DEGRADED", 3, message="domain rack=r0: 4 of 8 members degraded")],
                           "held with its domain: domain rack=r0: 4 of 8 members degraded (since "),
    "suppressed after alice's uncordon": ([*RECOVERED, Record(NODE, "SCORE_CHANGED", 60),
                                           Record(NODE, "POLICY_HALTED", 50, message=HALTED),
                                           Record(NODE, "NODE_UNCORDONED", 5, actor="alice")],
                                          "suppressed until "),
    "halted by the nvlink domain's limit": ([*RECOVERED, Record(NODE, "NODE_UNCORDONED", 120, actor="alice"),
                                             Record(NODE, "SCORE_CHANGED", 60),
                                             Record(NODE, "POLICY_HALTED", 50, message=HALTED)],
                                            f"{HALTED} (since "),
}


@asynccontextmanager
async def _api(nats_server: NatsServer) -> AsyncIterator[tuple[httpx.AsyncClient, live.Feed, NATS]]:
    """The api's routes on the api's own connection, its index and config followed."""
    nc = await connect(nats_server.url, name="api", creds=creds_for(nats_server, "api"), give_up_after=5)
    log = structlog.get_logger("test")
    feed = live.Feed(log)
    stopping = asyncio.Event()
    events = live.node_events(nc, log)
    following = asyncio.gather(feed.run(nc, nc.jetstream(), stopping, events), events.run(stopping))
    backend = app.Backend(nc, nc.jetstream(), feed, auth.Callers(None, open_bus=True), log)
    try:
        await asyncio.wait_for(feed.loaded.wait(), 10)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app.build(backend)),
                                     base_url="http://api") as client:
            yield client, feed, nc
    finally:
        stopping.set()
        await following
        await nc.close()


async def _lines(nats_server: NatsServer, client: httpx.AsyncClient) -> tuple[str, str, str]:
    """The page's line, the API's and ``node show``'s (on a viewer's connection)."""
    path = f"/nodes/{pages.quote_id(NODE)}"
    page = await client.get(path)
    assert page.status_code == 200, page.text
    found = re.search(r'<section class="why" id="automation">.*?<p>(.*?)</p>', page.text, re.S)
    assert found is not None, page.text
    shown = await client.get(f"/api/v1{path}")
    assert shown.status_code == 200, shown.text
    viewer = await connect(nats_server.url, name="viewer", creds=creds_for(nats_server, "viewer"), give_up_after=5)
    try:
        cli = await reads.automation_status(viewer.jetstream(), _view(), datetime.now(UTC))
    finally:
        await viewer.close()
    return html.unescape(found.group(1)).strip(), shown.json()["automation"], cli


@pytest.mark.parametrize("case", list(CASES))
async def test_api4_ui4_the_node_page_the_api_and_node_show_say_the_same_automation_line(
        nats_server: NatsServer, js: JetStreamContext, case: str) -> None:
    """API-4, UI-4: a node with a policy event, a manual uncordon and its domains' events: the
    page (its inputs from the events it read), the API and ``node show`` give one line."""
    records, expected = CASES[case]
    async with as_admin(js) as admin:
        await apply_config(admin, parse_cluster_config({"cluster": CLUSTER, "nodeHealth": {"mode": "drain"}}))
    await js.publish(subjects.node_view(CLUSTER, NODE), wire.encode(_view()))
    await _put(js, records)
    async with _api(nats_server) as (client, _, _):
        page, api, cli = await _lines(nats_server, client)
    assert page == api == cli
    assert page.startswith(expected), page


async def test_api4_ui4_a_policy_event_older_than_the_pages_read_is_still_the_line(
        nats_server: NatsServer, js: JetStreamContext) -> None:
    """UI-4: more score changes after the policy's conclusion than the page reads: its read does
    not reach the POLICY_HALTED, which is read with the domains' events, and the line is still
    the API's and ``node show``'s."""
    async with as_admin(js) as admin:
        await apply_config(admin, parse_cluster_config({"cluster": CLUSTER, "nodeHealth": {"mode": "drain"}}))
    await js.publish(subjects.node_view(CLUSTER, NODE), wire.encode(_view()))
    await _put(js, [*RECOVERED, Record(NODE, "NODE_UNCORDONED", 120, actor="alice"),
                    Record(NODE, "POLICY_HALTED", 50, message=HALTED)])
    await _put(js, [Record(NODE, "SCORE_CHANGED", 40)] * (app.NODE_PAGE_READ + 10), first=100)
    async with _api(nats_server) as (client, _, _):
        page, api, cli = await _lines(nats_server, client)
    assert page == api == cli
    assert page.startswith(f"{HALTED} (since "), page


async def test_api4_the_apis_followed_config_is_what_a_read_of_the_stream_says(
        nats_server: NatsServer, js: JetStreamContext) -> None:
    """API-4: the api keeps the config in force from HP_CONFIG as it is written, a record that
    is not a config passed over as ``configstore.read`` passes it (REL-3), and the line follows
    a new config without a read of its own."""
    async with as_admin(js) as admin:
        await apply_config(admin, parse_cluster_config({"cluster": CLUSTER, "nodeHealth": {"mode": "drain"}}))
    await js.publish(subjects.node_view(CLUSTER, NODE), wire.encode(_view()))
    await _put(js, [*RECOVERED, Record(NODE, "SCORE_CHANGED", 60)])
    async with _api(nats_server) as (client, feed, _):
        async def followed() -> bool:
            return feed.config == await configstore.read(js)

        await until(followed, 10, "the config followed")
        assert feed.config is not None and feed.config.in_force is not None
        async with as_admin(js) as admin:
            await admin.publish(subjects.CONFIG, b"not a config")
            await until(followed, 10, "the bad record passed over")
            assert feed.config.skipped and feed.config.in_force is not None
            await apply_config(admin, parse_cluster_config({"cluster": CLUSTER, "nodeHealth": {"mode": "observe"}}))
        await until(followed, 10, "the new config")
        page, api, cli = await _lines(nats_server, client)
    assert page == api == cli == "observe mode: recommended drain at 30 (mode observe recommends, never acts)"


async def test_sec7_api4_a_domain_event_naming_another_domain_on_its_subject_is_not_believed(
        nats_server: NatsServer, js: JetStreamContext) -> None:
    """SEC-7, API-4: the newest record on rack r0's DOMAIN_DEGRADED subject says it is rack r9's
    (another payload on this subject): the line is what the records that are rack r0's say, on
    the page, the API and ``node show`` alike."""
    async with as_admin(js) as admin:
        await apply_config(admin, parse_cluster_config({"cluster": CLUSTER, "nodeHealth": {"mode": "drain"}}))
    await js.publish(subjects.node_view(CLUSTER, NODE), wire.encode(_view()))
    await _put(js, [*RECOVERED, Record(NODE, "NODE_UNCORDONED", 120, actor="alice"),
                    Record(NODE, "SCORE_CHANGED", 60), Record(NODE, "POLICY_HALTED", 50, message=HALTED)])
    forged = wire.NodeEvent(id="forged", node_id="domain:rack=r9", cluster=CLUSTER, type="DOMAIN_DEGRADED",
                            occurred_at=NOW - timedelta(minutes=1), message="domain rack=r9: 8 of 8 members silent",
                            actor="policy")
    await js.publish(subjects.event(CLUSTER, RACK, "DOMAIN_DEGRADED"), wire.encode(forged))
    async with _api(nats_server) as (client, _, _):
        page, api, cli = await _lines(nats_server, client)
    assert page == api == cli
    assert page.startswith(f"{HALTED} (since "), page
