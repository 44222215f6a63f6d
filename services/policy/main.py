"""``healthplane service policy``."""

from __future__ import annotations

import argparse

from healthplane.runtime.lifecycle import run_processor_service
from healthplane_policy.fold import INPUTS, OUTPUTS, SERVICE, PolicyCore
from healthplane_policy.metrics import BreakerSeries
from healthplane_policy.rules import PolicyState


def main(args: argparse.Namespace) -> int:
    return run_processor_service(args, SERVICE, lambda ctx: PolicyCore(), PolicyState, INPUTS, OUTPUTS,
                                 series=BreakerSeries)
