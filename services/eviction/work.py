"""Allocations and the provisioner's answers as they arrive: what runs where, a failure
attributed to a faulty node (EVI-7), a validation step's end, a deprovisioned node's teardown."""

from __future__ import annotations

from healthplane.contracts import wire
from healthplane.contracts.subjects import node_key
from healthplane_eviction import climbing, holds, rules, runs
from healthplane_eviction import ladder as remediation
from healthplane_eviction import validation as vrules
from healthplane_eviction.state import SERVICE, EvictionState, Out, node_of


def allocation(state: EvictionState, alloc: wire.Allocation, out: Out) -> None:
    run = state.runs.get(alloc.job_id)
    if run is not None:
        runs.run_step(state, run, alloc, out)
        return
    if alloc.job_id.startswith(vrules.RUN_PREFIX):
        return  # a finished run's late record: validation work is never the job index's
    node = node_of(state, alloc.cluster, alloc.node_id)
    seen = runs.seen_job(state, alloc)
    if alloc.state in ("placed", "started"):
        if alloc.id in node.ending:
            return  # already told to end; a late "started" does not bring it back
        node.running = {**node.running, alloc.id: alloc}
        evict = next((h for h in node.holds.values() if h.effect == "evict"), None)
        if evict is not None or node.gone:
            # The evict hold outlives the eviction: work that lands anyway is taken off again.
            limit = state.config.limits(node.definition).max_eviction_restarts
            fate = rules.evict_fate(alloc, limit)
            reason = (evict.reason if evict else None) or "deprovisioned"
            holds.end(node, alloc, "requeue" if fate == "move" else "fail",
                      rules.held_message(node.node_id, reason, fate, alloc.node_fault_restarts), out,
                      by_operator=True)
        return
    node.running = {k: v for k, v in node.running.items() if k != alloc.id}
    node.ending = [a for a in node.ending if a != alloc.id]
    by_operator = alloc.id in node.operator_ended
    if by_operator:
        node.operator_ended = [a for a in node.operator_ended if a != alloc.id]
    fault = rules.worst_fault(node.faults)
    if alloc.state == "failed" and not by_operator and fault is not None:
        # EVI-7: the step failed on hardware that carries a real fault.
        out.event(node, "JOB_FAILURE_ATTRIBUTED",
                  f"job {alloc.job_id} failed on a node with {rules.fault_phrase(fault)}", SERVICE,
                  fault_class=rules.fault_class(fault), allocation_id=alloc.id)
        seen.attributed = [*seen.attributed, node.node_id]
    elif alloc.state == "failed" and not by_operator:
        runs.isolate_automatically(state, seen, out)
    holds.teardown_when_empty(node, out)
    if node.climb is not None and node.climb.phase == "draining" and not node.running and not node.ending:
        policy = state.config.remediation
        climbing.step_ladder(state, node, remediation.drained(node.climb, out.at, policy.max_attempts, policy.window), out)


def termination(state: EvictionState, result: wire.TerminationResult, out: Out) -> None:
    node = state.nodes.get(node_key(result.cluster, result.node_id))
    if node is None or node.terminate_directive != result.directive_id:
        return  # not ours, or an answer to a directive already settled
    node.terminate_directive = None
    command_id, node.force_command = node.force_command, None
    teardown, actor = node.teardown, node.teardown_actor or SERVICE
    if result.accepted:
        kind: wire.EventType = "NODE_REPLACED" if teardown == "replace" else "NODE_DEPROVISIONED"
        for alloc in list(node.running.values()):  # --force: the work ends with the instance
            holds.end(node, alloc, "fail", rules.teardown_message(node.node_id), out, by_operator=True)
        out.event(node, kind, f"{'replaced' if kind == 'NODE_REPLACED' else 'deprovisioned'}: {result.message}",
                  actor, provisioned=True)
        node.gone, node.teardown = True, None
    elif teardown == "force":
        node.teardown = None
    if command_id is not None:
        command = wire.Command(id=command_id, node_id=node.node_id, cluster=node.cluster, verb="deprovision",
                               actor=actor, issued_at=out.at, force=True)
        out.outcome(command, "applied" if result.accepted else "refused", result.message)
