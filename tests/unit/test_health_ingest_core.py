"""health-ingest's pure core: given these reports, then these conditions and events (ING-1..ING-7)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from healthplane.contracts import wire
from healthplane_collector.agent import Collector, Settings
from healthplane_collector.sim import SimNode
from healthplane_health_ingest.fold import IngestCore
from healthplane_health_ingest.rules import (
    IngestConfig,
    IngestState,
    assess,
    health,
    miss_deadline,
    missed,
    serviced,
    validated,
)
from tests.support.records import subject_for

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


async def sim_report(node: SimNode) -> wire.HealthReport:
    collector = Collector(Settings(node_id=node.node_id, cluster="c"), node, node.kmsg)
    collector.refresh_inventory()
    return await collector.collect("scheduled", T0)


class Scenario:
    """A node's reports through the core, one fault at a time, as the simulator makes them."""

    def __init__(self, config: IngestConfig | None = None) -> None:
        self.node = SimNode("n1")
        self.state = IngestState(config=config or IngestConfig())
        self.now = T0
        self.seq = 0

    async def report(self, *faults: str, gpu: int | None = None) -> list[str]:
        for fault in faults:
            self.node.inject(fault, gpu, self.now)
        self.seq += 1
        self.now += timedelta(seconds=30)
        _, changes = assess(self.state, await sim_report(self.node), self.now, self.seq)
        return [f"{c.type} {c.condition.type if c.condition else ''}".strip() for c in changes]

    @property
    def conditions(self) -> dict[str, wire.Condition]:
        return self.state.nodes["c\x00n1"].conditions

    def reason(self, condition_type: str) -> tuple[str, str]:
        c = self.conditions[condition_type]
        return c.reason, c.severity


async def test_healthy_node_has_no_conditions_and_is_healthy() -> None:
    s = Scenario()
    assert await s.report() == []
    assert s.conditions == {} and health(s.state.nodes["c\x00n1"]) == "HEALTHY"


@pytest.mark.parametrize(
    ("fault", "gpu", "condition", "reason", "severity"),
    [
        ("smart-failing", None, "disk_degraded", "SmartFailing", "critical"),
        ("readonly-mount", None, "disk_readonly", "ReadOnlyMount", "critical"),
        ("edac-ce", None, "memory_errors", "CorrectableMemoryErrors", "warning"),
        ("edac-ue", None, "memory_errors", "UncorrectableMemoryErrors", "critical"),
        ("mce-corrected", None, "machine_check_errors", "MachineCheckCorrected", "warning"),
        ("mce-fatal", None, "machine_check_errors", "MachineCheckFatal", "critical"),
        ("hw-error-fatal", None, "machine_check_errors", "HardwareErrorRecord", "critical"),
        ("hw-error-corrected", None, "machine_check_errors", "HardwareErrorRecord", "warning"),
        ("ecc-correctable", 1, "gpu_ecc_errors", "GpuEccCorrectable", "warning"),
        ("ecc-uncorrectable", 1, "gpu_ecc_errors", "GpuEccUncorrectable", "critical"),
        ("row-remap-failure", 1, "gpu_ecc_errors", "GpuRowRemapFailure", "critical"),
        ("xid:79", 0, "gpu_xid_errors", "GpuXidHardware", "critical"),
        ("xid:13", 0, "gpu_xid_errors", "GpuXidApplication", "warning"),
        ("throttle-thermal", 2, "gpu_throttling", "GpuThermalThrottle", "warning"),
        ("power-brake", 2, "gpu_throttling", "GpuPowerBrake", "warning"),
        ("io-errors", None, "disk_degraded", "IoErrors", "warning"),
        ("collector-failed:smart", None, "collector_failed", "CollectorFailed", "warning"),
    ],
)
async def test_every_reason_from_its_fault(fault: str, gpu: int | None, condition: str, reason: str,
                                           severity: str) -> None:
    # ING-1: each fault the collector can see raises its condition with its reason code.
    s = Scenario()
    await s.report()  # baseline report: sysfs counters start their baseline here
    events = await s.report(fault, gpu=gpu)
    assert f"CONDITION_RAISED {condition}" in events
    assert s.reason(condition) == (reason, severity)


