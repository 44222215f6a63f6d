"""DOM-4 on the whole system: a real ``healthplane up`` (every service, the reference scheduler)
and a simulated fleet of 8 nodes whose GPUs tell two NVLink domains of 4 (``sim run
--nvlink-domain-size 4``), with a suite that needs the fabric (``acrossDomain: nvlink``, an
NCCL all-reduce). ``node validate`` of one member runs one validation across its whole domain;
a silent GPU fault on one member fails the run for every member, and health-ingest raises
``validation_failed`` on each of them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.racks import fleet, up_without_fleet
from tests.support.stack import Stack

pytestmark = [pytest.mark.slow, pytest.mark.nats]
CONFIG = """\
cluster: default
nodeHealth:
  mode: observe
validation:
  suites:
    gpu-diag: {command: [dcgmi, diag, -r, "2"], timeoutSeconds: 600, gpus: 8}
    nccl: {command: [all_reduce_perf, -b, "8", -e, 8G, -g, "8"], timeoutSeconds: 600, gpus: 8, acrossDomain: nvlink}
  defaultSuite: gpu-diag
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("domain-validation")
    with pytest.MonkeyPatch.context() as env:
        # Fast simulated runs and placement, as VAL's own tests run them.
        env.setenv("HEALTHPLANE_SCHEDULER_VALIDATION_SECONDS", "0.5")
        env.setenv("HEALTHPLANE_SCHEDULER_TICK_SECONDS", "0.2")
        with up_without_fleet(root, CONFIG) as found, \
                fleet(found, root / "sim.log", "run", "--nodes", "8", "--nvlink-domain-size", "4", "--interval", "5"):
            found.wait_until(lambda: sum(1 for row in found.cli_json("node", "list")
                                         if row.get("score") is not None and row["domains"].get("nvlink")) == 8,
                             90, "8 nodes scored in their NVLink domains")
            yield found


def _events(stack: Stack, node: str, kind: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = stack.cli_json("node", "events", node, "--type", kind, "--page-size", "500")["events"]
    return found


def test_dom4_validating_one_member_with_a_fabric_suite_runs_across_its_nvlink_domain(stack: Stack) -> None:
    """DOM-4: `node validate sim-001 --suite nccl` is one validation job over sim-000..003."""
    nvlink = stack.cli_json("node", "show", "sim-001")["domains"]["nvlink"]
    done = stack.cli("node", "validate", "sim-001", "--suite", "nccl", "--timeout", "90")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.fullmatch(rf"sim-001: validation passed: suite nccl in \d+\.\ds \(across domain nvlink={nvlink}, "
                        r"4 node\(s\)\)\n", done.stdout), done.stdout
    jobs = set()
    for node in ("sim-000", "sim-001", "sim-002", "sim-003"):
        [started] = _events(stack, node, "VALIDATION_STARTED")
        assert started["validation"]["domain"] == f"nvlink={nvlink}" and started["validation"]["nodes"] == 4
        jobs.add(started["validation"]["job"])
        assert [e["validation"]["job"] for e in _events(stack, node, "VALIDATION_PASSED")] == [started["validation"]["job"]]
    assert len(jobs) == 1  # one run, the whole domain
    assert _events(stack, "sim-004", "VALIDATION_STARTED") == []  # the other domain is not touched


def test_dom4_a_fault_on_one_member_fails_the_fabric_suite_for_the_whole_domain(stack: Stack) -> None:
    """DOM-4: the fault class is the fabric's: every member fails and carries validation_failed."""
    injected = stack.cli("sim", "inject", "sim-006", "--fault", "silent-gpu", "--gpu", "3")
    assert injected.returncode == 0, injected.stderr
    done = stack.cli("node", "validate", "sim-005", "--suite", "nccl", "--timeout", "90")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "validation failed: suite nccl" in done.stderr and "its members share the verdict" in done.stderr
    members = ("sim-004", "sim-005", "sim-006", "sim-007")
    for node in members:
        assert len(_events(stack, node, "VALIDATION_FAILED")) == 1

    def flagged() -> bool:
        return all("validation_failed" in {c["type"] for c in stack.cli_json("node", "show", n)["conditions"]}
                   for n in members)

    stack.wait_until(flagged, 60, "validation_failed on every member of the domain")
    assert all(not any(c["type"] == "validation_failed" for c in stack.cli_json("node", "show", n)["conditions"])
               for n in ("sim-000", "sim-001", "sim-002", "sim-003"))
