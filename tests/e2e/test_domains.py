"""DOM-1 through the whole stack: a real ``healthplane up`` (nats-server, every service, the api
served by uvicorn, the simulated fleet with every 4 nodes on one NVLink fabric) with a cluster
config whose ``domains`` section puts nodes in racks by pattern and by an explicit mapping. Two
more nodes report as themselves, with their own credentials: one on a fabric of its own, in a
rack whose name needs escaping everywhere, one with no fabric at all.

Then ``node list --domain`` and ``GET /api/v1/nodes?domain=`` return exactly the nodes in the
domains asked for, ``node show`` names them, and the ``substrate-nodes`` record carries what
the hardware told, from which (with the config) a reader resolves the same domains."""

from __future__ import annotations

import asyncio
import html
import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest

from healthplane.contracts import domains, streams, subjects, wire
from healthplane.contracts.config import load_cluster_config
from healthplane.runtime.connect import connect
from healthplane_api.pages import node_path
from healthplane_collector.agent import Collector, Settings
from healthplane_collector.sim import SimNode, sim_fabric
from tests.support.stack import Stack, running

pytestmark = [pytest.mark.slow, pytest.mark.nats]

ODD_NODE = "10.0.0.42/9100"
ODD_RACK = "r 12/a=b&c%+ü#?"  # a space, '/', '=', '&', '%', '+', UTF-8, '#', '?'
ODD_FABRIC = wire.GpuFabric(cluster_uuid="0f0e0d0c-0b0a-0908-0706-050403020100", clique_id=7, state="completed")
PLAIN_NODE = "cpu-r12-01"
CONFIG = f"""\
cluster: default
domains:
  rules:
    - {{kind: rack, match: "sim-00[0-5]", value: r12}}
    - {{kind: rack, match: "cpu-r12-*", value: r12}}
    - {{kind: rack, regex: 'sim-(?P<n>\\d+)', value: "r-{{n}}"}}
    - {{kind: power, regex: 'sim-00(?P<power>[0-3])'}}
  nodes:
    "{ODD_NODE}": {{rack: "{ODD_RACK}", nvlink: from-the-config}}
"""
SIM_NVLINK = [domains.nvlink_domain(f.cluster_uuid, f.clique_id)
              for f in (sim_fabric("default", 4, 0), sim_fabric("default", 4, 4)) if f is not None]


async def _report_as_itself(nats_url: str, creds: Path, node: SimNode) -> None:
    """One health report and one resource report, as the node's collector sends them."""
    nc = await connect(nats_url, name=f"collector {node.node_id}", creds=str(creds), give_up_after=5)
    try:
        collector = Collector(Settings(node_id=node.node_id, cluster="default", interval_s=30), node, node.kmsg)
        collector.refresh_inventory()
        js, now = nc.jetstream(), datetime.now(UTC)
        health = await collector.collect("scheduled", now)
        await js.publish(subjects.report("default", node.node_id), wire.encode(health), timeout=5)
        resources = collector.resource_report(True, now)
        assert resources is not None
        await js.publish(subjects.resource("default", node.node_id), wire.encode(resources), timeout=5)
    finally:
        await nc.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("domains")
    config = root / "cluster.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    with running(root, "--config", str(config), nodes=8) as found:
        for index, node in enumerate((SimNode(ODD_NODE, fabric=ODD_FABRIC), SimNode(PLAIN_NODE, gpus=0))):
            creds = root / f"node-{index}.creds"
            issued = found.cli("creds", "node", node.node_id, "--data-dir", str(found.data_dir), "-o", str(creds))
            assert issued.returncode == 0, issued.stderr
            asyncio.run(_report_as_itself(str(found.stack["natsUrl"]), creds, node))

        def every_node_has_its_domains() -> bool:
            listed = {v["nodeId"]: v for v in found.get("/api/v1/nodes").json()["nodes"]}
            return len(listed) == 10 and all(v["domains"].get("rack") for v in listed.values())

        found.wait_until(every_node_has_its_domains, 90, "every node's view with its domains")
        yield found


