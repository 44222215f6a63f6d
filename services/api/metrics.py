"""The api service's series: requests by route and status code, commands by verb and result;
on a federation hub, each attached cluster's reachability and the age of its data (FED-2)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