async def test_xid_79_also_fails_the_gpu_collector() -> None:
    # COL-8 / ING-2: off the bus = the Xid condition and CollectorFailed for the GPU signal.
    s = Scenario()
    await s.report("xid:79", gpu=0)
    assert s.reason("gpu_xid_errors") == ("GpuXidHardware", "critical")
    assert "gpu" in s.conditions["collector_failed"].message
    assert health(s.state.nodes["c\x00n1"]) == "DEGRADED"  # real fault beats the failed sensor


async def test_xid_grade_is_the_worst_and_message_names_the_latest() -> None:
    # ING-2: "GPU 0000:18:00.0: Xid 13 (worst 48)" — a crash after a DBE keeps it critical.
    s = Scenario()
    await s.report("xid:48", gpu=0)
    s.now += timedelta(seconds=1)
    await s.report("xid:13", gpu=0)
    assert s.reason("gpu_xid_errors") == ("GpuXidHardware", "critical")
    assert s.conditions["gpu_xid_errors"].message == "GPU 0000:18:00.0: Xid 13 (worst 48)"
    assert (await s.report()) == []  # sticky: nothing new, still raised
    assert "gpu_xid_errors" in s.conditions


async def test_application_xid_clears_when_it_stops_climbing() -> None:
    s = Scenario()
    assert await s.report("xid:13", gpu=3) == ["CONDITION_RAISED gpu_xid_errors"]
    assert await s.report() == ["CONDITION_CLEARED gpu_xid_errors"]


async def test_quiet_reports_to_clear_holds_a_climbing_condition() -> None:
    s = Scenario(IngestConfig(quiet_reports_to_clear=3))
    await s.report()
    await s.report("edac-ce")
    assert await s.report() == [] and await s.report() == []
    assert await s.report() == ["CONDITION_CLEARED memory_errors"]


async def test_escalation_is_raised_with_previous_severity() -> None:
    s = Scenario()
    await s.report()
    await s.report("edac-ce")
    node = s.state.nodes["c\x00n1"]
    s.node.inject("edac-ue", None, s.now)
    s.seq += 1
    _, changes = assess(s.state, await sim_report(s.node), s.now + timedelta(seconds=30), s.seq)
    (change,) = [c for c in changes if c.type == "CONDITION_RAISED"]
    assert change.condition is not None and change.condition.previous_severity == "warning"
    assert change.condition.severity == "critical" and node.conditions["memory_errors"].observations == 2


async def test_unmatched_xid_is_still_graded() -> None:
    # ING-2: an Xid whose address matches no device still raises.
    s = Scenario()
    report = await sim_report(s.node)
    xid = wire.XidEntry(pci_bus_id="0000:99:00.0", gpu_index=None, xid=94, count=1, last_at=T0, last_message="m")
    report = msgspec.structs.replace(report, signals=msgspec.structs.replace(
        report.signals, kmsg=msgspec.structs.replace(report.signals.kmsg, xid=[xid])))
    assess(s.state, report, T0, 1)
    assert s.reason("gpu_xid_errors") == ("GpuXidHardware", "critical")
    assert "0000:99:00.0 (no matching device): Xid 94" in s.conditions["gpu_xid_errors"].message


async def test_sticky_clears_only_on_service() -> None:
    # ING-3: uncorrectable memory stays until NODE_SERVICED.
    s = Scenario()
    await s.report()
    await s.report("edac-ue")
    for _ in range(3):
        assert await s.report() == []
    _, changes = serviced(s.state, "c", "n1", s.now)
    assert [c.type for c in changes] == ["CONDITION_CLEARED"] and "memory_errors" not in s.conditions
    assert await s.report() == []  # the counter did not rise again: stays clear


async def test_smart_failing_clears_when_the_drive_passes_again() -> None:
    # ING-2a: SMART is the drive's current verdict, not a sticky fault.
    s = Scenario()
    await s.report("smart-failing")
    assert s.reason("disk_degraded") == ("SmartFailing", "critical")
    assert await s.report() == []  # still failing: no change
    assert await s.report("clear") == ["CONDITION_CLEARED disk_degraded"]
    assert "disk_degraded" not in s.conditions


