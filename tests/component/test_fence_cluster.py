"""HA-6 on a real three-server cluster (R3, ``NatsCluster``): a lease holder's writes are bound
to its mark by the server (runtime.fencing) and go as one atomic batch per output stream, the
streams' batches in flight together (``Processor._store``). A kill then leaves each output
stream a prefix of its own records, not of all of them: the scorer's first-score wave may
have an assessment's SCORE_CHANGED stored and not its view. The next holder emits exactly
what each stream lacks (REL-1), and a superseded holder is still refused by the server."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.contracts import streams, subjects, wire
from healthplane.runtime import converge
from healthplane.runtime.connect import connect
from healthplane.runtime.fencing import EXPECT_SEQ, EXPECT_SUBJECT, WRONG_LAST_SEQUENCE
from healthplane.runtime.fold import Emit, Inbound, Step
from healthplane.runtime.lease import HEADER
from healthplane.runtime.processor import LeaseLost, Processor
from healthplane.runtime.publish import MAX_ATOMIC, Publisher, PublishError
from healthplane.runtime.replay import StoredMsg, read_all
from healthplane.stack.natsserver import NatsCluster
from healthplane_scorer.fold import OUTPUTS, SERVICE, ScorerCore, ScorerState, node_view
from tests.support import fenced
from tests.support.pipeline import until, view_of
from tests.support.secure import creds_for

pytestmark = [pytest.mark.nats, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
MARKS_PER_LIFE = 1  # a holder marks each stream it writes once, when it takes over


def _assessment(node: str, n: int = 0) -> bytes:
    at = T0 + timedelta(seconds=n)
    return wire.encode(wire.Assessment(node_id=node, cluster="lab", assessed_at=at, report_sent_at=at,
                                       health="HEALTHY", conditions=[], real_fault=False, last_report_at=at,
                                       interval_seconds=30))


async def _bus(cluster: NatsCluster) -> NATS:
    """The test's maintainer connection, every stream R3, and the scorer's output streams
    de-duplicating for 0.1 s only: an output written twice a moment apart is then stored
    twice and counted, not absorbed by the server's window (REL-1: whatever it says)."""
    nc = await connect(cluster.url, name="ha6", creds=creds_for(cluster, "maintainer", "test"), give_up_after=10)
    js = nc.jetstream()
    await converge.ensure(js, servers=len(nc.servers))
    for name in OUTPUTS:
        info = await js.stream_info(name)
        assert info.config.num_replicas == 3 and info.config.allow_atomic
        info.config.duplicate_window = 0.1
        await js.update_stream(info.config)
    return nc


async def _first_score_wave(js: JetStreamContext, nodes: list[str]) -> None:
    """One assessment of each node, never scored before: a SCORE_CHANGED and a view each."""
    for start in range(0, len(nodes), 500):
        acks = [await js.publish_async(subjects.assessment("lab", node), _assessment(node))
                for node in nodes[start:start + 500]]
        await asyncio.gather(*acks)


async def _count(js: JetStreamContext, stream: str) -> int:
    """The records now in ``stream``, its holders' marks left aside."""
    info = await js.stream_info(stream, subjects_filter=f"{streams.FENCE_PREFIX}.>")
    return info.state.messages - sum((info.state.subjects or {}).values())


async def _assert_exactly_once_and_a_replay(nc: NATS, js: JetStreamContext, nodes: list[str], lives: int,
                                            deleted_views: int = 0) -> None:
    """Every node's SCORE_CHANGED stored once and its view written once (but for the views
    the test deleted, which are written again), both what a replay of the assessments folds to."""
    core, state = ScorerCore(), ScorerCore().initial_state()
    replayed: dict[str, wire.NodeEvent] = {}
    for msg in await read_all(nc, js, "HP_ASSESSMENTS", "hp.assess.>"):
        state, emits, _ = core.step(state, Inbound("HP_ASSESSMENTS", msg.seq, msg.subject, msg.data, {}, msg.time, True))
        for emit in emits:
            if emit.subject.endswith(".SCORE_CHANGED"):
                event = wire.decode(wire.NodeEvent, emit.payload)
                replayed[event.node_id] = event

    events = await read_all(nc, js, "HP_NODE_EVENTS", "hp.event.>")
    ids = Counter((m.headers or {}).get("Nats-Msg-Id") for m in events)
    assert not [i for i, n in ids.items() if n > 1], "a SCORE_CHANGED stored twice"
    stored = {e.node_id: e for e in (wire.decode(wire.NodeEvent, m.data) for m in events)
              if e.type == "SCORE_CHANGED"}
    assert len(stored) == len(nodes) == len(replayed), "a SCORE_CHANGED lost"
    for node, event in replayed.items():
        assert (stored[node].id, stored[node].score, stored[node].message) == (event.id, event.score, event.message)

    # HP_NODES keeps each node's latest view: a view written twice would have replaced the
    # first, one more sequence each. One view per node and one mark per life, no more.
    written = (await js.stream_info("HP_NODES")).state.last_seq
    assert written == len(nodes) + deleted_views + lives * MARKS_PER_LIFE, "a view written twice"
    latest = {v.node_id: v for v in (wire.decode(wire.NodeView, m.data) for m in
                                     await read_all(nc, js, "HP_NODES", "hp.node.>", last_per_subject=True))}
    assert set(latest) == set(nodes), "a view lost"
    for node in state.nodes.values():
        assert view_of(latest[node.node_id], node_view(state, node)), node.node_id


