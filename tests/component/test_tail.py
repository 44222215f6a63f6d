"""``runtime.replay.Tail`` on a real nats-server (SEC-8: reads without a consumer; UI-2: the api's
node events, read once for its removals, timeline and breakfix figures). Each follower gets
exactly the records its filter selects from its own start, in stream order, once; a follower
whose filter matches nothing new is still moved past what was read, and the server is asked
for every record (no subject), so a sparse filter over a fleet's subjects never costs it a walk
of them (docs/benchmarks.md, "Fleet")."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from healthplane.contracts import subjects
from healthplane.runtime.replay import StoredMsg, Tail, follow
from healthplane.stack.natsserver import NatsServer

pytestmark = [pytest.mark.nats, pytest.mark.insecure]  # the test watches the requests on the bus


def _event(node: str, kind: str) -> str:
    return subjects.event("default", node, kind)


class Seen:
    def __init__(self) -> None:
        self.subjects: list[str] = []
        self.seqs: list[int] = []
        self.caught_up = False

    def __call__(self, batch: list[StoredMsg], caught_up: bool) -> None:
        self.subjects += [s.subject for s in batch]
        self.seqs += [s.seq for s in batch]
        self.caught_up = self.caught_up or caught_up


async def _until(check: Callable[[], bool], what: str) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within 10 s: {what}")


async def test_sec8_ui2_each_follower_gets_what_its_filter_selects_from_its_start_once(
        nc: NATS, js: JetStreamContext) -> None:
    for n in range(300):  # the frequent kind, which the sparse follower never wants
        await js.publish(_event(f"n{n}", "SCORE_CHANGED"), b"{}")
    gone = (await js.publish(_event("n7", "NODE_DEPROVISIONED"), b"{}")).seq
    asked: list[bytes] = []

    async def ask(msg: Msg) -> None:
        asked.append(msg.data)

    spy = await nc.subscribe("$JS.API.DIRECT.GET.HP_NODE_EVENTS", cb=ask)

    tail = Tail(nc, "HP_NODE_EVENTS", every_s=0.05)
    everything, removals, later = Seen(), Seen(), Seen()
    tail.add(f"{subjects.PREFIX}.event.>", everything, start_seq=1)
    tail.add(subjects.event_type_filters(["NODE_DEPROVISIONED", "NODE_REPLACED"]), removals, start_seq=gone + 1)
    stopping = asyncio.Event()
    running = asyncio.create_task(tail.run(stopping))
    try:
        await _until(lambda: everything.caught_up and removals.caught_up, "both caught up")
        assert len(everything.seqs) == 301 and everything.seqs == sorted(everything.seqs)
        assert removals.subjects == []  # n7's removal was stored before its start
        # A follower added while the tail runs, from the beginning: the tail reads back for it
        # and the others are not handed anything twice.
        tail.add(subjects.event_type_filters(["NODE_DEPROVISIONED"]), later, start_seq=1)
        await _until(lambda: later.caught_up, "the later follower caught up")
        assert later.subjects == [_event("n7", "NODE_DEPROVISIONED")]
        for n in range(50):
            await js.publish(_event(f"n{n}", "SCORE_CHANGED"), b"{}")
        replaced = (await js.publish(_event("n9", "NODE_REPLACED"), b"{}")).seq
        await _until(lambda: removals.subjects == [_event("n9", "NODE_REPLACED")], "the replacement")
        assert removals.seqs == [replaced]
        await _until(lambda: len(everything.seqs) == 352, "every record once")
        assert len(set(everything.seqs)) == 352 and everything.seqs == sorted(everything.seqs)
        assert later.subjects == [_event("n7", "NODE_DEPROVISIONED")]
    finally:
        stopping.set()
        await running
        await spy.unsubscribe()
    # Never a subject filter for the server to match against every node's subjects.
    assert asked and not [body for body in asked if b"next_by_subj" in body]


@pytest.mark.parametrize("reader", ["Tail", "follow"])
async def test_a_follower_told_to_stop_with_its_bus_gone_stops_at_once(nats_server: NatsServer, nc: NATS,
                                                                        js: JetStreamContext, reader: str) -> None:
    # A round asked of a server that went away is never answered: a stop must not wait it
    # out (10 s), or the service it runs in outlasts its supervisor's grace and is killed.
    await js.publish(_event("n1", "NODE_REGISTERED"), b"{}")
    seen, stopping = Seen(), asyncio.Event()
    if reader == "Tail":
        tail = Tail(nc, "HP_NODE_EVENTS", every_s=0.05)
        tail.add("hp.event.>", seen, start_seq=1)
        running = asyncio.create_task(tail.run(stopping))
    else:
        running = asyncio.create_task(follow(nc, "HP_NODE_EVENTS", "hp.event.>", seen, start_seq=1,
                                             stopping=stopping, every_s=0.05))
    await _until(lambda: seen.caught_up and len(seen.seqs) == 1, f"the record read ({seen.seqs}, {seen.caught_up})")
    await asyncio.to_thread(nats_server.stop)
    await asyncio.sleep(0.5)  # a round asked of the server that is gone
    stop_at = asyncio.get_running_loop().time()
    stopping.set()
    await asyncio.wait_for(running, 10)
    assert asyncio.get_running_loop().time() - stop_at < 1.0
    await asyncio.to_thread(nats_server.start)  # the connection's own end, for the fixture
    await _until(lambda: nc.is_connected, "reconnected")
