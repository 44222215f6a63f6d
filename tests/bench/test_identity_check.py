"""Issue 40, "Figures": what SEC-7's identity check (the subject names the payload's node)
costs health-ingest per report — the fold's CPU per report with the checked codec against
the same fold with the unchecked one, interleaved in one run over the same 20,000 reports."""

from __future__ import annotations

from datetime import timedelta

import pytest

from healthplane.contracts import subjects, wire
from healthplane.runtime.fold import Inbound, decoder
from healthplane_health_ingest import fold as ingest
from healthplane_health_ingest.fold import IngestCore
from healthplane_health_ingest.rules import IngestState
from tests.bench import harness
from tests.bench.bus import core_cpu_per_record
from tests.bench.test_health_ingest import T0, _template

# In-process services run as the test's own identity: on an open server, as the other
# component benches (what identities cost is tests/bench/test_auth_pipeline.py's).
pytestmark = pytest.mark.insecure

NODES = 20_000
ROUNDS = 9


async def test_sec7_identity_check_cost_per_report() -> None:
    template = await _template()
    fields = {f: getattr(template, f) for f in template.__struct_fields__}
    inbounds = []
    for i in range(NODES):
        node_id = f"cn-{i:06d}"
        data = wire.encode(wire.HealthReport(**{**fields, "node_id": node_id, "hostname": node_id, "sent_at": T0}))
        inbounds.append(Inbound("HP_REPORTS", i + 1, subjects.report("bench", node_id), data, {},
                                T0 + timedelta(seconds=i / 1000), True))
    checked, unchecked = dict(ingest.CODECS), {**ingest.CODECS, "HP_REPORTS": decoder(wire.HealthReport)}
    with_check, without = [], []
    try:
        for _ in range(ROUNDS):  # interleaved: a busy moment of the machine hits both alike
            ingest.CODECS.clear()
            ingest.CODECS.update(unchecked)
            without.append(core_cpu_per_record(IngestCore([]), IngestState(), inbounds))
            ingest.CODECS.clear()
            ingest.CODECS.update(checked)
            with_check.append(core_cpu_per_record(IngestCore([]), IngestState(), inbounds))
    finally:
        ingest.CODECS.clear()
        ingest.CODECS.update(checked)
    # The least of each: CPU time a busy moment inflates, never deflates.
    checked_us, unchecked_us = min(with_check), min(without)
    harness.record("health-ingest fold CPU a report, SEC-7 check on (baseline: off)", checked_us, "us",
                   baseline=unchecked_us, target="ratio <= 1.03")
    print(f"\nSEC-7 identity check: {checked_us:.2f} us a report checked, {unchecked_us:.2f} unchecked "
          f"(ratio {checked_us / unchecked_us:.3f}; goal <= 1.03)")
    assert checked_us / unchecked_us <= 1.03
