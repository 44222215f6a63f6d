"""The reference scheduler's series, computed from the state this replica leads at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from healthplane.contracts.gating import gated
from healthplane_scheduler.rules import SchedulerState, drain_below_for


class SchedulerSeries(Collector):
    """Steps by state and nodes gated by POL-5, computed from the state at scrape time."""

    def __init__(self, led: Callable[[], list[SchedulerState]]) -> None:
        self._led = led  # the state this replica leads; none on a standby

    def collect(self) -> Iterator[GaugeMetricFamily]:
        led = self._led()
        state = led[0] if led else SchedulerState()
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
