"""UI-1 against the real server process: every route and page takes a node id as one
percent-encoded segment of the raw path. A real ``healthplane up`` (uvicorn, as the api
service runs it); nodes whose ids need escaping report with their own credentials, as their
collectors would; beside each one a decoy named what a wrong decoding of its id would read
(split at the ``/``, decoded twice, ``+`` taken for a space...), so a route that reads the
wrong segment answers for the decoy, visibly, instead of for the node."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from healthplane.contracts import subjects, wire
from healthplane.runtime.connect import connect
from healthplane_api.pages import node_path, quote_id
from healthplane_collector.agent import Collector, Settings
from healthplane_collector.sim import SimNode
from tests.support.stack import Stack, running

pytestmark = [pytest.mark.slow, pytest.mark.nats]

# (the node's id, the node a wrong decoding of its encoded segment would name)
IDS = [
    pytest.param("10.0.0.42/9100", "10.0.0.42", id="slash"),  # the references' form; split at the /
    pytest.param("n%41", "nA", id="percent"),  # decoded twice
    pytest.param("a+b", "a b", id="plus"),  # '+' read as a form's space
    pytest.param("with space", "with+space", id="space"),  # a space written as a form's '+'
    pytest.param("x#y?z=1", "x", id="hash-query"),  # cut at the fragment or the query
    pytest.param("gpu-ü-01", "gpu-Ã¼-01", id="utf8"),  # UTF-8 read as latin-1
]
NODES = [n for p in IDS for n in p.values]


async def _report_as_itself(nats_url: str, creds: Path, node_id: str) -> None:
    """One health report and one resource report, as the node's collector sends them."""
    nc = await connect(nats_url, name=f"collector {node_id}", creds=str(creds), give_up_after=5)
    try:
        node = SimNode(node_id)
        collector = Collector(Settings(node_id=node_id, cluster="default", interval_s=30), node, node.kmsg)
        collector.refresh_inventory()
        js, now = nc.jetstream(), datetime.now(UTC)
        await js.publish(subjects.report("default", node_id), wire.encode(await collector.collect("scheduled", now)),
                         timeout=5)
        resources = collector.resource_report(True, now)
        assert resources is not None
        await js.publish(subjects.resource("default", node_id), wire.encode(resources), timeout=5)
    finally:
        await nc.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("node-ids")
    with running(root, nodes=2) as found:
        for index, node_id in enumerate(NODES):
            creds = root / f"node-{index}.creds"
            issued = found.cli("creds", "node", node_id, "--data-dir", str(found.data_dir), "-o", str(creds))
            assert issued.returncode == 0, issued.stderr
            asyncio.run(_report_as_itself(str(found.stack["natsUrl"]), creds, node_id))

        def every_node_listed() -> bool:  # by the list, which takes no id: the routes under test wait
            listed = found.get("/api/v1/nodes").json()["nodes"]
            return set(NODES) <= {view["nodeId"] for view in listed}

        found.wait_until(every_node_listed, 60, "every node's view")
        yield found


def _holds(stack: Stack, node_id: str) -> list[dict[str, Any]]:
    answer = stack.get(f"/api/v1/nodes/{quote_id(node_id)}")
    assert answer.status_code == 200, answer.text
    return list(answer.json()["holds"])


@pytest.mark.parametrize(("node_id", "decoy"), IDS)
def test_ui1_the_api_the_node_page_and_the_table_take_the_id_as_one_segment(stack: Stack, node_id: str,
                                                                              decoy: str) -> None:
    shown = stack.get(f"/api/v1/nodes/{quote_id(node_id)}")
    assert shown.status_code == 200, shown.text
    assert shown.json()["nodeId"] == node_id
    assert stack.get(f"/api/v1/nodes/{quote_id(decoy)}").json()["nodeId"] == decoy

    events = stack.get(f"/api/v1/nodes/{quote_id(node_id)}/events")
    assert events.status_code == 200, events.text
    assert events.json()["events"] and {e["nodeId"] for e in events.json()["events"]} == {node_id}

    page = stack.get(node_path(node_id))
    assert page.status_code == 200, page.text
    assert f"<h1>{html.escape(node_id)} " in page.text

    table = stack.get("/nodes", q=node_id)
    assert table.status_code == 200
    links = re.findall(r'<a href="(/nodes/[^"?]+)\?cluster=default">', table.text)
    assert node_path(node_id) in links, links
    assert stack.get(node_path(node_id)).status_code == 200

    # Without a token the page sends to the login with the way back as sent: the id still one segment.
    anonymous = httpx.get(stack.api_url + node_path(node_id), follow_redirects=False, timeout=30)
    assert anonymous.status_code == 303
    assert parse_qs(urlsplit(anonymous.headers["location"]).query)["next"] == [node_path(node_id)]


@pytest.mark.parametrize(("node_id", "decoy"), IDS)
def test_ui1_a_command_by_the_api_and_by_the_node_pages_form_acts_on_that_node_only(stack: Stack, node_id: str,
                                                                                      decoy: str) -> None:
    cordoned = stack.post(f"/api/v1/nodes/{quote_id(node_id)}/cordon", {"reason": "UI-1"})
    assert cordoned.status_code == 200, cordoned.text
    assert (cordoned.json()["nodeId"], cordoned.json()["result"]) == (node_id, "applied")
    stack.wait_until(lambda: _holds(stack, node_id), 20, f"the cordon hold on {node_id}")
    assert [h["reason"] for h in _holds(stack, node_id)] == ["UI-1"]
    assert _holds(stack, decoy) == []

    # The page's uncordon form, at the action the page itself rendered, with the page's CSRF value.
    page = stack.get(node_path(node_id)).text
    action = html.unescape(re.findall(r'<form method="post" action="([^"]+/uncordon)"', page)[0])
    assert action == node_path(node_id, "uncordon")
    csrf = re.findall(r'name="csrf" value="([^"]+)"', page)[0]
    sent = httpx.post(stack.api_url + action, data={"csrf": csrf}, follow_redirects=False, timeout=30,
                      headers={"Authorization": f"Bearer {stack.token('admin')}"})
    assert sent.status_code == 303, sent.text
    back = urlsplit(sent.headers["location"])
    assert back.path == node_path(node_id) and "notice" in parse_qs(back.query), sent.headers["location"]
    stack.wait_until(lambda: _holds(stack, node_id) == [], 20, f"{node_id} uncordoned")


@pytest.mark.parametrize("node_id", ["gone/" + n for n in NODES] + ["10.0.0.42/cordon", "sim-000/events"])
def test_ui1_an_unknown_id_is_404_on_every_route_never_405(stack: Stack, node_id: str) -> None:
    segment = quote_id(node_id)
    read = stack.get(f"/api/v1/nodes/{segment}")
    assert read.status_code == 404 and read.json()["error"] == f"node {node_id} not found"
    assert stack.get(f"/api/v1/nodes/{segment}/events").status_code == 404
    assert stack.post(f"/api/v1/nodes/{segment}/cordon").status_code == 404
    assert stack.get(f"/nodes/{segment}").status_code == 404