def _listed(stack: Stack, *selectors: str) -> list[str]:
    args = [arg for s in selectors for arg in ("--domain", s)]
    return [row["nodeId"] for row in stack.cli_json("node", "list", *args)]


def _api(stack: Stack, *selectors: str, **params: Any) -> list[str]:
    answer = stack.get("/api/v1/nodes", domain=list(selectors), **params)
    assert answer.status_code == 200, answer.text
    return [view["nodeId"] for view in answer.json()["nodes"]]


R12 = ["cpu-r12-01", "sim-000", "sim-001", "sim-002", "sim-003", "sim-004", "sim-005"]


def test_dom1_node_list_domain_returns_exactly_the_nodes_in_it(stack: Stack) -> None:
    assert _listed(stack, "rack=r12") == R12
    assert _listed(stack, "rack=r12", f"nvlink={SIM_NVLINK[0]}") == ["sim-000", "sim-001", "sim-002", "sim-003"]
    assert _listed(stack, f"nvlink={SIM_NVLINK[1]}") == ["sim-004", "sim-005", "sim-006", "sim-007"]
    assert _listed(stack, "rack=r-007") == ["sim-007"]
    assert _listed(stack, "power=2") == ["sim-002"]
    assert _listed(stack, f"rack={ODD_RACK}") == [ODD_NODE]
    assert _listed(stack, "rack=r12", "rack=r13") == []

    text = stack.cli("node", "list", "--domain", "rack=r12")
    assert text.returncode == 0, text.stderr
    assert [line.split()[0] for line in text.stdout.splitlines()[1:]] == R12

    bad = stack.cli("node", "list", "--domain", "rack")
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == ["healthplane: --domain: domain 'rack': expected KIND=VALUE, e.g. rack=r12"]


def test_dom1_node_show_names_the_domains_the_hardware_wins_for_nvlink(stack: Stack) -> None:
    shown = stack.cli_json("node", "show", "sim-001")
    assert shown["domains"] == {"nvlink": SIM_NVLINK[0], "power": "1", "rack": "r12"}
    text = stack.cli("node", "show", "sim-001")
    assert f"Domains:   nvlink {SIM_NVLINK[0]}, power 1, rack r12" in text.stdout.splitlines()

    odd = stack.cli_json("node", "show", ODD_NODE)  # the config said nvlink too: the fabric wins
    assert odd["domains"] == {"nvlink": domains.nvlink_domain(ODD_FABRIC.cluster_uuid, 7), "rack": ODD_RACK}
    assert stack.cli_json("node", "show", PLAIN_NODE)["domains"] == {"rack": "r12"}  # no fabric: no nvlink


def test_dom1_the_api_filter_through_the_real_server(stack: Stack) -> None:
    assert _api(stack, "rack=r12") == R12  # the whole list (the listing read)
    assert _api(stack, "rack=r12", pageSize=3) == R12[:3]  # a page (the live index)
    page = stack.get("/api/v1/nodes", domain="rack=r12", pageSize=3).json()
    assert page["total"] == len(R12) and page["nextPageToken"]
    assert _api(stack, "rack=r12", f"nvlink={SIM_NVLINK[0]}") == ["sim-000", "sim-001", "sim-002", "sim-003"]

    # a value with odd characters, percent-encoded by the client, decoded once by the server
    assert _api(stack, f"rack={ODD_RACK}") == [ODD_NODE]
    assert _api(stack, f"rack={ODD_RACK}", pageSize=10) == [ODD_NODE]
    assert _api(stack, f"rack={ODD_RACK[:-1]}") == []
    # written by hand: the '=' inside the parameter's value needs no escaping
    raw = httpx.get(stack.api_url + "/api/v1/nodes?domain=rack=r12&domain=power=3",
                    headers={"Authorization": f"Bearer {stack.token('admin')}"}, timeout=30)
    assert [v["nodeId"] for v in raw.json()["nodes"]] == ["sim-003"]

    bad = stack.get("/api/v1/nodes", domain="Rack=r12")
    assert bad.status_code == 400
    assert "\n" not in bad.json()["error"] and bad.json()["error"].startswith("domain 'Rack=r12': kind 'Rack'")
    node = stack.get("/api/v1/nodes/" + "10.0.0.42%2F9100")
    assert node.json()["domains"]["rack"] == ODD_RACK


