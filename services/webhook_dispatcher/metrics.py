"""Series the dispatcher owns, by endpoint label (never the URL: docs/webhooks.md)."""

from __future__ import annotations

from typing import Literal

from prometheus_client import Counter, Gauge, Histogram

# Why an event's delivery to an endpoint ended without a 2xx: it is then a dead letter (INT-2).
GiveUpReason = Literal["max_attempts", "rejected"]

DELIVERIES = Counter(
    "healthplane_webhook_deliveries_total",
    "Delivery attempts by result: delivered (2xx), failed (retryable status), rejected (4xx "
    "other than 408/429), error (no HTTP answer: refused, reset, timeout)",
    ["endpoint", "outcome"],
)
DEAD_LETTERS = Counter(
    "healthplane_webhook_dead_letters_total",
    "Events whose delivery to this endpoint ended without a 2xx, recorded in HP_DEAD_LETTERS "
    "(healthplane webhooks replay sends them again): max_attempts, rejected (4xx)",
    ["endpoint", "reason"],
)
FILTERED = Counter(
    "healthplane_webhook_filtered_total",
    "Events of this endpoint's types that its CEL filter did not select (INT-3)",
    ["endpoint"],
)
LATENCY = Histogram(
    "healthplane_webhook_request_seconds",
    "Time of one delivery attempt, request sent to answer read (or failure)",
    ["endpoint"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
HELD = Gauge(
    "healthplane_webhook_held_events",
    "Events read from this endpoint's consumer and not yet settled: waiting for a worker or "
    "being delivered (bounded by HEALTHPLANE_WEBHOOK_QUEUE_SIZE, the consumer's max_ack_pending)",
    ["endpoint"],
)
LAG = Gauge(
    "healthplane_webhook_lag_events",
    "Events of this endpoint's that are not delivered yet: stored and not read, or read and "
    "not settled (its consumer's pending plus ack pending; INT-2)",
    ["endpoint"],
)
DOWN = Gauge(
    "healthplane_webhook_endpoint_down",
    "1 while this endpoint is down (attempts of two different events failed in a row and no "
    "answer since): its deliveries paused, its events held without spending attempts, one "
    "probe at a time (INT-2)",
    ["endpoint"],
)
ENDPOINTS = Gauge("healthplane_webhook_endpoints", "Webhook endpoints in force")
CONFIG_VERSION = Gauge("healthplane_webhook_config_version", "Version of the cluster config in force")


def forget(label: str) -> None:
    """An endpoint gone: its gauges go too (its counters stay, as counters do)."""
    for gauge in (HELD, LAG, DOWN):
        try:
            gauge.remove(label)
        except KeyError:
            pass
