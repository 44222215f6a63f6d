"""``healthplane service eviction``."""

from __future__ import annotations

import argparse

from healthplane.runtime.lifecycle import run_processor_service
from healthplane_eviction.fold import INPUTS, OUTPUTS, SERVICE, EvictionCore, EvictionState


def main(args: argparse.Namespace) -> int:
    return run_processor_service(args, SERVICE, lambda ctx: EvictionCore(), EvictionState, INPUTS, OUTPUTS)
