"""Running one service process: logs, metrics endpoint, connection, streams, signals.

``run_service`` is the one entry point every ``healthplane service NAME`` goes through.
SIGTERM/SIGINT set ``ctx.stopping``; the service finishes the batch in hand, acks,
snapshots and returns, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from prometheus_client import REGISTRY
from prometheus_client.registry import Collector

from healthplane import streams
from healthplane.runtime import connect, logs, metrics
from healthplane.runtime.processor import Core, Input, Processor

S = TypeVar("S")


@dataclass
class ServiceContext:
    name: str
    nc: NATS
    js: JetStreamContext
    log: Any
    metrics_url: str
    stopping: asyncio.Event


ServiceMain = Callable[[ServiceContext], Awaitable[None]]


async def _run(name: str, main: ServiceMain, nats_url: str | None, creds: str | None,
               metrics_port: int) -> int:
    log = logs.configure(name)
    endpoint = metrics.serve(metrics_port)
    log.info("metrics endpoint", url=endpoint.url)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    closed = asyncio.Event()
    nc = await connect.connect(nats_url, name=f"healthplane-{name}", creds=creds, log=log, closed=closed)
    js = nc.jetstream(publish_async_max_pending=8192)
    lost = asyncio.create_task(_closed_for_good(closed, stopping))
    try:
        # Existing streams keep the replicas their operator chose; missing ones get R3 on a
        # cluster, R1 on one server (HA-1).
        await streams.ensure(js, servers=len(nc.servers))
        ctx = ServiceContext(name, nc, js, log, endpoint.url, stopping)
        log.info("service started", nats_url=nats_url or connect.default_url())
        await main(ctx)
    finally:
        lost.cancel()
        if not nc.is_closed:
            await nc.drain()
    if nc.is_closed and lost.done() and not lost.cancelled() and lost.result():
        # The server closed it and nats-py will not reconnect (a revoked identity): exit so
        # the supervisor says so, instead of running on with no bus.
        log.error("service stopped: the server closed the connection", error=str(nc.last_error or ""))
        return 1
    log.info("service stopped")
    return 0


async def _closed_for_good(closed: asyncio.Event, stopping: asyncio.Event) -> bool:
    await closed.wait()
    stopping.set()
    return True


def run_service(name: str, main: ServiceMain, *, nats_url: str | None = None,
                creds: str | None = None, metrics_port: int = 0) -> int:
    try:
        return asyncio.run(_run(name, main, nats_url, creds, metrics_port))
    except streams.StreamConflict as exc:
        logs.get(service=name).error("cannot start", reason=str(exc))
        return 1


async def until_stopped(ctx: ServiceContext, *runners: Any) -> None:
    """Run processors (anything with ``run()``/``stop()``) until a signal arrives."""
    tasks = [asyncio.create_task(r.run()) for r in runners]
    waiter = asyncio.create_task(ctx.stopping.wait())
    await asyncio.wait([*tasks, waiter], return_when=asyncio.FIRST_COMPLETED)
    for runner in runners:
        runner.stop()
    await asyncio.gather(*tasks)
    waiter.cancel()


def run_processor_service(args: Any, service: str, core: Callable[[ServiceContext], Core[S]], state_type: type[S],
                          inputs: Sequence[Input], outputs: Sequence[str], *,
                          series: Callable[[Callable[[], S]], Collector] | None = None) -> int:
    """``healthplane service NAME`` for a service that is one Processor: build it, register its
    state-derived metrics (``series``), run it until a signal arrives."""

    async def serve(ctx: ServiceContext) -> None:
        proc = Processor(nc=ctx.nc, js=ctx.js, service=service, core=core(ctx), state_type=state_type,
                         inputs=inputs, outputs=outputs, batch=512, log=ctx.log)
        if series is not None:
            REGISTRY.register(series(lambda: proc.state))
        await proc.start()
        await until_stopped(ctx, proc)

    return run_service(service, serve, nats_url=args.nats_url, creds=args.creds, metrics_port=args.metrics_port)
