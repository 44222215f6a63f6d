"""HA-1..3 on a real three-server JetStream cluster (``NatsCluster``: three nats-server
processes routed to each other, every stream and bucket R3), with the services as their own
processes, two scorers among them, and a fleet of collectors publishing as production does
(Nats-Msg-Id, retried until acknowledged). Everything is counted: every acknowledged report
is stored once, no output is stored twice, the views equal a replay."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from nats import errors as nats_errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import APIError

from healthplane.contracts import streams, wire
from healthplane.runtime import converge
from healthplane.runtime.connect import connect
from healthplane.runtime.replay import read_all
from healthplane.stack.natsserver import (
    CLUSTER_READY_TIMEOUT_S,
    NatsCluster,
    NatsServer,
    NatsServerError,
)
from tests.support.pipeline import (
    Fleet,
    assert_views_equal_a_replay,
    caught_up,
    clients,
    service,
    stop_all,
    until,
    viewed_all,
)
from tests.support.secure import creds_for

pytestmark = [pytest.mark.nats, pytest.mark.slow]
NODES = [f"n{i:02d}" for i in range(16)]


async def test_ha1_every_stream_and_bucket_is_r3_and_more_than_the_cluster_has_is_refused(
        cluster: NatsCluster) -> None:
    # HA-1: on three servers a service's ensure() creates everything R3 (it sees the three);
    # R5 on three servers is refused with the stream named; R1 -> R3 happens in place.
    nc = await connect(cluster.url, name="ha1", creds=creds_for(cluster, "maintainer", "test"), give_up_after=10)
    try:
        js = nc.jetstream()
        assert len(nc.servers) == 3
        await converge.ensure(js, servers=len(nc.servers))
        for name in [s.name for s in streams.STREAMS] + [f"KV_{streams.NODES_BUCKET}", f"KV_{streams.LEASES_BUCKET}"]:
            info = await js.stream_info(name)
            assert info.config.num_replicas == 3, name
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2, name
        with pytest.raises(converge.StreamConflict, match=r"stream HP_REPORTS: 5 replicas asked.*at least 5"):
            await converge.ensure(js, replicas=5)
        await converge.ensure(js, replicas=1)
        assert (await js.stream_info("HP_NODES")).config.num_replicas == 1
        again = await converge.ensure(js, replicas=3)  # in place: nothing recreated, records kept
        assert again.created == () and "HP_NODES" in again.updated
        assert (await js.stream_info(f"KV_{streams.LEASES_BUCKET}")).config.num_replicas == 3
    finally:
        await nc.close()


async def test_ha1_one_server_refuses_r3_naming_the_stream(nats_server: NatsServer, js: JetStreamContext) -> None:
    # HA-1: R1 on one server, and R3 asked of it is one line, not a traceback.
    assert (await js.stream_info("HP_REPORTS")).config.num_replicas == 1
    with pytest.raises(converge.StreamConflict, match=r"stream HP_REPORTS: 3 replicas asked.*at least 3"):
        await converge.ensure(js, replicas=3)


Lose = Callable[[NATS, JetStreamContext, dict[str, subprocess.Popen[bytes]], Fleet], Awaitable[float]]


async def _under_load(servers: NatsServer | NatsCluster, tmp_path: Path, lose: Lose,
                      lease_ttl_s: float | None = None) -> float:
    """The fleet reporting through health-ingest and two scorers; ``lose`` takes something
    away mid-run and says how long the pipeline took to notice; then everything is counted."""
    nc, sim_nc = await clients(servers, "ha")
    js = nc.jetstream()
    await converge.ensure(js, servers=len(nc.servers), lease_ttl_s=lease_ttl_s)
    processes = {label: service(servers, name, tmp_path / f"{label}.log")
                 for label, name in (("health-ingest", "health-ingest"), ("scorer", "scorer"), ("scorer-2", "scorer"))}
    fleet = Fleet(sim_nc.jetstream(), NODES)
    publishing = asyncio.create_task(fleet.run())
    try:
        await until(lambda: viewed_all(nc, js, fleet), 60, "a view of every node")
        figure = await lose(nc, js, processes, fleet)
        await asyncio.sleep(2)
        fleet.stopping.set()
        await publishing
        # Everything acknowledged is folded: each node's view is of its last acknowledged report.
        await until(lambda: caught_up(nc, js, fleet), 30, "every node assessed and viewed at its last acknowledged report")
        last_round = fleet.last_round()
    finally:
        fleet.stopping.set()
        await publishing
        stop_all(processes)

    # Nothing acknowledged lost, nothing stored twice.
    stored = Counter((m.headers or {}).get("Nats-Msg-Id") for m in
                     await read_all(nc, js, "HP_REPORTS", "hp.report.>"))
    # HP_REPORTS keeps the last 64 per node: a slow machine runs more rounds than that.
    kept = streams.STREAMS_BY_NAME["HP_REPORTS"].max_msgs_per_subject
    assert stored == Counter(msg_id for ids in fleet.acked.values() for msg_id in ids[-kept:])
    for stream, subject in (("HP_NODE_EVENTS", "hp.event.>"), ("HP_ASSESSMENTS", "hp.assess.>")):
        ids = Counter((m.headers or {}).get("Nats-Msg-Id") for m in
                      await read_all(nc, js, stream, subject))
        assert not [i for i, n in ids.items() if n > 1], f"{stream}: an output stored twice"
    raised = [wire.decode(wire.NodeEvent, m.data) for m in
              await read_all(nc, js, "HP_NODE_EVENTS", "hp.event.*.*.CONDITION_RAISED")]
    assert sorted(e.node_id for e in raised) == sorted(n for n in NODES if last_round[n] >= 8 + NODES.index(n))

    # The views equal a replay of the assessments (HA-3: state = replay).
    await assert_views_equal_a_replay(nc, js, fleet)
    await sim_nc.close()
    await nc.close()
    return figure


async def test_ha2_a_server_killed_under_load_loses_nothing_and_the_pipeline_resumes(
        cluster: NatsCluster, tmp_path: Path) -> None:
    # HA-2: kill -9 (a host lost, no goodbye), under load, the member that leads both the
    # reports' stream and the leases bucket: publishers retry until acknowledged, the services
    # reconnect to the other two, and the lease holders ride out the bucket's election (their
    # fence closes, nobody else can take over, and their next renewal reopens it).
    async def lose_the_leader_of_reports_and_leases(nc: NATS, js: JetStreamContext,
                                                    processes: dict[str, subprocess.Popen[bytes]],
                                                    fleet: Fleet) -> float:
        leader = await _lead_both(nc, js, "HP_REPORTS", f"KV_{streams.LEASES_BUCKET}")
        before = await _latest_view_at(nc, js)
        lost_at = time.monotonic()
        cluster.named(leader).kill()

        async def resumed() -> bool:  # a view of a report acknowledged after the kill
            try:
                return await _latest_view_at(nc, js) > before + timedelta(seconds=1)
            except (nats_errors.Error, APIError):  # the test's own server may be the one killed
                return False

        resumed_s = await until(resumed, 30, "the scorer writing views of new reports")
        print(f"HA-2: publishes stalled {fleet.longest_gap_after(lost_at):.2f} s, views resumed "
              f"{resumed_s:.2f} s after kill -9 of {leader}, the leader of HP_REPORTS and the leases")
        return resumed_s

    resumed_s = await _under_load(cluster, tmp_path, lose_the_leader_of_reports_and_leases)
    # Raft's election timeout (4-9 s, fixed in nats-server), then one round: 6.8 s alone here
    # (docs/operations.md has the runs). The bound is what "resumes" means, not the figure: in a
    # full parallel run on 2 cores the services starve (19.8 s seen once, 2026-12-07) and a
    # tight bound would fail for the machine, not the code.
    assert resumed_s < 30.0


async def _lead_both(nc: NATS, js: JetStreamContext, stream: str, other: str) -> str:
    """Move ``stream``'s leadership to the member that leads ``other`` (a stepdown with a
    preferred member, nats-server 2.11+); that member's name."""
    for _ in range(20):
        target = (await js.stream_info(other)).cluster.leader  # type: ignore[union-attr]
        if (await js.stream_info(stream)).cluster.leader == target:  # type: ignore[union-attr]
            return str(target)
        await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}",
                         json.dumps({"placement": {"preferred": target}}).encode(), timeout=5)
        await asyncio.sleep(0.5)
    raise AssertionError(f"{stream} never led by the leader of {other}")


