""""Why is automation not acting on this node?" (API-4), answered from the record.

The policy service concludes once per episode and says so in a node event (POLICY_RECOMMENDED,
POLICY_ACTED, POLICY_HALTED with the guardrail's numbers); the cases it stays silent on by
design (a node it cannot fully see, an operator's uncordon, a node taken out by hand, a first
score) follow from the view, the node's last uncordon and the config in force. ``explain`` is
pure; ``node show``, the API and the node page all call it with what ``reads`` fetched.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Final

from healthplane.contracts import wire
from healthplane.contracts.config import NodeHealth

POLICY: Final = "policy"
# Automation's own holds: the policy's, and fault eviction's cordon (EVI-5); every other
# actor is a person (or their tooling) who took the node out of service by hand (POL-4).
AUTOMATION: Final = frozenset({POLICY, "eviction"})
# A node the control plane cannot fully see is never acted on, and gets no policy event (POL-3).
BLIND: Final = frozenset({"heartbeat_missed", "telemetry_stale", "collector_failed"})
# XID-2: a collector failure a fatal fault of the same device explains (a GPU that fell off
# the bus cannot be read: it is gone, not unseen) is evidence, not blindness.
EXPLAINED: Final = "CollectorFailedExplained"


def blinding(conditions: Iterable[tuple[str, str]]) -> list[str]:
    """The condition types among ``(type, reason)`` that leave the node unseen (POL-3), an
    explained collector failure not among them (XID-2)."""
    return sorted(kind for kind, reason in conditions if kind in BLIND and reason != EXPLAINED)
POLICY_EVENTS: Final = ("POLICY_RECOMMENDED", "POLICY_ACTED", "POLICY_HALTED")
DOMAIN_EVENTS: Final = ("DOMAIN_DEGRADED", "DOMAIN_RECOVERED")


def explain(view: wire.NodeView, health: NodeHealth, *, last_policy: wire.NodeEvent | None,
            last_uncordon: wire.NodeEvent | None, last_score: wire.NodeEvent | None, now: datetime,
            domain_events: Sequence[wire.NodeEvent] = ()) -> str:
    """One line: the mode or guardrail behind automation's latest decision on this node, with
    its numbers, or why there is nothing to decide. ``domain_events``: the latest DOMAIN_* event
    of each of the node's domains (DOM-3); a degraded one holds per-node automation, so it
    comes first. A domain's budget (DOM-2) is a POLICY_HALTED like any guardrail's."""
    held = next((e for e in domain_events if e.type == "DOMAIN_DEGRADED"), None)
    if held is not None:
        return (f"held with its domain: {held.message} (since {wire.rfc3339(held.occurred_at)}); per-node "
                "automation waits for DOMAIN_RECOVERED (DOM-3)")
    if view.score is None:
        return "not yet scored: automation acts on a node's score, and this node has none yet"
    blind = blinding((c.type, c.reason) for c in view.conditions)
    if blind:
        return (f"blind: {wire.condition_title(blind[0])}; automation takes no action on a node it cannot fully "
                "see (POL-3)")
    explained = next((c for c in view.conditions if c.reason == EXPLAINED), None)
    prefix = f"not blind: {explained.message} (XID-2); " if explained is not None else ""
    return prefix + _decision(view, health, last_policy=last_policy, last_uncordon=last_uncordon,
                              last_score=last_score, now=now)


def _decision(view: wire.NodeView, health: NodeHealth, *, last_policy: wire.NodeEvent | None,
              last_uncordon: wire.NodeEvent | None, last_score: wire.NodeEvent | None, now: datetime) -> str:
    assert view.score is not None
    if view.score >= health.cordon_below:
        return f"nothing to do: score {view.score} is not below cordonBelow {health.cordon_below} ({health.mode} mode)"
    action = "drain" if view.score < health.drain_below else "cordon"
    if health.mode == "observe":
        return f"observe mode: recommended {action} at {view.score} (mode observe recommends, never acts)"
    by_hand = sorted({h.actor for h in view.holds if h.actor not in AUTOMATION})
    if by_hand:
        return (f"taken out of service by hand by {', '.join(by_hand)}: automation leaves the node to them "
                "(POL-4)")
    if last_uncordon is not None and last_uncordon.actor not in AUTOMATION:
        until = last_uncordon.occurred_at + timedelta(minutes=health.cordon_suppression_minutes)
        if now < until:
            return (f"suppressed until {wire.rfc3339(until)} after a manual uncordon by {last_uncordon.actor} "
                    f"(cordonSuppressionMinutes {health.cordon_suppression_minutes})")
    # The policy's own conclusion of this episode (it says nothing again until the node
    # recovers or the conclusion changes): a guardrail with its numbers, or what it did.
    if last_policy is not None and last_policy.type == "POLICY_HALTED":
        return f"{last_policy.message} (since {wire.rfc3339(last_policy.occurred_at)})"
    if last_policy is not None and last_policy.type == "POLICY_ACTED":
        return f"automation acted: {last_policy.message} (at {wire.rfc3339(last_policy.occurred_at)})"
    if last_score is not None and last_score.previous_score is None:
        return f"first score: automation waits for a second reading of score {view.score} before it acts (POL-3)"
    return (f"waiting for the policy's decision on score {view.score} ({health.mode} mode, cordonBelow "
            f"{health.cordon_below})")
