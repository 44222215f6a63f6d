"""``healthplane sim load``: a simulated fleet of 100,000 nodes that is not the bottleneck.

``sim run`` runs a real Collector per node (the agent's whole cycle, a task and a timer each):
right for a few hundred nodes, and 1.4 GB and a core for 50,000. Here a healthy node costs a
slot in one list and its reports are cut from bytes encoded once:

* **Templates.** One template node's reports (its first resource report, the ``start`` and
  ``scheduled`` health reports, the ready resource report) are encoded once by the real
  Collector and cut where a node or the clock shows through: node id, the disk's serial, the
  boot id, the GPUs' UUIDs, ``sentAt``. A node's report is those pieces joined with its own
  values, which are what :class:`SimNode` derives for it (its seeded RNG), so a node whose
  fault is injected is handed to a full SimNode without its inventory changing.
* **Schedule.** Node ``i`` of ``N`` reports at ``t0 + (k + i / N) * interval``: the fleet's
  first reports are spread over one interval, and one loop sends whatever is due, with no
  timer per node. Behind by more than an interval (the bus too slow), it skips ahead and
  counts what it skipped instead of bunching reports up.
* **Bounded.** At most ``in_flight`` reports unacknowledged (the Publisher's window); a
  publish that fails is not retried (the node's next report supersedes it, as an agent's
  does), and failures pause the loop with a jittered backoff instead of storming.
* **Faults keep their meaning.** ``sim inject`` (the same subject as ``sim run``) moves the
  node to a full SimNode and agent, which reports the fault at once (its first report) and from
  then on; a terminated instance goes silent.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import msgspec
from prometheus_client import Counter

from healthplane.contracts import domains, subjects, wire
from healthplane.runtime.backoff import Backoff
from healthplane_collector.agent import Collector, Settings, run_agent
from healthplane_collector.sim import (
    FaultError,
    InjectReply,
    InjectRequest,
    SimNode,
    serve_injections,
    sim_rack,
    terminations_subject,
)

TEMPLATE_ID: Final = "hp-loadgen-template-node"
TEMPLATE_RACK: Final = "hp-loadgen-template-rack"  # the hole of a node's rack (--rack-size, DOM-1)
TICK_S: Final = 0.005
SENT = Counter("healthplane_loadgen_reports_total", "Reports the load generator sent", ["outcome"])


@dataclass(frozen=True, slots=True)
class Cut:
    """An encoded record cut at its holes: ``literals[0] + value[holes[0]] + literals[1] + …``."""

    literals: tuple[bytes, ...]
    holes: tuple[int, ...]

    @classmethod
    def of(cls, encoded: bytes, placeholders: Sequence[bytes]) -> Cut:
        pattern = re.compile(b"|".join(re.escape(p) for p in sorted(placeholders, key=len, reverse=True)))
        literals, holes, at = [], [], 0
        for match in pattern.finditer(encoded):
            literals.append(encoded[at:match.start()])
            holes.append(placeholders.index(match.group()))
            at = match.end()
        literals.append(encoded[at:])
        return cls(tuple(literals), tuple(holes))

    def fill(self, values: Sequence[bytes]) -> bytes:
        parts = [self.literals[0]]
        for hole, literal in zip(self.holes, self.literals[1:], strict=True):
            parts.append(values[hole])
            parts.append(literal)
        return b"".join(parts)


def _identity(node_id: str, gpus: int) -> list[bytes]:
    """What differs between two healthy simulated nodes besides the clock: node id, the disk's
    serial, the boot id and the GPUs' UUIDs, as SimNode derives them."""
    rng = random.Random(f"{node_id}:0")
    boot = str(uuid.UUID(int=rng.getrandbits(128)))
    uuids = [f"GPU-{uuid.UUID(int=rng.getrandbits(128))}" for _ in range(gpus)]
    return [node_id.encode(), f"S6{node_id[-6:]}".encode(), boot.encode(), *(u.encode() for u in uuids)]


