"""``healthplane service policy``."""

from __future__ import annotations

import argparse

from prometheus_client import REGISTRY

from healthplane.runtime.lifecycle import ServiceContext, run_service, until_stopped
from healthplane.runtime.processor import Processor
from healthplane_policy.core import PolicyState
from healthplane_policy.metrics import BreakerSeries
from healthplane_policy.service import INPUTS, OUTPUTS, SERVICE, PolicyCore


def processor(ctx: ServiceContext) -> Processor[PolicyState]:
    return Processor(nc=ctx.nc, js=ctx.js, service=SERVICE, core=PolicyCore(ctx.log), state_type=PolicyState,
                     inputs=INPUTS, outputs=OUTPUTS, batch=512, log=ctx.log)


def main(args: argparse.Namespace) -> int:
    async def serve(ctx: ServiceContext) -> None:
        proc = processor(ctx)
        REGISTRY.register(BreakerSeries(lambda: proc.state))
        await proc.start()
        await until_stopped(ctx, proc)

    return run_service(SERVICE, serve, nats_url=args.nats_url, creds=args.creds, metrics_port=args.metrics_port)
