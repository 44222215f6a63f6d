"""The api service's series: requests by route and status code, commands by verb and result."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

REQUESTS = Histogram("healthplane_api_request_seconds", "API requests by route and HTTP status code",
                     ["route", "code"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
COMMANDS = Counter("healthplane_api_commands_total", "Node commands sent through the API, by verb and outcome",
                   ["verb", "result"])
