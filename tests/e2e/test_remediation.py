"""Issue 24 on the whole system: `healthplane up` (every service, the reference scheduler) and
a simulated fleet whose agents answer remediation requests the way the real agent does (a
GPU reset clears what a reset clears, a reboot brings a new boot id), policy in drain mode
(REM-1, REM-2).

One stack for the module; each scenario uses its own node."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from healthplane.contracts import wire
from tests.e2e.test_eviction_scenarios import Stack, _stack, until

pytestmark = [pytest.mark.slow, pytest.mark.nats]
CONFIG = """\
nodeHealth:
  mode: drain
  maxUnavailablePercent: 50
  cordonSuppressionMinutes: 0
validation:
  suites:
    gpu-diag: {command: [dcgmi, diag, -r, "2"], timeoutSeconds: 600}
  defaultSuite: gpu-diag
  validateBeforeReturn: true
remediation:
  ladders:
    - faultClass: GPU_XID_ERRORS
      xids: [48]
      steps: [{action: gpu-reset, timeoutSeconds: 10}, {action: reboot, timeoutSeconds: 10}, {action: needs-attention}]
    - faultClass: GPU_THROTTLING
      steps: [{action: gpu-reset, timeoutSeconds: 15}, {action: needs-attention}]
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    env = {**os.environ, "HEALTHPLANE_SCHEDULER_VALIDATION_SECONDS": "0.5"}
    yield from _stack(tmp_path_factory.mktemp("remediation"), CONFIG, env=env)


def ok(stack: Stack, *args: str) -> str:
    done = stack.cli(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def ladder_events(stack: Stack, node: str) -> list[wire.NodeEvent]:
    found = []
    for kind in ("REMEDIATION_STARTED", "REMEDIATION_SUCCEEDED", "REMEDIATION_FAILED", "NODE_NEEDS_ATTENTION"):
        found += [e for e in await stack.events(kind) if e.node_id == node]
    return sorted(found, key=lambda e: (e.occurred_at, e.id))


def test_rem1_rem2_an_xid_node_is_drained_reset_rebooted_and_stops_at_needs_attention(stack: Stack) -> None:
    async def scenario() -> None:
        [job] = stack.submit(1, "--definition", "gpu-pool")

        async def running() -> bool:
            return job in await stack.running()

        await until(running)
        node = (await stack.running())[job].node_id
        before = await stack.read("HP_RESOURCES", f"hp.resource.default.{node}", last=True)
        boot_before = wire.decode(wire.ResourceReport, before[0].data).boot_id
        ok(stack, "sim", "inject", node, "--fault", "xid:48", "--gpu", "0")

        async def stopped() -> bool:
            return any(e.type == "NODE_NEEDS_ATTENTION" for e in await ladder_events(stack, node))

        await until(stopped, timeout=90)
        # Drained first: its job was taken off before the first step.
        [drained] = [e for e in await stack.events("NODE_DRAINED") if e.node_id == node]
        steps = await ladder_events(stack, node)
        assert drained.occurred_at <= steps[0].occurred_at
        assert [(e.type, e.remediation.action if e.remediation else None) for e in steps] == [
            ("REMEDIATION_STARTED", "gpu-reset"), ("REMEDIATION_FAILED", "gpu-reset"),
            ("REMEDIATION_STARTED", "reboot"), ("REMEDIATION_FAILED", "reboot"), ("NODE_NEEDS_ATTENTION", None)]
        assert "GPU Xid Errors persisted 10s after it" in steps[3].message  # the reboot ran; the Xid is held
        # The reboot happened: a new boot id, reported from the new boot.
        after = await stack.read("HP_RESOURCES", f"hp.resource.default.{node}", last=True)
        report = wire.decode(wire.ResourceReport, after[0].data)
        assert report.boot_id != boot_before and report.remediation is not None
        assert report.remediation.result == "succeeded" and report.remediation.boot_id_before == boot_before
        # No further action: a loop would start the next step at once (the hour-long case is
        # tests/unit/test_remediation_runs.py's).
        await asyncio.sleep(6)
        assert len(await ladder_events(stack, node)) == 5
        shown = ok(stack, "node", "show", node)
        assert "Needs attention since" in shown and "every step of its ladder was tried" in shown
        refused = stack.cli("node", "remediate", node)
        assert refused.returncode == 1 and "needs attention" in refused.stderr
        ok(stack, "node", "service", node, "--reason", "replaced GPU 0")

        async def attended() -> bool:
            return (await stack.view(node)).needs_attention is None

        await until(attended)

    asyncio.run(scenario())


def test_rem1_a_reset_that_clears_the_fault_returns_the_node_through_validation(stack: Stack) -> None:
    async def scenario() -> None:
        node = "sim-003"
        ok(stack, "sim", "inject", node, "--fault", "throttle-thermal", "--gpu", "2")

        async def throttled() -> bool:
            return "gpu_throttling" in [c.type for c in (await stack.view(node)).conditions]

        await until(throttled)
        said = ok(stack, "node", "remediate", node)
        assert said.startswith(f"remediating {node} for GPU Throttling: gpu-reset → needs-attention")

        async def back() -> bool:
            view = await stack.view(node)
            return view.status == "READY" and not view.holds

        await until(back, timeout=60)
        steps = [(e.type, e.remediation.action if e.remediation else None) for e in await ladder_events(stack, node)]
        assert steps == [("REMEDIATION_STARTED", "gpu-reset"), ("REMEDIATION_SUCCEEDED", "gpu-reset")]
        passed = [e for e in await stack.events("VALIDATION_PASSED") if e.node_id == node]
        assert len(passed) == 1  # it returned through validation

    asyncio.run(scenario())