def test_dom1_the_node_page_links_each_domain_to_the_table_filtered_by_it(stack: Stack) -> None:
    page = stack.get(node_path(ODD_NODE))
    assert page.status_code == 200, page.text
    links = re.findall(r'<dd id="domains">(.*?)</dd>', page.text)[0]
    hrefs = [html.unescape(h) for h in re.findall(r'<a href="([^"]+)">', links)]
    assert [unquote(h.removeprefix("/nodes?domain=")) for h in hrefs] == [
        f"nvlink={domains.nvlink_domain(ODD_FABRIC.cluster_uuid, 7)}", f"rack={ODD_RACK}"]
    for href, expected in zip(hrefs, ([ODD_NODE], [ODD_NODE]), strict=True):
        table = httpx.get(stack.api_url + href, headers={"Authorization": f"Bearer {stack.token('admin')}"},
                          timeout=30)  # as the browser follows it (Stack.get's params would replace its query)
        assert table.status_code == 200
        assert re.findall(r'<a href="/nodes/[^"?]+\?cluster=default">([^<]+)</a>', table.text) == [
            html.escape(n) for n in expected]


def test_dom1_the_substrate_nodes_record_carries_the_fabric_and_readers_resolve_the_same(stack: Stack,
                                                                                         tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    spec = load_cluster_config(config).domains.spec()

    async def records() -> dict[str, wire.ResourceReport]:
        nc = await connect(str(stack.stack["natsUrl"]), name="test", creds=str(stack.stack["adminCreds"]))
        try:
            bucket = await nc.jetstream().key_value(streams.NODES_BUCKET)
            found = {}
            for node_id in ("sim-000", "sim-005", ODD_NODE, PLAIN_NODE):
                entry = await bucket.get(subjects.kv_node_key("default", node_id))
                assert entry.value is not None
                found[node_id] = wire.decode(wire.ResourceReport, entry.value)
            return found
        finally:
            await nc.close()

    found = asyncio.run(records())
    sim = found["sim-000"].devices[0].fabric
    assert sim is not None and sim.state == "completed" and uuid.UUID(sim.cluster_uuid)
    assert found[PLAIN_NODE].devices == []
    for node_id, report in found.items():
        shown = stack.cli_json("node", "show", node_id)["domains"]
        assert domains.of_report(report, spec) == shown, node_id
    assert json.loads(stack.cli("config", "show", "-o", "json").stdout)["config"]["domains"]["nodes"] == {
        ODD_NODE: {"rack": ODD_RACK, "nvlink": "from-the-config"}}


def test_dom3_sim_inject_domain_reaches_exactly_the_domains_members(stack: Stack) -> None:
    # DOM-3's drill: one fault into every node of a domain as the views show it (a rack's
    # power, an NVLink fabric), never a node outside it; bad input is one line, exit 2.
    fabric = f"nvlink={SIM_NVLINK[1]}"
    done = stack.cli("sim", "inject", "--domain", fabric, "--fault", "ecc-correctable")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [f"ecc-correctable injected on sim-00{n}" for n in range(4, 8)] + [
        f"4 of 4 node(s) of {fabric} injected with ecc-correctable"]
    for args, message in ((["--domain", "rack=nowhere"], "healthplane: no node of cluster default is in rack=nowhere"),
                          (["--domain", "rack"], "healthplane: --domain: "),
                          (["sim-000", "--domain", "rack=r12"], "healthplane: give a node or --domain, not both"),
                          ([], "healthplane: give the node to inject into, or --domain KIND=VALUE")):
        refused = stack.cli("sim", "inject", *args, "--fault", "ecc-correctable")
        assert refused.returncode == 2 and refused.stdout == "", (args, refused)
        assert refused.stderr.startswith(message) and len(refused.stderr.splitlines()) == 1, (args, refused.stderr)
