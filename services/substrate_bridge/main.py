"""``healthplane service substrate-bridge``: the bridge's fold (fold.py) on run_processor_service,
with the bucket's watch (bridge.py) beside it. One replica writes: two would each register a
newcomer (HA-3)."""

from __future__ import annotations

import argparse

from healthplane.runtime.fold import Core
from healthplane.runtime.lifecycle import ServiceContext, run_processor_service
from healthplane.runtime.processor import Processor
from healthplane_substrate_bridge.bridge import BucketWatch, Settings
from healthplane_substrate_bridge.fold import INPUTS, OUTPUTS, SERVICE, BridgeCore, BridgeState


def main(args: argparse.Namespace) -> int:
    def watch(ctx: ServiceContext, proc: Processor[BridgeState], core: Core[BridgeState]) -> list[BucketWatch]:
        bucket = BucketWatch(ctx, ctx.settings)
        proc.on_wait = bucket.rejected
        return [bucket]

    return run_processor_service(args, SERVICE, lambda ctx: BridgeCore(), BridgeState, INPUTS, OUTPUTS,
                                 settings=Settings, also_run=watch)