async def test_smart_without_a_verdict_keeps_the_last_one() -> None:
    # ING-2a: smartctl failing on the disk is no pass: the condition holds until a verdict.
    s = Scenario()
    await s.report("smart-failing")
    report = await sim_report(s.node)
    unreadable = msgspec.structs.replace(report.signals.smart, status="failed", reason="smartctl timed out",
                                         devices=[wire.SmartDevice(name="/dev/nvme0", error="timed out")])
    blind = msgspec.structs.replace(report, signals=msgspec.structs.replace(report.signals, smart=unreadable))
    s.seq += 1
    _, changes = assess(s.state, blind, s.now + timedelta(seconds=30), s.seq)
    assert s.reason("disk_degraded") == ("SmartFailing", "critical")
    assert [c.type for c in changes] == ["CONDITION_RAISED"]  # only collector_failed is new
    s.now += timedelta(seconds=30)
    assert "CONDITION_CLEARED disk_degraded" in await s.report("clear")


def test_smart_sticky_from_an_old_snapshot_clears_on_a_pass() -> None:
    # ING-2a on upgrade: a snapshot that held SmartFailing as sticky clears on the next pass.
    from healthplane_health_ingest.rules import Finding, NodeState, Sticky, _fold_smart_verdicts

    node = NodeState(cluster="c", node_id="n1", sticky={"smart./dev/sda": Sticky(
        Finding("disk_degraded", "SmartFailing", "critical", "x"), "/dev/sda", "S1")})
    _fold_smart_verdicts(node, wire.SmartSignal(status="ok", devices=[wire.SmartDevice(name="/dev/sda", passed=True)]))
    assert node.sticky == {} and node.smart_failing == {}


async def test_gpu_replacement_clears_its_sticky_faults() -> None:
    s = Scenario()
    await s.report("ecc-uncorrectable", gpu=1)
    s.node.hardware.gpus[1].uuid = "GPU-new-card"
    s.node.hardware.gpus[1].ecc_volatile = [0, 0]
    s.node._readings.clear()
    assert await s.report() == ["CONDITION_CLEARED gpu_ecc_errors"]


async def test_counter_reset_is_a_new_baseline_not_a_rise() -> None:
    # An agent restart: kmsg counts drop to zero, then one new record must raise once.
    s = Scenario()
    await s.report("mce-corrected")
    await s.report()
    s.node.kmsg.tally = type(s.node.kmsg.tally)()  # counts back to zero
    assert await s.report() == []
    assert await s.report("mce-corrected") == ["CONDITION_RAISED machine_check_errors"]


@pytest.mark.parametrize(("interval", "threshold", "window"), [
    (30, 3, 90), (2, 3, 15), (1, 1, 15), (100_000, 3, 3 * 86400), (60, 5, 300)])
def test_heartbeat_window_floor_and_cap(interval: int, threshold: int, window: int) -> None:
    # ING-4: max(15 s, threshold x min(interval, 24 h)) after the last report.
    state = IngestState()
    from healthplane_health_ingest.rules import NodeState

    node = NodeState(cluster="c", node_id="n", last_report_at=T0, interval_s=interval)
    assert miss_deadline(node, threshold) == T0 + timedelta(seconds=window)
    assert miss_deadline(NodeState(cluster="c", node_id="never"), threshold) is None
    assert state.nodes == {}


async def test_tick_marks_a_silent_node_missed_once_and_a_report_resumes_it() -> None:
    core = IngestCore()
    state = core.initial_state()
    s = Scenario()
    report = await sim_report(s.node)
    from healthplane.runtime.fold import Inbound

    state, _, _ = core.step(state, Inbound("HP_REPORTS", 1, "hp.report.c.n1", wire.encode(report), {}, T0, True))
    _, emits, _ = core.tick(state, T0 + timedelta(seconds=89))
    assert emits == []
    _, emits, _ = core.tick(state, T0 + timedelta(seconds=91))
    kinds = [msgspec.json.decode(e.payload).get("type") for e in emits]
    assert kinds == ["HEARTBEAT_MISSED", "CONDITION_RAISED", None]  # None: the assessment
    assert all(e.msg_id for e in emits)
    assert core.tick(state, T0 + timedelta(seconds=200))[1] == []  # once per silence
    node = state.nodes["c\x00n1"]
    assert health(node) == "UNKNOWN"
    _, emits, _ = core.step(state, Inbound("HP_REPORTS", 2, "hp.report.c.n1", wire.encode(report), {},
                                        T0 + timedelta(seconds=300), True))
    kinds = [msgspec.json.decode(e.payload).get("type") for e in emits]
    assert kinds[:2] == ["HEARTBEAT_RESUMED", "CONDITION_CLEARED"] and health(node) == "HEALTHY"


