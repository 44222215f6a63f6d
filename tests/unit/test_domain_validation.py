"""DOM-4: a validation of an NVLink-domain member runs domain-wide when its suite needs the
fabric (``acrossDomain: nvlink``, an NCCL all-reduce across the domain), its members share the
verdict, and isolation keeps a fabric suite's domain together. Through eviction's and the
reference scheduler's pure cores (the ``Loop`` of VAL-1..4's tests), and health-ingest's rule
for a failed run."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import ConfigError, parse_cluster_config
from healthplane_health_ingest.rules import validated
from tests.unit.test_health_ingest_core import Scenario
from tests.unit.test_validation_runs import CLUSTER, SUITE, Loop, held_node, holds_of, names

NCCL = {"command": ["all_reduce_perf", "-b", "8", "-e", "8G"], "timeoutSeconds": 60, "acrossDomain": "nvlink"}
FABRIC = {"suites": {"diag": SUITE, "nccl": NCCL}, "defaultSuite": "diag"}
NVL1 = {"rules": [{"kind": "nvlink", "regex": r"gpu-0[4-7]", "value": "nvl-1"}]}
DOMAIN = ["gpu-04", "gpu-05", "gpu-06", "gpu-07"]


def _register(loop: Loop, node: str, gpus: int) -> None:
    devices = [wire.ResourceDevice(kind="gpu", vendor="nvidia", index=i, pci_bus_id=f"0000:{i:02x}:00.0")
               for i in range(gpus)]
    loop.to_eviction("HP_RESOURCES", subjects.resource(CLUSTER, node), wire.ResourceReport(
        node_id=node, cluster=CLUSTER, hostname=node, sent_at=loop.now, ready=True, cores=64, memory_bytes=1 << 30,
        devices=devices))


def _runs(loop: Loop) -> list[list[str]]:
    return [list(job.nodes or []) for job in loop.validation_jobs]


def test_dom4_a_fabric_suite_on_one_member_validates_its_whole_nvlink_domain() -> None:
    """DOM-4: `validate gpu-05 --suite nccl` runs one job across gpu-04..07, said on each member."""
    loop = Loop(names(8), validation=FABRIC, domains=NVL1)
    command = loop.command("validate", "gpu-05", suite="nccl")
    assert _runs(loop) == [["gpu-05", "gpu-04", "gpu-06", "gpu-07"]]  # the node asked for first
    started = loop.of("VALIDATION_STARTED")
    assert sorted(e.node_id for e in started) == DOMAIN
    assert {(e.validation.domain, e.validation.nodes) for e in started if e.validation} == {("nvlink=nvl-1", 4)}
    assert started[0].message.endswith("across domain nvlink=nvl-1, 4 node(s)")
    loop.until(lambda: loop.outcome(command) is not None)
    outcome = loop.outcome(command)
    assert outcome is not None and outcome.result == "applied" and outcome.passed
    assert outcome.message.startswith("gpu-05: validation passed: suite nccl")
    assert sorted(e.node_id for e in loop.of("VALIDATION_PASSED")) == DOMAIN


def test_dom4_a_suite_without_the_fabric_or_a_node_without_a_domain_runs_alone() -> None:
    """DOM-4: a per-node suite, or a node in no NVLink domain, is validated alone as before (VAL-1)."""
    loop = Loop(names(8), validation=FABRIC, domains=NVL1)
    loop.command("validate", "gpu-05", suite="diag")  # a per-node suite: the node alone
    loop.command("validate", "gpu-01", suite="nccl")  # no NVLink domain: nothing to span
    assert _runs(loop) == [["gpu-05"], ["gpu-01"]]
    assert all(e.validation is not None and e.validation.domain is None for e in loop.of("VALIDATION_STARTED"))


def test_dom4_a_fabric_failure_is_every_members_and_health_ingest_raises_it_on_each() -> None:
    """DOM-4: a domain run that fails fails on every member: the fault class is the fabric's."""
    loop = Loop(names(8), validation=FABRIC, domains=NVL1)
    loop.plant("gpu-06", [3])  # one GPU of the fabric's: the all-reduce fails across the domain
    command = loop.command("validate", "gpu-04", suite="nccl")
    loop.until(lambda: loop.outcome(command) is not None)
    failed = loop.of("VALIDATION_FAILED")
    assert sorted(e.node_id for e in failed) == DOMAIN
    assert failed[0].message.endswith("(across domain nvlink=nvl-1, 4 node(s): its members share the verdict)")
    outcome = loop.outcome(command)
    assert outcome is not None and outcome.passed is False


def test_dom4_members_that_cannot_take_part_are_left_out_and_a_busy_domain_refuses_another_run() -> None:
    """DOM-4, VAL-4: a member already being validated runs in its own run; a member in the
    domain's run is busy for another."""
    loop = Loop(names(8), validation=FABRIC, domains=NVL1)
    loop.command("validate", "gpu-07", suite="diag")  # gpu-07 is being validated on its own
    loop.command("validate", "gpu-05", suite="nccl")
    assert _runs(loop) == [["gpu-07"], ["gpu-05", "gpu-04", "gpu-06"]]
    refused = loop.command("validate", "gpu-06", suite="nccl")  # in the domain's run already
    outcome = loop.outcome(refused)
    assert outcome is not None and outcome.result == "refused" and "gpu-06 is already being validated" in outcome.message


