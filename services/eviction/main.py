"""``healthplane service eviction``."""

from __future__ import annotations

import argparse

from healthplane.runtime.lifecycle import ServiceContext, run_service, until_stopped
from healthplane.runtime.processor import Processor
from healthplane_eviction.service import INPUTS, OUTPUTS, SERVICE, EvictionCore, EvictionState


def processor(ctx: ServiceContext) -> Processor[EvictionState]:
    return Processor(nc=ctx.nc, js=ctx.js, service=SERVICE, core=EvictionCore(), state_type=EvictionState,
                     inputs=INPUTS, outputs=OUTPUTS, batch=512, log=ctx.log)


def main(args: argparse.Namespace) -> int:
    async def serve(ctx: ServiceContext) -> None:
        proc = processor(ctx)
        await proc.start()
        await until_stopped(ctx, proc)

    return run_service(SERVICE, serve, nats_url=args.nats_url, creds=args.creds, metrics_port=args.metrics_port)
