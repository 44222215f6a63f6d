"""INT-4: what OpenTelemetry export costs the pipeline — health-ingest's reports/s with
export off, against the same Processor path, in the same run (off must be within 3 %), and
with export on (a span per report and the node events as OTLP logs, to a receiver in a
process of its own; every trace sampled, then 1 %), for information.

The machine these run on is shared (other jobs' load moves wall-clock rates by tens of per
cent from one run to the next), so each mode runs once per round, interleaved, the best of
each is compared, and the bound is checked on what a shared machine does not move much: the
process's CPU time per report (the fold is CPU-bound: its rate is one over it on a quiet
machine). The CPU counted is the whole process's, the SDK's export thread included."""

from __future__ import annotations

import subprocess
import sys
import time
import timeit
from typing import Any

import pytest
from nats.js import JetStreamContext

from healthplane.runtime import telemetry
from healthplane.runtime.fold import Core
from healthplane.runtime.processor import Processor
from healthplane.stack.natsserver import NatsServer
from healthplane_health_ingest.fold import INPUTS, OUTPUTS, IngestCore
from healthplane_health_ingest.rules import IngestState
from tests.bench import harness
from tests.bench.bus import fleet_reports, processor_rate, publish_all

pytestmark = pytest.mark.insecure  # in-process services as the test's own identity, as the other benches

REPORTS = 30_000  # distinct nodes: each run folds a fleet's first reports, ~4 s at ~7,000/s
ROUNDS = 5  # each mode runs once per round, interleaved; the best run of each is compared


class WithoutTelemetry(Processor[IngestState]):
    """The Processor as it was before INT-4: the core's step called as it is, never asking
    whether export is on. Export off must fold at this one's speed."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        core: Core[IngestState] = kwargs["core"]
        self._step = core.step
        self.__dict__.pop("_store", None)  # the class's own write, had anything been installed


def _processor(kind: type[Processor[IngestState]], nc: Any, js: JetStreamContext, name: str) -> Processor[IngestState]:
    return kind(nc=nc, js=js, service=name, core=IngestCore(), state_type=IngestState, inputs=INPUTS,
                outputs=OUTPUTS, batch=512, snapshot_every_inputs=10**9, snapshot_every_s=10**9)


async def _rate(kind: type[Processor[IngestState]], nc: Any, js: JetStreamContext,
                name: str) -> tuple[float, float]:
    """Reports/s and the process's CPU µs per report of one fold of every report."""
    proc = _processor(kind, nc, js, name)  # a service name of its own: its own consumers, from the first report
    await proc.start()
    cpu = time.process_time()
    rate = await processor_rate(proc, "HP_REPORTS", REPORTS)
    cpu_us = (time.process_time() - cpu) / REPORTS * 1e6
    assert len(proc.state.nodes) == REPORTS
    return rate, cpu_us


async def test_int4_otel_off_costs_nothing_and_on_for_information(
        nats_server: NatsServer, nc, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    await publish_all(nc, await fleet_reports(REPORTS))
    receiver = subprocess.Popen([sys.executable, "-m", "tests.support.otlp"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    assert receiver.stdout is not None and receiver.stdin is not None
    url = receiver.stdout.readline().strip()
    runs: dict[str, list[tuple[float, float]]] = {"without": [], "off": [], "on": [], "sampled": []}
    try:
        for round_ in range(ROUNDS):
            runs["without"].append(await _rate(WithoutTelemetry, nc, js, f"ingest-without-{round_}"))
            monkeypatch.delenv("HEALTHPLANE_OTEL", raising=False)
            assert telemetry.start("health-ingest") is None
            off = _processor(Processor, nc, js, "probe")
            assert off._step == off._core.step and "_store" not in off.__dict__  # nothing installed
            runs["off"].append(await _rate(Processor, nc, js, f"ingest-off-{round_}"))
            if round_ == 0:
                assert not telemetry.imported()  # off: never imported, in a process that folded 30,000 reports
            monkeypatch.setenv("HEALTHPLANE_OTEL", "1")
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
            for mode, sampler in (("on", "parentbased_always_on"), ("sampled", "parentbased_traceidratio")):
                monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
                monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.01")  # read by the ratio sampler only
                assert telemetry.start("health-ingest") is not None
                try:
                    runs[mode].append(await _rate(Processor, nc, js, f"ingest-{mode}-{round_}"))
                finally:
                    telemetry.shutdown()
    finally:
        receiver.stdin.close()
        took = receiver.stdout.read()
        receiver.wait(10)
    print(f"\n(reports/s, CPU µs a report) by round: {runs}; the receiver took {took.strip()}")
    rate = {mode: max(r for r, _ in found) for mode, found in runs.items()}
    cpu = {mode: min(c for _, c in found) for mode, found in runs.items()}
    harness.record("otel.ingest_reports_per_s_off (vs the same path without telemetry)", rate["off"], "reports/s",
                   baseline=rate["without"])
    harness.record("otel.ingest_cpu_per_report_off (vs the same path without telemetry)", cpu["off"], "µs",
                   baseline=cpu["without"], target="ratio <= 1.03")
    harness.record("otel.ingest_reports_per_s_on (vs the same path without telemetry)", rate["on"], "reports/s",
                   baseline=rate["without"])
    harness.record("otel.ingest_cpu_per_report_on (vs the same path without telemetry)", cpu["on"], "µs",
                   baseline=cpu["without"])
    # 1 % of traces sampled (each report a root here: no collector in front); the other 99 %
    # still carry their unsampled traceparent on, so that one trace is one decision.
    harness.record("otel.ingest_reports_per_s_on_sampled_1pct (vs the same path without telemetry)",
                   rate["sampled"], "reports/s", baseline=rate["without"])
    harness.record("otel.ingest_cpu_per_report_on_sampled_1pct (vs the same path without telemetry)",
                   cpu["sampled"], "µs", baseline=cpu["without"])
    # What off costs, where it is paid: reading the switch once per Processor built (and once
    # per collector start); nothing per input, batch or write.
    check_ns = min(timeit.repeat("telemetry.active is not None", globals={"telemetry": telemetry},
                                 number=1_000_000, repeat=5)) * 1e3
    harness.record("otel.off_check_per_processor_ns", check_ns, "ns")
    assert cpu["off"] / cpu["without"] <= 1.03, runs
