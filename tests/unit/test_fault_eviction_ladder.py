"""Fault eviction starts the remediation ladder (XID-2: "Fault eviction (EVI-5) starts the
ladder"), through eviction's pure core: the node is cordoned and its work moved or failed as
EVI-5 says, then the ladder its fault calls for (configured, else NVIDIA's catalog's) climbs from
its first step once no work is left, under the ladder's own bound per node and window; never a
second episode while one climbs, never on a node someone holds by hand or that needs
attention; and a refold of the same inputs rebuilds the same state and records (REL-1)."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import ClusterConfig
from healthplane.runtime.fold import Emit
from healthplane_eviction.fold import EvictionCore
from healthplane_eviction.state import EvictionState
from tests.unit.test_eviction_core import NODE, T0, Harness, events

LADDER: dict[str, Any] = {"ladders": [{"faultClass": "GPU_XID_ERRORS", "steps": [
    {"action": "gpu-reset", "timeoutSeconds": 300, "retries": 0}, {"action": "reboot", "timeoutSeconds": 900},
    {"action": "needs-attention"}]}]}


def harness(remediation: dict[str, Any] | None = None, classes: tuple[str, ...] = ("GPU_XID_ERRORS",)) -> Harness:
    h = Harness()
    config = ClusterConfig.model_validate({"nodeHealth": {"evictOnFaultClasses": list(classes)},
                                           "remediation": LADDER if remediation is None else remediation})
    h.feed("HP_CONFIG", subjects.CONFIG, wire.ConfigEnvelope(version=1, applied_at=T0, actor="t",
                                                            config=config.to_wire()))
    h.resources()
    return h


def xid(h: Harness, action: str | None = "RESET_GPU", severity: str = "critical") -> list[Emit]:
    return h.event("CONDITION_RAISED", condition=wire.ConditionChange(
        type="gpu_xid_errors", reason="GpuXidHardware", severity=severity,  # type: ignore[arg-type]
        message="GPU 0000:18:00.0: Xid 79", recommended_action=action))


def requests(emits: list[Emit]) -> list[wire.RemediationRequest]:
    return [wire.decode(wire.RemediationRequest, e.payload) for e in emits if e.subject.startswith("hp.remediate.")]


def ladder(emits: list[Emit]) -> list[tuple[str, str | None, str]]:
    return [(e.type, e.remediation.action if e.remediation else None, e.actor) for e in events(emits)
            if e.type.startswith(("REMEDIATION_", "NODE_NEEDS"))]


def agent(h: Harness, request: wire.RemediationRequest, result: str = "succeeded") -> list[Emit]:
    return h.feed("HP_RESOURCES", subjects.resource("default", NODE), wire.ResourceReport(
        node_id=NODE, cluster="default", hostname=f"host-{NODE}", sent_at=T0, cores=192, memory_bytes=1 << 40,
        devices=[], ready=True, remediation=wire.RemediationOutcome(
            request_id=request.id, action=request.action, result=result,  # type: ignore[arg-type]
            reason=result, finished_at=T0)))


def test_xid2_evi5_fault_eviction_emits_the_ladders_first_step() -> None:
    """XID-2 / EVI-5: an evicting fault on an idle node: cordon, NODE_EVICTED, then the first rung."""
    h = harness()
    emits = xid(h)
    assert [e.type for e in events(emits)] == ["HOLD_CREATED", "NODE_CORDONED", "NODE_EVICTED", "REMEDIATION_STARTED"]
    assert ladder(emits) == [("REMEDIATION_STARTED", "gpu-reset", "eviction")]
    [request] = requests(emits)
    assert (request.action, request.attempt, request.node_id, request.reason) == ("gpu-reset", 1, NODE, "GPU_XID_ERRORS")
    node = h.state.nodes[subjects.node_key("default", NODE)]
    [hold] = node.holds.values()
    assert node.climb_hold == hold.id and hold.actor == "eviction"  # the episode's hold is the fault's cordon


def test_xid2_evi5_the_first_step_waits_for_the_moved_work_to_leave() -> None:
    """XID-2 / EVI-5: work on the node is moved first (EVI-5's messages), the rung runs once it has left."""
    h = harness()
    h.alloc("j1.0.0", retry_on=["node"], retry_attempts=2, restart="on-node-fault")
    emits = xid(h)
    assert [e.type for e in events(emits)][-1] == "NODE_EVICTED" and not requests(emits)
    emits = h.alloc("j1.0.0", state="requeued")
    assert ladder(emits) == [("REMEDIATION_STARTED", "gpu-reset", "eviction")]


def test_xid2_evi5_without_a_configured_ladder_the_catalogs_reboot() -> None:
    """XID-2: NVIDIA's catalog says RESTART_BM and no ladder is configured: reboot, then a human."""
    h = harness(remediation={})
    emits = xid(h, action="RESTART_BM")
    assert ladder(emits) == [("REMEDIATION_STARTED", "reboot", "eviction")]
    node = h.state.nodes[subjects.node_key("default", NODE)]
    assert node.climb is not None and [r.action for r in node.climb.rungs] == ["reboot", "needs-attention"]


def test_xid2_evi5_no_ladder_for_the_fault_is_fault_eviction_only() -> None:
    """XID-2 / EVI-5: a fault with neither a configured ladder nor a catalog action: cordon only."""
    h = harness(remediation={}, classes=("GPU_ECC_ERRORS",))
    emits = h.raised("gpu_ecc_errors", "critical")
    assert [e.type for e in events(emits)] == ["HOLD_CREATED", "NODE_CORDONED", "NODE_EVICTED"]
    assert h.state.nodes[subjects.node_key("default", NODE)].climb is None


def test_xid2_evi5_a_node_already_climbing_is_not_started_twice() -> None:
    """XID-2 / REM-1: a second evicting raise, or an operator's remediate, while the ladder climbs."""
    h = harness()
    [first] = requests(xid(h))
    again = xid(h, action="RESTART_BM")  # the Xid escalates: re-raised
    assert "NODE_EVICTED" in [e.type for e in events(again)] and not requests(again) and not ladder(again)
    assert h.command("remediate").result == "refused"
    # The rung fails: the same episode climbs to the next rung, once.
    climbed = agent(h, first, result="failed")
    assert [(kind, action) for kind, action, _ in ladder(climbed)] == [
        ("REMEDIATION_FAILED", "gpu-reset"), ("REMEDIATION_STARTED", "reboot")]


def test_xid2_evi5_a_node_held_by_hand_or_needing_attention_gets_no_ladder() -> None:
    """XID-2 under POL-4's rule: a node someone took out of service is theirs; REM-1: attention is final."""
    held = harness()
    held.command("cordon")
    assert not requests(xid(held))
    attention = harness(remediation={"ladders": [{"faultClass": "GPU_XID_ERRORS",
                                                  "steps": [{"action": "needs-attention"}]}]})
    assert ladder(xid(attention)) == [("NODE_NEEDS_ATTENTION", None, "eviction")]
    attention.event("CONDITION_CLEARED", condition=wire.ConditionChange(
        type="gpu_xid_errors", reason="GpuXidHardware", severity="critical", message=""))
    assert not ladder(xid(attention))  # nothing automatic until service


def test_xid2_evi5_success_returns_the_node_and_a_new_fault_is_a_new_episode_within_the_bound() -> None:
    """XID-2 / REM-1: a rung that worked releases the fault's cordon; the next fault climbs again,
    until the node's attempts within the window reach maxAttemptsPerNode."""
    h = harness(remediation={**LADDER, "maxAttemptsPerNode": 2})
    for attempt in (1, 2):
        [request] = requests(xid(h))
        assert request.attempt == attempt
        agent(h, request)
        emits = h.event("CONDITION_CLEARED", condition=wire.ConditionChange(
            type="gpu_xid_errors", reason="GpuXidHardware", severity="critical", message=""))
        assert ("REMEDIATION_SUCCEEDED", "gpu-reset", "eviction") in ladder(emits)
        assert "HOLD_RELEASED" in [e.type for e in events(emits)]
        assert not h.state.nodes[subjects.node_key("default", NODE)].holds
    stopped = xid(h)
    assert not requests(stopped)
    [attention] = [e for e in events(stopped) if e.type == "NODE_NEEDS_ATTENTION"]
    assert "2 remediation attempt(s) within 24 h, the bound" in attention.message


# A tick's decisions are not refolded from inputs (the tick decides again at the same deadline,
# with the same message id): the script is the inputs only.
ACTIONS = st.lists(st.sampled_from(["fault", "catalog-fault", "clear", "alloc", "end", "ok", "fail",
                                    "cordon", "uncordon", "service", "remediate"]), max_size=30)


def _command(h: Harness, verb: str) -> list[Emit]:
    before = len(h.emitted)
    h.command(verb, **({"reason": "fixed"} if verb == "service" else {}))
    return h.emitted[before:]


@settings(max_examples=150, deadline=None)
@given(ACTIONS)
def test_xid2_evi5_fault_eviction_and_the_ladder_replay_to_the_same_state(script: list[str]) -> None:
    """XID-2 / EVI-5 / REL-1: whatever happens around it, one episode at a time, agent steps
    within maxAttemptsPerNode, and a refold of the inputs is the same state and records."""
    h = harness(remediation={**LADDER, "maxAttemptsPerNode": 3})
    key = subjects.node_key("default", NODE)
    sent: list[wire.RemediationRequest] = []
    for index, action in enumerate(script):
        node = h.state.nodes[key]
        before = node.climb if node.climb is not None and not node.climb.final else None
        emits: list[Emit] = []
        if action in ("fault", "catalog-fault"):
            emits = xid(h, action="RESTART_BM" if action == "catalog-fault" else "RESET_GPU")
        elif action == "clear":
            emits = h.event("CONDITION_CLEARED", condition=wire.ConditionChange(
                type="gpu_xid_errors", reason="GpuXidHardware", severity="critical", message=""))
        elif action == "alloc":
            emits = h.alloc(f"j{index}.0.0", retry_on=["node"], retry_attempts=2, restart="on-node-fault")
        elif action == "end":
            allocations = [*node.running, *node.ending]
            emits = h.alloc(allocations[0], state="finished") if allocations else []
        elif action in ("ok", "fail"):
            awaited = [r for r in sent if r.id == node.climb_request]
            emits = agent(h, awaited[0], "succeeded" if action == "ok" else "failed") if awaited else []
        else:
            emits = _command(h, action)
        new = requests(emits)
        sent += new
        climb = h.state.nodes[key].climb
        if new and before is not None:
            # A step of the episode under way (a retry or the next rung), never a second episode.
            assert climb is not None and climb.rungs == before.rungs and climb.step >= before.step
    assert len([r for r in sent if r.action in ("gpu-reset", "reboot")]) <= 3  # maxAttemptsPerNode in 24 h
    core = EvictionCore()
    state = core.initial_state()
    records: list[Emit] = []
    for inbound in h.inputs:
        state, emitted, _ = core.step(state, inbound)
        records += emitted
    assert msgspec.json.encode(state) == msgspec.json.encode(h.state)
    assert [e.payload for e in records] == [e.payload for e in h.emitted]
    restored = msgspec.json.decode(msgspec.json.encode(h.state), type=EvictionState)
    assert msgspec.json.encode(restored) == msgspec.json.encode(h.state)
