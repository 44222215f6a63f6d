"""HA-4 on a real nats-server with the services as their own processes: health-ingest and the
scorer run as partitions of the node space (``--partitions P``), the streams append each
node's slot to its records (a subject transform with the server's ``partition`` function),
the replicas share the partitions through KV leases, and the shares move when one dies, one
joins, or P changes. Everything is counted as in the HA-2/3 tests: every acknowledged report
stored once, no input's outputs stored twice (by any partition), the views equal a replay."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.contracts import streams, subjects, wire
from healthplane.runtime import converge
from healthplane.runtime.replay import read_all
from healthplane.stack.natsserver import NatsServer
from tests.support import pipeline
from tests.support.pipeline import CLUSTER, Fleet, service, until

pytestmark = [pytest.mark.nats, pytest.mark.slow]
NODES = [f"n{i:02d}" for i in range(16)]


async def _holders(js: JetStreamContext, service_name: str, partitions: int) -> dict[str, str]:
    """Partition label -> the replica holding its lease, for the partitions held now."""
    kv = await js.key_value(streams.LEASES_BUCKET)
    held = {}
    for k in range(partitions):
        label = subjects.partition_label(k, partitions)
        try:
            entry = await kv.get(f"{service_name}.{label}")
        except Exception:
            continue
        if entry.value:
            held[label] = entry.value.decode()
    return held


async def _count_everything(nc: NATS, js: JetStreamContext, fleet: Fleet, scorer_partitions: int) -> None:
    # Nothing acknowledged lost, nothing stored twice.
    # (HP_REPORTS keeps a node's latest 64.)
    kept = streams.STREAMS_BY_NAME["HP_REPORTS"].max_msgs_per_subject
    stored = Counter((m.headers or {}).get("Nats-Msg-Id") for m in
                     await read_all(nc, js, "HP_REPORTS", "hp.report.>"))
    assert stored == Counter(msg_id for ids in fleet.acked.values() for msg_id in ids[-kept:])
    # No input's outputs stored twice, whichever partition (or layout) folded it: the message
    # id without its producer is the input and the output's index.
    for stream, subject in (("HP_NODE_EVENTS", "hp.event.>"), ("HP_ASSESSMENTS", "hp.assess.>")):
        caused = Counter((m.headers or {}).get("Nats-Msg-Id", "").partition(":")[2] for m in
                         await read_all(nc, js, stream, subject)
                         if "Hp-Causation" in (m.headers or {}))
        assert not [c for c, n in caused.items() if n > 1], f"{stream}: an input's output stored twice"
    raised = [wire.decode(wire.NodeEvent, m.data) for m in
              await read_all(nc, js, "HP_NODE_EVENTS", "hp.event.*.*.CONDITION_RAISED")]
    last_round = fleet.last_round()
    assert sorted(e.node_id for e in raised) == sorted(n for n in NODES if last_round[n] >= 8 + NODES.index(n))

    # Each node's records carry its slot, and the partition that owns the slot wrote its view.
    slot_of = {subjects.parse(m.subject).node_id: int(m.subject.rpartition(".")[2]) for m in
               await read_all(nc, js, "HP_ASSESSMENTS", "hp.assess.>", last_per_subject=True)}
    assert set(slot_of) == set(NODES) and all(0 <= s < streams.PARTITION_SLOTS for s in slot_of.values())
    for m in await read_all(nc, js, "HP_NODES", "hp.node.>", last_per_subject=True):
        node_id = subjects.parse(m.subject).node_id
        owner = subjects.partition_label(slot_of[node_id] % scorer_partitions, scorer_partitions)
        assert (m.headers or {}).get("Hp-Producer") == f"scorer.{owner}", node_id

    # The views equal a replay of the assessments (state = replay, across the partitions).
    await pipeline.assert_views_equal_a_replay(nc, js, fleet)


async def test_ha4_replicas_share_the_partitions_and_take_a_dead_ones_share_and_give_a_newcomer_its_own(
        nats_server: NatsServer, tmp_path: Path) -> None:
    # HA-4: health-ingest as 2 partitions on one replica, the scorer as 4 on two replicas.
    # kill -9 of one scorer replica: the other owns all four before the dead one's keys could
    # lapse (HA-8: it is gone from the bus); a third joins: it is handed its share. Every
    # node's records stay in order in one partition.
    nc, sim_nc = await pipeline.clients(nats_server, "ha4")
    js = nc.jetstream()
    await converge.ensure(js, slotted=True)
    processes = {label: service(nats_server, name, tmp_path / f"{label}.log", "--partitions", p)
                 for label, name, p in (("health-ingest", "health-ingest", "2"), ("scorer-a", "scorer", "4"),
                                        ("scorer-b", "scorer", "4"))}
    fleet = Fleet(sim_nc.jetstream(), NODES)
    async with pipeline.publishing(fleet, processes):
        await until(lambda: pipeline.viewed_all(nc, js, fleet), 60, "a view of every node")

        async def shared_by(*replicas: str, partitions: int = 4) -> bool:
            held = await _holders(js, "scorer", partitions)
            owners = Counter(held.values())
            return len(held) == partitions and set(owners) == set(replicas) and max(owners.values()) - min(
                owners.values()) <= 1

        await until(lambda: shared_by("scorer-a", "scorer-b"), 30, "the scorer's partitions shared 2 and 2")
        assert set((await _holders(js, "health-ingest", 2)).values()) == {"health-ingest"}

        processes["scorer-a"].send_signal(signal.SIGKILL)
        taken_s = await until(lambda: shared_by("scorer-b"), 30, "scorer-b owning all four partitions")
        print(f"HA-4: scorer-b owned the dead replica's partitions {taken_s:.2f} s after its kill -9")
        # Its members key and leases were renewed at most a third of the TTL before the kill, so
        # they lapse no sooner than two thirds of it after: sooner is presence's doing.
        assert taken_s < streams.LEASE_TTL_S * 2 / 3

        processes["scorer-c"] = service(nats_server, "scorer", tmp_path / "scorer-c.log", "--partitions", "4")
        joined_s = await until(lambda: shared_by("scorer-b", "scorer-c"), 30, "scorer-c handed its share")
        print(f"HA-4: a joining replica held its share {joined_s:.2f} s after it started")

        await asyncio.sleep(2)  # the newcomer's partitions folding live
        await pipeline.finish(nc, js, fleet, timeout=30)
    await _count_everything(nc, js, fleet, scorer_partitions=4)
    await sim_nc.close()
    await nc.close()


async def test_ha4_changing_p_hands_over_where_the_last_layout_stood_without_emitting_twice(
        nats_server: NatsServer, tmp_path: Path) -> None:
    # HA-4, changing P (docs/operations.md "Partitions"): start the replicas with the new P,
    # then stop the old ones. While both run, neither owns anything (two layouts would fold a
    # node twice); once the old ones are gone the new partitions replay from the start,
    # taking every input the old layout had folded as emitted, and go on live.
    nc, sim_nc = await pipeline.clients(nats_server, "ha4-p")
    js = nc.jetstream()
    await converge.ensure(js, slotted=True)
    processes = {"health-ingest": service(nats_server, "health-ingest", tmp_path / "health-ingest.log"),
                 "scorer-p2": service(nats_server, "scorer", tmp_path / "scorer-p2.log", "--partitions", "2")}
    fleet = Fleet(sim_nc.jetstream(), NODES)
    async with pipeline.publishing(fleet, processes):
        await until(lambda: pipeline.viewed_all(nc, js, fleet), 60, "a view of every node")
        await until(lambda: _fleet_past(fleet, 20), 30, "the fleet past its faults")  # events of every node

        processes["scorer-p4"] = service(nats_server, "scorer", tmp_path / "scorer-p4.log", "--partitions", "4")

        async def p4_refuses() -> bool:
            return "another layout of this service is running" in (tmp_path / "scorer-p4.log").read_text()

        await until(p4_refuses, 30, "the P=4 replica seeing the P=2 one and owning nothing")
        assert await _holders(js, "scorer", 4) == {}

        processes["scorer-p2"].send_signal(signal.SIGTERM)
        processes["scorer-p2"].wait(30)

        async def p4_owns_all() -> bool:
            return len(await _holders(js, "scorer", 4)) == 4

        handed_s = await until(p4_owns_all, 30, "the P=4 replica owning all four partitions")
        print(f"HA-4: P=4 owned every partition {handed_s:.2f} s after the P=2 replica stopped")
        await asyncio.sleep(3)  # live under P=4
        await pipeline.finish(nc, js, fleet, timeout=60)
        assert "partitions changed: replaying where the last layout stood" in (tmp_path / "scorer-p4.log").read_text()
    await _count_everything(nc, js, fleet, scorer_partitions=4)
    await sim_nc.close()
    await nc.close()


async def _fleet_past(fleet: Fleet, round_: int) -> bool:
    return bool(fleet.acked) and min(fleet.last_round().values()) >= round_


async def test_ha4_a_partition_of_an_install_without_slots_refuses_to_start(
        nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> None:
    # HA-4: P is chosen at install. A partitioned scorer on streams without slots would fold
    # nothing; it says so in one line and exits 1. A service that decides over the whole
    # fleet refuses --partitions outright.
    scorer = service(nats_server, "scorer", tmp_path / "scorer.log", "--partitions", "2")
    policy = service(nats_server, "policy", tmp_path / "policy.log", "--partitions", "2")
    assert scorer.wait(60) == 1 and policy.wait(60) == 1
    scorer_log, policy_log = (tmp_path / "scorer.log").read_text(), (tmp_path / "policy.log").read_text()
    assert "stream HP_ASSESSMENTS has no partition slots" in scorer_log, scorer_log
    assert "policy decides over the whole fleet at once" in policy_log, policy_log
    assert "Traceback" not in scorer_log + policy_log
    # And the layout of streams that hold records is not changed in place.
    await js.publish(subjects.report(CLUSTER, "n00"), b"{}")
    with pytest.raises(converge.StreamConflict, match=r"HP_REPORTS holds 1 records without partition slots"):
        await converge.ensure(js, slotted=True)