async def _latest_view_at(nc: NATS, js: JetStreamContext) -> datetime:
    views = [wire.decode(wire.NodeView, m.data) for m in
             await read_all(nc, js, "HP_NODES", "hp.node.>", last_per_subject=True)]
    return max(v.last_reported_at for v in views if v.last_reported_at is not None)


async def test_ha3_ha8_the_scorer_holder_killed_under_load_is_replaced_within_the_lease_ttl(
        nats_server: NatsServer, tmp_path: Path) -> None:
    # HA-3: kill -9 the scorer replica that holds the lease under load: the standby writes
    # views, and its state equals a replay. HA-8: at the default TTL (10 s), sooner than the
    # key could lapse: the standby sees its holder gone from the bus (runtime.lease).
    async def lose_the_holder(nc: NATS, js: JetStreamContext, processes: dict[str, subprocess.Popen[bytes]],
                              fleet: Fleet) -> float:
        kv = await js.key_value(streams.LEASES_BUCKET)
        holder = processes[(await kv.get("scorer")).value.decode()]  # type: ignore[union-attr]  # its instance
        before = await _latest_revision(nc, js)
        holder.send_signal(signal.SIGKILL)

        async def taken_over() -> bool:
            return await _latest_revision(nc, js) > before

        return await until(taken_over, 30, "the standby scorer writing views")

    takeover_s = await _under_load(nats_server, tmp_path, lose_the_holder)
    print(f"HA-3: the standby scorer wrote {takeover_s:.2f} s after kill -9 of the holder")
    # The holder renewed at most a third of the TTL before the kill: the key lapses no sooner
    # than two thirds of it after. (Under 3 s alone: docs/operations.md, "The lease TTL".)
    assert takeover_s < streams.LEASE_TTL_S * 2 / 3


