"""``healthplane service scorer``: the lease, the Processor, and the node series.

Replicas are warm standbys: only the lease holder consumes and appends, so SCORE_CHANGED and
the node views have one writer and every replica does not each need a full consumer of its
own. A standby takes the lease within its TTL when the holder dies, then restores the latest
snapshot and replays what came after it. A holder that loses the lease (a partition longer
than the TTL, or an event loop frozen past it) is fenced off: its Processor asks the lease
before every write (``Lease.fence``), stops before writing anything more, snapshot included,
and the replica goes back to waiting. Every output carries the lease revision it was written
under.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket

from prometheus_client import REGISTRY

from healthplane.runtime.lease import Lease
from healthplane.runtime.lifecycle import ServiceContext, run_service
from healthplane.runtime.processor import LeaseLost, Processor
from healthplane_scorer.fold import INPUTS, OUTPUTS, SERVICE, ScorerCore, ScorerState
from healthplane_scorer.metrics import NodeSeries


def main(args: argparse.Namespace) -> int:
    async def serve(ctx: ServiceContext) -> None:
        leading = asyncio.Event()
        lost = asyncio.Event()

        def on_change(leader: bool) -> None:
            (leading if leader else lost).set()

        lease = Lease(ctx.js, SERVICE, f"{socket.gethostname()}:{os.getpid()}", on_change=on_change, log=ctx.log)
        active: list[Processor[ScorerState]] = []  # the Processor while this replica leads
        REGISTRY.register(NodeSeries(lambda: active[0].state if active else ScorerState(),
                                     lambda: lease.is_leader and bool(active)))
        holder = asyncio.create_task(lease.run(ctx.stopping))
        try:
            while not ctx.stopping.is_set():
                if not await _first(leading, ctx.stopping):
                    break
                leading.clear()
                lost.clear()
                proc = Processor(nc=ctx.nc, js=ctx.js, service=SERVICE, core=ScorerCore(), state_type=ScorerState,
                                 inputs=INPUTS, outputs=OUTPUTS, batch=512, log=ctx.log, fence=lease.fence)
                try:
                    await proc.start()
                    active[:] = [proc]
                    running = asyncio.create_task(proc.run())
                    await _first(lost, ctx.stopping, done=running)
                    active.clear()
                    proc.stop()
                    await running
                except LeaseLost:
                    active.clear()
                if not ctx.stopping.is_set():
                    ctx.log.warning("lease lost: stopped appending, waiting to lead again")
        finally:
            await holder

    return run_service(SERVICE, serve, nats_url=args.nats_url, creds=args.creds, metrics_port=args.metrics_port)


async def _first(event: asyncio.Event, stopping: asyncio.Event, done: asyncio.Task[None] | None = None) -> bool:
    """Wait for ``event``, ``stopping`` or ``done``; True only when ``event`` came first."""
    waiters = [asyncio.create_task(event.wait()), asyncio.create_task(stopping.wait())]
    await asyncio.wait([*waiters, *([done] if done else [])], return_when=asyncio.FIRST_COMPLETED)
    for waiter in waiters:
        waiter.cancel()
    return event.is_set() and not stopping.is_set()
