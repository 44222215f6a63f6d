"""OpenTelemetry export (INT-4): the spans of one report's path and node events as OTLP logs,
through the official ``opentelemetry-*`` packages (the ``otel`` extra); off unless
``HEALTHPLANE_OTEL=1``.

**Off** (the default), nothing here imports opentelemetry and :data:`active` is None. The
runtime asks once, when a Processor is built (and the collector once, when it starts), and
installs nothing: a fold pays nothing per input, a batch nothing per write
(docs/benchmarks.md, "OpenTelemetry").

**On**, :func:`start` (every service process calls it as it starts, ``runtime.lifecycle``;
the collector in its own entry point) builds a TracerProvider with a BatchSpanProcessor and
the OTLP/HTTP span exporter, and a LoggerProvider with a BatchLogRecordProcessor and the
OTLP/HTTP log exporter. Both read the standard environment: ``OTEL_EXPORTER_OTLP_ENDPOINT``
(and the per-signal ``…_TRACES_…``/``…_LOGS_…`` forms), ``…_HEADERS``, ``…_TIMEOUT``,
``…_COMPRESSION``, ``…_CERTIFICATE``; ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``;
``OTEL_TRACES_SAMPLER``; ``OTEL_BSP_*`` and ``OTEL_BLRP_*``. ``OTEL_TRACES_EXPORTER=none``
or ``OTEL_LOGS_EXPORTER=none`` leaves that signal out. :func:`shutdown` flushes both when
the service stops, within ``SHUTDOWN_S``. Export happens on the SDK's own threads, bounded by
its queues (a full queue drops, the SDK logs it) and its exporters' timeout: a slow or absent
collector never holds up a fold.

**Spans.** W3C trace context travels in NATS message headers (``traceparent``,
``tracestate``), written and read by the official W3C propagator. The collector starts a
trace per report it publishes (:meth:`Exporting.publishing`); a Processor folds each input
inside a span (``{service} fold {stream}``, a child of the input's ``traceparent`` when it
has one) and every output of that input carries the span's context
(:meth:`Exporting.traced_step`). So collector → health-ingest → scorer → policy → eviction
is one trace, each hop a span of the service that folded it. An input refolded only to
rebuild the state (its outputs are in the streams already: a restart) gets no span.

**Node events as logs.** Each node event a Processor stores (an output on ``hp.event.>``
that JetStream acknowledged as new) is also an OTLP log record (:meth:`Exporting.stored`),
written by the service that decided it, in the context of the span whose input caused it.
Why there and not in one reader of ``HP_NODE_EVENTS`` (the webhook dispatcher, or a tail):
the record then carries the trace and span of the report that led to it, its
``service.name`` is the service that decided, and no consumer, durable or process is added
to run, secure and watch. It is best effort, as OTLP export is: a process killed between the
write and the export loses that record (the stream keeps the event; webhooks are the at
least once path, INT-2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, TypeVar

from healthplane.contracts import subjects, wire

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk.trace import TracerProvider

    from healthplane.runtime.fold import Inbound, Step
    from healthplane.runtime.publish import Ack, Outbound

S = TypeVar("S")

SWITCH: Final = "HEALTHPLANE_OTEL"
ON_VALUES: Final = frozenset({"1", "true", "yes", "on"})
TRACEPARENT: Final = "traceparent"
SCOPE: Final = "healthplane"
EVENT_NAME: Final = "healthplane.node_event"
EVENTS_PREFIX: Final = f"{subjects.PREFIX}.event."
SHUTDOWN_S: Final = 5.0  # a stop waits this long at most for the last spans and records to go out

# What a Healthplane severity is as an OTLP log severity (SeverityNumber's values).
SEVERITY_NUMBERS: Final = {"info": 9, "warning": 13, "critical": 17}  # INFO, WARN, ERROR

active: Exporting | None = None  # set by start(), while this process exports


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``HEALTHPLANE_OTEL`` asks for export."""
    return environ.get(SWITCH, "").strip().lower() in ON_VALUES


def start(service: str, log: Any = None) -> Exporting | None:
    """Export this process's spans and node events when ``HEALTHPLANE_OTEL`` says so (the
    only place opentelemetry is imported); None, having imported nothing, when off. Called
    once per process, before any Processor is built; a second call returns the first's."""
    global active
    if active is not None or not enabled():
        return active
    try:
        active = Exporting(service, log)
    except ImportError as exc:  # asked for, not installed: said loudly, and the service runs on
        if log is not None:
            log.error("OpenTelemetry export asked for but not installed: exporting nothing", switch=SWITCH,
                      install="pip install 'healthplane[otel]'", error=str(exc))
        return None
    return active