async def _latest_revision(nc, js: JetStreamContext) -> int:  # type: ignore[no-untyped-def]
    found = await read_all(nc, js, "HP_NODES", "hp.node.>", last_per_subject=True)
    return max((int((m.headers or {}).get("Hp-Lease-Rev", "0")) for m in found), default=0)



def test_ha1_two_servers_given_one_route_port_start_on_new_ones(tmp_path: Path) -> None:
    # Seen in a full run: the second server listened for clients, then exited over its route
    # port, which the first held; the start took it for up and waited 30 s for a leader.
    servers = NatsCluster(tmp_path / "nats")
    first, second = servers.servers[0], servers.servers[1]
    assert first.routes is not None and second.routes is not None
    second.routes = replace(second.routes, port=first.routes.port)
    started = time.monotonic()
    servers.start()
    try:
        assert len({s.routes.port for s in servers.servers if s.routes is not None}) == 3
        assert all(server.healthy() for server in servers.servers)
        assert time.monotonic() - started < CLUSTER_READY_TIMEOUT_S
    finally:
        servers.stop()


def test_ha1_a_member_gone_while_the_cluster_waits_for_a_leader_is_said_at_once(tmp_path: Path) -> None:
    # The readiness wait looks at its members' processes, not only at their /healthz: one gone
    # (here killed; in a full run, exited over a taken route port after it listened for clients)
    # is reported then, not after the whole timeout.
    servers = NatsCluster(tmp_path / "nats")
    alone = servers.servers[0].start()  # one of three: no leader can be elected
    killer = threading.Timer(0.5, alone.kill)
    killer.start()
    started = time.monotonic()
    try:
        with pytest.raises(NatsServerError, match="hp-0 exited at start"):
            servers.wait_ready(timeout_s=10)
        assert time.monotonic() - started < 5
    finally:
        killer.cancel()
        servers.stop()


@pytest.mark.parametrize("which", ["route", "client"])
def test_ha1_a_cluster_whose_picked_port_was_taken_starts_on_new_ones(tmp_path: Path, which: str) -> None:
    # Another process on the host may take a port the cluster picked free before its server
    # binds it (another test's cluster picking the same port; seen in fresh-clone CI and full
    # runs): a route port found taken by the server, a client port by the check before the
    # start. The cluster picks again instead of failing its caller.
    servers = NatsCluster(tmp_path / "nats")
    second = servers.servers[1]
    taken = second.routes.port if which == "route" and second.routes is not None else second.port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        servers.start()
        try:
            assert all(s.routes is not None and s.routes.port != taken and s.port != taken for s in servers.servers)
            assert all(server.healthy() for server in servers.servers)
        finally:
            servers.stop()