def _life(cluster: NatsCluster, revision: int, log: Path, snapshot_every: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "tests.support.fenced", cluster.url,
                             creds_for(cluster, "scorer") or "", str(revision), str(snapshot_every)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log, "ab"), stdin=subprocess.DEVNULL)


async def test_ha6_the_holder_killed_mid_wave_on_three_servers_loses_nothing_and_writes_nothing_twice(
        cluster: NatsCluster, tmp_path: Path) -> None:
    # HA-6/REL-1: kill -9 the scorer's fenced holder twice during a first-score wave on three
    # servers (once with snapshots taken along the way, once without), then let a third
    # holder finish: every node's SCORE_CHANGED and view are stored exactly once and equal a
    # replay. Where each kill cut the two streams is printed (events, views).
    nodes = [f"n{i:05d}" for i in range(6000)]
    nc = await _bus(cluster)
    js = nc.jetstream()
    try:
        await _first_score_wave(js, nodes)
        cuts = []
        for revision, snapshot_every in ((5, 10**9), (6, 700)):
            # Killed once it has written 1,500 views of its own (it has marked the streams).
            kill_at = await _count(js, "HP_NODES") + 1500
            life = _life(cluster, revision, tmp_path / f"life-{revision}.log", snapshot_every)
            try:
                async def far_enough(kill_at: int = kill_at) -> bool:
                    return await _count(js, "HP_NODES") >= kill_at

                await until(far_enough, 90, f"holder {revision} writing its views")
            finally:
                life.send_signal(signal.SIGKILL)
                life.wait(10)
            cuts.append((await _count(js, "HP_NODE_EVENTS"), await _count(js, "HP_NODES")))
            await asyncio.sleep(0.3)  # past the de-duplication window: only the scan can stop a repeat
        print(f"HA-6: SCORE_CHANGED and views stored at each kill -9: {cuts}")
        last = _life(cluster, 7, tmp_path / "life-7.log", 10**9)
        try:
            async def done() -> bool:
                return await _count(js, "HP_NODES") >= len(nodes) and await _count(js, "HP_NODE_EVENTS") >= len(nodes)

            await until(done, 120, "every node scored and viewed")
            await asyncio.sleep(0.5)  # anything written twice would land by now
        finally:
            last.terminate()
            assert last.wait(30) == 0
        assert "outputs already in the streams" in (tmp_path / "life-6.log").read_text()
        await _assert_exactly_once_and_a_replay(nc, js, nodes, lives=3)
    finally:
        await nc.close()


