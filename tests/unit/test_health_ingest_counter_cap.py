"""SEC-11: the climbing counters per node are capped. A node that names new disks in every
report (each disk's I/O error counter is a key of its node's state) cannot grow health-ingest's
state without bound: the first ``COUNTERS_MAX`` in fold order are followed, the rest refused,
noted once, and a refold or a snapshot reaches the same state."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import msgspec

from healthplane.contracts import wire
from healthplane.runtime.fold import Inbound, Note
from healthplane_health_ingest.fold import COUNTERS_CAPPED, IngestCore
from healthplane_health_ingest.rules import COUNTERS_MAX, IngestState
from tests.support.records import subject_for

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
KEY = "c\x00n1"
PER_REPORT = 6_000  # under the decoder's 8,192 disks a report


def _report(first: int, count: int = 1) -> bytes:
    devices = [wire.IoErrorCount(name=f"sd{i}", count=count) for i in range(first, first + PER_REPORT)]
    report = wire.HealthReport(
        node_id="n1", cluster="c", hostname="n1", sent_at=T0, interval_seconds=30, trigger="scheduled",
        signals=wire.Signals(edac=wire.EdacSignal(status="ok"), smart=wire.SmartSignal(status="ok"),
                             ioerr=wire.IoerrSignal(status="ok", devices=devices), kmsg=wire.KmsgSignal(status="ok"),
                             mounts=wire.MountsSignal(status="ok"), gpu=wire.GpuSignal(status="ok")))
    return wire.encode(report)


INPUTS = [_report(0), _report(PER_REPORT), _report(2 * PER_REPORT), _report(3 * PER_REPORT), _report(0, count=5)]


def _fold(inputs: Sequence[bytes], snapshot_at: int | None = None) -> tuple[IngestState, list[list[Note]]]:
    core, state = IngestCore(plugins=[]), IngestState()
    notes: list[list[Note]] = []
    for seq, data in enumerate(inputs, 1):
        if seq == snapshot_at:
            state = msgspec.json.decode(msgspec.json.encode(state), type=IngestState)
            core = IngestCore(plugins=[])
        inbound = Inbound("HP_REPORTS", seq, subject_for("HP_REPORTS", data), data, {},
                          T0 + timedelta(seconds=30 * seq), True)
        state, _, said = core.step(state, inbound)
        notes.append([n for n in said if n.counter == COUNTERS_CAPPED])
    return state, notes


def test_sec11_counters_of_one_node_are_capped_noted_once_and_the_first_still_climb() -> None:
    state, notes = _fold(INPUTS)
    node = state.nodes[KEY]
    assert len(node.counters) == COUNTERS_MAX
    assert node.counters_refused == 4 * PER_REPORT - COUNTERS_MAX  # the 3rd and 4th reports' new disks past the cap
    assert [len(n) for n in notes] == [0, 0, 1, 0, 0]  # when it first bound, not every report after
    # The disks followed first still climb: the last report raised their I/O errors.
    assert node.conditions["disk_degraded"].reason == "IoErrors"


def test_sec11_the_counter_cap_is_deterministic_across_a_refold_and_a_snapshot() -> None:
    state, notes = _fold(INPUTS)
    encoded = msgspec.json.encode(state)
    for cut in range(1, len(INPUTS) + 1):
        again, notes_again = _fold(INPUTS, snapshot_at=cut)
        assert msgspec.json.encode(again) == encoded, cut
        assert [[n.fields for n in said] for said in notes_again] == [[n.fields for n in said] for said in notes]
