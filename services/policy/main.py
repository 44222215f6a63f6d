"""``healthplane service policy``."""

from __future__ import annotations

import argparse

from healthplane.runtime.lifecycle import run_processor_service
from healthplane_policy.core import PolicyState
from healthplane_policy.metrics import BreakerSeries
from healthplane_policy.service import INPUTS, OUTPUTS, SERVICE, PolicyCore


def main(args: argparse.Namespace) -> int:
    return run_processor_service(args, SERVICE, lambda ctx: PolicyCore(ctx.log), PolicyState, INPUTS, OUTPUTS,
                                 series=BreakerSeries)
