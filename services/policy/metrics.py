"""Breaker series (POL-6), computed from the policy's state at scrape time:
``healthplane_policy_breaker_threshold_nodes{cluster,bound}`` (the effective threshold in
nodes, ``bound`` naming what produced it), ``healthplane_policy_breaker_utilization{cluster}``
(recent automated cordons as a fraction of the fleet) and ``healthplane_policy_breaker_tripped``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from healthplane_policy import breaker
from healthplane_policy.rules import PolicyState


class BreakerSeries(Collector):
    def __init__(self, states: Callable[[], list[PolicyState]],
                 now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._states = states  # the lead's state; none on a standby (lifecycle.run_processor_service)
        self._now = now

    def collect(self) -> Iterator[GaugeMetricFamily]:
        led = self._states()
        state = led[0] if led else PolicyState()
        settings = state.config.breaker
        threshold = GaugeMetricFamily("healthplane_policy_breaker_threshold_nodes",
                                      "Effective circuit-breaker threshold in nodes; bound names what produced it",
                                      labels=["cluster", "bound"])
        utilization = GaugeMetricFamily("healthplane_policy_breaker_utilization",
                                        "Automated cordons inside the breaker window as a fraction of the fleet",
                                        labels=["cluster"])
        tripped = GaugeMetricFamily("healthplane_policy_breaker_tripped",
                                    "1 while the breaker is TRIPPED (until `healthplane policy breaker reset`)",
                                    labels=["cluster"])
        if settings.enabled:
            now = self._now()
            clusters = sorted(set(state.fleet) | set(state.breakers))
            for cluster in clusters:
                fleet = state.fleet.get(cluster, 0)
                current = state.breakers.get(cluster, breaker.BreakerState())
                found = breaker.reported_threshold(current, settings, fleet)
                if found is not None:
                    threshold.add_metric([cluster, found.bound], found.nodes)
                utilization.add_metric([cluster], breaker.utilization(current, settings, fleet, now))
                tripped.add_metric([cluster], 1 if current.tripped else 0)
        yield threshold
        yield utilization
        yield tripped
