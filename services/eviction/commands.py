"""Operators' and policy's commands on one node (EVI-1..4): cordon, uncordon, drain, evict,
deprovision (and replace), release holds, record service."""

from __future__ import annotations

from healthplane.contracts import wire
from healthplane_eviction import holds, rules, runs
from healthplane_eviction.state import EvictionState, Node, Out, status


def cordon(state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
    hold = holds.hold(node, command, "cordon", out)
    out.event(node, "NODE_CORDONED", f"cordoned: {command.reason or 'no reason given'}", command.actor,
              command_id=command.id)
    out.outcome(command, "applied", rules.hold_created("cordon", node.node_id, hold.id))


def uncordon(state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
    cordons = [h for h in node.holds.values() if h.effect == "cordon"]
    if runs.gated(state, node, command, cordons, out):
        return
    holds.release_holds(node, cordons, command, out)
    if cordons:
        out.event(node, "NODE_UNCORDONED", f"uncordoned: {len(cordons)} cordon hold(s) released",
                  command.actor, command_id=command.id)
    out.outcome(command, "applied", rules.uncordoned(node.node_id, len(cordons), node.holds.values()))


def drain(state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
    current = status(node)
    if command.batch_id is not None and current != "READY":
        # --all counts what it took out of service, so anything not READY is skipped.
        out.outcome(command, "refused", f"skipped {node.node_id}: {current}", skipped=True)
        return
    if current not in ("READY", "CORDONED"):
        out.outcome(command, "refused", rules.not_drainable(node.node_id, current))
        return
    holds.hold(node, command, "cordon", out)
    moved, stuck = holds.drain_work(node, command, command.active, out)
    message = "Cordoned 1 node(s)" + (f"; requeued {moved} allocation(s)" if command.active else "")
    if stuck:
        message += f"; failed {len(stuck)} that cannot be requeued"
    out.outcome(command, "applied", message, moved=moved, failed=len(stuck) if stuck else None)


def evict(state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
    hold = holds.hold(node, command, "evict", out)
    moved, failed = holds.evict_running(state, node, rules.reason_of(command), out)
    out.event(node, "NODE_EVICTED", f"evicted: {moved} moved, {failed} failed", command.actor, moved=moved,
              failed=failed, command_id=command.id)
    out.outcome(command, "applied", rules.hold_created("evict", node.node_id, hold.id), moved=moved, failed=failed)


def deprovision(state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
    if node.provisioned is None:
        if command.batch_id is not None:
            out.outcome(command, "refused", rules.provisioning_unknown_skipped(node.node_id), skipped=True)
        else:
            out.outcome(command, "retry", rules.provisioning_unknown(node.node_id))
        return
    if not node.provisioned:
        if command.batch_id is not None:
            out.outcome(command, "refused", rules.static_skipped(node.node_id), skipped=True)
        else:
            out.outcome(command, "refused", rules.static_node(node.node_id))
        return
    if command.force:
        # No hold: the instance goes now, and the provisioner's own answer is the outcome.
        node.teardown, node.teardown_actor, node.force_command = "force", command.actor, command.id
        node.terminate_directive = out.directive(node, "terminate", f"deprovision --force by {command.actor}")
        return
    existing = next((h for h in node.holds.values() if h.effect == "deprovision"), None)
    if existing is not None:
        # Asked again (policy retrying a rejected replacement, an operator repeating
        # himself): one deprovision hold says it; only the teardown is tried again.
        lines = [f"deprovision hold already in place for {node.node_id}: {existing.id}"]
        out.hold_ids.append(existing.id)
    else:
        lines = [rules.hold_created("deprovision", node.node_id,
                                   holds.hold(node, command, "deprovision", out).id)]
    moved = failed = 0
    if command.evict:  # scoped to where the deprovision hold landed: this node
        lines.append(rules.hold_created("evict", node.node_id, holds.hold(node, command, "evict", out).id))
        moved, failed = holds.evict_running(state, node, rules.reason_of(command), out)
        out.event(node, "NODE_EVICTED", f"evicted: {moved} moved, {failed} failed", command.actor, moved=moved,
                  failed=failed, command_id=command.id)
    node.teardown, node.teardown_actor = ("replace" if command.verb == "replace" else "deprovision"), command.actor
    holds.teardown_when_empty(node, out)
    out.outcome(command, "applied", "\n".join(lines), moved=moved if command.evict else None,
                failed=failed if command.evict else None)


def release(state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
    missing = [h for h in command.hold_ids if h not in node.holds]
    if missing:
        out.outcome(command, "refused", f"hold {missing[0]} not found on {node.node_id}")
        return
    chosen = [h for h in node.holds.values()
              if (not command.hold_ids or h.id in command.hold_ids)
              and (command.effect is None or h.effect == command.effect)]
    if runs.gated(state, node, command, chosen, out):
        return
    holds.release_holds(node, chosen, command, out)
    out.outcome(command, "applied", rules.released(node.node_id, len(chosen), node.holds.values()))


def service(state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
    out.event(node, "NODE_SERVICED", f"serviced: {command.reason or 'no reason given'}", command.actor,
              command_id=command.id)
    if node.climb is not None and node.climb.final:  # an operator took over: the episode is over
        node.climb = node.climb_ladder = node.climb_actor = node.climb_request = node.climb_hold = None
    node.needs_attention = None
    out.outcome(command, "applied", f"service recorded for {node.node_id}")
