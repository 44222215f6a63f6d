"""Series the dispatcher owns, by endpoint label (never the URL: docs/webhooks.md)."""

from __future__ import annotations

from typing import Literal

from prometheus_client import Counter, Gauge, Histogram

DropReason = Literal["queue_full", "max_attempts", "rejected", "endpoint_removed", "shutdown"]

DELIVERIES = Counter(
    "healthplane_webhook_deliveries_total",
    "Delivery attempts by result: delivered (2xx), failed (retryable status), rejected (4xx "
    "other than 408/429), error (no HTTP answer: refused, reset, timeout)",
    ["endpoint", "outcome"],
)
DROPPED = Counter(
    "healthplane_webhook_dropped_total",
    "Events an endpoint will never receive: queue_full (burst beyond its queue), max_attempts, "
    "rejected (4xx), endpoint_removed (config apply), shutdown (still queued at stop)",
    ["endpoint", "reason"],
)
LATENCY = Histogram(
    "healthplane_webhook_request_seconds",
    "Time of one delivery attempt, request sent to answer read (or failure)",
    ["endpoint"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
QUEUE_DEPTH = Gauge(
    "healthplane_webhook_queue_depth",
    "Events waiting for a worker of this endpoint (bounded by HEALTHPLANE_WEBHOOK_QUEUE_SIZE)",
    ["endpoint"],
)
ENDPOINTS = Gauge("healthplane_webhook_endpoints", "Webhook endpoints in force")
CONFIG_VERSION = Gauge("healthplane_webhook_config_version", "Version of the cluster config in force")


def forget_queue_depth(label: str) -> None:
    try:
        QUEUE_DEPTH.remove(label)
    except KeyError:
        pass
