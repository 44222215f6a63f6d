"""INT-4: optional OpenTelemetry export, off by default, no cost when off.

On, against an in-process OTLP/HTTP receiver (tests.support.otlp: a real HTTP server that
decodes with opentelemetry-proto's classes): the collector's report starts a trace that
health-ingest, the scorer, policy and eviction — each its own ``healthplane service``
process, with its own identity — continue, one span per fold, and the node events they write
arrive as OTLP log records in that trace. Off: a real service sends nothing and never imports
opentelemetry."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import parse_cluster_config
from healthplane.runtime import telemetry
from healthplane.runtime.connect import connect
from healthplane.runtime.replay import read_all
from healthplane.stack.natsserver import NatsServer
from healthplane_collector.agent import Collector, Settings
from healthplane_collector.main import publisher
from healthplane_collector.sim import SimNode
from tests.support import otlp
from tests.support.secure import apply_config, creds_for, env_for

CLUSTER, NODE = "lab", "n1"
PATH = ("health-ingest", "scorer", "policy", "eviction")  # collector → … → eviction
CONSUMER, PRODUCER = 5, 4  # opentelemetry.proto.trace.v1.Span.SpanKind
# Exports every 0.1 s instead of 5 s (the SDK's OTEL_BSP_/OTEL_BLRP_ variables): the test
# waits for what arrives.
QUICK = {"OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_BLRP_SCHEDULE_DELAY": "100"}


def _otel_env(receiver: otlp.OtlpReceiver, on: bool) -> dict[str, str]:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, **QUICK}
    if on:
        env["HEALTHPLANE_OTEL"] = "1"
    return env


@contextmanager
def _services(server: NatsServer, tmp_path: Path, names: tuple[str, ...], env: dict[str, str],
              argv: tuple[str, ...] = ("-m", "healthplane.cli")) -> Iterator[dict[str, subprocess.Popen[str]]]:
    """``healthplane service NAME`` for each name, its own identity, stopped with SIGTERM (a
    clean stop: the last spans and records flushed) and its log shown on a failure."""
    started: dict[str, subprocess.Popen[str]] = {}
    for name in names:
        service_env = env_for(server, name, **env)
        if "HEALTHPLANE_OTEL" not in env:
            service_env.pop("HEALTHPLANE_OTEL", None)
        with open(tmp_path / f"{name}.log", "ab") as log:
            started[name] = subprocess.Popen([sys.executable, *argv, "service", name, "--metrics-port", "0"],
                                             env=service_env, stdout=subprocess.PIPE, stderr=log,
                                             stdin=subprocess.DEVNULL, text=True)
    try:
        yield started
    finally:
        for process in started.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for name, process in started.items():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.returncode != 0:
                print(f"--- {name} (exit {process.returncode})\n{(tmp_path / f'{name}.log').read_text()[-4000:]}")


async def _publish_reports(server: NatsServer, nc: NATS, js: JetStreamContext, *, xid: bool) -> str:
    """As the node's collector, with its own identity and its publish (``publisher``): the
    resource report and a healthy report, then, once the scorer has scored it (a first score to
    fall from), one with an Xid 48 on GPU 0 (``xid``); the subject of the health reports."""
    node_nc = await connect(server.url, name="test-collector",
                            creds=creds_for(server, "collector", f"{CLUSTER}/{NODE}"), give_up_after=5)
    try:
        publish = publisher(node_nc.jetstream())
        sim = SimNode(NODE)
        collector = Collector(Settings(node_id=NODE, cluster=CLUSTER, interval_s=3600), sim, sim.kmsg)
        collector.refresh_inventory()
        await collector.probe(("gpu",))
        resources = collector.resource_report(True, datetime.now(UTC))
        assert resources is not None
        await publish(subjects.resource(CLUSTER, NODE), wire.encode(resources))
        healthy = await collector.collect("scheduled", datetime.now(UTC))
        await publish(subjects.report(CLUSTER, NODE), wire.encode(healthy))
        if xid:
            async with asyncio.timeout(30):
                while not any(wire.decode(wire.NodeView, m.data).last_reported_at is not None
                              for m in await read_all(nc, js, "HP_NODES", subjects.node_view(CLUSTER, NODE))):
                    await asyncio.sleep(0.1)
            sim.inject("xid:48", 0, datetime.now(UTC))
            report = await collector.collect("scheduled", datetime.now(UTC))
            await publish(subjects.report(CLUSTER, NODE), wire.encode(report))
    finally:
        await node_nc.close()
    return subjects.report(CLUSTER, NODE)


async def _stored_events(nc: NATS, js: JetStreamContext) -> dict[str, tuple[wire.NodeEvent, dict[str, str]]]:
    found = await read_all(nc, js, "HP_NODE_EVENTS", "hp.event.>")
    return {event.id: (event, dict(m.headers or {}))
            for m in found for event in [wire.decode(wire.NodeEvent, m.data)]}


def _show(receiver: otlp.OtlpReceiver) -> None:
    """What arrived, for a failure's output."""
    for s in receiver.spans():
        print("span", s.service, s.name, s.trace_id[:8], s.span_id[:8], s.parent_span_id[:8], s.attributes)
    for log in receiver.logs():
        print("log", log.service, log.trace_id[:8], log.span_id[:8], log.attributes, log.body)