async def test_ha6_a_write_cut_between_streams_is_completed_stream_by_stream(cluster: NatsCluster) -> None:
    # HA-6/REL-1: the cut a kill can leave on a cluster, made exact: the streams' batches of a
    # write are separate, so one stream may hold an input's outputs and the other not. Here
    # the last 300 views are gone and the last 100 events (a holder's life cut at different
    # places in its two streams); the next holder writes exactly those, nothing else. Read as
    # one prefix of all emits (before HA-6), the 200 views between would have been lost.
    nodes = [f"n{i:04d}" for i in range(1200)]
    nc = await _bus(cluster)
    js = nc.jetstream()
    life = await connect(cluster.url, name="life", creds=creds_for(cluster, "scorer"), give_up_after=10)
    try:
        await _first_score_wave(js, nodes)
        first = fenced.holder(life, 5)
        await first.start()
        running = asyncio.create_task(first.run())

        async def written() -> bool:
            return await _count(js, "HP_NODES") >= len(nodes) and await _count(js, "HP_NODE_EVENTS") >= len(nodes)

        await until(written, 60, "the first holder's outputs")
        await life.close()  # a crash: no snapshot
        await asyncio.gather(running, return_exceptions=True)
        for stream, cut in (("HP_NODES", 300), ("HP_NODE_EVENTS", 100)):
            # The last ``cut`` records, each its node's only one on its subject (a purge by
            # subject: the maintainer may purge, nobody may delete one record, SEC-10).
            last_seq = (await js.stream_info(stream)).state.last_seq
            for msg in await read_all(nc, js, stream, list(streams.STREAMS_BY_NAME[stream].subjects),
                                      start_seq=last_seq - cut + 1):
                await js.purge_stream(stream, subject=msg.subject)
        assert (await _count(js, "HP_NODES"), await _count(js, "HP_NODE_EVENTS")) == (len(nodes) - 300,
                                                                                      len(nodes) - 100)
        await asyncio.sleep(0.3)  # past the de-duplication window

        again = await connect(cluster.url, name="again", creds=creds_for(cluster, "scorer"), give_up_after=10)
        try:
            second = fenced.holder(again, 6)
            await second.start()
            running = asyncio.create_task(second.run())
            await until(written, 60, "the second holder's outputs")
            await asyncio.sleep(0.5)
            second.stop()
            await running
        finally:
            await again.close()
        await _assert_exactly_once_and_a_replay(nc, js, nodes, lives=2, deleted_views=300)
    finally:
        await life.close()
        await nc.close()


def _holder(nc: NATS, revision: int) -> Processor[ScorerState]:
    return fenced.holder(nc, revision, batch=64)


@contextlib.asynccontextmanager
async def _two_holders(cluster: NatsCluster) -> AsyncIterator[tuple[NATS, Processor[ScorerState], Processor[ScorerState]]]:
    """The test's bus, and holders A (lease revision 5) and B (7) on connections of their own."""
    nc = await _bus(cluster)
    creds = creds_for(cluster, "scorer")
    nc_a = await connect(cluster.url, name="holder-a", creds=creds, give_up_after=10)
    nc_b = await connect(cluster.url, name="holder-b", creds=creds, give_up_after=10)
    try:
        yield nc, _holder(nc_a, 5), _holder(nc_b, 7)
    finally:
        await nc_a.close()
        await nc_b.close()
        await nc.close()


async def test_ha6_a_superseded_holder_is_refused_by_the_servers_of_a_cluster(cluster: NatsCluster) -> None:
    # HA-3 on three servers, after HA-6: holder A (lease revision 5) writes; B (revision 7)
    # takes over and marks the streams; A, whose clock still says it leads, sends the write
    # it had queued (a view and an event: two streams' atomic batches in flight together):
    # the servers refuse both, A stops with LeaseLost, and every stored record after B's
    # mark is B's.
    async with _two_holders(cluster) as (nc, a, b):
        js = nc.jetstream()
        await a.start()
        running_a = asyncio.create_task(a.run())
        await js.publish(subjects.assessment("lab", "n1"), _assessment("n1", 1))

        async def a_wrote() -> bool:
            return bool(await read_all(nc, js, "HP_NODES", "hp.node.lab.n1"))

        await until(a_wrote, 30, "holder A's view")
        [a_view] = await read_all(nc, js, "HP_NODES", "hp.node.lab.n1")
        await b.start()  # B marks every stream it writes (and the snapshots)
        running_b = asyncio.create_task(b.run())

        def queued(state: ScorerState, now: datetime) -> Step[ScorerState]:
            return Step(state, [Emit(a_view.subject, a_view.data),
                                Emit(subjects.event("lab", "n1", "SCORE_CHANGED"), b"{}"),
                                Emit(subjects.node_view("lab", "n9"), a_view.data)])

        with pytest.raises(LeaseLost):
            await a.act(queued)
        a.stop()
        await running_a
        await js.publish(subjects.assessment("lab", "n2"), _assessment("n2", 2))

        async def b_wrote() -> bool:
            return bool(await read_all(nc, js, "HP_NODES", "hp.node.lab.n2"))

        await until(b_wrote, 30, "holder B's view")
        [view] = await read_all(nc, js, "HP_NODES", "hp.node.lab.n2")
        assert view.headers is not None and view.headers[HEADER] == "7"
        assert not await read_all(nc, js, "HP_NODES", "hp.node.lab.n9")
        for stream in (*OUTPUTS, "HP_SNAPSHOTS"):
            mark = streams.fence_subject(stream, SERVICE)
            assert mark is not None
            marked_at = (await js.get_last_msg(stream, mark)).seq
            after = await read_all(nc, js, stream, list(streams.STREAMS_BY_NAME[stream].subjects),
                                   start_seq=(marked_at or 0) + 1)
            assert not [m for m in after if (m.headers or {}).get(HEADER) == "5"], stream
        b.stop()
        await running_b


