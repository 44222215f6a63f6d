"""``healthplane service scheduler``: the reference scheduler (EVI-8).

Settings come from the environment, as everything a container is given:
``HEALTHPLANE_SCHEDULER_SLOTS`` (allocations one node runs at once, default 1) and
``HEALTHPLANE_SCHEDULER_TICK_SECONDS`` (how often it places, starts and finishes, default 1) and
``HEALTHPLANE_SCHEDULER_VALIDATION_SECONDS`` (how long a simulated validation run takes, default 5).
"""

from __future__ import annotations

import argparse

import pydantic

from healthplane.runtime.lifecycle import run_processor_service
from healthplane.runtime.settings import EnvSettings
from healthplane_scheduler.fold import INPUTS, OUTPUTS, SERVICE, SchedulerCore
from healthplane_scheduler.metrics import SchedulerSeries
from healthplane_scheduler.rules import SchedulerState


class Settings(EnvSettings):
    PREFIX = "HEALTHPLANE_SCHEDULER_"
    slots_per_node: int = pydantic.Field(1, ge=1, alias="SLOTS")
    tick_seconds: float = pydantic.Field(1.0, ge=0.01, le=60, alias="TICK_SECONDS")
    validation_seconds: float = pydantic.Field(5.0, ge=0, le=86400, alias="VALIDATION_SECONDS")


def main(args: argparse.Namespace) -> int:
    # One replica places work: two would both place the same job (HA-3).
    return run_processor_service(
        args, SERVICE, lambda ctx: SchedulerCore(ctx.settings.slots_per_node, ctx.settings.validation_seconds),
        SchedulerState, INPUTS, OUTPUTS, settings=Settings, series=SchedulerSeries,
        tick_every_s=lambda settings: settings.tick_seconds, rides_out=False)
