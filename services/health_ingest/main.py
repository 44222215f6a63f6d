"""``healthplane service health-ingest``."""

from __future__ import annotations

import argparse

from healthplane.runtime.lifecycle import ServiceContext, run_processor_service
from healthplane_health_ingest import detectors
from healthplane_health_ingest.fold import INPUTS, OUTPUTS, SERVICE, IngestCore
from healthplane_health_ingest.metrics import DetectorFailures
from healthplane_health_ingest.rules import IngestState


def main(args: argparse.Namespace) -> int:
    failures = DetectorFailures()

    def core(ctx: ServiceContext) -> IngestCore:
        def not_loaded(name: str, exc: Exception) -> None:
            failures.not_loaded(name)
            ctx.log.warning("detector plug-in failed", detector=name, error=f"{type(exc).__name__}: {exc}")

        return IngestCore(plugins=detectors.load_plugins(not_loaded))

    return run_processor_service(args, SERVICE, core, IngestState, INPUTS, OUTPUTS, series=lambda _: failures,
                                 partitionable=True)