async def test_ha6_a_superseded_holders_snapshot_is_refused_as_lease_lost_on_a_cluster(cluster: NatsCluster) -> None:
    """HA-3 and HA-6 on three servers: holder A's snapshot after B marked the snapshots stream
    is refused by the fence and A stops with LeaseLost; every snapshot record after B's mark
    is bound to it."""
    async with _two_holders(cluster) as (nc, a, b):
        js = nc.jetstream()
        await a.start()
        await a.snapshot()  # A's own, while it holds the mark: stored
        await b.start()  # B marks every stream it writes, the snapshots too
        with pytest.raises(LeaseLost):
            await a.snapshot()
        await b.snapshot()
        mark = streams.fence_subject("HP_SNAPSHOTS", SERVICE)
        assert mark is not None
        marked_at = (await js.get_last_msg("HP_SNAPSHOTS", mark)).seq or 0
        after: list[StoredMsg] = []

        async def b_snapshot_read() -> bool:
            # A direct get is answered by any replica, and one outside the quorum that acked
            # B's snapshot may not hold it yet (nats-server: no read-after-write on direct gets).
            after[:] = await read_all(nc, js, "HP_SNAPSHOTS", list(streams.STREAMS_BY_NAME["HP_SNAPSHOTS"].subjects),
                                      start_seq=marked_at + 1)
            return bool(after)

        await until(b_snapshot_read, 10, "B's snapshot readable")
        assert all((m.headers or {}).get(EXPECT_SEQ) == str(marked_at) for m in after)


async def test_ha6_each_streams_batches_go_one_at_a_time_the_streams_together(cluster: NatsCluster) -> None:
    # HA-6 (Publisher.store_runs on a cluster): a run longer than the server's largest atomic
    # batch is cut into several, a stream's batches go one write after another (another with
    # an expectation on the same subject would be refused while one is being stored), the
    # streams' batches side by side; the acks come back in the order of the runs given, and
    # a refusal names its batch's first record in that order.
    nc = await _bus(cluster)
    try:
        publisher = Publisher(nc)
        count = 2 * MAX_ATOMIC + 500  # three batches each
        expect = {EXPECT_SUBJECT: "hp.fence.node.ha6.0", EXPECT_SEQ: "0"}  # no mark there: sequence 0
        views = [(subjects.node_view("lab", f"v{i:05d}"), b"{}", None) for i in range(count)]
        events = [(subjects.event("lab", f"e{i:05d}", "SCORE_CHANGED"), b"{}", None) for i in range(count)]
        acks = await publisher.store_runs([(views, expect, "HP_NODES"), (events, expect, "HP_NODE_EVENTS")],
                                          one_per_stream=True)
        assert [a.stream for a in acks] == ["HP_NODES"] * count + ["HP_NODE_EVENTS"] * count
        for stream_acks in (acks[:count], acks[count:]):
            seqs = [a.seq for a in stream_acks]
            assert seqs == list(range(seqs[0], seqs[0] + count)) and not any(a.duplicate for a in stream_acks)

        wrong = {EXPECT_SUBJECT: "hp.fence.event.ha6.0", EXPECT_SEQ: "7"}  # a mark that is not there
        more = [(subjects.node_view("lab", f"w{i:05d}"), b"{}", None) for i in range(10)]
        with pytest.raises(PublishError) as refused:
            await publisher.store_runs([(more, expect, "HP_NODES"), (events[:10], wrong, "HP_NODE_EVENTS")],
                                       one_per_stream=True)
        assert refused.value.err_code == WRONG_LAST_SEQUENCE and refused.value.index == 10
    finally:
        await nc.close()
