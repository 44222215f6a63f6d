"""The pieces of an end-to-end pipeline test on real servers: a fleet of collectors that
publishes as production does (Nats-Msg-Id, retried until acknowledged), services as their own
processes, and a bounded wait. Shared by the HA-2..4 tests."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.runtime.connect import connect
from healthplane.runtime.fold import Inbound
from healthplane.runtime.replay import read_all, replay
from healthplane.stack.natsserver import NatsCluster, NatsServer
from healthplane_collector.agent import Collector, Settings
from healthplane_collector.sim import SimNode
from healthplane_scorer.fold import ScorerCore, node_view
from tests.support.secure import creds_for, env_for

CLUSTER = "lab"
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@dataclass
class Fleet:
    """Collectors of ``nodes`` publishing one report each per round (every 0.2 s), each retried
    with the same Nats-Msg-Id until acknowledged, as the agent does; node ``i`` gets an Xid in
    round ``8 + i``, so there are events to count."""

    js: JetStreamContext
    nodes: Sequence[str]
    acked: dict[str, list[str]] = field(default_factory=dict)  # node -> msg ids acknowledged
    ack_times: list[float] = field(default_factory=list)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self.run())

    async def stop(self) -> None:
        """No more rounds; returns once the round in hand is acknowledged."""
        self.stopping.set()
        if self._task is not None:
            await self._task

    async def run(self) -> None:
        sims = {node: SimNode(node) for node in self.nodes}
        collectors = {node: Collector(Settings(node_id=node, cluster=CLUSTER, interval_s=3600), sim, sim.kmsg)
                      for node, sim in sims.items()}
        for collector in collectors.values():
            collector.refresh_inventory()
        round_ = 0
        while not self.stopping.is_set():
            round_ += 1
            for index, node in enumerate(self.nodes):
                if round_ == 8 + index:
                    sims[node].inject("xid:48", 0, T0)
                report = await collectors[node].collect("scheduled", T0 + timedelta(seconds=round_))
                await self._publish(node, f"{node}:{round_}", wire.encode(report))
            await asyncio.sleep(0.2)

    async def _publish(self, node: str, msg_id: str, payload: bytes) -> None:
        delay = 0.05
        while True:
            try:
                await self.js.publish(subjects.report(CLUSTER, node), payload, timeout=2,
                                      headers={"Nats-Msg-Id": msg_id})
            except Exception:  # no responders, a timeout while the stream elects a leader
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)
                continue
            self.acked.setdefault(node, []).append(msg_id)
            self.ack_times.append(time.monotonic())
            return

    def last_round(self) -> dict[str, int]:
        return {node: int(ids[-1].rpartition(":")[2]) for node, ids in self.acked.items()}

    def longest_gap_after(self, moment: float) -> float:
        """The longest time without an acknowledged publish since ``moment``; while none has
        come since, the time until now (the views can resume before the publishers hear an
        ack: reports stored just before a leader's kill are folded while their acks were lost)."""
        times = [moment, *[t for t in self.ack_times if t >= moment]]
        if len(times) == 1:
            times.append(time.monotonic())
        return max(b - a for a, b in pairwise(times))


def service(servers: NatsServer | NatsCluster, name: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    """``healthplane service NAME ARGS`` as its own identity; the log's stem names the replica."""
    return subprocess.Popen([sys.executable, "-m", "healthplane.cli", "service", name, *args],
                            env=env_for(servers, name, HEALTHPLANE_INSTANCE=log.stem),
                            stdout=subprocess.DEVNULL, stderr=open(log, "ab"), stdin=subprocess.DEVNULL)


async def until(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> float:
    """Seconds until ``check`` holds; an AssertionError naming ``what`` past ``timeout``."""
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(0.1)
    return time.monotonic() - started


async def viewed_all(nc: NATS, js: JetStreamContext, fleet: Fleet) -> bool:
    """Every node of the fleet has a view."""
    return len(await read_all(nc, js, "HP_NODES", "hp.node.>", last_per_subject=True)) == len(fleet.nodes)


async def caught_up(nc: NATS, js: JetStreamContext, fleet: Fleet) -> bool:
    """Ingest folded every acknowledged report, the scorer every assessment: each node's
    latest assessment is of its last acknowledged report, and its view of that assessment."""
    last_round = fleet.last_round()
    assessed = [wire.decode(wire.Assessment, m.data)
                for m in await read_all(nc, js, "HP_ASSESSMENTS", "hp.assess.>", last_per_subject=True)]
    views = {v.node_id: v for v in (wire.decode(wire.NodeView, m.data) for m in
                                    await read_all(nc, js, "HP_NODES", "hp.node.>", last_per_subject=True))}
    return len(assessed) == len(fleet.nodes) and all(
        a.report_sent_at == T0 + timedelta(seconds=last_round[a.node_id])
        and a.node_id in views and _viewed(views[a.node_id], a) for a in assessed)


def _viewed(view: wire.NodeView, assessment: wire.Assessment) -> bool:
    """The view is of this assessment's report, or, for a quiet node (no condition), of an
    earlier one the scorer has not rewritten since (it does every third report)."""
    if view.last_reported_at == assessment.last_report_at:
        return True
    return (not assessment.conditions and not view.conditions and view.last_reported_at is not None
            and assessment.last_report_at is not None and view.last_reported_at < assessment.last_report_at)


def view_of(view: wire.NodeView | None, folded: wire.NodeView) -> bool:
    """Whether ``view``, as the scorer wrote it, is the view of the ``folded`` state: equal, or
    for a quiet node (no condition, score 100) equal but for an older ``lastReportedAt``."""
    if view is None or view == folded:
        return view is not None
    quiet = not folded.conditions and folded.score == 100
    return (quiet and view.last_reported_at is not None and folded.last_reported_at is not None
            and view.last_reported_at < folded.last_reported_at
            and msgspec.structs.replace(view, last_reported_at=None)
            == msgspec.structs.replace(folded, last_reported_at=None))


async def clients(servers: NatsServer | NatsCluster, name: str) -> tuple[NATS, NATS]:
    """The test's own connection (a maintainer: it makes the streams, SEC-10) and the fleet's
    (the cluster's simulator identity)."""
    nc = await connect(servers.url, name=name, creds=creds_for(servers, "maintainer", "test"), give_up_after=10)
    sim_nc = await connect(servers.url, name=f"{name}-fleet", creds=creds_for(servers, "sim", CLUSTER),
                           give_up_after=10)
    return nc, sim_nc


def stop_all(processes: dict[str, subprocess.Popen[bytes]]) -> None:
    for process in processes.values():
        if process.poll() is None:
            process.terminate()
    for process in processes.values():
        process.wait(30)


@contextlib.asynccontextmanager
async def publishing(fleet: Fleet, processes: dict[str, subprocess.Popen[bytes]]) -> AsyncIterator[None]:
    """The fleet publishing while the block runs; then it stops, and so do the processes."""
    fleet.start()
    try:
        yield
    finally:
        await fleet.stop()
        stop_all(processes)


async def finish(nc: NATS, js: JetStreamContext, fleet: Fleet, timeout: float) -> None:
    """Stop publishing and wait until every acknowledged report has been folded through."""
    await fleet.stop()
    await until(lambda: caught_up(nc, js, fleet), timeout, "every node assessed and viewed at its last report")


async def assert_views_equal_a_replay(nc: NATS, js: JetStreamContext, fleet: Fleet) -> None:
    """HA-3/4: the scorer's views, however many replicas and partitions wrote them, equal a
    replay of the assessments by one core."""
    core, state = ScorerCore(), ScorerCore().initial_state()
    async for msg in replay(js, "HP_ASSESSMENTS", "hp.assess.>"):
        state, _, _ = core.step(state, Inbound("HP_ASSESSMENTS", msg.seq, msg.subject, msg.data,
                                            {}, T0, True))
    latest = {v.node_id: v for v in (wire.decode(wire.NodeView, m.data) for m in
                                     await read_all(nc, js, "HP_NODES", "hp.node.>", last_per_subject=True))}
    assert set(latest) == set(fleet.nodes)
    for node in state.nodes.values():
        assert view_of(latest[node.node_id], node_view(state, node)), node.node_id
