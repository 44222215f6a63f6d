"""FED-1 and HA-1 together (issue 46.6): a federation hub on three servers and a member on three
servers, each its own ``healthplane up --servers 3``. Every hub server listens for leaf
connections, every member server connects one; the hub's aggregate and the member's offer are
R3. Then one server of each is killed with -9 (the hub's aggregate leader, the member's offer
leader): after nats-server's elections a fault in the member still reaches the hub."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from healthplane.contracts.permissions import HUB_CONSUMER, SOURCED_STREAM
from healthplane.runtime.connect import connect
from tests.e2e.test_federation import NODES, _health, _same_as_own
from tests.support.stack import Stack, launched, running, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.nats]


def _leafs(server: dict[str, Any]) -> list[dict[str, Any]]:
    """The server's own account of its leaf connections (its /leafz)."""
    with urllib.request.urlopen(f"{server['monitorUrl']}/leafz", timeout=5) as answer:
        found: list[dict[str, Any]] = json.loads(answer.read())["leafs"] or []
    return found


async def _raft(stack: Stack, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """A JetStream API answer (a stream's or consumer's ``config``, ``cluster``: its leader and
    replicas, ``state``), as the maintainer."""
    nc = await connect(str(stack.stack["natsUrl"]), name="test", creds=str(stack.stack["maintainerCreds"]),
                       give_up_after=10)
    try:
        answer: dict[str, Any] = json.loads((await nc.request(subject, json.dumps(body or {}).encode(),
                                                              timeout=10)).data)
        return answer
    finally:
        await nc.close()


def _hub_health(hub: Stack, node: str) -> tuple[str, int | None] | None:
    """The node's health and score on the hub; ``None`` while the hub's read is refused as
    retryable (exit 3: the aggregate's leader being elected answers nothing for seconds)."""
    done = hub.cli("node", "list", "--federation", "--cluster", "a", "-o", "json")
    if done.returncode != 0:
        assert done.returncode == 3 and "retry" in done.stderr, done.stderr
        return None
    _status, health, score = _health(json.loads(done.stdout))[node]
    return health, score


def _own_health(member: Stack, node: str) -> tuple[str, int | None] | None:
    done = member.cli("node", "show", node, "-o", "json")
    if done.returncode != 0:  # a stream leader being elected on the member: retryable, exit 3
        return None
    shown = json.loads(done.stdout)
    return shown["health"], shown["score"]


def _kill(stack: Stack, name: str) -> None:
    os.kill(next(int(s["pid"]) for s in stack.stack["servers"] if s["name"] == name), signal.SIGKILL)


# A hub (3 servers, the api) and a member (3 servers, every service, 4 simulated nodes) on 2 cores.
@pytest.mark.timeout(300)
def test_fed1_ha1_a_three_server_member_on_a_three_server_hub_outlives_a_server_of_each(tmp_path: Path) -> None:
    """FED-1 on HA-1 clusters: `up --federation-hub --servers 3` gives a leaf URL per server and
    `federation attach` hands them all to the member; each of the member's three servers holds a
    leaf connection to the hub; the hub's aggregate and the member's offer (the consumer the hub
    sources through) are R3; the member's nodes show on the hub as its own cluster shows them,
    each view sourced once, and a cordon from the hub lands once in the member (FED-3).
    kill -9 of the aggregate's leader on the hub and of the offer's leader on the member: a fault
    injected then reaches the hub, and the hub still counts the member reachable."""
    with ExitStack() as stack:
        hub = stack.enter_context(running(tmp_path / "hub", "--federation-hub", "--servers", "3", "--leaf-port", "0",
                                          nodes=0))
        urls = hub.stack["leafUrls"]
        assert len(set(urls)) == 3 and hub.stack["leafUrl"] == ",".join(urls)
        creds = tmp_path / "a.member.creds"
        attach = hub.cli("federation", "attach", "a", "--data-dir", str(hub.data_dir), "-o", str(creds))
        assert attach.returncode == 0, attach.stderr
        assert f"--attach {hub.stack['leafUrl']} --attach-creds {creds}" in attach.stdout
        config = tmp_path / "a.yaml"
        config.write_text("cluster: a\n", encoding="utf-8")
        a = stack.enter_context(launched(tmp_path / "a", "--servers", "3", "--attach", hub.stack["leafUrl"],
                                         "--attach-creds", str(creds), "--config", str(config), nodes=NODES)).ready()

        wait_for(lambda: _same_as_own(hub, a, "a"), 60, "a's nodes on the hub")
        # Every server of the member has its own leaf connection, each bound for the hub.
        assert [len(_leafs(server)) for server in a.stack["servers"]] == [1, 1, 1]
        assert sum(len(_leafs(server)) for server in hub.stack["servers"]) == 3
        aggregate = asyncio.run(_raft(hub, "$JS.API.STREAM.INFO.HP_FED_a"))
        offer = asyncio.run(_raft(a, f"$JS.API.CONSUMER.INFO.{SOURCED_STREAM}.{HUB_CONSUMER}"))
        assert aggregate["config"]["num_replicas"] == 3 and len(aggregate["cluster"]["replicas"]) == 2
        assert len(offer["cluster"]["replicas"]) == 2  # a consumer is as replicated as its stream: R3
        # Three leaf connections are one leaf cluster to the hub: a command from it lands once (FED-3).
        cordon = hub.cli("node", "cordon", "sim-002", "--cluster", "a", "--federation", "--reason", "from the hub")
        assert cordon.returncode == 0 and "cordon hold created for sim-002" in cordon.stdout, cordon.stderr
        commands = asyncio.run(_raft(a, "$JS.API.STREAM.INFO.HP_COMMANDS", {"subjects_filter": "hp.cmd.a.>"}))
        assert list(commands["state"]["subjects"].values()) == [1], commands["state"]["subjects"]
        # Each view sourced once: the hub's copy (read first) holds no more than the offer delivered.
        assert 0 < aggregate["state"]["last_seq"] <= offer["delivered"]["consumer_seq"]

        lost = next(server for server in hub.stack["servers"] if server["name"] == aggregate["cluster"]["leader"])
        leafs_on_lost = len(_leafs(lost))
        _kill(hub, aggregate["cluster"]["leader"])
        _kill(a, offer["cluster"]["leader"])
        killed_at = time.monotonic()
        injected = a.cli("sim", "inject", "sim-001", "--fault", "xid:79", "--gpu", "0", "--cluster", "a")
        assert injected.returncode == 0, injected.stderr
        wait_for(lambda: _own_health(a, "sim-001") == ("DEGRADED", 55), 60, "the fault in a itself")
        in_member = time.monotonic() - killed_at
        wait_for(lambda: _hub_health(hub, "sim-001") == ("DEGRADED", 55), 60,
                 "the fault on the hub after a server of each was lost")
        print(f"FED-1 on R3: a hub server and a member server killed -> the fault in a in {in_member:.1f}s, "
              f"on the hub in {time.monotonic() - killed_at:.1f}s ({leafs_on_lost} member leaf connection(s) "
              "had been on the lost hub server)", file=sys.stderr)
        assert _same_as_own(hub, a, "a")
        # The member's surviving servers each hold a leaf again: those that had reached the lost
        # hub server went to another of the URLs they were given.
        alive = [s for s in a.stack["servers"] if s["name"] != offer["cluster"]["leader"]]
        wait_for(lambda: [len(_leafs(server)) for server in alive] == [1, 1], 20, "the leaf connections back")
        [member] = hub.cli_json("federation", "list")
        assert (member["cluster"], member["reachable"]) == ("a", True)
        assert asyncio.run(_raft(hub, "$JS.API.STREAM.INFO.HP_FED_a"))["cluster"]["leader"] != \
            aggregate["cluster"]["leader"]
