"""The api service's series: requests by route and status code, commands by verb and result;
on a federation hub, each attached cluster's reachability and the age of its data (FED-2);
the breakfix figures per cluster and fault class (issue 41.5), computed at scrape time from
the fold the api keeps of the stored node events."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from healthplane.contracts import breakfix

REQUESTS = Histogram("healthplane_api_request_seconds", "API requests by route and HTTP status code",
                     ["route", "code"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
COMMANDS = Counter("healthplane_api_commands_total", "Node commands sent through the API, by verb and outcome",
                   ["verb", "result"])
FEDERATION_REACHABLE = Gauge("healthplane_federation_cluster_reachable",
                             "1 while the hub hears from the attached cluster, 0 past the unreachable threshold",
                             ["cluster"])
FEDERATION_DATA_AGE = Gauge("healthplane_federation_cluster_data_age_seconds",
                            "Seconds since the hub last heard from the attached cluster (a record or a heartbeat)",
                            ["cluster"])
FEDERATION_LAG = Gauge("healthplane_federation_cluster_lag", "Records the hub's copy of the cluster is behind by",
                       ["cluster"])


class BreakfixRead(Protocol):
    state: breakfix.Breakfix
    caught_up: bool


class BreakfixSeries(Collector):
    """``healthplane_breakfix_incidents_total{cluster,fault_class}`` and the summary
    ``healthplane_breakfix_seconds{cluster,fault_class,stage}`` (``_sum`` and ``_count``): per
    stage of ``breakfix.STAGES`` the seconds from the fault to out of service, to remediated, to
    back in service (MTTR), and between incidents on a node. Absent until every stored event is
    folded: a partial fold would be a wrong number, not a missing one."""

    def __init__(self, read: BreakfixRead) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        incidents = CounterMetricFamily("healthplane_breakfix_incidents",
                                        "Incidents (a real fault's critical condition on a node with none open) "
                                        "since the oldest stored node event, per cluster and fault class",
                                        labels=["cluster", "fault_class"])
        seconds = SummaryMetricFamily("healthplane_breakfix_seconds",
                                      "Seconds from a fault to each stage (out_of_service, remediated, "
                                      "back_in_service: MTTR) and between incidents on a node (between_incidents)",
                                      labels=["cluster", "fault_class", "stage"])
        if self._read.caught_up:
            for key, figures in list(self._read.state.figures.items()):  # the api's loop folds meanwhile
                cluster, fault_class = key.split("\x00", 1)
                incidents.add_metric([cluster, fault_class], figures.incidents)
                for stage in breakfix.STAGES:
                    found: breakfix.Stage = getattr(figures, stage)
                    seconds.add_metric([cluster, fault_class, stage], count_value=found.count,
                                       sum_value=found.seconds)
        yield incidents
        yield seconds
