"""The Prometheus endpoint of a service and the series every service shares.

The same port answers ``/healthz`` (the process's event loop is turning: 200, else 503 with
how long it has stalled) and ``/readyz`` (every readiness probe the service registered says
so: 200 "caught up" or "standby", else 503 naming what it waits for), for a supervisor or a
load balancer. They are served from their own threads, so a busy fold delays them by the
interpreter's switch interval, not by its batch.

Series per node (the scorer's, SCO-6) are too many for prometheus_client's exposition: at
100,000 nodes, 1.5 million samples took longer than a scrape's timeout. A service renders
those itself (:class:`Rendered`: whole families of Prometheus text, as deflated pieces it keeps
between scrapes) and ``/metrics`` streams them after the registry's, as text format 0.0.4:
gzip-encoded where the scraper accepts it (Prometheus does: 5.4 MB instead of 143 MB at
100,000 nodes), inflated piece by piece otherwise (runtime.gzipped).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any, Final, Protocol, runtime_checkable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.exposition import gzip_accepted
from prometheus_client.registry import Collector

from healthplane.runtime import gzipped

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
IDENTITY_MISMATCH = Counter(
    "healthplane_identity_mismatch_total",
    "Records whose payload named another cluster or node than their subject, dead-lettered unfolded (SEC-7)",
    ["service", "stream"],
)
INPUTS_WAITING = Counter(
    "healthplane_inputs_waiting_total",
    "Inputs nak'd for later because the server refused an output that may wait (a full bucket, BRG-2)",
    ["service", "stream"],
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
SNAPSHOT_SECONDS = Gauge(
    "healthplane_snapshot_duration_seconds",
    "Wall time of the last snapshot (encode, compress, store, heap settled): the fold waits for it",
    ["service", "partition"],
)
SNAPSHOT_BYTES = Gauge(
    "healthplane_snapshot_bytes",
    "Compressed size of the last snapshot: it grows with the fleet",
    ["service", "partition"],
)
FAST_PATH_ENABLED = Gauge(
    "healthplane_fast_path_enabled",
    "1 when this nats-py fast path passed its start-up self-test on the latest connection that "
    "tried it, 0 when it fell back to nats-py's public path (runtime/nats_internals.py)",
    ["path"],
)


@runtime_checkable
class Rendered(Protocol):
    """Series a service renders itself: ``render()`` yields deflated pieces whose texts, in
    order, are whole metric families (HELP, TYPE and their samples) as Prometheus text 0.0.4,
    as of the scrape."""

    def render(self) -> Iterator[gzipped.Piece]: ...


_rendered: list[Rendered] = []


def register_series(series: Collector | Rendered, registry: CollectorRegistry = REGISTRY) -> None:
    """Export state-derived series: a prometheus_client collector, or a :class:`Rendered`."""
    if isinstance(series, Rendered):
        _rendered.append(series)
    else:
        registry.register(series)


def label_value(value: str) -> str:
    """A label value escaped for the text format (backslash, double quote, newline)."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


@dataclass(frozen=True, slots=True)
class MetricsEndpoint:
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"


STALLED_AFTER_S: Final = 10.0  # an event loop not turning for this long fails /healthz
# name -> () -> (ready, what it is doing): registered by what the service runs (a Processor).
_probes: dict[str, Callable[[], tuple[bool, str]]] = {}
_loop_turned_at = [time.monotonic()]


def readiness(name: str, probe: Callable[[], tuple[bool, str]] | None) -> None:
    """Register (``None``: remove) one readiness probe of this process."""
    if probe is None:
        _probes.pop(name, None)
    else:
        _probes[name] = probe


async def keep_alive() -> None:
    """Stamp the event loop as turning, every second, for ``/healthz``."""
    while True:
        _loop_turned_at[0] = time.monotonic()
        await asyncio.sleep(1.0)


def health() -> tuple[bool, str]:
    stalled_s = time.monotonic() - _loop_turned_at[0]
    return (True, "ok") if stalled_s < STALLED_AFTER_S else (False, f"event loop stalled for {stalled_s:.0f} s")


def ready() -> tuple[bool, str]:
    answers = [(name, *probe()) for name, probe in sorted(list(_probes.items()))]
    waiting = [f"{name}: {detail}" for name, ok, detail in answers if not ok]
    if waiting:
        return False, "; ".join(waiting)
    return True, "; ".join(f"{name}: {detail}" for name, _, detail in answers) or "ok"


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes are not log lines


def _app(registry: CollectorRegistry) -> Callable[..., Iterable[bytes]]:
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            ok, detail = health() if path == "/healthz" else ready()
            start_response("200 OK" if ok else "503 Service Unavailable",
                           [("Content-Type", "text/plain; charset=utf-8")])
            return [f"{detail}\n".encode()]
        if not _rendered:
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]
        # Negotiated as prometheus_client negotiates the registry-only endpoints.
        if gzipped.NOT_JOINABLE is None and gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Encoding", "gzip"),
                                       ("Vary", "Accept-Encoding")])
            return gzipped.stream(_exposition(registry))
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST), ("Vary", "Accept-Encoding")])
        return map(gzipped.inflate, _exposition(registry))

    return app


def _exposition(registry: CollectorRegistry) -> Iterator[gzipped.Piece]:
    """The registry's series, then each rendered set's pieces, streamed: a scrape of a large
    fleet never holds the whole text, and the fold gets the interpreter between pieces."""
    yield gzipped.piece(generate_latest(registry))
    for series in list(_rendered):
        yield from series.render()


def serve(port: int, host: str = "127.0.0.1", registry: CollectorRegistry = REGISTRY) -> MetricsEndpoint:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz``; ``port=0`` picks a free port (the caller
    logs the URL)."""
    server = make_server(host, port, _app(registry), _Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return MetricsEndpoint(host, server.server_port)
