"""The server's own fence (HA-3, runtime.fencing): two scorer holders on one real nats-server,
each believing it leads. Whatever the clocks say, nats-server stores the writes of the holder
with the higher lease revision only, and refuses the other's by its mark."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from nats.js import JetStreamContext

from healthplane.contracts import streams, subjects, wire
from healthplane.runtime.connect import connect
from healthplane.runtime.fold import Emit, Step
from healthplane.runtime.lease import HEADER
from healthplane.runtime.processor import LeaseLost, Processor
from healthplane.runtime.replay import read_all
from healthplane.stack.natsserver import NatsServer
from healthplane_scorer.fold import INPUTS, OUTPUTS, SERVICE, ScorerCore, ScorerState
from tests.support.secure import creds_for

pytestmark = pytest.mark.nats
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def _assessment(node: str, n: int) -> bytes:
    at = T0 + timedelta(seconds=n)
    return wire.encode(wire.Assessment(node_id=node, cluster="lab", assessed_at=at, report_sent_at=at,
                                       health="HEALTHY", conditions=[], real_fault=False, last_report_at=at,
                                       interval_seconds=30))


def _holder(nc, revision: int) -> Processor[ScorerState]:  # type: ignore[no-untyped-def]
    return Processor(nc=nc, js=nc.jetstream(), service=SERVICE, core=ScorerCore(), state_type=ScorerState,
                     inputs=INPUTS, outputs=OUTPUTS, batch=64, fence=lambda: revision)


async def _until(check, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.1)


async def test_a_superseded_holder_is_refused_by_the_server(nats_server: NatsServer, js: JetStreamContext) -> None:
    # HA-3: holder A (lease revision 5) writes; B (revision 7) takes over and marks the streams;
    # A, whose clock still says it leads, sends the write it had queued: the server refuses it,
    # A stops with LeaseLost, and every stored record after B's mark is B's.
    creds = creds_for(nats_server, "scorer")
    nc_a = await connect(nats_server.url, name="holder-a", creds=creds, give_up_after=5)
    nc_b = await connect(nats_server.url, name="holder-b", creds=creds, give_up_after=5)
    a, b = _holder(nc_a, 5), _holder(nc_b, 7)
    try:
        await a.start()
        running_a = asyncio.create_task(a.run())
        await js.publish(subjects.assessment("lab", "n1"), _assessment("n1", 1))

        async def a_wrote() -> bool:
            return bool(await read_all(nc_a, js, "HP_NODES", "hp.node.lab.n1"))

        await _until(a_wrote)
        [a_view] = await read_all(nc_a, js, "HP_NODES", "hp.node.lab.n1")
        await b.start()  # B marks every stream it writes (and the snapshots)
        running_b = asyncio.create_task(b.run())

        def queued(state: ScorerState, now: datetime) -> Step[ScorerState]:
            return Step(state, [Emit(a_view.subject, a_view.data), Emit(subjects.event("lab", "n1", "SCORE_CHANGED"), b"{}")])

        with pytest.raises(LeaseLost):
            await a.act(queued)
        a.stop()
        await running_a
        await js.publish(subjects.assessment("lab", "n2"), _assessment("n2", 2))

        async def b_wrote() -> bool:
            return bool(await read_all(nc_b, js, "HP_NODES", "hp.node.lab.n2"))

        await _until(b_wrote)
        [view] = await read_all(nc_b, js, "HP_NODES", "hp.node.lab.n2")
        assert view.headers is not None and view.headers[HEADER] == "7"
        # Nothing of A's after B's mark, in any stream the scorer writes, snapshots included
        # (A's stop took none: its fence said it still led, the server said no).
        for stream in (*OUTPUTS, "HP_SNAPSHOTS"):
            mark = streams.fence_subject(stream, SERVICE)
            assert mark is not None
            marked_at = (await js.get_last_msg(stream, mark)).seq
            after = await read_all(nc_b, js, stream, list(streams.STREAMS_BY_NAME[stream].subjects),
                                   start_seq=(marked_at or 0) + 1)
            assert not [m for m in after if (m.headers or {}).get(HEADER) == "5"], stream
        b.stop()
        await running_b
    finally:
        await nc_a.close()
        await nc_b.close()


async def test_an_older_holder_cannot_take_over_from_a_newer_one(nats_server: NatsServer,
                                                                js: JetStreamContext) -> None:
    # HA-3: a holder that wakes with a lease revision lower than the mark in force (it took
    # the lease, then stalled before marking) does not mark over it: start() says LeaseLost
    # and nothing of it reaches any stream.
    creds = creds_for(nats_server, "scorer")
    nc = await connect(nats_server.url, name="holders", creds=creds, give_up_after=5)
    try:
        newer = _holder(nc, 9)
        await newer.start()
        newer.stop()
        await newer.run()
        before = {s: (await js.stream_info(s)).state.last_seq for s in (*OUTPUTS, "HP_SNAPSHOTS")}
        with pytest.raises(LeaseLost):
            await _holder(nc, 4).start()
        assert {s: (await js.stream_info(s)).state.last_seq for s in before} == before
    finally:
        await nc.close()
