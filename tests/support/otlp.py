"""An OTLP/HTTP receiver for the INT-4 tests and benchmark: a real HTTP server on a free
loopback port, in a thread of the test's process, that takes what the official exporters
POST (``/v1/traces``, ``/v1/logs``: protobuf, plain or gzip or deflate) and decodes it with
opentelemetry-proto's own classes. Services started as processes export to its ``url``
(``OTEL_EXPORTER_OTLP_ENDPOINT``)."""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY = 64 * 1024 * 1024  # an export larger than this is refused (413), not read


@dataclass(frozen=True)
class ReceivedSpan:
    service: str  # the resource's service.name
    name: str
    trace_id: str  # hex, as in a traceparent
    span_id: str
    parent_span_id: str  # "" for a root
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind
    attributes: dict[str, Any]
    start_unix_nano: int
    end_unix_nano: int


@dataclass(frozen=True)
class ReceivedLog:
    service: str
    body: Any
    severity_number: int
    severity_text: str
    time_unix_nano: int
    trace_id: str  # "" outside a trace
    span_id: str
    event_name: str
    attributes: dict[str, Any]


def _value(any_value: Any) -> Any:
    """An OTLP AnyValue as Python."""
    which = any_value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in any_value.kvlist_value.values}
    return getattr(any_value, which)


def _attributes(key_values: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in key_values}


class OtlpReceiver:
    """``decode=False`` (the benchmark): each export is read and answered, not decoded, so
    the receiver costs the process it shares as little as it can."""

    def __init__(self, *, decode: bool = True) -> None:
        self.decode = decode
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self._logs: list[ReceivedLog] = []
        self.requests: dict[str, int] = {"/v1/traces": 0, "/v1/logs": 0}
        self.bytes = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    self.send_response(413)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = self.rfile.read(length)
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                answer = receiver._take(self.path, body)
                if answer is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def url(self) -> str:
        """What ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set to (the exporters add ``/v1/…``)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def _take(self, path: str, body: bytes) -> bytes | None:
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        if path not in self.requests:
            return None
        with self._lock:
            self.requests[path] += 1
            self.bytes += len(body)
        if path == "/v1/traces":
            if self.decode:
                traces = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                spans = [
                    ReceivedSpan(
                        service=str(_attributes(rs.resource.attributes).get("service.name", "")),
                        name=span.name, trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(), kind=span.kind,
                        attributes=_attributes(span.attributes), start_unix_nano=span.start_time_unix_nano,
                        end_unix_nano=span.end_time_unix_nano)
                    for rs in traces.resource_spans for ss in rs.scope_spans for span in ss.spans]
                with self._lock:
                    self._spans += spans
            return bytes(trace_service_pb2.ExportTraceServiceResponse().SerializeToString())
        if self.decode:
            logs = logs_service_pb2.ExportLogsServiceRequest.FromString(body)
            records = [
                ReceivedLog(
                    service=str(_attributes(rl.resource.attributes).get("service.name", "")),
                    body=_value(record.body), severity_number=record.severity_number,
                    severity_text=record.severity_text, time_unix_nano=record.time_unix_nano,
                    trace_id=record.trace_id.hex() if any(record.trace_id) else "",
                    span_id=record.span_id.hex() if any(record.span_id) else "",
                    event_name=record.event_name, attributes=_attributes(record.attributes))
                for rl in logs.resource_logs for sl in rl.scope_logs for record in sl.log_records]
            with self._lock:
                self._logs += records
        return bytes(logs_service_pb2.ExportLogsServiceResponse().SerializeToString())

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def logs(self) -> list[ReceivedLog]:
        with self._lock:
            return list(self._logs)

    def received(self) -> int:
        """Exports received, of either signal."""
        with self._lock:
            return sum(self.requests.values())

    def wait_for(self, check: Callable[[OtlpReceiver], bool], timeout_s: float, what: str) -> None:
        """Until ``check`` holds (called from a thread: the test's loop is not blocked when run
        through ``asyncio.to_thread``); an AssertionError naming ``what`` past ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not check(self):
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout_s:g} s: {what} (spans {len(self.spans())}, "
                                     f"log records {len(self.logs())})")
            time.sleep(0.05)


@contextmanager
def receiver(*, decode: bool = True) -> Iterator[OtlpReceiver]:
    running = OtlpReceiver(decode=decode).start()
    try:
        yield running
    finally:
        running.stop()


if __name__ == "__main__":
    # ``python -m tests.support.otlp``: a discarding receiver in a process of its own (the
    # benchmark: its work stays out of the process measured); prints its URL, serves until
    # stdin closes, then prints the exports it took as JSON.
    import json
    import sys

    with receiver(decode=False) as running:
        print(running.url, flush=True)
        sys.stdin.read()
        print(json.dumps({"requests": running.requests, "bytes": running.bytes}), flush=True)
