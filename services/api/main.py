"""``healthplane service api``: the HTTP API and the web UI (API-1..5), wiring only.

The routes are ``app``, the live index ``live``/``fold``, who may do what ``auth``. The
process reads with its own identity (the ``api`` service: read-only, every stream) and
commands only as the caller. uvicorn serves the app on this service's event loop; the
signals stay ``runtime.lifecycle``'s, so a stop is the same as every service's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

import pydantic
import uvicorn

from healthplane.client import federation
from healthplane.runtime import metrics
from healthplane.runtime.connect import default_creds
from healthplane.runtime.lifecycle import ServiceContext, run_service
from healthplane.runtime.settings import EnvSettings
from healthplane_api import auth, live
from healthplane_api.app import Backend, build
from healthplane_api.metrics import FEDERATION_DATA_AGE, FEDERATION_LAG, FEDERATION_REACHABLE

SERVICE = "api"


class Settings(EnvSettings):
    host: str = pydantic.Field("127.0.0.1", alias="API_HOST")
    port: int = pydantic.Field(8780, ge=0, le=65535, alias="API_PORT")
    federation_hub: bool = pydantic.Field(False, alias="FEDERATION_HUB")  # `up --federation-hub` sets it


class _Embedded(uvicorn.Server):
    """uvicorn on a loop it does not own: the process's signals are lifecycle's."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def main(args: argparse.Namespace) -> int:
    # Without credentials of its own the API is on an open bus (up --insecure): nothing can
    # say who a caller is, so it serves reads to anyone and takes no commands.
    callers = auth.Callers(args.nats_url, open_bus=not (args.creds or default_creds()))
    try:
        threshold = federation.unreachable_after_s()
    except federation.FederationError as exc:
        print(f"healthplane service api: {exc}", file=sys.stderr)
        return 2

    async def serve(ctx: ServiceContext) -> None:
        settings: Settings = ctx.settings
        feed = live.Feed(ctx.log)
        # /readyz: ready once every node's latest view is in the index (the first full read).
        metrics.readiness(SERVICE, lambda: (True, "node views read") if feed.loaded.is_set() and feed.readable
                          else (False, feed.unreadable_reason if feed.loaded.is_set() else "reading node views"))
        backend = Backend(ctx.nc, ctx.js, feed, callers, ctx.log, hub=settings.federation_hub)
        server = _Embedded(uvicorn.Config(build(backend), host=settings.host, port=settings.port, http="h11",
                                          ws="none", lifespan="off", log_config=None, access_log=False,
                                          timeout_keep_alive=5, timeout_graceful_shutdown=1,
                                          limit_concurrency=1000, server_header=False))
        try:  # bound here, not by uvicorn: a port in use is one line and exit 1, and the URL is known
            listening = _listen(settings.host, settings.port)
        except OSError as exc:
            ctx.log.error("api cannot listen", host=settings.host, port=settings.port, error=str(exc))
            raise SystemExit(1) from None
        folding = asyncio.create_task(feed.run(ctx.nc, ctx.js, ctx.stopping))
        serving = asyncio.create_task(server.serve(sockets=[listening]))
        sweeping = asyncio.create_task(_sweep(callers, ctx.stopping))
        watching = asyncio.create_task(_watch_members(ctx, threshold)) if settings.federation_hub else None
        port = listening.getsockname()[1]
        ctx.log.info("api listening", url=f"http://{settings.host}:{port}/", insecure=callers.open)
        await ctx.stopping.wait()
        server.should_exit = True
        await asyncio.gather(serving, folding, sweeping, *([watching] if watching else []), return_exceptions=True)
        await callers.close()

    return run_service(SERVICE, serve, nats_url=args.nats_url, creds=args.creds, metrics_port=args.metrics_port,
                       settings=Settings)


def _listen(host: str, port: int) -> socket.socket:
    listening = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart takes its port back at once
    listening.bind((host, port))
    listening.listen(1024)
    listening.setblocking(False)
    return listening


async def _sweep(callers: auth.Callers, stopping: asyncio.Event) -> None:
    while not stopping.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), 30.0)
        await callers.sweep()


MEMBERS_EVERY_S = 2.0


async def _watch_members(ctx: ServiceContext, threshold: float) -> None:
    """A hub's view of its members, as series and as a log line when one comes or goes (FED-2)."""
    reachable: dict[str, bool] = {}
    while not ctx.stopping.is_set():
        try:
            found = await federation.members(ctx.nc)
        except (federation.FederationError, TimeoutError, ConnectionError) as exc:
            ctx.log.warning("federation members not read", error=str(exc))
            found = None
        if found is not None:
            now = datetime.now(UTC)
            for gone in set(reachable) - {m.name for m in found}:
                for gauge in (FEDERATION_REACHABLE, FEDERATION_DATA_AGE, FEDERATION_LAG):
                    gauge.remove(gone)
                del reachable[gone]
            for member in found:
                now_reachable = member.reachable(now, threshold)
                if reachable.get(member.name) != now_reachable:
                    if now_reachable:
                        ctx.log.info("federation member reachable", cluster=member.name)
                    else:
                        ctx.log.warning("federation member unreachable", cluster=member.name,
                                        reason=member.why_no_health())
                reachable[member.name] = now_reachable
                FEDERATION_REACHABLE.labels(member.name).set(1 if now_reachable else 0)
                FEDERATION_LAG.labels(member.name).set(member.lag)
                age = member.data_age_s(now)
                FEDERATION_DATA_AGE.labels(member.name).set(float("inf") if age is None else age)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ctx.stopping.wait(), MEMBERS_EVERY_S)
