"""Fault eviction starts the remediation ladder on the whole system (XID-2: "Fault eviction
(EVI-5) starts the ladder"): `healthplane up` with the reference scheduler and a simulated fleet
whose agents answer remediation requests as the real agent does, policy in observe mode (it
recommends, never acts), so only eviction's own fault eviction can start the ladder."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_eviction_scenarios import Stack, _stack, until
from tests.e2e.test_remediation import ladder_events, ok

pytestmark = [pytest.mark.slow, pytest.mark.nats]
CONFIG = """\
nodeHealth:
  mode: observe
  evictOnFaultClasses: [GPU_XID_ERRORS]
remediation:
  ladders:
    - faultClass: GPU_XID_ERRORS
      xids: [48]
      steps: [{action: gpu-reset, timeoutSeconds: 10}, {action: reboot, timeoutSeconds: 10}, {action: needs-attention}]
"""


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    env = {**os.environ, "HEALTHPLANE_SCHEDULER_VALIDATION_SECONDS": "0.5"}
    yield from _stack(tmp_path, CONFIG, env=env)


def test_xid2_evi5_fault_eviction_moves_the_work_then_climbs_the_ladder_to_needs_attention(stack: Stack) -> None:
    """XID-2 / EVI-5 / REM-1: an Xid 48 on a node running work, policy observing: eviction cordons
    it, fails or moves its work (NODE_EVICTED), then runs the ladder's steps itself, each after
    the work left, and stops at needs attention; nothing runs twice."""
    async def scenario() -> None:
        [job] = stack.submit(1)

        async def running() -> bool:
            return job in await stack.running()

        await until(running)
        node = (await stack.running())[job].node_id
        ok(stack, "sim", "inject", node, "--fault", "xid:48", "--gpu", "0")

        async def stopped() -> bool:
            return any(e.type == "NODE_NEEDS_ATTENTION" for e in await ladder_events(stack, node))

        await until(stopped, timeout=120)
        [evicted] = [e for e in await stack.events("NODE_EVICTED") if e.node_id == node]
        assert (evicted.actor, evicted.fault_class) == ("eviction", "GPU_XID_ERRORS")
        steps = await ladder_events(stack, node)
        assert evicted.occurred_at <= steps[0].occurred_at
        assert [(e.type, e.remediation.action if e.remediation else None) for e in steps] == [
            ("REMEDIATION_STARTED", "gpu-reset"), ("REMEDIATION_FAILED", "gpu-reset"),
            ("REMEDIATION_STARTED", "reboot"), ("REMEDIATION_FAILED", "reboot"), ("NODE_NEEDS_ATTENTION", None)]
        assert {e.actor for e in steps} == {"eviction"}  # eviction's own: policy only observes
        assert not [e for e in await stack.events("POLICY_ACTED") if e.node_id == node]
        await asyncio.sleep(6)
        assert len(await ladder_events(stack, node)) == 5  # no loop
        shown = ok(stack, "node", "show", node)
        assert "Needs attention since" in shown and "every step of its ladder was tried" in shown

    asyncio.run(scenario())
