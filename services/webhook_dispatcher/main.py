"""``healthplane service webhook-dispatcher``: the dispatcher (dispatch.py) behind the service's
lease."""

from __future__ import annotations

import argparse
import asyncio

from healthplane.runtime import metrics
from healthplane.runtime.lease import Lease
from healthplane.runtime.lifecycle import Runner, ServiceContext, run_service, serve_replicated
from healthplane_webhook_dispatcher.dispatch import Dispatcher
from healthplane_webhook_dispatcher.rules import (
    SERVICE,
    Settings,
)


def main(args: argparse.Namespace) -> int:
    async def serve(ctx: ServiceContext) -> None:
        delivering = asyncio.Event()
        metrics.readiness(SERVICE, lambda: (True, "delivering") if delivering.is_set() else (True, "standby"))

        async def lead(_lease: Lease) -> list[Runner]:
            # One replica delivers: per endpoint, events go out in the order they happened,
            # which two consumers of one durable could not keep (HA-3).
            dispatcher = Dispatcher(ctx, ctx.settings)
            await dispatcher.start()
            # /readyz: the endpoints of the config in force are known and its consumer is made.
            delivering.set()
            return [dispatcher]

        await serve_replicated(ctx, SERVICE, lead)

    return run_service(SERVICE, serve, nats_url=args.nats_url, creds=args.creds,
                       metrics_port=args.metrics_port, settings=Settings)
