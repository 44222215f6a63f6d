"""The rules of holds, drain, evict, deprovision and node loss, as pure functions.

Every user-visible sentence lives here, worded as reference 002 and the "Draining a node",
"fault-triggered eviction" and "when a node disappears" parts of reference 000 word them, so
a test can hold each one as a golden string.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from healthplane.contracts import wire

# Conditions that say the control plane cannot see the node, not that its hardware is bad:
# they never name a fault (EVI-6) and never attribute a failure (EVI-7).
NOT_A_FAULT = frozenset({"heartbeat_missed", "telemetry_stale", "collector_failed", "scheduler_drained"})

# How a fault reads in a job's error ("node gpu-14: GPU ECC errors; ...").
FAULT_PHRASES = {
    "memory_errors": "memory errors",
    "disk_degraded": "disk degraded",
    "disk_readonly": "read-only disk",
    "machine_check_errors": "machine check errors",
    "gpu_ecc_errors": "GPU ECC errors",
    "gpu_xid_errors": "GPU Xid errors",
    "gpu_throttling": "GPU throttling",
}

SEVERITY_RANK = wire.SEVERITY_LEVEL

Fate = Literal["move", "fail", "fail-budget"]

NOT_DRAINABLE = "only a READY or already cordoned node can be taken out of service"


def fault_class(condition_type: str) -> str:
    """SPEC.md: fault classes are condition types in upper case."""
    return condition_type.upper()


def fault_phrase(condition_type: str) -> str:
    return FAULT_PHRASES.get(condition_type, condition_type.replace("_", " "))


def worst_fault(faults: dict[str, str]) -> str | None:
    """The condition type of the most severe real fault (condition type -> severity), if any;
    ties go to the type named first in the vocabulary, so the choice is stable."""
    real = [(SEVERITY_RANK[severity], -wire.CONDITION_TYPES.index(kind), kind)
            for kind, severity in faults.items() if kind not in NOT_A_FAULT and kind in wire.CONDITION_TYPES]
    return max(real)[2] if real else None


def restart_budget(alloc: wire.Allocation, max_eviction_restarts: int) -> int:
    """EVI-3: the lower of the step's own retry attempts and the cluster's maxEvictionRestarts."""
    return min(alloc.retry_attempts, max_eviction_restarts)


def evict_fate(alloc: wire.Allocation, max_eviction_restarts: int) -> Fate:
    """An evict hold (EVI-3): moved only if the step declared ``retry.on: [node]`` and has budget."""
    if "node" not in alloc.retry_on:
        return "fail"
    if alloc.node_fault_restarts >= restart_budget(alloc, max_eviction_restarts):
        return "fail-budget"
    return "move"


def fault_fate(alloc: wire.Allocation, max_eviction_restarts: int) -> Fate:
    """A fault or a lost node (EVI-5, EVI-6): moved only with ``restart: on-node-fault`` and
    while it has been moved fewer than ``maxEvictionRestarts`` times."""
    if alloc.restart != "on-node-fault":
        return "fail"
    if alloc.node_fault_restarts >= max_eviction_restarts:
        return "fail-budget"
    return "move"


def held_message(node_id: str, reason: str, fate: Fate, restarts: int) -> str:
    """Reference 002: what a user reads on work an evict hold moved or failed."""
    head = f"node {node_id} was held: {reason}; "
    if fate == "move":
        return head + "work moved to another node"
    if fate == "fail":
        return head + ("job failed. Set policy.retry.on to node for work that is safe to run again "
                       "from the beginning")
    return head + f"job failed after {restarts} node restart(s), the limit for this step"


def fault_message(node_id: str, condition_type: str, fate: Fate, restarts: int) -> str:
    """Reference 000, fault-triggered eviction."""
    head = f"node {node_id}: {fault_phrase(condition_type)}; "
    if fate == "move":
        return head + "work moved off the node and the node cordoned"
    if fate == "fail":
        return head + ("job failed and the node cordoned. Set policy.restart to on-node-fault for work "
                       "that is safe to run again from the beginning")
    return head + f"job failed after {restarts} node restart(s), the limit for this step"


def offline_message(node_id: str, fault: str | None, fate: Fate, restarts: int) -> str:
    """Reference 000, "when a node disappears": a fault is named only when the node carries a
    real one; a disappearance alone says nothing about the hardware."""
    if fate == "move":
        return f"node {node_id} went offline; work moved to another node"
    if fault is not None:
        return f"node {node_id}: {fault_phrase(fault)}; job stopped responding on this node"
    if fate == "fail":
        return (f"node {node_id} went offline; job failed. Set policy.restart to on-node-fault for work "
                "that is safe to run again from the beginning")
    return f"node {node_id} went offline; job failed after {restarts} node restart(s), the limit for this step"


def drain_requeue_message(node_id: str, reason: str | None) -> str:
    return f"node {node_id} was drained{': ' + reason if reason else ''}; work moved to another node"


def drain_fail_message(node_id: str, reason: str | None, job_id: str) -> str:
    return (f"node {node_id} was drained{': ' + reason if reason else ''}; job {job_id} failed: "
            "its scheduler cannot requeue it (submitted not requeueable)")


def teardown_message(node_id: str) -> str:
    return f"node {node_id} was deprovisioned; job failed"


def hold_created(effect: str, node_id: str, hold_id: str) -> str:
    return f"{effect} hold created for {node_id}: {hold_id}"


def not_drainable(node_id: str, status: str) -> str:
    return f"node {node_id} is {status} and cannot be drained: {NOT_DRAINABLE}"


def static_node(node_id: str) -> str:
    return f"cannot deprovision static node {node_id}"


def static_skipped(node_id: str) -> str:
    return f"skipped {node_id}: statically provisioned; Healthplane did not create this instance"


def provisioning_unknown(node_id: str) -> str:
    return (f"rpc error: code = Unavailable desc = node {node_id} has not reported its resources yet, "
            "so whether Healthplane provisioned it is not known; retry")


def provisioning_unknown_skipped(node_id: str) -> str:
    return (f"skipped {node_id}: has not reported its resources yet, so whether Healthplane "
            "provisioned it is not known")


def remaining(holds: Iterable[wire.Hold]) -> str:
    effects = [h.effect for h in holds]
    return f"{len(effects)} hold(s) remain" + (f" ({', '.join(effects)})" if effects else "")


def uncordoned(node_id: str, released: int, left: Iterable[wire.Hold]) -> str:
    """Reference 002: "0 cordon hold(s) released for cn-042: 1 hold(s) remain (evict)"."""
    return f"{released} cordon hold(s) released for {node_id}: {remaining(left)}"


def released(node_id: str, count: int, left: Iterable[wire.Hold]) -> str:
    return f"{count} hold(s) released for {node_id}: {remaining(left)}"


def unknown_node(node_id: str) -> str:
    return f"node {node_id} not found"


def reason_of(command: wire.Command) -> str:
    """A hold's or an eviction's reason: the command's, else who sent it."""
    return command.reason or f"evicted by {command.actor}"
