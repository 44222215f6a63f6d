"""``healthplane service substrate-bridge``: the bridge (bridge.py) behind the service's lease."""

from __future__ import annotations

import argparse

from healthplane.runtime import metrics
from healthplane.runtime.lease import Lease
from healthplane.runtime.lifecycle import Runner, ServiceContext, run_service, serve_replicated
from healthplane_substrate_bridge.bridge import SERVICE, Bridge, Settings, report_cap


def main(args: argparse.Namespace) -> int:
    async def serve(ctx: ServiceContext) -> None:
        settings: Settings = ctx.settings
        led: list[tuple[Bridge, Lease]] = []  # this replica's last lead

        def ready() -> tuple[bool, str]:
            if not led or not led[0][1].is_leader:
                return True, "standby"
            return (True, "caught up") if led[0][0].caught_up else (False, "replaying")

        metrics.readiness(SERVICE, ready)

        async def lead(lease: Lease) -> list[Runner]:
            # One replica consumes: two would each register a newcomer (HA-3).
            await report_cap(ctx.js, ctx.log, settings)
            bridge = Bridge(ctx, settings.bucket_sample_seconds)
            led[:] = [(bridge, lease)]
            await bridge.start()
            return [bridge]

        await serve_replicated(ctx, SERVICE, lead)

    return run_service(SERVICE, serve, nats_url=args.nats_url, creds=args.creds,
                       metrics_port=args.metrics_port, settings=Settings)