async def test_a_decommissioned_node_is_forgotten_and_never_missed() -> None:
    """NODE_DEPROVISIONED: no heartbeat miss for an instance that is gone, and a report that was
    in flight when it went is ignored; a report sent later (a new instance) is a node again."""
    from healthplane.runtime.fold import Inbound

    core = IngestCore()
    state = core.initial_state()
    report = await sim_report(SimNode("n1"))
    state, _, _ = core.step(state, Inbound("HP_REPORTS", 1, "hp.report.c.n1", wire.encode(report), {}, T0, True))
    gone = wire.NodeEvent(id="g", node_id="n1", cluster="c", type="NODE_DEPROVISIONED",
                          occurred_at=T0 + timedelta(seconds=5), message="deprovisioned", actor="eviction")
    state, _, _ = core.step(state, Inbound("HP_NODE_EVENTS", 2, subject_for("HP_NODE_EVENTS", wire.encode(gone)), wire.encode(gone), {}, T0, True))
    assert core.tick(state, T0 + timedelta(hours=1))[1] == []
    state, emits, _ = core.step(state, Inbound("HP_REPORTS", 3, "hp.report.c.n1", wire.encode(report), {}, T0, True))
    assert emits == [] and state.nodes == {}
    later = msgspec.structs.replace(report, sent_at=T0 + timedelta(minutes=5))
    state, emits, _ = core.step(state, Inbound("HP_REPORTS", 4, "hp.report.c.n1", wire.encode(later), {}, T0, True))
    assert emits and "c\x00n1" in state.nodes


def test_never_reported_node_is_never_missed() -> None:
    core = IngestCore()
    state = core.initial_state()
    assert core.tick(state, T0 + timedelta(days=10))[1] == []


def test_heartbeat_sweep_is_proportional_to_what_is_due() -> None:
    from healthplane_health_ingest.rules import NodeState

    state = IngestState()
    for i in range(1000):
        state.nodes[f"c\x00n{i}"] = NodeState(cluster="c", node_id=f"n{i}", last_report_at=T0 + timedelta(seconds=i),
                                              last_report_seq=i)
    core = IngestCore()
    _, emits, _ = core.tick(state, T0 + timedelta(seconds=100))
    assert len([e for e in emits if b"HEARTBEAT_MISSED" in e.payload]) == 11  # deadlines T0+90 .. T0+100
    _, emits, _ = core.tick(state, T0 + timedelta(seconds=100))
    assert emits == []


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["edac-ce", "edac-ue", "mce-corrected", "xid:13", "xid:79", "io-errors",
                                 "readonly-mount", "clear", "service", "quiet"]), max_size=12))
def test_conditions_never_clear_without_a_report_or_service(steps: list[str]) -> None:
    # Hypothesis: a sticky condition survives any sequence of reports until service.
    import asyncio

    async def run() -> None:
        s = Scenario()
        await s.report()
        for step in steps:
            before = dict(s.conditions)
            if step == "service":
                serviced(s.state, "c", "n1", s.now)
                continue
            if step == "quiet":
                await s.report()
            elif step == "clear":
                s.node.inject("clear", None, s.now)
                continue
            else:
                await s.report(step, gpu=0)
            for kind, condition in before.items():
                if condition.severity == "critical" and kind in ("memory_errors", "gpu_xid_errors"):
                    assert kind in s.conditions, (steps, kind)

    asyncio.run(run())


def test_missed_then_event_replay_is_idempotent() -> None:
    from healthplane_health_ingest.rules import NodeState

    node = NodeState(cluster="c", node_id="n", last_report_at=T0)
    first = missed(node, T0)
    assert [c.type for c in first] == ["HEARTBEAT_MISSED", "CONDITION_RAISED"]
    assert node.missed and "heartbeat_missed" in node.conditions


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["edac-ce", "edac-ue", "mce-corrected", "mce-fatal", "xid:13", "xid:48",
                                 "io-errors", "readonly-mount", "ecc-correctable", "smart-failing", "quiet"]),
                min_size=1, max_size=10),
       st.integers(min_value=0, max_value=10))
