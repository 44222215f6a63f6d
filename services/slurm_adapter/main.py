"""``healthplane service slurm-adapter``: the adapter's settings, its fold and the reconciler
beside it (reconcile.py), on run_processor_service."""

from __future__ import annotations

import argparse
from typing import cast

from healthplane.runtime.fold import Core
from healthplane.runtime.lifecycle import ServiceContext, run_processor_service
from healthplane.runtime.processor import Processor
from healthplane_slurm_adapter.fold import (
    INPUTS,
    OUTPUTS,
    SERVICE,
    AdapterCore,
)
from healthplane_slurm_adapter.reconcile import Reconciler, Settings, core_from
from healthplane_slurm_adapter.rules import AdapterState
from healthplane_slurm_adapter.slurm import Slurm


def main(args: argparse.Namespace) -> int:
    # One replica talks to Slurm: the holder's decisions go out through its fenced Processor
    # before any command runs, so a holder fenced off runs none.
    def reconciler(ctx: ServiceContext, proc: Processor[AdapterState], core: Core[AdapterState]) -> list[Reconciler]:
        settings: Settings = ctx.settings
        slurm = Slurm(settings.bin_dir, timeout_s=settings.command_timeout_seconds,
                      notice=lambda event, fields: ctx.log.warning(event, **fields))
        return [Reconciler(proc, cast(AdapterCore, core), slurm, settings, ctx.log)]

    return run_processor_service(args, SERVICE, lambda ctx: core_from(ctx.settings), AdapterState, INPUTS, OUTPUTS,
                                 settings=Settings, also_run=reconciler, rides_out=False)
