"""``healthplane service scorer``: the Processor, the lease, and the node series."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket

from prometheus_client import REGISTRY

from healthplane.runtime.lease import Lease
from healthplane.runtime.lifecycle import ServiceContext, run_service, until_stopped
from healthplane.runtime.processor import Processor
from healthplane_scorer.metrics import NodeSeries
from healthplane_scorer.service import INPUTS, OUTPUTS, SERVICE, ScorerCore, ScorerState


def main(args: argparse.Namespace) -> int:
    async def serve(ctx: ServiceContext) -> None:
        proc = Processor(nc=ctx.nc, js=ctx.js, service=SERVICE, core=ScorerCore(), state_type=ScorerState,
                         inputs=INPUTS, outputs=OUTPUTS, batch=512, log=ctx.log)
        lease = Lease(ctx.js, SERVICE, f"{socket.gethostname()}:{os.getpid()}", log=ctx.log)
        REGISTRY.register(NodeSeries(lambda: proc.state, lambda: lease.is_leader))
        await proc.start()
        holder = asyncio.create_task(lease.run(ctx.stopping))
        try:
            await until_stopped(ctx, proc)
        finally:
            await holder

    return run_service(SERVICE, serve, nats_url=args.nats_url, creds=args.creds, metrics_port=args.metrics_port)
