"""DOM-1: domains a node's own resource report tells (its agent's ``domain.healthplane.io/KIND``
annotations, the simulator's ``--rack-size``), counted only for the kinds the config's
``domains.fromReports`` lists and only where neither the hardware nor the config gives one."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthplane.contracts import domains, wire
from healthplane.contracts.config import ConfigError, parse_cluster_config
from healthplane.contracts.domains import Rule, Spec
from healthplane_collector.loadgen import LoadFleet, Templates
from healthplane_collector.sim import Fleet, sim_rack

RACK = domains.TOLD_PREFIX + "rack"


def _report(annotations: dict[str, str], fabric: wire.GpuFabric | None = None) -> wire.ResourceReport:
    devices = [wire.ResourceDevice(kind="gpu", vendor="nvidia", index=0, pci_bus_id="0000:18:00.0", fabric=fabric)]
    return wire.ResourceReport(node_id="n1", cluster="c", hostname="n1", sent_at=datetime(2026, 12, 7, tzinfo=UTC),
                               ready=True, cores=1, memory_bytes=1, devices=devices, annotations=annotations)


def test_dom1_a_reported_rack_counts_only_where_the_config_accepts_it_and_gives_none() -> None:
    """DOM-1: by default a report places a node in no rack; with fromReports: [rack] it does,
    unless the config's nodes or rules give the node's rack; the hardware's nvlink is never a
    report's to tell."""
    fabric = wire.GpuFabric(cluster_uuid="6b1d6c4e-2e0f-4c65-9d3e-0d8f8a1c2b3a", clique_id=3, state="completed")
    told = domains.hardware_domains(_report({RACK: "r7", domains.TOLD_PREFIX + "nvlink": "fake", "other": "x"},
                                            fabric))
    assert told == {"rack": "r7", "nvlink": "6b1d6c4e-2e0f-4c65-9d3e-0d8f8a1c2b3a.3"}
    assert domains.resolve("n1", told, Spec()) == {"nvlink": told["nvlink"]}
    accepting = Spec(reported=("rack",))
    assert domains.resolve("n1", told, accepting) == {"nvlink": told["nvlink"], "rack": "r7"}
    ruled = Spec(rules=(Rule(kind="rack", match="n*", value="r1"),), reported=("rack",))
    assert domains.resolve("n1", told, ruled)["rack"] == "r1"  # the config wins
    assert domains.resolve("n1", told, Spec(nodes={"n1": {"rack": "r2"}}, reported=("rack",)))["rack"] == "r2"


@given(st.dictionaries(st.text(max_size=40), st.text(max_size=300), max_size=6))
def test_dom1_any_annotations_tell_only_valid_kinds_and_values(annotations: dict[str, str]) -> None:
    """DOM-1: whatever a report's annotations hold, what they tell is valid domains, never nvlink."""
    found = domains.told_domains(annotations)
    assert "nvlink" not in found
    for kind, value in found.items():
        assert domains.check_kind(kind) == kind and domains.check_value(value) == value
        assert annotations[domains.TOLD_PREFIX + kind] == value


def test_dom1_from_reports_is_checked_at_config_apply() -> None:
    """DOM-1: fromReports names kinds, and not one the hardware tells."""
    spec = parse_cluster_config({"domains": {"fromReports": ["rack", "power"]}}).domains.spec()
    assert spec.reported == ("rack", "power")
    with pytest.raises(ConfigError, match="told by the hardware"):
        parse_cluster_config({"domains": {"fromReports": ["nvlink"]}})
    with pytest.raises(ConfigError, match="fromReports"):
        parse_cluster_config({"domains": {"fromReports": ["Rack"]}})


def test_dom1_sim_run_and_sim_load_tell_racks_of_rack_size() -> None:
    """DOM-1: --rack-size N: nodes 0..N-1 in r0, N..2N-1 in r1, …; 0 tells no rack. sim load's
    pre-encoded resource reports carry each node's own rack."""
    assert [sim_rack(3, i) for i in (0, 2, 3, 7)] == [{RACK: "r0"}, {RACK: "r0"}, {RACK: "r1"}, {RACK: "r2"}]
    assert sim_rack(0, 5) == {}
    assert Fleet(5, rack_size=2).annotations["sim-004"] == {RACK: "r2"}
    fleet = LoadFleet(10, rack_size=4)
    templates = asyncio.run(Templates.build("default", 30, 8, racks=True))
    now = datetime.now(UTC)
    for index, rack in ((0, "r0"), (5, "r1"), (9, "r2")):
        first, _, ready = fleet.records(index, templates, now)
        for _, payload in (first, ready):
            report = wire.decode(wire.ResourceReport, payload)
            assert report.node_id == f"load-{index:06d}" and report.annotations == {RACK: rack}
    plain = LoadFleet(2)
    _, _, ready = plain.records(1, asyncio.run(Templates.build("default", 30, 8)), now)
    assert wire.decode(wire.ResourceReport, ready[1]).annotations == {}
