"""``healthplane service health-ingest``."""

from __future__ import annotations

import argparse

from healthplane.runtime.lifecycle import ServiceContext, run_service, until_stopped
from healthplane.runtime.processor import Processor
from healthplane_health_ingest.core import IngestState
from healthplane_health_ingest.service import INPUTS, OUTPUTS, SERVICE, IngestCore


def processor(ctx: ServiceContext) -> Processor[IngestState]:
    return Processor(nc=ctx.nc, js=ctx.js, service=SERVICE, core=IngestCore(ctx.log), state_type=IngestState,
                     inputs=INPUTS, outputs=OUTPUTS, batch=512, log=ctx.log)


def main(args: argparse.Namespace) -> int:
    async def serve(ctx: ServiceContext) -> None:
        proc = processor(ctx)
        await proc.start()
        await until_stopped(ctx, proc)

    return run_service(SERVICE, serve, nats_url=args.nats_url, creds=args.creds, metrics_port=args.metrics_port)
