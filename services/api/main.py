"""``healthplane service api``: the HTTP API and web UI (server.py) on the service's connection."""

from __future__ import annotations

import argparse
import asyncio
import sys

import uvicorn

from healthplane.client import federation
from healthplane.runtime import metrics
from healthplane.runtime.connect import default_creds
from healthplane.runtime.lifecycle import ServiceContext, port_in_use, run_service
from healthplane_api import auth, live
from healthplane_api.app import Backend, build
from healthplane_api.metrics import BreakfixSeries
from healthplane_api.server import (
    SERVICE,
    MembersWatched,
    Settings,
    _Embedded,
    _listen,
    _sweep,
    _watch_members,
)


def main(args: argparse.Namespace) -> int:
    # Without credentials of its own the API is on an open bus (up --insecure): nothing can
    # say who a caller is, so it serves reads to anyone and takes no commands.
    own_creds = args.creds or default_creds()
    signers = auth.token_signers_beside(own_creds)
    callers = auth.Callers(args.nats_url, open_bus=not own_creds, signers=signers)
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
        watched = MembersWatched() if settings.federation_hub else None
        # UI-2: the dashboard's 24 h of node events, the control plane's own state, the figures.
        recent = live.Recent(ctx.log, feed)
        boards = live.Dashboards(feed, recent, live.Plane(ctx.log))
        # Issue 41.5: the breakfix figures as series, the same on every replica (each folds every stored event).
        figures = live.Breakfix(ctx.log)
        if not settings.federation_hub:
            metrics.register_series(BreakfixSeries(figures))
        backend = Backend(ctx.nc, ctx.js, feed, callers, ctx.log, hub=settings.federation_hub, stopping=ctx.stopping,
                          grafana_url=settings.grafana_url, members=watched, boards=boards)
        server = _Embedded(uvicorn.Config(build(backend), host=settings.host, port=settings.port, http="h11",
                                          ws="none", lifespan="off", log_config=None, access_log=False,
                                          timeout_keep_alive=5, timeout_graceful_shutdown=1,
                                          limit_concurrency=1000, server_header=False))
        try:  # bound here, not by uvicorn: a port in use is one line and exit 1, and the URL is known
            listening = _listen(settings.host, settings.port)
        except OSError as exc:
            ctx.log.error("api cannot listen", host=settings.host, port=settings.port, error=str(exc))
            raise SystemExit(port_in_use(exc)) from None
        events = live.node_events(ctx.nc, ctx.log)  # one read of the node events for the three of them
        folding = asyncio.create_task(feed.run(ctx.nc, ctx.js, ctx.stopping, events))
        recalling = (asyncio.create_task(recent.run(ctx.nc, ctx.js, ctx.stopping, events))
                     if not settings.federation_hub else None)
        if not settings.federation_hub:
            figures.follow(events)
        tailing = asyncio.create_task(events.run(ctx.stopping))
        serving = asyncio.create_task(server.serve(sockets=[listening]))
        sweeping = asyncio.create_task(_sweep(callers, ctx.stopping))
        watching = asyncio.create_task(_watch_members(ctx, threshold, watched)) if settings.federation_hub else None
        port = listening.getsockname()[1]
        ctx.log.info("api listening", url=f"http://{settings.host}:{port}/", insecure=callers.open)
        if own_creds and signers is None:
            ctx.log.warning("bearer tokens are checked by nats-server only, at connect (no readable "
                            "token-signers.json beside the api's credentials: a key directory `up` or `creds` "
                            "has not re-signed, or the file is damaged)")
        await ctx.stopping.wait()
        server.should_exit = True
        await asyncio.gather(serving, folding, tailing, sweeping, *[t for t in (watching, recalling) if t is not None],
                             return_exceptions=True)
        await callers.close()

    return run_service(SERVICE, serve, nats_url=args.nats_url, creds=args.creds, metrics_port=args.metrics_port,
                       settings=Settings)
