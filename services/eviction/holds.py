"""A node's holds and the work on it, and where that work is released when the node is lost,
drained, evicted or torn down (EVI-1..4, EVI-6): placing and releasing holds, and ending each
allocation by its fate (requeued, failed or terminated by directive: ``release_work``,
``drain_work``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from healthplane.contracts import wire
from healthplane_eviction import rules
from healthplane_eviction.state import EvictionState, Node, Out

# Hold ids look like the reference's (UUIDs) and are derived from the command, so a replayed
# command recreates the very same hold.
HOLD_NAMESPACE = uuid.UUID("6f1d3c52-7b0e-4a7e-9d55-0c1f2b9e8a41")


def hold(node: Node, command: wire.Command, effect: wire.HoldEffect, out: Out) -> wire.Hold:
    hold = wire.Hold(id=str(uuid.uuid5(HOLD_NAMESPACE, f"{command.id}:{effect}")), effect=effect,
                     reason=command.reason, actor=command.actor, created_at=out.at)
    node.holds = {**node.holds, hold.id: hold}
    out.event(node, "HOLD_CREATED", f"{effect} hold created: {command.reason or 'no reason given'}",
              command.actor, hold=hold, command_id=command.id)
    out.hold_ids.append(hold.id)
    return hold


def release_holds(node: Node, holds: list[wire.Hold], command: wire.Command, out: Out) -> None:
    for hold in holds:
        node.holds = {k: v for k, v in node.holds.items() if k != hold.id}
        out.event(node, "HOLD_RELEASED", f"{hold.effect} hold released", command.actor, hold=hold,
                  command_id=command.id)
        out.hold_ids.append(hold.id)
    if node.teardown in ("deprovision", "replace") and node.terminate_directive is None \
            and not any(h.effect == "deprovision" for h in node.holds.values()):
        node.teardown = node.teardown_actor = None  # releasing the deprovision hold cancels teardown


def drain_work(node: Node, command: wire.Command, active: bool,
                out: Out) -> tuple[int, list[wire.Allocation]]:
    """EVI-2: active requeues what may run again and fails what may not; then NODE_DRAINED."""
    moved, stuck = 0, []
    if active:
        for alloc in list(node.running.values()):
            if alloc.requeueable is False:  # the scheduler cannot run it again (Slurm --no-requeue)
                stuck.append(alloc)
                end(node, alloc, "fail", rules.drain_fail_message(node.node_id, command.reason, alloc.job_id),
                          out, by_operator=True)
                continue
            end(node, alloc, "requeue", rules.drain_requeue_message(node.node_id, command.reason), out,
                      by_operator=True)
            moved += 1
    mode = "active" if active else "passive"
    detail = f"; {moved} allocation(s) requeued" if active else ""
    if stuck:
        detail += f"; {len(stuck)} failed, not requeueable: job {', '.join(a.job_id for a in stuck)}"
    out.event(node, "NODE_DRAINED", f"drained ({mode}){detail}", command.actor, drain_mode=mode, moved=moved,
              failed=len(stuck) if stuck else None, command_id=command.id)
    return moved, stuck


def evict_running(state: EvictionState, node: Node, reason: str, out: Out) -> tuple[int, int]:
    limit = state.config.limits(node.definition).max_eviction_restarts
    return release_work(node, lambda a: rules.evict_fate(a, limit),
                              lambda fate, a: rules.held_message(node.node_id, reason, fate, a.node_fault_restarts),
                              out, by_operator=True)


def release_work(node: Node, fate_of: Callable[[wire.Allocation], rules.Fate],
                  message: Callable[[rules.Fate, wire.Allocation], str], out: Out, *,
                  by_operator: bool) -> tuple[int, int]:
    """Move or fail every allocation running on the node; (moved, failed)."""
    moved = failed = 0
    for alloc in list(node.running.values()):
        fate = fate_of(alloc)
        end(node, alloc, "requeue" if fate == "move" else "fail", message(fate, alloc), out,
                  by_operator=by_operator)
        moved, failed = moved + (fate == "move"), failed + (fate != "move")
    return moved, failed


def end(node: Node, alloc: wire.Allocation, action: wire.DirectiveAction, message: str, out: Out, *,
         by_operator: bool) -> None:
    """Tell the scheduler to requeue or fail one allocation; it leaves the running set now so
    that nothing decides about it twice."""
    out.directive(node, action, message, alloc.id)
    node.running = {k: v for k, v in node.running.items() if k != alloc.id}
    node.ending = [*node.ending, alloc.id]
    if by_operator:
        node.operator_ended = [*node.operator_ended, alloc.id]


def teardown_when_empty(node: Node, out: Out) -> None:
    if (node.teardown in ("deprovision", "replace") and not node.running and not node.ending
            and node.terminate_directive is None):
        node.terminate_directive = out.directive(node, "terminate",
                                                 f"{node.teardown} by {node.teardown_actor}: no work left")
