"""Series the bridge owns: put failures (BRG-2) and the bucket's size (BRG-3)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

PUT_FAILURES = Counter(
    "healthplane_substrate_nodes_bucket_put_failures_total",
    "Resource reports the substrate-nodes bucket rejected (each redelivery counts again)",
)


class BucketGauges(Collector):
    """``…_bytes_used`` / ``…_bytes_max``: absent until the first successful sample (BRG-3)."""

    def __init__(self) -> None:
        self.sample: tuple[int, int] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.sample is None:
            return
        used, cap = self.sample
        yield GaugeMetricFamily("healthplane_substrate_nodes_bucket_bytes_used",
                                "Bytes stored in the substrate-nodes bucket", value=used)
        yield GaugeMetricFamily("healthplane_substrate_nodes_bucket_bytes_max",
                                "Size cap of the substrate-nodes bucket", value=cap)


GAUGES = BucketGauges()
REGISTRY.register(GAUGES)
