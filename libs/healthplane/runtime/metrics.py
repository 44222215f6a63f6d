"""The Prometheus endpoint of a service and the series every service shares."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, start_http_server

CONSUMER_LAG = Gauge(
    "healthplane_consumer_lag_messages",
    "Messages in the input stream not yet delivered to this service (OBS-1)",
    ["service", "stream", "consumer"],
)
MESSAGES_PROCESSED = Counter(
    "healthplane_messages_processed_total",
    "Input messages folded and acknowledged",
    ["service", "stream"],
)
MESSAGES_REJECTED = Counter(
    "healthplane_messages_rejected_total",
    "Input messages refused as malformed or failing (REL-3); terminated, never redelivered",
    ["service", "stream", "reason"],
)
MESSAGES_RETRIED = Counter(
    "healthplane_messages_retried_total",
    "Input messages left for redelivery",
    ["service", "stream"],
)
EMITTED = Counter(
    "healthplane_records_emitted_total",
    "Records this service appended (after de-duplication)",
    ["service", "stream"],
)
DEAD_LETTERS = Counter(
    "healthplane_dead_letters_total",
    "Inputs set aside in HP_DEAD_LETTERS (malformed, the core raised, or an output refused for good)",
    ["service", "reason"],
)
FOLD_NOTES = Counter(
    "healthplane_fold_notes_total",
    "What a service's fold reported about live inputs (a plug-in failed, a node missed its heartbeat)",
    ["service", "note"],
)
DUPLICATES_SKIPPED = Counter(
    "healthplane_records_duplicate_skipped_total",
    "Outputs not emitted again after a restart because the stream already had them (REL-1)",
    ["service"],
)
FAST_PATH_ENABLED = Gauge(
    "healthplane_fast_path_enabled",
    "1 when this nats-py fast path passed its start-up self-test on the latest connection that "
    "tried it, 0 when it fell back to nats-py's public path (runtime/nats_internals.py)",
    ["path"],
)


@dataclass(frozen=True, slots=True)
class MetricsEndpoint:
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"


def serve(port: int, host: str = "127.0.0.1", registry: CollectorRegistry = REGISTRY) -> MetricsEndpoint:
    """Serve ``/metrics``; ``port=0`` picks a free port (the caller logs the URL)."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return MetricsEndpoint(host, server.server_port)
