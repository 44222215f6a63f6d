"""``healthplane service scorer``."""

from __future__ import annotations

import argparse

from healthplane.runtime.lifecycle import ServiceContext, run_service, until_stopped
from healthplane.runtime.processor import Processor
from healthplane_scorer.service import INPUTS, OUTPUTS, SERVICE, ScorerCore, ScorerState


def main(args: argparse.Namespace) -> int:
    async def serve(ctx: ServiceContext) -> None:
        proc = Processor(nc=ctx.nc, js=ctx.js, service=SERVICE, core=ScorerCore(), state_type=ScorerState,
                         inputs=INPUTS, outputs=OUTPUTS, batch=512, log=ctx.log)
        await proc.start()
        await until_stopped(ctx, proc)

    return run_service(SERVICE, serve, nats_url=args.nats_url, creds=args.creds, metrics_port=args.metrics_port)
