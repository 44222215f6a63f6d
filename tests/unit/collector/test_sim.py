"""The simulator runs the collector's own report code; every fault it can inject shows up in
the report where the real collector would put it (COL-14, COL-8)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from healthplane.contracts import subjects, wire
from healthplane_collector.agent import Collector, Settings
from healthplane_collector.sim import FaultError, SimNode
from tests.support.log import Log

NOW = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


async def _report(node: SimNode, trigger: wire.ReportTrigger = "scheduled") -> wire.HealthReport:
    collector = Collector(Settings(node_id=node.node_id, cluster="sim"), node, node.kmsg)
    collector.refresh_inventory()
    return await collector.collect(trigger, NOW)


async def test_healthy_node_reports_every_signal_ok() -> None:
    report = await _report(SimNode("sim-000"))
    assert {name: s["status"] for name, s in wire.to_builtins(report.signals).items()} == dict.fromkeys(
        ("edac", "smart", "ioerr", "kmsg", "mounts", "gpu"), "ok")
    assert len(report.signals.gpu.devices) == 8 and report.hostname == "sim-000"


@pytest.mark.parametrize(
    ("fault", "gpu", "check"),
    [
        ("xid:13", 2, lambda r: [(x.xid, x.gpu_index, x.pci_bus_id) for x in r.signals.kmsg.xid] == [(13, 2, "0000:38:00.0")]),
        ("xid:79", 0, lambda r: r.signals.gpu.status == "failed" and r.signals.kmsg.xid[0].xid == 79),
        ("ecc-correctable", 1, lambda r: r.signals.gpu.devices[1].ecc.volatile.corrected == 1),
        ("ecc-uncorrectable", 1, lambda r: r.signals.gpu.devices[1].ecc.aggregate.uncorrected == 1),
        ("row-remap-failure", 3, lambda r: r.signals.gpu.devices[3].row_remap.failed),
        ("edac-ce", None, lambda r: r.signals.edac.controllers[0].ce == 1),
        ("edac-ue", None, lambda r: r.signals.edac.controllers[0].ue == 1 and r.signals.kmsg.edac.ue == 1),
        ("mce-corrected", None, lambda r: r.signals.kmsg.machine_checks.corrected == 1),
        ("mce-fatal", None, lambda r: r.signals.kmsg.machine_checks.fatal == 1),
        ("hw-error-fatal", None, lambda r: r.signals.kmsg.hardware_errors.fatal == 1),
        ("smart-failing", None, lambda r: r.signals.smart.devices[0].passed is False),
        ("io-errors", None, lambda r: r.signals.ioerr.devices[0].count == 3),
        ("readonly-mount", None, lambda r: r.signals.mounts.read_only[0].mount_point == "/data"),
        ("throttle-thermal", 4, lambda r: r.signals.gpu.devices[4].throttle.thermal),
        ("power-brake", 4, lambda r: r.signals.gpu.devices[4].throttle.power_brake),
        ("collector-failed:smart", None, lambda r: r.signals.smart.status == "failed" and "simulated" in r.signals.smart.reason),
        # DOM-3's fabric drill: NVLink5's Xid 145 on every GPU of the node, or on --gpu N alone.
        ("nvlink-fabric", None, lambda r: sorted((x.xid, x.gpu_index) for x in r.signals.kmsg.xid) == [
            (145, i) for i in range(8)]),
        ("nvlink-fabric", 3, lambda r: [(x.xid, x.gpu_index) for x in r.signals.kmsg.xid] == [(145, 3)]),
    ],
)
async def test_every_fault_shows_up_in_the_report(fault: str, gpu: int | None, check) -> None:  # type: ignore[no-untyped-def]
    node = SimNode("sim-001")
    node.inject(fault, gpu, NOW)
    assert check(await _report(node))


@pytest.mark.parametrize("fault", ["xid:79", "edac-ue", "mce-fatal", "hw-error-corrected"])
def test_kernel_faults_trigger_an_out_of_band_report(fault: str) -> None:
    # COL-2: the same faults that would reach /dev/kmsg.
    node = SimNode("sim-002")
    node.inject(fault, 0, NOW)
    assert node.out_of_band.is_set()


def test_silence_resume_and_clear() -> None:
    node = SimNode("sim-003")
    node.inject("silent", None, NOW)
    assert node.silent
    node.inject("resume", None, NOW)
    node.inject("smart-failing", None, NOW)
    node.inject("clear", None, NOW)
    assert not node.silent and not node.hardware.smart_failing


@pytest.mark.parametrize(("fault", "gpu", "message"), [
    ("xid:abc", 0, "xid needs a number"), ("ecc-correctable", 9, "has no GPU 9"),
    ("collector-failed:disk", None, "unknown signal 'disk'"), ("meltdown", None, "unknown fault 'meltdown'")])
def test_bad_injection_names_what_was_wrong(fault: str, gpu: int | None, message: str) -> None:
    with pytest.raises(FaultError, match=message):
        SimNode("sim-004").inject(fault, gpu, NOW)


@pytest.mark.parametrize("fault", ["hw-error-corrected", "mce-corrected"])
async def test_col2_a_kernel_error_logged_before_the_first_report_rises_and_stays(fault: str) -> None:
    # COL-2 with health-ingest's climbing counters: an error logged before the agent's first
    # report (`sim inject` as `up` starts) goes out in that report, and no second report
    # follows at once, which would read as quiet and clear the condition it raised (a
    # corrected error's warning lasted milliseconds, and `node show` never saw it).
    from healthplane_collector.agent import run_agent
    from healthplane_health_ingest.rules import IngestConfig, NodeState, findings

    node = SimNode("sim-004")
    node.inject(fault, None, NOW)
    sent: list[wire.HealthReport] = []
    stopping = asyncio.Event()

    async def publish(subject: str, payload: bytes) -> None:
        if subject == subjects.report("sim", node.node_id):
            sent.append(wire.decode(wire.HealthReport, payload))

    collector = Collector(Settings(node_id=node.node_id, cluster="sim", interval_s=30), node, node.kmsg)
    agent = asyncio.create_task(run_agent(collector, publish, stopping, node.out_of_band, Log()))
    async with asyncio.timeout(10):
        while not sent:
            await asyncio.sleep(0.01)
    await asyncio.sleep(1.0)  # well past the out-of-band coalescing (0.2 s)
    stopping.set()
    await agent

    state = NodeState("sim", node.node_id)
    latest = [findings(state, report, IngestConfig()) for report in sent][-1]  # health-ingest's fold
    assert [f.type for f in latest] == ["machine_check_errors"], [r.trigger for r in sent]
    assert [r.trigger for r in sent] == ["start"]
