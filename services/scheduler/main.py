"""``healthplane service scheduler``: the reference scheduler (EVI-8).

Settings come from the environment, as everything a container is given:
``HEALTHPLANE_SCHEDULER_SLOTS`` (allocations one node runs at once, default 1) and
``HEALTHPLANE_SCHEDULER_TICK_SECONDS`` (how often it places, starts and finishes, default 1) and
``HEALTHPLANE_SCHEDULER_VALIDATION_SECONDS`` (how long a simulated validation run takes, default 5).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Mapping

import pydantic
from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from healthplane.contracts.gating import gated
from healthplane.runtime.lease import Lease
from healthplane.runtime.lifecycle import Runner, ServiceContext, run_service, serve_replicated
from healthplane.runtime.processor import Processor
from healthplane.runtime.settings import EnvSettings
from healthplane_scheduler.fold import INPUTS, OUTPUTS, SERVICE, SchedulerCore
from healthplane_scheduler.rules import SchedulerState, drain_below_for


class Settings(EnvSettings):
    PREFIX = "HEALTHPLANE_SCHEDULER_"
    slots_per_node: int = pydantic.Field(1, ge=1, alias="SLOTS")
    tick_seconds: float = pydantic.Field(1.0, ge=0.01, le=60, alias="TICK_SECONDS")
    validation_seconds: float = pydantic.Field(5.0, ge=0, le=86400, alias="VALIDATION_SECONDS")


def settings_from(environ: Mapping[str, str]) -> Settings:
    """The scheduler's settings; a bad value is refused naming the variable."""
    return Settings.from_env(environ)


class SchedulerSeries(Collector):
    """Steps by state and nodes gated by POL-5, computed from the state at scrape time."""

    def __init__(self, state: Callable[[], SchedulerState]) -> None:
        self._state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = self._state()
        counts = {"queued": 0, "placed": 0, "started": 0}
        for job in list(state.jobs.values()):  # one copy: the event loop mutates the dict
            for step in list(job.steps):
                if step.status in counts:
                    counts[step.status] += 1
        steps = GaugeMetricFamily("healthplane_scheduler_steps", "Job steps by state (reference scheduler)",
                                  labels=["state"])
        for name, value in counts.items():
            steps.add_metric([name], value)
        yield steps
        nodes = list(state.nodes.values())
        gated_nodes = sum(1 for n in nodes if n.known and gated(n.score, drain_below_for(state, n.definition)))
        yield GaugeMetricFamily("healthplane_scheduler_gated_nodes",
                                "Nodes with a score below their drainBelow: no new placement (POL-5)",
                                value=gated_nodes)


def main(args: argparse.Namespace) -> int:
    try:
        settings = settings_from(os.environ)
    except ValueError as exc:
        print(f"healthplane service scheduler: {exc}", file=sys.stderr)
        return 2

    async def serve(ctx: ServiceContext) -> None:
        active: list[Processor[SchedulerState]] = []  # this replica's Processor while it leads
        REGISTRY.register(SchedulerSeries(lambda: active[0].state if active else SchedulerState()))
        ctx.log.info("scheduler settings", slots_per_node=settings.slots_per_node,
                     tick_seconds=settings.tick_seconds, validation_seconds=settings.validation_seconds)

        async def lead(lease: Lease) -> list[Runner]:
            # One replica places work: two would both place the same job (HA-3).
            core = SchedulerCore(settings.slots_per_node, settings.validation_seconds)
            proc = Processor(nc=ctx.nc, js=ctx.js, service=SERVICE, core=core, state_type=SchedulerState,
                             inputs=INPUTS, outputs=OUTPUTS, batch=512, log=ctx.log, fence=lease.fence)
            proc.tick_every_s = settings.tick_seconds
            await proc.start()
            active[:] = [proc]
            return [proc]

        await serve_replicated(ctx, SERVICE, lead)

    return run_service(SERVICE, serve, nats_url=args.nats_url, creds=args.creds, metrics_port=args.metrics_port)
