"""``healthplane service health-ingest``."""

from __future__ import annotations

import argparse

from healthplane.runtime.lifecycle import run_processor_service
from healthplane_health_ingest.core import IngestState
from healthplane_health_ingest.service import INPUTS, OUTPUTS, SERVICE, IngestCore


def main(args: argparse.Namespace) -> int:
    return run_processor_service(args, SERVICE, lambda ctx: IngestCore(ctx.log), IngestState, INPUTS, OUTPUTS)