def test_snapshot_and_replay_equal_live_state(steps: list[str], cut: int) -> None:
    # REL-1 at the core: folding with a snapshot (encode, decode) anywhere in the middle ends
    # in the same state, and the same events, as folding straight through.
    import asyncio

    from healthplane.runtime.fold import Inbound

    async def reports() -> list[bytes]:
        node = SimNode("n1")
        out = []
        for step in steps:
            if step != "quiet":
                node.inject(step, 0, T0)
            out.append(wire.encode(await sim_report(node)))
        return out

    payloads = asyncio.run(reports())

    def fold(snapshot_at: int | None) -> tuple[bytes, list[bytes]]:
        core, state = IngestCore(), IngestState()
        emitted: list[bytes] = []
        for seq, data in enumerate(payloads, 1):
            if seq == snapshot_at:
                state = msgspec.json.decode(msgspec.json.encode(state), type=IngestState)
                core = IngestCore()  # a restarted process: fresh derived indexes
            state, emits, _ = core.step(state, Inbound("HP_REPORTS", seq, subject_for("HP_REPORTS", data), data, {}, T0 + timedelta(seconds=30 * seq), True))
            emitted += [e.payload for e in emits]
        return msgspec.json.encode(state), emitted

    assert fold(min(cut, len(payloads))) == fold(None)


@settings(max_examples=60, deadline=None)
@example([("report", 0, 1, 60), ("tick", 0, 1, 10), ("report", 0, 5, 10), ("tick", 0, 40, 10)])  # the interval shrinks
@example([("report", 0, 1, 10), ("report", 0, 20, 10), ("tick", 0, 20, 10), ("tick", 0, 20, 10)])
@given(st.lists(st.tuples(st.sampled_from(["report", "tick"]), st.integers(0, 2), st.integers(1, 120),
                          st.sampled_from([10, 30, 60])), max_size=40))
def test_every_silence_is_missed_once_at_its_deadline(steps: list[tuple[str, int, int, int]]) -> None:
    # ING-4 with one heap entry per node (fold._deadlines): whatever the order of reports,
    # interval changes and sweeps, a sweep reports exactly the nodes whose deadline (last
    # report + 3 x interval, floor 15 s) has passed since their last report, once per silence.
    import asyncio

    from healthplane.runtime.fold import Inbound

    template = asyncio.run(sim_report(Scenario().node))
    core = IngestCore()
    state = core.initial_state()
    now, seq = T0, 0
    last: dict[str, tuple[datetime, int]] = {}
    missed_already: set[str] = set()
    for action, node, advance, interval in steps:
        now += timedelta(seconds=advance)
        node_id = f"n{node}"
        if action == "report":
            seq += 1
            report = msgspec.structs.replace(template, node_id=node_id, hostname=node_id, sent_at=now,
                                             interval_seconds=interval)
            state, _, _ = core.step(state, Inbound("HP_REPORTS", seq, f"hp.report.c.{node_id}", wire.encode(report),
                                                {}, now, True))
            last[node_id] = (now, interval)
            missed_already.discard(node_id)
            continue
        state, emits, _ = core.tick(state, now)
        reported = {msgspec.json.decode(e.payload)["nodeId"] for e in emits if b'"HEARTBEAT_MISSED"' in e.payload}
        due = {n for n, (at, every) in last.items()
               if n not in missed_already and at + timedelta(seconds=max(15, 3 * every)) <= now}
        assert reported == due, (steps, now)
        missed_already |= due


def _validation_event(kind: str, nodes: int = 1, reason: str = "exit status 1 (passes with 0)") -> wire.NodeEvent:
    return wire.NodeEvent(id=f"v-{kind}", node_id="n1", cluster="c", type=kind,  # type: ignore[arg-type]
                          occurred_at=T0, message="", actor="eviction",
                          validation=wire.ValidationRecord(suite="gpu-diag", job="val-1", nodes=nodes, reason=reason))


async def test_val1_a_failed_run_of_the_node_alone_raises_validation_failed_until_a_pass_or_service() -> None:
    s = Scenario()
    await s.report()
    # A group's failure names no node: nothing is raised.
    assert validated(s.state, _validation_event("VALIDATION_FAILED", nodes=8))[1] == []
    _, changes = validated(s.state, _validation_event("VALIDATION_FAILED"))
    assert [c.type for c in changes] == ["CONDITION_RAISED"]
    assert s.reason("validation_failed") == ("ValidationFailed", "critical")
    assert s.conditions["validation_failed"].message == "suite gpu-diag: exit status 1 (passes with 0)"
    for _ in range(2):  # held across reports, like a sticky fault
        assert await s.report() == []
    assert "validation_failed" in s.conditions
    _, changes = validated(s.state, _validation_event("VALIDATION_PASSED", nodes=4))
    assert [c.type for c in changes] == ["CONDITION_CLEARED"] and "validation_failed" not in s.conditions
    validated(s.state, _validation_event("VALIDATION_FAILED"))
    _, changes = serviced(s.state, "c", "n1", s.now)
    assert [c.type for c in changes] == ["CONDITION_CLEARED"] and "validation_failed" not in s.conditions


