"""DOM-1 and DOM-3's drill in the simulator: ``sim run --rack-size`` and ``sim load --rack-size``
put every N simulated nodes in a row in one rack (r0, r1, …), told by their resource reports as
an agent told its rack does (taken where the config's ``domains.fromReports`` lists ``rack``),
so that on a real ``healthplane up`` ``node list --domain rack=r1``
lists exactly those nodes and ``sim inject --domain rack=r1 --fault power-loss`` silences
exactly them. A bad ``--rack-size`` is one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.racks import fleet, racks_of, up_without_fleet
from tests.support.stack import Stack

pytestmark = [pytest.mark.slow, pytest.mark.nats]
# The cluster takes racks from the nodes' reports (a report places a node in no rack otherwise).
CONFIG = "cluster: default\ndomains:\n  fromReports: [rack]\n"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with up_without_fleet(tmp_path_factory.mktemp("racks"), CONFIG) as found:
        yield found


def _listed(stack: Stack, selector: str) -> list[str]:
    return [row["nodeId"] for row in stack.cli_json("node", "list", "--domain", selector)]


def test_dom1_sim_run_rack_size_places_nodes_in_racks_and_a_rack_loses_power(stack: Stack, tmp_path: Path) -> None:
    """DOM-1, DOM-3: sim run --rack-size 4 → racks r0, r1 in the views; power-loss on rack r1
    silences its four nodes (their heartbeats are missed) and no other."""
    with fleet(stack, tmp_path / "sim.log", "run", "--nodes", "8", "--rack-size", "4", "--nvlink-domain-size", "2",
               "--interval", "2"):
        placed = stack.wait_until(lambda: len(racks_of(stack)) == 8 and racks_of(stack), 60, "8 nodes in racks")
        assert placed == {f"sim-00{i}": f"r{i // 4}" for i in range(8)}
        assert _listed(stack, "rack=r1") == ["sim-004", "sim-005", "sim-006", "sim-007"]
        nvlink = stack.cli_json("node", "show", "sim-005")["domains"]["nvlink"]  # the fabric's, beside the rack
        assert _listed(stack, f"nvlink={nvlink}") == ["sim-004", "sim-005"]

        done = stack.cli("sim", "inject", "--domain", "rack=r1", "--fault", "power-loss")
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [f"power-loss injected on sim-00{i}" for i in range(4, 8)] + [
            "4 of 4 node(s) of rack=r1 injected with power-loss"]

        def health() -> dict[str, str]:
            return {row["nodeId"]: row["health"] for row in stack.cli_json("node", "list")}

        # ING-4's deadline is at least 15 s after the last report.
        stack.wait_until(lambda: all(health()[f"sim-00{i}"] == "UNKNOWN" for i in range(4, 8)), 60,
                         "rack r1's heartbeats missed")
        assert {node: h for node, h in health().items() if node < "sim-004"} == {
            f"sim-00{i}": "HEALTHY" for i in range(4)}


def test_dom1_sim_load_rack_size_places_nodes_in_racks(stack: Stack, tmp_path: Path) -> None:
    """DOM-1: sim load --rack-size 3 → load-000000..2 in r0, …, load-000006..7 in r2; a fault
    injected by domain reaches exactly that rack's nodes, which keep their rack as whole agents."""
    with fleet(stack, tmp_path / "load.log", "load", "--nodes", "8", "--rack-size", "3", "--interval", "2",
               "--prefix", "load-"):
        def loaded() -> dict[str, str]:
            return {node: rack for node, rack in racks_of(stack).items() if node.startswith("load-")}

        placed = stack.wait_until(lambda: len(loaded()) == 8 and loaded(), 60, "8 load nodes in racks")
        assert placed == {f"load-00000{i}": f"r{i // 3}" for i in range(8)}
        assert _listed(stack, "rack=r2") == ["load-000006", "load-000007"]  # sim run's fleet had r0 and r1 only

        done = stack.cli("sim", "inject", "--domain", "rack=r2", "--fault", "xid:79", "--gpu", "0")
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == "2 of 2 node(s) of rack=r2 injected with xid:79"
        stack.wait_until(lambda: all(stack.cli_json("node", "show", n)["health"] == "DEGRADED"
                                     for n in ("load-000006", "load-000007")), 60, "rack r2's Xid 79 reported")
        assert _listed(stack, "rack=r2") == ["load-000006", "load-000007"]  # as whole agents, still in r2


@pytest.mark.parametrize(("action", "value"), [("run", "x"), ("load", "-1"), ("run", "4.5")])
def test_dom1_a_bad_rack_size_is_one_line_exit_2(action: str, value: str) -> None:
    """DOM-1: --rack-size takes a count of nodes (0: no racks); anything else is refused before
    the fleet starts."""
    done = subprocess.run([sys.executable, "-m", "healthplane.cli", "sim", action, "--rack-size", value,
                           "--nats-url", "nats://127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"healthplane: --rack-size: {value!r} is not a number of nodes per rack (1 or more; 0: no racks)"]
