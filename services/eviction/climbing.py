"""The remediation ladder as it runs in eviction's fold (REM-1..4): drain first, each rung's
request to the node, its outcome in the node's resource report, the climb to the next rung,
and the return to service through validation. The ladder itself is ``ladder.py``, its
sentences ``remediating.py``."""

from __future__ import annotations

import uuid

from healthplane.contracts import wire
from healthplane.contracts.automation import AUTOMATION
from healthplane.contracts.subjects import node_key
from healthplane.runtime.fold import Inbound, note
from healthplane_eviction import commands, holds, rules, runs
from healthplane_eviction import ladder as remediation
from healthplane_eviction import remediating as rem
from healthplane_eviction.holds import HOLD_NAMESPACE
from healthplane_eviction.state import SERVICE, EvictionState, Node, Out, status
from healthplane_eviction.validation import Gate


def remediate(state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
    """REM-1: drain the node, then climb the ladder its worst fault calls for."""
    if node.needs_attention is not None:
        out.outcome(command, "refused", f"{node.node_id} needs attention ({node.needs_attention}): nothing "
                    "automatic touches it until service is recorded")
        return
    if node.climb is not None and not node.climb.final:
        out.outcome(command, "refused", f"{node.node_id} is being remediated already "
                    f"({node.climb.rung.action}, step {node.climb.step + 1} of {len(node.climb.rungs)})")
        return
    ladder = ladder_of(state, node)
    current = status(node)
    if current not in ("READY", "CORDONED"):
        out.outcome(command, "refused", rules.not_drainable(node.node_id, current))
        return
    hold = holds.hold(node, command, "cordon", out)
    moved, stuck = holds.drain_work(node, command, True, out)
    drained = f"drained: {moved} allocation(s) requeued" + (f", {len(stuck)} failed" if stuck else "")
    if ladder is None:
        out.outcome(command, "applied", f"no remediation ladder for the faults of {node.node_id}; {drained}",
                    moved=moved)
        return
    out.outcome(command, "applied", f"remediating {node.node_id} for {wire.condition_title(ladder.condition)}: "
                f"{ladder.describe()}; {drained}", moved=moved)
    begin(state, node, ladder, command.actor, hold.id, out)


def ladder_of(state: EvictionState, node: Node) -> rem.LadderSpec | None:
    """The ladder the node's worst fault that has one calls for (configured, else the catalog's)."""
    order = sorted(node.faults, key=lambda t: (-rules.SEVERITY_RANK.get(node.faults[t], 0),
                                                wire.CONDITION_TYPES.index(t) if t in wire.CONDITION_TYPES else 99))
    return rem.ladder_for(state.config.remediation.ladders, node.fault_details,
                          [t for t in order if t not in rules.NOT_A_FAULT])


def begin(state: EvictionState, node: Node, ladder: rem.LadderSpec, actor: str, hold_id: str, out: Out) -> None:
    """A new episode on a node out of service under ``hold_id`` whose work is leaving: its first
    step runs once no work is left (here, or when the last allocation ends: ``work``)."""
    policy = state.config.remediation
    recent = [at for at in node.remediation_attempts if out.at - at < policy.window]
    node.climb = remediation.begin(ladder.fault_class, ladder.rungs, tuple(recent))
    node.climb_ladder, node.climb_actor, node.climb_hold = ladder, actor, hold_id
    node.climb_request = None
    if not node.running and not node.ending:
        step_ladder(state, node, remediation.drained(node.climb, out.at, policy.max_attempts, policy.window), out)


def after_fault_eviction(state: EvictionState, node: Node, hold_id: str, out: Out) -> None:
    """XID-2: fault eviction (EVI-5) starts the ladder, as a ``remediate`` command would, under
    the guardrails the policy path keeps for a node automation already holds: none while the
    node needs attention or climbs already (one episode at a time), none on a node someone took
    out of service by hand (theirs, POL-4), and the ladder's own bound of agent steps per node
    and window (``maxAttemptsPerNode``, shared with every other start). The node is out of
    service already, whatever the breaker said (EVI-5 acts in every mode), so the ladder takes
    no capacity the breaker would count: it adds no second budget (docs/remediation.md)."""
    if node.needs_attention is not None or (node.climb is not None and not node.climb.final):
        return
    if node.teardown is not None or any(h.actor not in AUTOMATION for h in node.holds.values()):
        return
    ladder = ladder_of(state, node)
    if ladder is not None:
        begin(state, node, ladder, SERVICE, hold_id, out)


def step_ladder(state: EvictionState, node: Node, moved: tuple[remediation.Climb, remediation.Decision],
           out: Out) -> None:
    """Keep the ladder's new state and do what it decided."""
    node.climb, decision = moved
    key = node_key(node.cluster, node.node_id)
    if node.climb.final or node.climb.deadline is None:
        state.climbing = [k for k in state.climbing if k != key]
    elif key not in state.climbing:
        state.climbing = [*state.climbing, key]
    actor = node.climb_actor or SERVICE
    attempt = len(node.climb.attempts)
    if decision.action == "run" and decision.step is not None:
        request = wire.RemediationRequest(
            id=f"rem-{uuid.uuid5(HOLD_NAMESPACE, f'{out.stem}:{key}:{node.climb.step}').hex[:16]}",
            node_id=node.node_id, cluster=node.cluster, action=decision.step,  # type: ignore[arg-type]
            attempt=attempt, requested_at=out.at, timeout_seconds=node.climb.rung.timeout_s,
            reason=node.climb.fault_class)
        out.remediate(request)
        node.climb_request = request.id
        node.remediation_attempts = [*node.remediation_attempts[-49:], out.at]
        out.event(node, "REMEDIATION_STARTED", rem.started(decision.step, attempt, node.climb.fault_class), actor,
                  remediation=wire.RemediationRecord(action=decision.step, attempt=attempt,  # type: ignore[arg-type]
                                                     reason=node.climb.fault_class, request_id=request.id))
    elif decision.action == "succeeded" and decision.step is not None:
        node.climb_request = None
        out.event(node, "REMEDIATION_SUCCEEDED", rem.succeeded(decision.step, attempt, decision.why), actor,
                  remediation=wire.RemediationRecord(action=decision.step, attempt=attempt,  # type: ignore[arg-type]
                                                     reason=decision.why))
        after_remedy(state, node, out)
    elif decision.action == "replace":
        out.event(node, "REMEDIATION_STARTED", rem.started("replace", attempt, node.climb.fault_class), actor,
                  remediation=wire.RemediationRecord(action="replace", attempt=attempt,
                                                     reason=node.climb.fault_class))
        if node.provisioned:
            command = wire.Command(id=f"{out.stem}:replace", node_id=node.node_id, cluster=node.cluster,
                                   verb="replace", actor=actor, issued_at=out.at,
                                   reason=f"remediation: {node.climb.fault_class}")
            commands.deprovision(state, node, command, out)
        else:
            needs_attention(node, f"{node.climb.fault_class}: the ladder ends in replace, but "
                                  "Healthplane did not provision this node", actor, out)
    elif decision.action == "needs-attention":
        needs_attention(node, decision.why, actor, out)


def needs_attention(node: Node, why: str, actor: str, out: Out) -> None:
    node.needs_attention = why
    node.climb_request = None
    out.event(node, "NODE_NEEDS_ATTENTION", rem.needs_attention(why), actor)


def after_remedy(state: EvictionState, node: Node, out: Out) -> None:
    """A step worked: the episode's hold is released, through validation when configured
    (the ladder's suite, or VAL-2's gate)."""
    hold = node.holds.get(node.climb_hold or "")
    if hold is None:
        return
    actor = node.climb_actor or SERVICE
    command = wire.Command(id=f"{out.stem}:return", node_id=node.node_id, cluster=node.cluster,
                           verb="hold-release", actor=actor, issued_at=out.at, hold_ids=[hold.id])
    ladder = node.climb_ladder
    policy = state.config.validation
    suite = ladder.validate_suite if ladder is not None and ladder.validate_suite else None
    if suite is None and policy.before_return_for(node.definition):
        suite = policy.default_suite
    rule = policy.rules.get(suite or "")
    if rule is None or runs.running_on(state, node) is not None:
        holds.release_holds(node, [hold], command, out)
        return
    run = runs.start_run(state, node.cluster, rule, [node.node_id], "gate", actor, out, command_id=command.id)
    node.gate = Gate(run=run.id, command_id=command.id, verb="hold-release", actor=actor, hold_ids=[hold.id])


def remediation_outcome(state: EvictionState, node: Node, outcome: wire.RemediationOutcome,
                         out: Out, inbound: Inbound) -> None:
    """The agent's word on the step it was sent (REM-2): a reboot counts only with a new boot
    id; a step the host refused runs again after a backoff, up to its retries (REM-4)."""
    climb = node.climb
    if climb is None or node.climb_request != outcome.request_id or climb.phase != "running":
        return  # an outcome already read (the report is re-sent), or of a step no longer awaited
    node.climb_request = None
    ran = outcome.result == "succeeded"
    reason = outcome.reason
    if ran and outcome.action == "reboot" and (outcome.boot_id is None or outcome.boot_id == outcome.boot_id_before):
        ran, reason = False, f"boot id unchanged ({outcome.boot_id}): the reboot did not happen"
    active = climb.fault_class.lower() in node.faults
    policy = state.config.remediation
    moved = remediation.outcome(climb, out.at, ran=ran, reason=reason, fault_active=active,
                                max_attempts=policy.max_attempts, window=policy.window)
    if not ran:
        said = reason + (f"; {moved[1].why}" if moved[1].action == "retry" else "")
        out.event(node, "REMEDIATION_FAILED", rem.failed(outcome.action, len(climb.attempts), said),
                  node.climb_actor or SERVICE, remediation=wire.RemediationRecord(
                      action=climb.rung.action, attempt=len(climb.attempts), reason=said,  # type: ignore[arg-type]
                      request_id=outcome.request_id))
        out.notes.append(note("warning", "remediation step refused", counter=f"remediation_{outcome.result}",
                              node_id=node.node_id, action=outcome.action, reason=reason,
                              retry=moved[1].why if moved[1].action == "retry" else None))
    step_ladder(state, node, moved, out)