@dataclass(frozen=True, slots=True)
class Templates:
    """The four records a healthy node sends, cut at its identity and the clock."""

    resource_initial: Cut
    report_start: Cut
    report_scheduled: Cut
    resource_ready: Cut

    @classmethod
    async def build(cls, cluster: str, interval_s: int, gpus: int, definition: str = "gpu-pool",
                    racks: bool = False) -> Templates:
        """``racks``: the resource reports tell a rack, filled in per node (the last hole)."""
        node = SimNode(TEMPLATE_ID, gpus)
        annotations = domains.told_annotations({"rack": TEMPLATE_RACK}) if racks else {}
        collector = Collector(Settings(node_id=TEMPLATE_ID, cluster=cluster, interval_s=interval_s,
                                       definition=definition, annotations=annotations), node, node.kmsg)
        collector.refresh_inventory()
        await collector.probe(("gpu",))
        clock = datetime(2000, 1, 1, tzinfo=UTC)
        holes = [*_identity(TEMPLATE_ID, gpus), _timestamp(clock), TEMPLATE_RACK.encode()]
        return cls(resource_initial=Cut.of(wire.encode(collector.resource_report(False, clock)), holes),  # type: ignore[arg-type]
                   report_start=Cut.of(wire.encode(await collector.collect("start", clock)), holes),
                   report_scheduled=Cut.of(wire.encode(await collector.collect("scheduled", clock)), holes),
                   resource_ready=Cut.of(wire.encode(collector.resource_report(True, clock)), holes))  # type: ignore[arg-type]


def _timestamp(at: datetime) -> bytes:
    return msgspec.json.encode(at)[1:-1]  # without its quotes: it goes inside the template's


