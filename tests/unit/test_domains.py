"""DOM-1: each node's failure domains, resolved from what its hardware tells (NVML's GPU fabric
info in the resource report) and what the cluster config says (rules by node id pattern, an
explicit node mapping); validated at `config validate` / `config apply` with one line naming
the field; carried in the scorer's view and selected by the api's table."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthplane.contracts import domains, wire
from healthplane.contracts.config import ConfigError, parse_cluster_config
from healthplane.contracts.domains import DomainError, Rule, Spec
from healthplane.runtime.fold import Inbound
from healthplane_api.fold import PageError, ViewIndex
from healthplane_scorer.fold import ScorerCore, ScorerState

T0 = datetime(2026, 8, 5, 13, 41, 2, tzinfo=UTC)
UUID_A = "6b1d6c4e-2e0f-4c65-9d3e-0d8f8a1c2b3a"
UUID_B = "0f0e0d0c-0b0a-0908-0706-050403020100"

kinds = st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True)
values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FF, exclude_characters="\x7f"),
                 min_size=1, max_size=20)
node_ids = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=16)


def fabric(cluster_uuid: str = UUID_A, clique: int = 1, state: wire.GpuFabricState = "completed") -> wire.GpuFabric:
    return wire.GpuFabric(cluster_uuid=cluster_uuid, clique_id=clique, state=state)


def gpu(index: int, found: wire.GpuFabric | None) -> wire.ResourceDevice:
    return wire.ResourceDevice(kind="gpu", vendor="nvidia", index=index, pci_bus_id=f"0000:{index + 1:02x}:00.0",
                               fabric=found)


def report(node_id: str, *fabrics: wire.GpuFabric | None, sent_at: datetime = T0) -> wire.ResourceReport:
    return wire.ResourceReport(node_id=node_id, cluster="default", hostname=node_id, sent_at=sent_at, ready=True,
                               cores=8, memory_bytes=1 << 30, devices=[gpu(i, f) for i, f in enumerate(fabrics)])


# ---------------------------------------------------------------------------- the hardware


def test_dom1_nvlink_id_is_cluster_uuid_dot_clique_id() -> None:
    assert domains.nvlink_domain(UUID_A.upper(), 32766) == f"{UUID_A}.32766"
    assert domains.hardware_domains(report("n", fabric(), fabric())) == {"nvlink": f"{UUID_A}.1"}


@pytest.mark.parametrize("found", [
    pytest.param(None, id="no fabric (NOT_SUPPORTED)"),
    pytest.param(fabric(state="in-progress"), id="registration in progress"),
    pytest.param(fabric(state="not-started"), id="not started"),
    pytest.param(fabric(state="failed"), id="registration failed"),
    pytest.param(fabric(domains.ZERO_UUID), id="zero cluster uuid"),
])
def test_dom1_hardware_without_a_usable_fabric_tells_no_nvlink_domain(found: wire.GpuFabric | None) -> None:
    assert domains.hardware_domains(report("n", found, found)) == {}
    assert domains.hardware_domains(report("cpu-only")) == {}


@given(st.lists(st.tuples(st.sampled_from([UUID_A, UUID_B]), st.integers(0, 3)), min_size=1, max_size=8),
       st.randoms())
def test_dom1_gpus_that_disagree_take_the_most_common_domain_ties_by_lower_id(pairs: list[tuple[str, int]],
                                                                             rng: object) -> None:
    ids = [domains.nvlink_domain(u, c) for u, c in pairs]
    counts = {i: ids.count(i) for i in ids}
    most = max(counts.values())
    expected = min(i for i, n in counts.items() if n == most)
    shuffled = list(pairs)
    rng.shuffle(shuffled)  # type: ignore[attr-defined]
    found = domains.nvlink_of([gpu(i, fabric(u, c)) for i, (u, c) in enumerate(shuffled)])
    assert found == expected


# ---------------------------------------------------------------------------- the config


@given(node_ids, st.from_regex(r"[a-z0-9*?\-\[\]]{1,8}", fullmatch=True), values)
def test_dom1_match_is_a_case_sensitive_glob_over_the_whole_id(node_id: str, glob: str, value: str) -> None:
    spec = Spec(rules=(Rule(kind="rack", match=glob, value=value),))
    expected = fnmatch.fnmatchcase(node_id, glob)
    assert domains.resolve(node_id, {}, spec) == ({"rack": value} if expected else {})


@given(st.integers(0, 999), st.integers(0, 99))
def test_dom1_regex_groups_give_the_value(rack: int, node: int) -> None:
    spec = Spec(rules=(Rule(kind="rack", regex=r"gpu-r(?P<rack>\d+)-n\d+"),
                       Rule(kind="power", regex=r"gpu-r(?P<r>\d+)-n(?P<n>\d+)", value="pdu-{r}-{n}")))
    assert domains.resolve(f"gpu-r{rack}-n{node}", {}, spec) == {"power": f"pdu-{rack}-{node}", "rack": str(rack)}
    # fullmatch: a prefix or a suffix of the pattern is not the node
    assert domains.resolve(f"x-gpu-r{rack}-n{node}", {}, spec) == {}
    assert domains.resolve(f"gpu-r{rack}-n{node}-x", {}, spec) == {}


@given(node_ids, values, values, values, st.one_of(st.none(), values))
def test_dom1_precedence_hardware_then_nodes_then_the_first_rule(node_id: str, first: str, second: str,
                                                                 mapped: str, told: str | None) -> None:
    rules = (Rule(kind="rack", match="*", value=first), Rule(kind="rack", match="*", value=second),
             Rule(kind="nvlink", match="*", value=second))
    assert domains.resolve(node_id, {}, Spec(rules=rules)) == {"nvlink": second, "rack": first}
    spec = Spec(rules=rules, nodes={node_id: {"rack": mapped, "nvlink": mapped}})
    hardware = {"nvlink": told} if told is not None else {}
    assert domains.resolve(node_id, hardware, spec) == {"nvlink": told if told is not None else mapped,
                                                        "rack": mapped}
    # only the kinds hardware may tell: a report cannot move a node to another rack
    assert domains.resolve(node_id, {"rack": "elsewhere"}, Spec()) == {}


@given(st.dictionaries(node_ids, st.dictionaries(kinds, values, max_size=3), max_size=4), node_ids,
       st.dictionaries(st.just("nvlink"), values))
def test_dom1_every_resolved_domain_is_a_valid_kind_and_value(nodes: dict[str, dict[str, str]], node_id: str,
                                                              hardware: dict[str, str]) -> None:
    spec = Spec(rules=(Rule(kind="site-row", regex=r"(?P<x>.)(?P<rest>.*)", value="{x}{rest}"),), nodes=nodes)
    found = domains.resolve(node_id, hardware, spec)
    assert list(found) == sorted(found)
    for kind, value in found.items():
        assert domains.check_kind(kind) == kind and domains.check_value(value) == value
    assert found.get("site-row") == nodes.get(node_id, {}).get("site-row", node_id)


def test_dom1_a_group_that_took_no_part_gives_nothing() -> None:
    spec = Spec(rules=(Rule(kind="rack", regex=r"n(?:-r(?P<r>\d+))?-\d+", value="r{r}"),))
    assert domains.resolve("n-r4-1", {}, spec) == {"rack": "r4"}
    assert domains.resolve("n-1", {}, spec) == {}


@pytest.mark.parametrize(("rule", "line"), [
    pytest.param("{kind: rack, regex: 'gpu-r(', value: r}",
                 "domains.rules[0].regex: not a regular expression: missing ), unterminated subpattern at position 5",
                 id="bad regex"),
    pytest.param("{kind: Rack, match: 'gpu-*', value: r}", "domains.rules[0].kind: kind 'Rack': a lower-case name",
                 id="bad kind"),
    pytest.param("{kind: rack, match: 'gpu-*'}", "domains.rules[0]: value: a match (glob) rule needs the value",
                 id="glob without value"),
    pytest.param("{kind: rack, regex: 'gpu-r(\\d+)'}",
                 "domains.rules[0]: value: needed unless regex 'gpu-r(\\\\d+)' has a group named after the kind",
                 id="regex without value or kind group"),
    pytest.param("{kind: rack, regex: 'r(?P<n>.)', value: 'r{m}'}",
                 "domains.rules[0]: value 'r{m}': {m} is not a named group", id="unknown group"),
    pytest.param("{kind: rack, match: 'a', regex: 'b', value: r}",
                 "domains.rules[0]: a rule needs exactly one of match (a glob) or regex", id="both"),
    pytest.param("{kind: rack, match: '', value: r}", "domains.rules[0]: match: an empty glob", id="empty glob"),
])
def test_dom1_config_validate_refuses_a_bad_rule_in_one_line_naming_the_field(tmp_path: Path, rule: str,
                                                                               line: str) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(f"cluster: default\ndomains:\n  rules:\n    - {{kind: rack, match: 'ok-*', value: r1}}\n"
                    f"    - {rule}\n".replace("rules[0]", "rules[1]"), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "healthplane.cli", "config", "validate", "-f", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"healthplane: {path}: ")
    assert line.replace("rules[0]", "rules[1]") in lines[0]


@pytest.mark.parametrize(("nodes", "line"), [
    ({"n1": {"rack": ""}}, "domains.nodes: node 'n1': value '': 1 to 256 characters"),
    ({"n1": {"Rack": "r1"}}, "domains.nodes: node 'n1': kind 'Rack'"),
    ({"n1": {"rack": "r\n1"}}, "domains.nodes: node 'n1': value 'r\\n1': control characters are not allowed"),
])
def test_dom1_config_refuses_a_bad_node_mapping_naming_the_node(nodes: dict[str, dict[str, str]], line: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_cluster_config({"domains": {"nodes": nodes}})
    assert len(str(caught.value).splitlines()) == 1
    assert line in str(caught.value)


def test_dom1_the_config_section_round_trips_through_the_applied_record() -> None:
    config = parse_cluster_config({"domains": {
        "rules": [{"kind": "rack", "match": "gpu-r12-*", "value": "r12"},
                  {"kind": "rack", "regex": r"gpu-r(?P<rack>\d+)-.*"}],
        "nodes": {"10.0.0.42/9100": {"power": "feed a/b=c", "nvlink": "manual"}}}})
    again = parse_cluster_config(config.to_wire())
    assert again.domains.spec() == config.domains.spec()
    spec = config.domains.spec()
    assert domains.resolve("gpu-r12-n01", {}, spec) == {"rack": "r12"}
    assert domains.resolve("gpu-r7-n01", {}, spec) == {"rack": "7"}
    assert domains.resolve("10.0.0.42/9100", {"nvlink": "hw.1"}, spec) == {"nvlink": "hw.1", "power": "feed a/b=c"}
    assert parse_cluster_config({}).domains.spec() == Spec()


# ---------------------------------------------------------------------------- selecting


@given(kinds, values)
def test_dom1_a_selector_is_kind_equals_value_the_value_may_hold_equals(kind: str, value: str) -> None:
    assert domains.parse_selector(f"{kind}={value}") == (kind, value)


@pytest.mark.parametrize("text", ["rack", "=r12", "rack=", "Rack=r12", "rack r12"])
def test_dom1_a_bad_selector_is_one_line(text: str) -> None:
    with pytest.raises(DomainError) as caught:
        domains.parse_selector(text)
    assert "\n" not in str(caught.value) and repr(text) in str(caught.value)


@given(st.dictionaries(kinds, values, max_size=4), st.lists(st.tuples(kinds, values), max_size=3))
def test_dom1_selection_is_and_over_every_selector(found: dict[str, str], wanted: list[tuple[str, str]]) -> None:
    assert domains.selected(found, wanted) == all(found.get(k) == v for k, v in wanted)
    assert domains.selected(found, [(k, v) for k, v in found.items()])


# ---------------------------------------------------------------------------- the view


def _inbound(stream: str, subject: str, record: wire.Record, seq: int, at: datetime = T0) -> Inbound:
    return Inbound(stream=stream, seq=seq, subject=subject, data=wire.encode(record), headers={}, at=at,
                   caught_up=True)


def _config(version: int, section: dict[str, object]) -> wire.ConfigEnvelope:
    return wire.ConfigEnvelope(version=version, applied_at=T0, actor="test", config={"domains": section})


def _views(core: ScorerCore, state: ScorerState, inbound: Inbound) -> list[wire.NodeView]:
    step = core.step(state, inbound)
    return [wire.decode(wire.NodeView, emit.payload) for emit in step.emits if emit.subject.startswith("hp.node.")]


def test_dom1_the_view_carries_the_domains_from_the_report_and_the_config() -> None:
    from healthplane.contracts import subjects

    core, state = ScorerCore(), ScorerCore().initial_state()
    core.step(state, _inbound("HP_CONFIG", "hp.config", _config(1, {
        "rules": [{"kind": "rack", "regex": r"gpu-r(?P<rack>\d+)-.*", "value": "r{rack}"},
                  {"kind": "nvlink", "match": "*", "value": "from-config"}]}), 1))
    told = report("gpu-r12-n01", fabric(), fabric())
    (view,) = _views(core, state, _inbound("HP_RESOURCES", subjects.resource("default", told.node_id), told, 2))
    assert view.domains == {"nvlink": f"{UUID_A}.1", "rack": "r12"}  # the hardware's nvlink wins

    silent = report("gpu-r12-n02")  # a node whose hardware tells nothing: the config's nvlink
    (view,) = _views(core, state, _inbound("HP_RESOURCES", subjects.resource("default", silent.node_id), silent, 3))
    assert view.domains == {"nvlink": "from-config", "rack": "r12"}

    # A new config: the node's next view carries the domains it gives.
    core.step(state, _inbound("HP_CONFIG", "hp.config", _config(2, {"nodes": {"gpu-r12-n02": {"rack": "r99"}}}), 4))
    again = report("gpu-r12-n02", sent_at=T0.replace(minute=50))
    (view,) = _views(core, state, _inbound("HP_RESOURCES", subjects.resource("default", again.node_id), again, 5))
    assert view.domains == {"rack": "r99"}

    moved = report("gpu-r12-n01", fabric(UUID_B, 7), sent_at=T0.replace(minute=50))  # the fabric says otherwise now
    (view,) = _views(core, state, _inbound("HP_RESOURCES", subjects.resource("default", moved.node_id), moved, 6))
    assert view.domains == {"nvlink": f"{UUID_B}.7"}


def test_dom1_the_api_table_selects_by_domain_and_refuses_a_bad_selector_in_one_line() -> None:
    index = ViewIndex()

    def add(node_id: str, found: dict[str, str]) -> None:
        view = wire.NodeView(node_id=node_id, cluster="default", hostname=node_id, status="READY", health="HEALTHY",
                             last_reported_at=T0, score=100, score_explanation=None, conditions=[],
                             attributed_failures=wire.AttributedFailures(), holds=[], domains=found)
        assert index.apply(wire.encode(view)) is not None

    add("a", {"rack": "r12", "nvlink": "x.1"})
    add("b", {"rack": "r12", "nvlink": "y.1"})
    add("c", {"rack": "r 13/a=b&c%"})
    add("d", {})
    assert [r.node_id for r in index.page(domain=["rack=r12"], page_size=None).rows] == ["a", "b"]
    assert [r.node_id for r in index.page(domain=["rack=r12", "nvlink=y.1"], page_size=None).rows] == ["b"]
    assert [r.node_id for r in index.page(domain=["rack=r 13/a=b&c%"], page_size=None).rows] == ["c"]
    assert index.page(domain=["power=p1"], page_size=None).total == 0
    with pytest.raises(PageError) as caught:
        index.page(domain=["rack"])
    assert str(caught.value) == "domain 'rack': expected KIND=VALUE, e.g. rack=r12"