def shutdown() -> None:
    """Flush and stop what :func:`start` started (a no-op when off), within ``SHUTDOWN_S``:
    the SDK's own shutdown waits up to 30 s per signal for an absent collector."""
    global active
    exporting, active = active, None
    if exporting is not None:
        stopping = threading.Thread(target=exporting.shutdown, name="healthplane-otel-shutdown", daemon=True)
        stopping.start()
        stopping.join(SHUTDOWN_S)


def _resource_attributes(service: str) -> dict[str, str]:
    """``service.name`` is the service's unless ``OTEL_SERVICE_NAME`` or
    ``OTEL_RESOURCE_ATTRIBUTES`` names one (the SDK reads those); every service of an install
    shares ``service.namespace`` ``healthplane``."""
    from importlib.metadata import PackageNotFoundError, version

    from healthplane.runtime.lease import instance_name

    attributes = {"service.namespace": "healthplane", "service.instance.id": instance_name()}
    try:
        attributes["service.version"] = version("healthplane")
    except PackageNotFoundError:
        pass
    named = os.environ.get("OTEL_SERVICE_NAME", "").strip() or any(
        item.split("=", 1)[0].strip() == "service.name"
        for item in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","))
    if not named:
        attributes["service.name"] = service
    return attributes


def _node_of(subject: str) -> tuple[str, str] | None:
    """(cluster, node id) of a per-node subject; None for any other (the config, a policy
    command)."""
    try:
        parsed = subjects.parse(subject)
    except subjects.SubjectError:
        return None
    return parsed.cluster, parsed.node_id


def _unix_ns(moment: datetime) -> int:
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1_000