class LoadFleet:
    """``count`` nodes (``{prefix}{i:06d}``) reporting every ``interval_s``; see the module."""

    def __init__(self, count: int, cluster: str = "default", interval_s: int = 30, prefix: str = "load-",
                 gpus: int = 8, in_flight: int = 4096, rack_size: int = 0) -> None:
        self.count, self.cluster, self.interval_s, self.prefix, self.gpus = count, cluster, interval_s, prefix, gpus
        self.rack_size = rack_size  # every rack_size nodes in a row tell one rack (0: none)
        self.in_flight = in_flight
        # Made at a node's first report: a node with one has sent its first cycle.
        self._identities: list[list[bytes] | None] = [None] * count
        self._full: dict[int, SimNode] = {}  # nodes a fault moved to a whole agent
        self._silent: set[int] = set()
        self.sent = self.failed = self.skipped = 0

    def node_id(self, index: int) -> str:
        return f"{self.prefix}{index:06d}"

    def index_of(self, node_id: str) -> int | None:
        number = node_id.removeprefix(self.prefix)
        if not node_id.startswith(self.prefix) or not number.isdigit() or int(number) >= self.count:
            return None
        return int(number)

    def records(self, index: int, templates: Templates, now: datetime) -> list[tuple[str, bytes]]:
        """What node ``index`` sends at ``now``: its first cycle (resource report, start report,
        ready resource report), or one scheduled report."""
        identity = self._identities[index]
        node_id = self.node_id(index)
        report = subjects.report(self.cluster, node_id)
        if identity is not None:
            return [(report, templates.report_scheduled.fill([*identity, _timestamp(now)]))]
        identity = self._identities[index] = _identity(node_id, self.gpus)
        rack = sim_rack(self.rack_size, index)
        values = [*identity, _timestamp(now), next(iter(rack.values()), "").encode()]
        resource = subjects.resource(self.cluster, node_id)
        return [(resource, templates.resource_initial.fill(values)), (report, templates.report_start.fill(values)),
                (resource, templates.resource_ready.fill(values))]

    def take_over(self, index: int) -> SimNode:
        """Node ``index`` as a whole SimNode from now on (a fault is being injected into it)."""
        node = self._full.get(index)
        if node is None:
            node = self._full[index] = SimNode(self.node_id(index), self.gpus)
        return node

    async def run(self, nc: Any, stopping: asyncio.Event, log: Any) -> None:
        from healthplane.runtime.publish import Publisher

        templates = await Templates.build(self.cluster, self.interval_s, self.gpus, racks=self.rack_size > 0)
        publisher = Publisher(nc, window=self.in_flight)
        agents: list[asyncio.Task[None]] = []

        def inject(request: InjectRequest) -> InjectReply:
            index = self.index_of(request.node_id)
            if index is None:
                return InjectReply(ok=False, message=f"no simulated node {request.node_id!r} in cluster {self.cluster}")
            fresh = index not in self._full
            node = self.take_over(index)
            try:
                reply = InjectReply(ok=True, message=node.inject(request.fault, request.gpu, datetime.now(UTC)))
            except FaultError as exc:  # an unknown fault, a GPU it does not have
                reply = InjectReply(ok=False, message=str(exc))
            if fresh:
                agents.append(asyncio.create_task(self._agent(node, publisher, stopping, log)))
            return reply

        async def on_terminated(msg: Any) -> None:
            try:
                result = wire.decode(wire.TerminationResult, msg.data)
            except wire.WireError:
                return
            index = self.index_of(result.node_id)
            if result.accepted and index is not None:
                self._silent.add(index)
                if index in self._full:
                    self._full[index].silent = True

        await serve_injections(nc, self.cluster, inject, log)
        await nc.subscribe(terminations_subject(self.cluster), cb=on_terminated)
        try:
            await self._send_due(publisher, templates, stopping, log)
        finally:
            for agent in agents:
                agent.cancel()
            await asyncio.gather(*agents, return_exceptions=True)

    async def _agent(self, node: SimNode, publisher: Any, stopping: asyncio.Event, log: Any) -> None:
        collector = Collector(Settings(node_id=node.node_id, cluster=self.cluster, interval_s=self.interval_s,
                                       definition="gpu-pool",
                                       annotations=sim_rack(self.rack_size, self.index_of(node.node_id) or 0)),
                              node, node.kmsg)

        async def publish(subject: str, payload: bytes) -> None:
            if not node.silent:
                await publisher.wait(subject, await publisher.submit(subject, payload))

        # Its first report, at once, carries the fault, as the report a kmsg line makes would.
        await run_agent(collector, publish, stopping, node.out_of_band, log.bind(node_id=node.node_id))

    async def _send_due(self, publisher: Any, templates: Templates, stopping: asyncio.Event, log: Any) -> None:
        """Send, every tick, the reports due since the last one (the fleet's schedule as a
        running count: ``due(t) = floor((t - t0) / interval * N)``), never more than
        ``in_flight`` unanswered; one unanswered past the ack timeout is given up."""
        started = time.monotonic()
        done = 0  # reports handed out so far, over all rounds
        backoff = Backoff(0.05, 2.0, jitter=0.5)  # generators started together do not retry in step
        unanswered: deque[tuple[float, asyncio.Future[Any]]] = deque()
        per_s = self.count / self.interval_s

        waiting = 0  # submitted and not settled

        def settled(future: asyncio.Future[Any]) -> None:
            nonlocal waiting
            waiting -= 1
            if future.cancelled() or future.exception() is not None:
                self.failed += 1
                SENT.labels("failed").inc()
            else:
                self.sent += 1
                SENT.labels("acked").inc()

        while not stopping.is_set():
            now = time.monotonic()
            while unanswered and (unanswered[0][1].done() or now - unanswered[0][0] > publisher.ack_timeout_s):
                _, future = unanswered.popleft()
                if not future.done():
                    publisher.abandon(future)  # never will be answered: its slot back
            due = int((now - started) * per_s)
            if due - done > self.count:  # an interval behind: skip ahead rather than bunch up
                self.skipped += due - done - self.count
                SENT.labels("skipped").inc(due - done - self.count)
                done = due - self.count
            failed_before = self.failed
            sent_at = datetime.now(UTC)
            while done < due and waiting < self.in_flight - 3 and not stopping.is_set():
                index = done % self.count
                done += 1
                if index in self._full or index in self._silent:
                    continue
                for subject, payload in self.records(index, templates, sent_at):
                    future = await publisher.submit(subject, payload)
                    waiting += 1
                    future.add_done_callback(settled)
                    unanswered.append((now, future))
            if self.failed > failed_before:
                delay = backoff.next()
                log.warning("publishes failing, backing off", failed=self.failed - failed_before, delay_s=delay)
                await _pause(stopping, delay)
            else:
                backoff.reset()
                await _pause(stopping, TICK_S)


async def _pause(stopping: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stopping.wait(), seconds)
    except TimeoutError:
        pass