# ---------------------------------------------------------------------------- packed counters (issue 25)


class _Reading:
    """ING-2's counter rule as it was written before counters were packed: the reference."""

    def __init__(self, value: int, baseline_zero: bool) -> None:
        self.last, self.active, self.quiet = (0 if baseline_zero else value), False, 0

    def climb(self, value: int, quiet_to_clear: int) -> bool:
        if value > self.last:
            self.active, self.quiet = True, 0
        elif self.active:
            self.quiet += 1
            if self.quiet >= quiet_to_clear:
                self.active = False
        self.last = value
        return self.active


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=30),
       st.integers(min_value=1, max_value=6), st.booleans())
@example([0, 5, 5, 5, 3, 3, 9], 2, False)
@example([2**40, 2**40 + 1, 0, 0], 1, True)
def test_ing2_packed_counters_climb_and_clear_as_the_readings_say(values: list[int], quiet_to_clear: int,
                                                                  baseline_zero: bool) -> None:
    # ING-2: a counter climbs while it rises, clears after quietReportsToClear quiet reports,
    # and a drop is a new baseline, whatever the size of its values; packing changes nothing.
    from healthplane_health_ingest.rules import NodeState, _climb

    node = NodeState(cluster="c", node_id="n1")
    reference = _Reading(values[0], baseline_zero)
    for value in values:
        assert _climb(node, "k", value, quiet_to_clear, baseline_zero=baseline_zero) == \
            reference.climb(value, quiet_to_clear)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=30), st.booleans())
def test_ing2_a_sticky_trigger_fires_exactly_when_its_count_rises(values: list[int], baseline_zero: bool) -> None:
    from healthplane_health_ingest.rules import NodeState, _rose

    node = NodeState(cluster="c", node_id="n1")
    last = 0 if baseline_zero else values[0]
    for value in values:
        assert _rose(node, "k", value, baseline_zero=baseline_zero) == (value > last)
        last = value


async def test_ing2_a_snapshot_from_before_packed_counters_keeps_every_baseline() -> None:
    # An upgrade restores a snapshot whose counters were objects: a climbing one clears after
    # its quiet report, and a quiet one that rises past its old baseline raises (no new baseline).
    report = await sim_report(SimNode("n1"))
    edac = report.signals.edac

    def with_ce(node_id: str, ce: int) -> wire.HealthReport:
        controller = msgspec.structs.replace(edac.controllers[0], ce=ce)
        signals = msgspec.structs.replace(report.signals, edac=msgspec.structs.replace(edac, controllers=[controller]))
        return msgspec.structs.replace(report, node_id=node_id, signals=signals)

    key = f"edac.ce.{edac.controllers[0].name}"
    condition = {"type": "memory_errors", "reason": "CorrectableMemoryErrors", "severity": "warning",
                 "message": "rising", "firstSeen": "2026-11-30T09:00:00Z", "observations": 1}
    old = {"nodes": {
        "c\x00climbing": {"cluster": "c", "node_id": "climbing", "last_report_at": "2026-11-30T09:00:00Z",
                          "climbs": {key: {"last": 7, "active": True, "quiet": 0}},
                          "sticky": {}, "conditions": {"memory_errors": condition}, "smart_failing": {}},
        "c\x00quiet": {"cluster": "c", "node_id": "quiet", "last_report_at": "2026-11-30T09:00:00Z",
                       "climbs": {key: {"last": 7, "active": False, "quiet": 3}},
                       "sticky": {}, "conditions": {}, "smart_failing": {}}}}
    state = msgspec.json.decode(msgspec.json.encode(old), type=IngestState)
    _, cleared = assess(state, with_ce("climbing", 7), T0 + timedelta(seconds=30), 1)
    _, raised = assess(state, with_ce("quiet", 9), T0 + timedelta(seconds=30), 2)
    assert [(c.type, c.condition and c.condition.type) for c in cleared] == [("CONDITION_CLEARED", "memory_errors")]
    assert [(c.type, c.condition and c.condition.type) for c in raised] == [("CONDITION_RAISED", "memory_errors")]
    assert b"climbs" not in msgspec.json.encode(state)  # the next snapshot is in the new form