@pytest.mark.nats
@pytest.mark.slow
async def test_int4_one_report_is_one_trace_from_the_collector_to_eviction_and_its_events_are_logs(
        nats_server: NatsServer, nc: NATS, js: JetStreamContext, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Cordon mode, one node of one may be out: the Xid's score (55) makes policy act and
    # eviction hold the node, so the trace runs the whole path.
    await apply_config(js, parse_cluster_config(
        {"cluster": CLUSTER, "nodeHealth": {"mode": "cordon", "maxUnavailablePercent": 100}}))
    with otlp.receiver() as receiver:
        for name, value in _otel_env(receiver, on=True).items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        assert telemetry.start("collector") is not None  # the test plays the node's collector
        try:
            with _services(nats_server, tmp_path, PATH, _otel_env(receiver, on=True)):
                report_subject = await _publish_reports(nats_server, nc, js, xid=True)
                *_, stored = await read_all(nc, js, "HP_REPORTS", report_subject)  # the Xid's
                traceparent = (stored.headers or {})["traceparent"]
                trace_id = traceparent.split("-")[1]

                def whole_path(r: otlp.OtlpReceiver) -> bool:
                    names = {s.name for s in r.spans() if s.trace_id == trace_id}
                    kinds = {log.attributes.get("healthplane.event.type") for log in r.logs() if log.trace_id == trace_id}
                    return ("eviction fold HP_COMMANDS" in names and "HOLD_CREATED" in kinds
                            and "POLICY_ACTED" in kinds and "SCORE_CHANGED" in kinds and "CONDITION_RAISED" in kinds)

                telemetry.shutdown()  # the collector's span goes out now
                try:
                    await asyncio.to_thread(receiver.wait_for, whole_path, 60, f"trace {trace_id} to eviction")
                except AssertionError:
                    _show(receiver)
                    raise
        finally:
            telemetry.shutdown()
        events = await _stored_events(nc, js)  # the services stopped: every record flushed

        spans = [s for s in receiver.spans() if s.trace_id == trace_id]
        by_id = {s.span_id: s for s in spans}
        [root] = [s for s in spans if not s.parent_span_id]
        assert (root.service, root.name, root.kind) == ("collector", "collector publish report", PRODUCER)
        assert root.span_id == traceparent.split("-")[2]
        assert root.attributes == {"healthplane.subject": report_subject, "healthplane.cluster": CLUSTER,
                                   "healthplane.node.id": NODE}

        def chain(span: otlp.ReceivedSpan) -> list[str]:
            hops = [span.name]
            while span.parent_span_id:
                span = by_id[span.parent_span_id]
                hops.append(span.name)
            return hops[::-1]

        # One hop per service, each a child of the fold whose output it folded.
        [held] = [s for s in spans if s.name == "eviction fold HP_COMMANDS"]
        assert chain(held) == ["collector publish report", "health-ingest fold HP_REPORTS",
                               "scorer fold HP_ASSESSMENTS", "policy fold HP_NODE_EVENTS", "eviction fold HP_COMMANDS"]
        for span in (s for s in spans if s is not root):
            service = span.name.split(" fold ")[0]
            assert span.service == service and span.kind == CONSUMER, span
            assert set(span.attributes) == {"healthplane.stream", "healthplane.seq", "healthplane.subject",
                                            "healthplane.cluster", "healthplane.node.id"}, span.attributes
            assert span.attributes["healthplane.stream"] == span.name.split(" fold ")[1]
            assert span.attributes["healthplane.node.id"] == NODE and span.attributes["healthplane.seq"] >= 1
            assert span.end_unix_nano >= span.start_unix_nano
        [ingest] = [s for s in spans if s.name == "health-ingest fold HP_REPORTS"]
        assert ingest.parent_span_id == root.span_id and ingest.attributes["healthplane.subject"] == report_subject

        # Each node event the path wrote is a log record of the service that wrote it, in the
        # span of the fold that decided it, carrying what the stored event says.
        logs = {log.attributes["healthplane.event.id"]: log for log in receiver.logs()}
        in_trace = {event_id: log for event_id, log in logs.items() if log.trace_id == trace_id}
        writers = {"CONDITION_RAISED": "health-ingest", "SCORE_CHANGED": "scorer", "POLICY_ACTED": "policy",
                   "HOLD_CREATED": "eviction"}
        for event_type, service in writers.items():
            [(event_id, log)] = [(i, log) for i, log in in_trace.items()
                                 if log.attributes["healthplane.event.type"] == event_type]
            event, headers = events[event_id]
            assert log.service == service and by_id[log.span_id].service == service
            assert headers["traceparent"].split("-")[2] == log.span_id  # the record and the log agree
            assert log.body == event.message and log.event_name == "healthplane.node_event"
            assert log.time_unix_nano == int(event.occurred_at.timestamp()) * 10**9 + event.occurred_at.microsecond * 1000
            assert {k: log.attributes[k] for k in ("healthplane.node.id", "healthplane.cluster", "healthplane.actor")} \
                == {"healthplane.node.id": NODE, "healthplane.cluster": CLUSTER, "healthplane.actor": event.actor}
        raised = next(log for log in in_trace.values() if log.attributes["healthplane.event.type"] == "CONDITION_RAISED")
        condition = events[raised.attributes["healthplane.event.id"]][0].condition
        assert condition is not None
        assert raised.attributes["healthplane.condition.type"] == condition.type
        assert raised.attributes["healthplane.condition.severity"] == condition.severity
        assert raised.attributes.get("healthplane.condition.recommended_action") == condition.recommended_action
        assert (raised.severity_text, raised.severity_number) == (
            condition.severity, telemetry.SEVERITY_NUMBERS[condition.severity])
        # Every stored event came out, once (the resource report's too, in its own trace).
        assert set(logs) == set(events)
        assert len(receiver.logs()) == len(logs)


@pytest.mark.nats
async def test_int4_off_a_service_sends_nothing_and_never_imports_opentelemetry(
        nats_server: NatsServer, nc: NATS, js: JetStreamContext, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch off (HEALTHPLANE_OTEL unset) with the OTEL_ variables set: health-ingest and
    the scorer fold the collector's reports and write their events, no record carries a
    traceparent, the receiver hears nothing, and neither service process (asked at its exit)
    ever loaded an opentelemetry module."""
    at_exit = ("import atexit, json, sys\n"
               "from healthplane.runtime import telemetry\n"
               "atexit.register(lambda: print(json.dumps({'imported': telemetry.imported(), "
               "'loaded': sorted(m for m in sys.modules if m.startswith('opentelemetry'))}), flush=True))\n"
               "from healthplane.cli.main import main\n"
               "sys.exit(main(sys.argv[1:]))\n")
    monkeypatch.delenv("HEALTHPLANE_OTEL", raising=False)
    assert telemetry.start("collector") is None
    with otlp.receiver() as receiver:
        with _services(nats_server, tmp_path, ("health-ingest", "scorer"), _otel_env(receiver, on=False),
                       argv=("-c", at_exit)) as started:
            await _publish_reports(nats_server, nc, js, xid=True)  # waits for the scorer's first view

            async def scored_55() -> bool:
                return any(e.type == "SCORE_CHANGED" and e.score == 55 for e, _ in (await _stored_events(nc, js)).values())

            async with asyncio.timeout(30):
                while not await scored_55():
                    await asyncio.sleep(0.1)
            said = {}
            for name, process in started.items():
                process.send_signal(signal.SIGTERM)
                out, _ = process.communicate(timeout=30)
                assert process.returncode == 0, name
                said[name] = json.loads(out.strip().splitlines()[-1])
        assert said == {name: {"imported": False, "loaded": []} for name in ("health-ingest", "scorer")}
        events = await _stored_events(nc, js)
        assert {"CONDITION_RAISED", "SCORE_CHANGED"} <= {e.type for e, _ in events.values()}
        stored = [*await read_all(nc, js, "HP_REPORTS", "hp.report.>"),
                  *await read_all(nc, js, "HP_ASSESSMENTS", "hp.assess.>"),
                  *await read_all(nc, js, "HP_NODES", "hp.node.>")]
        assert all("traceparent" not in (m.headers or {}) for m in stored)
        assert all("traceparent" not in headers for _, headers in events.values())
        await asyncio.sleep(0.5)  # more than an export interval (QUICK), had anything been queued
        assert receiver.received() == 0


def test_int4_node_event_severities_and_attributes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The log record of a node event: severity from the condition (a cleared one, and an
    event without one, INFO; a fault observation's own), the condition's fields where
    present; outside any trace when the record carries none."""
    at = datetime(2026, 12, 1, 9, 0, 0, 123456, tzinfo=UTC)

    def event(kind: str, **fields: object) -> wire.NodeEvent:
        return wire.NodeEvent(id=f"e-{kind}", node_id=NODE, cluster=CLUSTER, type=kind, occurred_at=at,  # type: ignore[arg-type]
                              message=f"{kind.lower()} on {NODE}", actor="health-ingest", **fields)  # type: ignore[arg-type]

    critical = wire.ConditionChange(type="gpu_xid_errors", reason="Xid48", severity="critical", message="DBE",
                                    recommended_action="RESET_GPU")
    with otlp.receiver() as receiver:
        for name, value in _otel_env(receiver, on=True).items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        exporting = telemetry.start("health-ingest")
        assert exporting is not None
        try:
            exporting.node_event(event("CONDITION_RAISED", condition=critical), {})
            exporting.node_event(event("CONDITION_CLEARED", condition=critical), {})
            exporting.node_event(event("SCORE_CHANGED", score=55, previous_score=100), {})
            exporting.node_event(event("HOLD_CREATED"), {"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"})
        finally:
            telemetry.shutdown()
        receiver.wait_for(lambda r: len(r.logs()) == 4, 10, "four log records")
        logs = {log.attributes["healthplane.event.type"]: log for log in receiver.logs()}
    assert {kind: (log.severity_text, log.severity_number) for kind, log in logs.items()} == {
        "CONDITION_RAISED": ("critical", 17), "CONDITION_CLEARED": ("info", 9), "SCORE_CHANGED": ("info", 9),
        "HOLD_CREATED": ("info", 9)}
    raised = logs["CONDITION_RAISED"]
    assert raised.service == "health-ingest" and raised.body == f"condition_raised on {NODE}"
    assert raised.time_unix_nano == 1796115600_123456000
    assert raised.attributes == {
        "healthplane.event.id": "e-CONDITION_RAISED", "healthplane.event.type": "CONDITION_RAISED",
        "healthplane.node.id": NODE, "healthplane.cluster": CLUSTER, "healthplane.actor": "health-ingest",
        "healthplane.condition.type": "gpu_xid_errors", "healthplane.condition.reason": "Xid48",
        "healthplane.condition.severity": "critical", "healthplane.condition.recommended_action": "RESET_GPU"}
    assert logs["SCORE_CHANGED"].attributes["healthplane.score"] == 55
    assert (raised.trace_id, raised.span_id) == ("", "")
    assert (logs["HOLD_CREATED"].trace_id, logs["HOLD_CREATED"].span_id) == ("ab" * 16, "cd" * 8)


def test_int4_asked_for_but_not_installed_is_one_error_and_the_service_runs_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """HEALTHPLANE_OTEL=1 where the ``otel`` extra is missing: one error naming the extra,
    nothing exported, nothing installed in the fold."""
    said: list[tuple[str, dict[str, object]]] = []

    class Log:
        def error(self, event: str, **fields: object) -> None:
            said.append((event, fields))

        def info(self, event: str, **fields: object) -> None:
            raise AssertionError(event)

    monkeypatch.setenv("HEALTHPLANE_OTEL", "1")
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    assert telemetry.start("health-ingest", Log()) is None and telemetry.active is None
    [(event, fields)] = said
    assert "not installed" in event and fields["install"] == "pip install 'healthplane[otel]'"