class Exporting:
    """The providers of one process while export is on, and the hooks the runtime installs."""

    def __init__(self, service: str, log: Any = None) -> None:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.service = service
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()
        if protocol and protocol != "http/protobuf" and log is not None:
            log.warning("OpenTelemetry: only OTLP over HTTP/protobuf is exported", asked=protocol)
        resource = Resource.create(_resource_attributes(service))
        self.traces = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() != "none"
        self.logs = os.environ.get("OTEL_LOGS_EXPORTER", "otlp").strip().lower() != "none"
        self.tracer_provider: TracerProvider | None = None
        self.logger_provider: LoggerProvider | None = None
        if self.traces:
            self.tracer_provider = TracerProvider(resource=resource)
            self.tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        if self.logs:
            self.logger_provider = LoggerProvider(resource=resource)
            self.logger_provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter()))
        # Kept as attributes: the hooks below run per input and per record while on.
        self._tracer = self.tracer_provider.get_tracer(SCOPE) if self.tracer_provider is not None else None
        self._logger = self.logger_provider.get_logger(SCOPE) if self.logger_provider is not None else None
        self._propagator = TraceContextTextMapPropagator()
        self._consumer, self._producer = SpanKind.CONSUMER, SpanKind.PRODUCER
        self._error = Status, StatusCode.ERROR
        self._in_context = set_span_in_context
        if log is not None:
            log.info("OpenTelemetry export on", traces=self.traces, logs=self.logs,
                     endpoint=os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318"))

    def shutdown(self) -> None:
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.logger_provider is not None:
            self.logger_provider.shutdown()

    # ------------------------------------------------------------------ spans

    def context_of(self, headers: Mapping[str, str]) -> Context | None:
        """The trace context a record's headers carry, if any."""
        if TRACEPARENT not in headers:
            return None
        return self._propagator.extract(headers)

    def traced_step(self, service: str, step: Callable[[S, Inbound], Step[S]]) -> Callable[[S, Inbound], Step[S]]:
        """``step`` inside one span per input (``{service} fold {stream}``), each output of it
        carrying the span's ``traceparent``. The Processor folds with this instead of the
        core's step only while export is on; an input refolded with ``wants_output`` False
        (its outputs are stored already) is folded as it is."""
        tracer = self._tracer
        if tracer is None:
            return step
        from healthplane.runtime.fold import Step

        kind, (status, error), in_context = self._consumer, self._error, self._in_context
        inject, context_of = self._propagator.inject, self.context_of

        def traced(state: S, inbound: Inbound) -> Step[S]:
            if not inbound.wants_output:
                return step(state, inbound)
            span = tracer.start_span(f"{service} fold {inbound.stream}", context=context_of(inbound.headers),
                                     kind=kind)
            if span.is_recording():  # an unsampled trace's span records nothing: its attributes unbuilt
                attributes: dict[str, str | int] = {
                    "healthplane.stream": inbound.stream, "healthplane.seq": inbound.seq,
                    "healthplane.subject": inbound.subject}
                node = _node_of(inbound.subject)
                if node is not None:
                    attributes["healthplane.cluster"], attributes["healthplane.node.id"] = node
                span.set_attributes(attributes)
            try:
                state, emits, notes = step(state, inbound)
            except BaseException as exc:
                span.record_exception(exc)
                span.set_status(status(error, f"{type(exc).__name__}: {exc}"))
                raise
            finally:
                span.end()
            if emits:
                carrier: dict[str, str] = {}
                inject(carrier, context=in_context(span))
                emits = [emit if emit.purge_stream is not None
                         else dataclasses.replace(emit, headers={**emit.headers, **carrier}) for emit in emits]
            return Step(state, emits, notes)

        return traced

    @contextlib.contextmanager
    def publishing(self, service: str, subject: str) -> Iterator[dict[str, str] | None]:
        """The headers that start a report's trace (the collector's publish, inside its span:
        ``{service} publish {kind}``); None when traces are not exported."""
        tracer = self._tracer
        if tracer is None:
            yield None
            return
        attributes: dict[str, str | int] = {"healthplane.subject": subject}
        node = _node_of(subject)
        if node is not None:
            attributes["healthplane.cluster"], attributes["healthplane.node.id"] = node
        kind = subject.split(".")[1] if subject.count(".") >= 1 else subject
        span = tracer.start_span(f"{service} publish {kind}", kind=self._producer, attributes=attributes)
        from opentelemetry.trace import use_span

        with use_span(span, end_on_exit=True):
            headers: dict[str, str] = {}
            self._propagator.inject(headers, context=self._in_context(span))
            yield headers

    # ------------------------------------------------------------------ node events as logs

    def logging_store(self, store: Callable[[list[Outbound]], Coroutine[Any, Any, list[Ack]]]
                      ) -> Callable[[list[Outbound]], Coroutine[Any, Any, list[Ack]]]:
        """A Processor's write (``Processor._store``), followed by :meth:`stored` of what it
        wrote; ``store`` itself while logs are not exported."""
        if self._logger is None:
            return store
        stored = self.stored

        async def store_and_log(records: list[Outbound]) -> list[Ack]:
            acks = await store(records)
            stored(records, acks)
            return acks

        return store_and_log

    def stored(self, records: Sequence[Outbound], acks: Sequence[Ack]) -> None:
        """An OTLP log record for each node event among ``records`` that JetStream stored as
        new (its ack not a duplicate: an event written again after a lost ack is logged once)."""
        if self._logger is None:
            return
        for (subject, payload, headers), ack in zip(records, acks, strict=False):
            if ack.duplicate or not subject.startswith(EVENTS_PREFIX):
                continue
            try:
                event = wire.decode(wire.NodeEvent, payload)
            except wire.WireError:
                continue
            self.node_event(event, headers or {})

    def node_event(self, event: wire.NodeEvent, headers: Mapping[str, str]) -> None:
        """One node event as an OTLP log record: its message the body, its time the
        timestamp, its severity the condition's (a cleared condition, and an event without
        one, are INFO), its fields the attributes; in the trace its headers carry."""
        if self._logger is None:
            return
        attributes: dict[str, str | int] = {
            "healthplane.event.id": event.id, "healthplane.event.type": event.type,
            "healthplane.node.id": event.node_id, "healthplane.cluster": event.cluster,
            "healthplane.actor": event.actor}
        severity: str = "info"
        condition = event.condition
        if condition is not None:
            attributes["healthplane.condition.type"] = condition.type
            attributes["healthplane.condition.reason"] = condition.reason
            attributes["healthplane.condition.severity"] = condition.severity
            if condition.recommended_action is not None:
                attributes["healthplane.condition.recommended_action"] = condition.recommended_action
            if event.type != "CONDITION_CLEARED":
                severity = condition.severity
        elif event.fault is not None:
            severity = event.fault.severity
            if event.fault.recommended_action is not None:
                attributes["healthplane.condition.recommended_action"] = event.fault.recommended_action
        if event.score is not None:
            attributes["healthplane.score"] = event.score
        if event.action is not None:
            attributes["healthplane.action"] = event.action
        from opentelemetry._logs import SeverityNumber

        self._logger.emit(
            timestamp=_unix_ns(event.occurred_at), context=self.context_of(headers),
            severity_number=SeverityNumber(SEVERITY_NUMBERS.get(severity, 9)), severity_text=severity,
            body=event.message, attributes=attributes, event_name=EVENT_NAME)


def imported() -> bool:
    """Whether any opentelemetry module is loaded in this process (tests: off imports none)."""
    return any(name == "opentelemetry" or name.startswith("opentelemetry.") for name in sys.modules)
