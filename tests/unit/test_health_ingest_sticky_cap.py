"""SEC-11: sticky conditions per node are capped. A node that makes devices up (an Xid 79 on a new
PCI address in every entry: each one a sticky key) cannot grow its state without bound: the
first ``STICKY_MAX`` in fold order are held, the rest refused, and the fold notes it once per
occurrence, deterministically, so a replay reaches the same state."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import msgspec

from healthplane.contracts import wire
from healthplane.runtime.fold import Inbound, Note
from healthplane_health_ingest.fold import STICKY_CAPPED, IngestCore
from healthplane_health_ingest.rules import STICKY_MAX, IngestState
from tests.support.records import subject_for

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
KEY = "c\x00n1"


def _bus(b: int) -> str:
    return f"0000:{b >> 8:02x}:{b & 0xff:02x}.0"


def _report(buses: Sequence[int], count: int = 1) -> bytes:
    """A report whose kernel log shows Xid 79 (hardware: sticky) on each made-up bus."""
    xid = [wire.XidEntry(pci_bus_id=_bus(b), gpu_index=None, xid=79, count=count,
                         last_at=T0, last_message=f"NVRM: Xid (PCI:{b}): 79, GPU has fallen off the bus.")
           for b in buses]
    report = wire.HealthReport(
        node_id="n1", cluster="c", hostname="n1", sent_at=T0, interval_seconds=30, trigger="kmsg",
        signals=wire.Signals(edac=wire.EdacSignal(status="ok"), smart=wire.SmartSignal(status="ok"),
                             ioerr=wire.IoerrSignal(status="ok"), kmsg=wire.KmsgSignal(status="ok", xid=xid),
                             mounts=wire.MountsSignal(status="ok"), gpu=wire.GpuSignal(status="ok")))
    return wire.encode(report)


def _serviced() -> bytes:
    return wire.encode(wire.NodeEvent(id="s1", node_id="n1", cluster="c", type="NODE_SERVICED", occurred_at=T0,
                                      message="serviced", actor="admin"))


# The attack, then service, then the attack again: the cap and 44 more made-up GPUs, 200 more,
# the first ones' counts rising, service, then as many others.
FLOOD = STICKY_MAX + 44
INPUTS: list[tuple[str, bytes]] = [
    ("HP_REPORTS", _report(range(FLOOD))),
    ("HP_REPORTS", _report(range(FLOOD, FLOOD + 200))),
    ("HP_REPORTS", _report(range(FLOOD), count=2)),
    ("HP_NODE_EVENTS", _serviced()),
    ("HP_REPORTS", _report(range(10_000, 10_000 + FLOOD))),
]


def _fold(inputs: Sequence[tuple[str, bytes]], snapshot_at: int | None = None) -> tuple[IngestState, list[list[Note]]]:
    core, state = IngestCore(plugins=[]), IngestState()
    notes: list[list[Note]] = []
    for seq, (stream, data) in enumerate(inputs, 1):
        if seq == snapshot_at:  # a restart from a snapshot in the middle
            state = msgspec.json.decode(msgspec.json.encode(state), type=IngestState)
            core = IngestCore(plugins=[])
        inbound = Inbound(stream, seq, subject_for(stream, data), data, {}, T0 + timedelta(seconds=30 * seq), True)
        state, _, said = core.step(state, inbound)
        notes.append([n for n in said if n.counter == STICKY_CAPPED])
    return state, notes


def test_sec11_sticky_faults_of_one_node_are_capped_and_noted_once_per_occurrence() -> None:
    """SEC-11: STICKY_MAX + 44 made-up GPUs with an Xid 79 each: STICKY_MAX held, 44 refused,
    one note; more of them while full: no new note; service empties the map, and the next
    flood is a new occurrence, noted again."""
    state, notes = _fold(INPUTS[:1])
    node = state.nodes[KEY]
    assert len(node.sticky) == STICKY_MAX
    assert node.sticky_refused == 44
    # Deterministic: the first STICKY_MAX in fold order (per bus address, as ING-2 grades them).
    assert sorted(s.device for s in node.sticky.values()) == sorted(_bus(b) for b in range(FLOOD))[:STICKY_MAX]
    assert [(n.level, n.fields["node_id"], n.fields["cap"], n.fields["refused"]) for n in notes[0]] == [
        ("warning", "n1", STICKY_MAX, 44)]
    assert node.conditions["gpu_xid_errors"].severity == "critical"  # the node is still graded

    state, notes = _fold(INPUTS)
    assert [len(n) for n in notes] == [1, 0, 0, 0, 1]  # once per occurrence, not once per report
    node = state.nodes[KEY]
    assert len(node.sticky) == STICKY_MAX and node.sticky_refused == 44
    assert sorted(s.device for s in node.sticky.values()) == sorted(
        _bus(b) for b in range(10_000, 10_000 + FLOOD))[:STICKY_MAX]


def test_sec11_the_cap_is_deterministic_across_a_refold_and_a_snapshot() -> None:
    """SEC-11, REL-1: folding again from scratch, or from a snapshot taken anywhere, reaches the
    same state (the same held keys, the same refusal count) and the same notes."""
    state, notes = _fold(INPUTS)
    encoded = msgspec.json.encode(state)
    for cut in range(1, len(INPUTS) + 1):
        again, notes_again = _fold(INPUTS, snapshot_at=cut)
        assert msgspec.json.encode(again) == encoded, cut
        assert [[n.fields for n in said] for said in notes_again] == [[n.fields for n in said] for said in notes]


def test_sec11_a_real_node_never_reaches_the_cap() -> None:
    """SEC-11: the biggest real node (16 GPUs) with every hardware Xid on every GPU holds at most
    128 sticky Xid faults (and one per promotion rule that fired: RUL-1's fatal-Xid rule
    does, five fatal Xids on one GPU): well within the cap, and no note."""
    hardware = (48, 63, 64, 74, 79, 92, 94, 95)
    xid = [wire.XidEntry(pci_bus_id=f"0000:{0x18 + g:02x}:00.0", gpu_index=g, xid=x, count=1, last_at=T0,
                         last_message=f"NVRM: Xid {x}") for g in range(16) for x in hardware]
    report = msgspec.json.decode(_report(()))
    report["signals"]["kmsg"]["xid"] = msgspec.to_builtins(xid)
    state, notes = _fold([("HP_REPORTS", msgspec.json.encode(report))])
    held = state.nodes[KEY].sticky
    assert 0 < len([k for k in held if k.startswith("xid.")]) <= 128 < STICKY_MAX
    assert [k for k in held if not k.startswith("xid.")] == ["rule.fatal-xid-repeated"]
    assert state.nodes[KEY].sticky_refused == 0 and notes == [[]]
