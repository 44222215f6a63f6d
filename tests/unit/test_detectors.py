"""Custom failure detectors (POL-8): CEL over the node object and Python plug-ins raise a
condition through health-ingest's own path, clear when they stop matching, and score."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import ClusterConfig, ConfigError, parse_cluster_config
from healthplane.runtime.fold import Inbound
from healthplane_collector.agent import Collector, Settings
from healthplane_collector.sim import SimNode
from healthplane_health_ingest import detectors
from healthplane_health_ingest.fold import IngestCore
from healthplane_scorer.rules import PenaltyTable

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
ECC_LABEL = {"name": "ecc-label", "condition": "gpu_ecc_errors", "severity": "critical",
             "expression": 'node.metadata.labels["nvidia.com/gpu.ecc.error.count"] > "0"',
             "message": "ECC error count label set on the node"}


def detectors_config(*entries: dict[str, Any]) -> wire.ConfigEnvelope:
    config = ClusterConfig.model_validate({"cluster": "c", "nodeHealth": {"detectors": list(entries)}})
    return wire.ConfigEnvelope(version=1, applied_at=T0, actor="t", config=config.to_wire())


def test_pol8_a_bad_detector_is_refused_naming_it() -> None:
    for entry, says in [
        ({**ECC_LABEL, "expression": 'nod.labels["x"] == "1"'}, "detector 'ecc-label'"),
        ({**ECC_LABEL, "expression": "node.labels["}, "detector 'ecc-label'"),
        ({**ECC_LABEL, "condition": "heartbeat_missed"}, "the control plane's own condition"),
        ({**ECC_LABEL, "condition": "gpu_on_fire"}, "nodeHealth.detectors[0].condition"),
    ]:
        with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace("[", r"\[")):
            parse_cluster_config({"nodeHealth": {"detectors": [entry]}})
    with pytest.raises(ConfigError, match="detector name 'ecc-label' is used more than once"):
        parse_cluster_config({"nodeHealth": {"detectors": [ECC_LABEL, ECC_LABEL]}})


class Node:
    """One simulated node through IngestCore, with its resource report and the config."""

    def __init__(self, core: IngestCore, *entries: dict[str, Any]) -> None:
        self.core, self.sim, self.seq = core, SimNode("n1"), 0
        self.state = core.initial_state()
        self.feed("HP_CONFIG", subjects.CONFIG, wire.encode(detectors_config(*entries)))

    def feed(self, stream: str, subject: str, data: bytes) -> list[wire.NodeEvent]:
        self.seq += 1
        at = T0 + timedelta(seconds=30 * self.seq)
        inbound = Inbound(stream, self.seq, subject, data, {}, at, True)
        self.state, emits, self.notes = self.core.step(self.state, inbound)
        return [wire.decode(wire.NodeEvent, e.payload) for e in emits if ".event." in e.subject]

    def labels(self, annotations: dict[str, str]) -> None:
        self.feed("HP_RESOURCES", subjects.resource("c", "n1"), wire.encode(wire.ResourceReport(
            node_id="n1", cluster="c", hostname="n1", sent_at=T0, ready=True, cores=192, memory_bytes=1 << 40,
            annotations=annotations)))

    async def report(self) -> list[tuple[str, str, str]]:
        collector = Collector(Settings(node_id="n1", cluster="c"), self.sim, self.sim.kmsg)
        collector.refresh_inventory()
        report = await collector.collect("scheduled", T0)
        events = self.feed("HP_REPORTS", subjects.report("c", "n1"), wire.encode(report))
        return [(e.type, e.condition.reason, e.condition.severity) for e in events if e.condition]


async def test_pol8_a_cel_detector_raises_its_condition_and_clears_when_it_stops_matching() -> None:
    node = Node(IngestCore(plugins=[]), ECC_LABEL)
    assert await node.report() == []
    node.labels({"nvidia.com/gpu.ecc.error.count": "3"})
    assert await node.report() == [("CONDITION_RAISED", "ecc-label", "critical")]
    assert await node.report() == []  # still matching: no new event
    condition = node.state.nodes["c\x00n1"].conditions["gpu_ecc_errors"]
    assert (condition.message, condition.observations) == ("ECC error count label set on the node", 2)
    node.labels({"nvidia.com/gpu.ecc.error.count": "0"})
    assert await node.report() == [("CONDITION_CLEARED", "ecc-label", "critical")]


async def test_pol8_detectors_see_the_conditions_the_built_in_rules_found() -> None:
    both = {"name": "ecc-and-hot", "condition": "gpu_throttling", "severity": "warning",
            "expression": '"gpu_ecc_errors" in node.conditions && node.allocatable.cpu >= 128'}
    node = Node(IngestCore(plugins=[]), both)
    node.labels({})
    node.sim.inject("ecc-uncorrectable", 0, T0)
    raised = await node.report()
    assert ("CONDITION_RAISED", "ecc-and-hot", "warning") in raised
    assert ("CONDITION_RAISED", "GpuEccUncorrectable", "critical") in raised


async def test_pol8_a_python_plugin_raises_and_a_failing_one_never_stops_the_report() -> None:
    def nvlink(node: Mapping[str, Any]) -> Iterable[detectors.Detection]:
        if node["annotations"].get("nvlink") == "down":
            yield detectors.Detection("gpu_xid_errors", "NvlinkDown", "critical", "NVLink reported down")

    def broken(node: Mapping[str, Any]) -> Iterable[detectors.Detection]:
        raise RuntimeError("bug in a plug-in")

    node = Node(IngestCore(plugins=[("broken", broken), ("nvlink", nvlink)]))
    node.labels({"nvlink": "down"})
    assert await node.report() == [("CONDITION_RAISED", "NvlinkDown", "critical")]
    # Noted, not counted by the fold: the Processor counts it for live inputs only (issue 17).
    [note] = node.notes
    assert (note.event, note.counter, note.fields["detector"]) == (
        "detector plug-in failed", "detector_failed:broken", "broken")


def test_pol8_plugins_are_found_through_the_entry_point_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gpu_checks.py").write_text(
        "from healthplane_health_ingest.detectors import Detection\n"
        "def detect(node):\n"
        "    return [Detection('memory_errors', 'SiteCheck', 'warning', 'site check')]\n")
    info = tmp_path / "gpu_checks-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpu-checks\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[healthplane.detectors]\nsite = gpu_checks:detect\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = detectors.load_plugins()
    assert [name for name, _ in loaded] == ["site"]
    assert [d.reason for d in loaded[0][1]({})] == ["SiteCheck"]
    sys.modules.pop("gpu_checks", None)


def test_pol8_a_detectors_reason_scores_by_severity_until_the_table_names_it() -> None:
    condition = wire.Condition(type="gpu_ecc_errors", reason="ecc-label", severity="critical", message="m",
                               first_seen=T0)
    assert PenaltyTable.build().for_condition(condition) == 45
    assert PenaltyTable.build({"ecc-label": 20}).for_condition(condition) == 20
    assert PenaltyTable.build().for_condition(msgspec.structs.replace(condition, severity="info")) == 0
