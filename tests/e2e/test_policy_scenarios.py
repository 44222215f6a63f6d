"""Issue #9's scenarios on the whole system: `healthplane up`, a simulated fleet reporting every
5 s (sim-002 and sim-003 provisioned by the control plane), the reference scheduler, faults
from `healthplane sim inject` (POL-1, POL-2, POL-4)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_eviction_scenarios import Stack, _stack, until

pytestmark = [pytest.mark.slow, pytest.mark.nats]


@pytest.fixture
def observe(tmp_path: Path) -> Iterator[Stack]:
    yield from _stack(tmp_path, "nodeHealth:\n  mode: observe\n")


@pytest.fixture
def cordon(tmp_path: Path) -> Iterator[Stack]:
    # One node of four may be out of service (25 %); the default 20 % would refuse even one.
    yield from _stack(tmp_path, "nodeHealth:\n  mode: cordon\n  maxUnavailablePercent: 25\n")


@pytest.fixture
def replace(tmp_path: Path) -> Iterator[Stack]:
    yield from _stack(tmp_path, "nodeHealth:\n  mode: replace\n  maxUnavailablePercent: 50\n")


def test_pol2_observe_records_one_recommendation_per_episode_and_changes_nothing(observe: Stack) -> None:
    async def scenario() -> None:
        assert observe.cli("sim", "inject", "sim-000", "--fault", "xid:48", "--gpu", "0").returncode == 0

        async def recommended() -> bool:
            return bool(await observe.events("POLICY_RECOMMENDED"))

        await until(recommended)
        await asyncio.sleep(6)  # another report at 55: the same conclusion, no new event
        [event] = await observe.events("POLICY_RECOMMENDED")
        assert (event.node_id, event.message, event.policy_mode, event.score) == (
            "sim-000", "cordon: score 55", "observe", 55)
        assert (await observe.view("sim-000")).status == "READY"
        assert not await observe.events("HOLD_CREATED")

    asyncio.run(scenario())


def test_pol1_cordon_mode_cordons_below_60(cordon: Stack) -> None:
    async def scenario() -> None:
        assert cordon.cli("sim", "inject", "sim-001", "--fault", "xid:48", "--gpu", "0").returncode == 0

        async def cordoned() -> bool:
            view = await cordon.view("sim-001")
            return view.status == "CORDONED" and [h.actor for h in view.holds] == ["policy"]

        await until(cordoned)
        [acted] = await cordon.events("POLICY_ACTED")
        assert (acted.node_id, acted.message, acted.action) == ("sim-001", "cordon: score 55", "ACTION_CORDON")
        # A second fault on another node: the ceiling (25 % of 4 nodes) is already spent.
        assert cordon.cli("sim", "inject", "sim-000", "--fault", "xid:48", "--gpu", "0").returncode == 0

        async def halted() -> bool:
            return bool(await cordon.events("POLICY_HALTED"))

        await until(halted)
        [event] = await cordon.events("POLICY_HALTED")
        assert event.node_id == "sim-000" and "maxUnavailablePercent" in event.message
        assert (await cordon.view("sim-000")).status == "READY"

    asyncio.run(scenario())


def test_pol4_replace_mode_terminates_a_provisioned_node_once_its_work_is_done(replace: Stack) -> None:
    async def scenario() -> None:
        done = replace.cli("sim", "submit", "--count", "4", "--duration", "20")  # one per node
        assert done.returncode == 0, done.stderr

        async def placed() -> bool:
            return len([a for a in (await replace.running()).values() if a.state == "started"]) == 4

        await until(placed)
        on = {a.node_id: a for a in (await replace.running()).values()}
        for fault in ("xid:48", "edac-ue"):  # 100 - 45 - 45 = 10: below drainBelow
            assert replace.cli("sim", "inject", "sim-002", "--fault", fault, "--gpu", "0").returncode == 0

        async def waiting() -> bool:
            return any("waiting for 1 allocation(s)" in e.message for e in await replace.events("POLICY_ACTED"))

        await until(waiting)
        assert not await replace.events("NODE_REPLACED")  # its work is still running: passive

        async def replaced() -> bool:
            return [e.node_id for e in await replace.events("NODE_REPLACED")] == ["sim-002"]

        await until(replaced, timeout=60)
        [event] = await replace.events("NODE_REPLACED")
        assert event.actor == "policy"
        assert (await replace.allocations())[on["sim-002"].id].state == "finished"  # never cut short

    asyncio.run(scenario())
