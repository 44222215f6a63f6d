"""`healthplane up --servers 3 --replicas 2` (HA-1, HA-3): the whole control plane on a real
three-server JetStream cluster with two processes of every service; a member server and the
scorer's holder killed with -9, and a fault injected after both still reaches `node show`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from healthplane.cli import registry
from healthplane.contracts import streams
from healthplane.runtime.connect import connect
from tests.e2e.test_up import _alive, _up, _wait_for_stack

pytestmark = [pytest.mark.slow, pytest.mark.nats]
def _cli(stack: dict[str, object], *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEALTHPLANE_NATS_URL": str(stack["natsUrl"]),
           "HEALTHPLANE_NATS_CREDS": str(stack["adminCreds"])}
    return subprocess.run([sys.executable, "-m", "healthplane.cli", *args], capture_output=True, text=True,
                          env=env, timeout=60)


def _health(stack: dict[str, object], node: str) -> str:
    shown = _cli(stack, "node", "show", node, "-o", "json")
    return str(json.loads(shown.stdout)["health"]) if shown.returncode == 0 else f"exit {shown.returncode}"


def _until(check, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.5)


def test_ha1_ha3_ha4_up_servers_3_replicas_2_partitions_2_survives_a_server_and_a_holder_killed(
        tmp_path: Path) -> None:
    # HA-1/3/4: the whole control plane on three servers, two of each service, health-ingest
    # and the scorer as two partitions shared by their two replicas; kill -9 the views'
    # stream leader and the replica holding the scorer's partition 0: a fault injected then
    # still reaches node show.
    process = _up(tmp_path, "--servers", "3", "--replicas", "2", "--partitions", "2", "--nodes", "4")
    try:
        stack = _wait_for_stack(tmp_path / "hp" / "stack.json", process, timeout=120)
        servers = stack["servers"]
        assert isinstance(servers, list) and [s["name"] for s in servers] == ["hp-0", "hp-1", "hp-2"]
        assert str(stack["natsUrl"]).split(",") == [s["url"] for s in servers]
        services = stack["services"]
        assert isinstance(services, list)
        for name in registry.control_plane("reference"):
            assert sorted(s["replica"] for s in services if s["name"] == name) == [1, 2], name

        async def leaders() -> tuple[str, str]:
            nc = await connect(str(stack["natsUrl"]), name="test", creds=str(stack["adminCreds"]), give_up_after=10)
            try:
                js = nc.jetstream()
                for definition in streams.STREAMS:
                    assert (await js.stream_info(definition.name)).config.num_replicas == 3, definition.name
                cluster = (await js.stream_info("HP_NODES")).cluster
                assert (await js.stream_info("HP_REPORTS")).config.subject_transform is not None  # slotted
                holder = await (await js.key_value(streams.LEASES_BUCKET)).get("scorer.0of2")
                assert cluster is not None and cluster.leader is not None and holder.value is not None
                return cluster.leader, holder.value.decode()
            finally:
                await nc.close()

        _until(lambda: _health(stack, "sim-000") == "HEALTHY", 90, "sim-000 scored")
        server_name, holder = asyncio.run(leaders())
        # The views' stream leader and the scorer replica that holds partition 0, both kill -9.
        os.kill(next(int(s["pid"]) for s in servers if s["name"] == server_name), signal.SIGKILL)
        label = holder.rpartition("/")[2]  # `up` names each child's instance HOST/LABEL
        scorer = next(s for s in services if s["name"] == "scorer" and (s["replica"] == 1) == (label == "scorer"))
        os.kill(int(scorer["pid"]), signal.SIGKILL)
        injected = _cli(stack, "sim", "inject", "sim-001", "--fault", "xid:48", "--gpu", "0")
        assert injected.returncode == 0, injected.stderr
        _until(lambda: _health(stack, "sim-001") == "DEGRADED", 60, "the fault in node show after both losses")
    finally:
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=90)
    assert process.returncode == 0, err
    assert "nats-server hp-2" in out and "scorer-2" in out
    for pid in [int(s["pid"]) for s in servers] + [int(s["pid"]) for s in services]:
        assert not _alive(pid), f"process {pid} outlived `healthplane up`"