def test_dom4_val2_a_gate_with_a_fabric_suite_validates_the_domain_and_returns_only_its_node() -> None:
    """DOM-4, VAL-2: a member that carried a fault returns once the fabric suite passes across
    its domain; only its own holds are released, another member's cordon stays."""
    gated = {"suites": {"nccl": NCCL}, "defaultSuite": "nccl", "validateBeforeReturn": True}
    loop = Loop(names(8), validation=gated, domains=NVL1)
    held_node(loop, "gpu-05")
    loop.command("cordon", "gpu-06", reason="maintenance")  # out of service by hand: still takes part
    outcome = loop.outcome(loop.command("uncordon", "gpu-05"))
    assert outcome is not None and outcome.result == "applied" and "suite nccl passes" in outcome.message
    assert _runs(loop) == [["gpu-05", "gpu-04", "gpu-06", "gpu-07"]]
    loop.until(lambda: len(loop.of("VALIDATION_PASSED")) == 4)
    assert holds_of(loop, "gpu-05") == 0 and holds_of(loop, "gpu-06") == 1
    assert [e.node_id for e in loop.of("NODE_UNCORDONED")] == ["gpu-05"]


def test_dom4_isolation_keeps_a_fabric_suites_domain_together_without_keep_together() -> None:
    """DOM-4, VAL-3: the isolation's groups are its own (never widened), but a suite that needs the fabric
    keeps its domain's suspects together even with ``keepTogether: []``."""
    validation = {"suites": {"nccl": NCCL}, "defaultSuite": "nccl", "isolation": {"keepTogether": []}}
    loop = Loop(names(8), validation=validation, domains=NVL1)
    assert loop.isolate_planted().faulty == DOMAIN
    for job in loop.validation_jobs:
        members = set(job.nodes or [])
        assert members >= set(DOMAIN) or not members & set(DOMAIN), job.nodes
    assert all(e.validation is not None and e.validation.domain is None for e in loop.of("VALIDATION_STARTED"))


@st.composite
def fleets(draw: st.DrawFn) -> tuple[dict[str, str], str, set[str], set[str]]:
    nodes = names(draw(st.integers(2, 12)))
    placed = {n: f"nvl-{draw(st.integers(0, 2))}" for n in nodes if draw(st.booleans())}
    target = draw(st.sampled_from(nodes))
    busy = set(draw(st.lists(st.sampled_from([n for n in nodes if n != target]), unique=True, max_size=3)))
    small = set(draw(st.lists(st.sampled_from([n for n in nodes if n != target]), unique=True, max_size=3)))
    return placed, target, busy, small - busy


@settings(max_examples=40, deadline=None)
@given(fleets())
def test_dom4_a_fabric_run_covers_exactly_the_targets_domain_members_that_can_take_part(
        case: tuple[dict[str, str], str, set[str], set[str]]) -> None:
    """DOM-4, VAL-4: the run is the node asked for, then every other member of its NVLink
    domain in id order but those being validated already and those with too few GPUs; a node in
    no domain runs alone."""
    placed, target, busy, small = case
    nodes = names(max(int(n[-2:]) for n in [target, *busy, *small, *placed]) + 1)
    suites = {"diag": {**SUITE, "gpus": 0}, "nccl": {**NCCL, "gpus": 8}}
    loop = Loop([n for n in nodes if n not in small], validation={"suites": suites},
                domains={"nodes": {n: {"nvlink": v} for n, v in placed.items()}})
    for node in sorted(small):  # 4 GPUs: the fabric suite needs 8 (VAL-4 excludes it)
        _register(loop, node, gpus=4)
    for node in sorted(busy):
        loop.command("validate", node, suite="diag")
    loop.command("validate", target, suite="nccl")
    run = _runs(loop)[-1]
    domain = placed.get(target)
    expected = [target, *sorted(n for n in nodes if domain is not None and n != target and placed.get(n) == domain
                                and n not in busy and n not in small)]
    assert run == expected
    [started] = {e.validation.domain for e in loop.of("VALIDATION_STARTED")
                 if e.node_id == target and e.validation and e.validation.suite == "nccl"}
    assert started == (f"nvlink={domain}" if domain is not None else None)


def test_dom4_across_domain_must_name_a_kind() -> None:
    """DOM-4: `acrossDomain` is a domain kind (DOM-1's rules), checked at `config apply`."""
    with pytest.raises(ConfigError, match="acrossDomain"):
        parse_cluster_config({"validation": {"suites": {"nccl": {**NCCL, "acrossDomain": "NVLink"}}}})


def _failed(nodes: int, domain: str | None) -> wire.NodeEvent:
    return wire.NodeEvent(id=f"v-{nodes}-{domain}", node_id="n1", cluster="c", type="VALIDATION_FAILED",
                          occurred_at=Scenario().now, message="", actor="eviction",
                          validation=wire.ValidationRecord(suite="nccl", job="val-1", nodes=nodes,
                                                           reason="exit status 1 (passes with 0)", domain=domain))


async def test_dom4_health_ingest_raises_validation_failed_on_a_member_of_a_failed_domain_run() -> None:
    """DOM-4, VAL-1: a failed run across a domain raises validation_failed on the member; a
    failed isolation group still names no one."""
    s = Scenario()
    await s.report()
    assert validated(s.state, _failed(4, None))[1] == []  # an isolation's group: no one named
    _, changes = validated(s.state, _failed(4, "nvlink=nvl-1"))
    assert [c.type for c in changes] == ["CONDITION_RAISED"]
    assert s.conditions["validation_failed"].message == (
        "suite nccl (across domain nvlink=nvl-1): exit status 1 (passes with 0)")
