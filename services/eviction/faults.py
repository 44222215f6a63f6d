"""Health events (EVI-5, EVI-6): a fault on a node whose class evicts its work, a node lost to
heartbeat, and what the remediation ladder makes of a fault; and evidence that asks for
diagnostics (RUL-2's ``validate`` rules, JOB-3's anomalous job failures) starts a validation
run of the default suite (VAL-1)."""

from __future__ import annotations

import uuid

from healthplane.contracts import wire
from healthplane_eviction import climbing, holds, rules, runs
from healthplane_eviction import ladder as remediation
from healthplane_eviction import remediating as rem
from healthplane_eviction import validation as vrules
from healthplane_eviction.holds import HOLD_NAMESPACE
from healthplane_eviction.state import SERVICE, EvictionState, Node, Out, node_of


def health(state: EvictionState, event: wire.NodeEvent, out: Out) -> None:
    node = node_of(state, event.cluster, event.node_id)
    node.known = True
    if event.type == "CONDITION_RAISED" and event.condition is not None:
        condition = event.condition
        node.faults = {**node.faults, condition.type: condition.severity}
        node.fault_details = {**node.fault_details, condition.type: rem.Fault(
            condition.severity, condition.reason, condition.message, condition.recommended_action)}
        if condition.type not in rules.NOT_A_FAULT:
            node.fault_seen = True
        limits = state.config.limits(node.definition)
        if (condition.severity == "critical" and condition.type not in rules.NOT_A_FAULT
                and rules.fault_class(condition.type) in limits.evict_on_fault_classes and not node.gone):
            hold_id = fault_evict(node, condition.type, limits.max_eviction_restarts, out)
            climbing.after_fault_eviction(state, node, hold_id, out)
        if condition.type == JOB_FAILURES and condition.reason == AFTER_VALIDATION:
            jobs_after_validation(node, out)
        elif condition.type == JOB_FAILURES:
            validate_on_evidence(state, node, out)
    elif event.type == "RULE_FIRED" and event.rule is not None:
        if event.rule.action == "validate" and event.rule.mode == "act":
            validate_on_evidence(state, node, out)
    elif event.type == "CONDITION_CLEARED" and event.condition is not None:
        node.faults = {k: v for k, v in node.faults.items() if k != event.condition.type}
        node.fault_details = {k: v for k, v in node.fault_details.items() if k != event.condition.type}
        if node.climb is not None and node.climb.fault_class.lower() == event.condition.type:
            climbing.step_ladder(state, node, remediation.cleared(node.climb), out)
    elif event.type == "HEARTBEAT_MISSED":
        node.offline = True
        node_gone(state, node, out)
    elif event.type == "HEARTBEAT_RESUMED":
        node.offline = False


# JOB-3: a node whose jobs fail improbably often is diagnosed before anyone trusts it again.
JOB_FAILURES = "job_failures_anomalous"
AFTER_VALIDATION = "JobFailuresAfterValidation"


def jobs_after_validation(node: Node, out: Out) -> None:
    """JOB-3: the node passed its validation and its jobs still fail: the diagnostics found
    nothing a drain or a ladder could fix, so it stops at NODE_NEEDS_ATTENTION (no hold, no
    drain: its score keeps new work off it) until a person records service."""
    if node.needs_attention is None and not node.gone:
        climbing.needs_attention(node, "job_failures_anomalous: its jobs still fail after a passed validation "
                                       "(JOB-3)", SERVICE, out)


def validate_on_evidence(state: EvictionState, node: Node, out: Out) -> None:
    """Evidence that asks for diagnostics starts a run of the default suite on ``node``; none
    starts while one runs there already, without a default suite, or on a node the suite
    cannot run on (too few GPUs, gone): the evidence stands in its event and condition, and
    ``node validate`` remains for a person."""
    policy = state.config.validation
    if node.gone or vrules.no_suite(None, policy) is not None or runs.running_on(state, node) is not None:
        return
    rule = policy.rules[policy.default_suite or ""]
    if runs.excluded_why(state, node.cluster, node.node_id, rule) is None:
        runs.start_run(state, node.cluster, rule, [node.node_id], "validate", SERVICE, out)


def fault_evict(node: Node, condition_type: str, limit: int, out: Out) -> str:
    """EVI-5: cordon, then move or fail each step by what it declared, then NODE_EVICTED; the id
    of the fault's cordon hold (placed now, or already there)."""
    cordon = next((h for h in node.holds.values() if h.actor == SERVICE and h.effect == "cordon"), None)
    if cordon is None:
        hold = wire.Hold(id=str(uuid.uuid5(HOLD_NAMESPACE, f"{out.stem}:fault")), effect="cordon",
                         reason=rules.fault_phrase(condition_type), actor=SERVICE, created_at=out.at)
        node.holds = {**node.holds, hold.id: hold}
        out.event(node, "HOLD_CREATED", f"cordon hold created: {hold.reason}", SERVICE, hold=hold)
        out.event(node, "NODE_CORDONED", f"cordoned: {hold.reason}", SERVICE)
        cordon = hold
    moved, failed = holds.release_work(
        node, lambda a: rules.fault_fate(a, limit),
        lambda fate, a: rules.fault_message(node.node_id, condition_type, fate, a.node_fault_restarts),
        out, by_operator=False)
    fault = rules.fault_class(condition_type)
    out.event(node, "NODE_EVICTED", f"{rules.fault_phrase(condition_type)}: {moved} moved, {failed} failed",
              SERVICE, fault_class=fault, moved=moved, failed=failed)
    return cordon.id


def node_gone(state: EvictionState, node: Node, out: Out) -> None:
    """EVI-6: the node is gone and its work died with it: release it now, not after a timeout."""
    limit = state.config.limits(node.definition).max_eviction_restarts
    fault = rules.worst_fault(node.faults)
    holds.release_work(node, lambda a: rules.fault_fate(a, limit),
                       lambda fate, a: rules.offline_message(node.node_id, fault, fate, a.node_fault_restarts),
                       out, by_operator=False)
