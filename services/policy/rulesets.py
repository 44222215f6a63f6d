"""CEL rule sets (POL-7, reference 004): which rule sets match a health event on a node, and how
their labels and taints combine. Pure apart from the compiled-program cache.

A rule set matches when every ``all`` expression and at least one ``any`` expression (if there
are any) is true. ``HealthEvent`` expressions read ``event``, the node event exactly as the
stream holds it plus ``faultClass`` and ``isFatal``; ``Node`` expressions read ``node``, built
from the node's latest resource report, its active conditions, its holds and what rule sets
applied (see :func:`node_object`).

Conflicts, as in the reference: a label key is owned by the highest priority that set it in
the current quarantine session (a later, lower-priority match cannot downgrade it; at equal
priority the later rule set in configuration order wins); a taint is keyed by key and value,
and its effect is resolved the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import cel
import msgspec

from healthplane.contracts import wire
from healthplane.contracts.config import RULE_VARIABLES
from healthplane.contracts.expressions import Bindings, compile_expression

HEALTH_EVENT_TYPES = frozenset({"CONDITION_RAISED", "SCORE_CHANGED"})
RECOVERY_EVENT_TYPES = frozenset({"CONDITION_CLEARED"})


class RuleExpressionSpec(msgspec.Struct, frozen=True):
    kind: str
    expression: str


class RuleSetSpec(msgspec.Struct, frozen=True):
    name: str
    order: int  # position in the config: the tie-break at equal priority
    priority: int = 0
    enabled: bool = True
    all: tuple[RuleExpressionSpec, ...] = ()
    any: tuple[RuleExpressionSpec, ...] = ()
    cordon: bool = False
    taint_key: str | None = None
    taint_value: str = ""
    taint_effect: str = "NoSchedule"
    label_key: str | None = None
    label_value: str = ""


class Applied(msgspec.Struct, frozen=True):
    """A label value or a taint effect, with the rule set that owns it."""

    value: str
    rule_set: str
    priority: int
    order: int

    def yields_to(self, rule_set: RuleSetSpec) -> bool:
        return rule_set.priority > self.priority or (
            rule_set.priority == self.priority and rule_set.order >= self.order)


def scope_of(event: wire.NodeEvent) -> str:
    """What recovery ends a match: the condition it raised, or the score itself."""
    if event.condition is not None:
        return event.condition.type
    return "score"


def event_object(event: wire.NodeEvent) -> dict[str, Any]:
    body: dict[str, Any] = wire.to_builtins(event)
    if event.condition is not None:
        body["faultClass"] = event.condition.type.upper()
        body["isFatal"] = event.condition.severity == "critical"
    else:
        body["faultClass"], body["isFatal"] = None, False
    return body


def node_object(*, node_id: str, cluster: str, hostname: str | None, definition: str | None, provisioned: bool,
                ready: bool, labels: Mapping[str, str], annotations: Mapping[str, str],
                taints: Sequence[Mapping[str, str]], allocatable: Mapping[str, int],
                conditions: Mapping[str, Mapping[str, str]], score: int | None,
                holds: Sequence[wire.Hold]) -> dict[str, Any]:
    """The ``node`` a Node expression reads. ``metadata.labels``/``metadata.annotations`` are
    there too, so the reference's own expressions run unchanged."""
    return {
        "id": node_id, "name": node_id, "cluster": cluster, "hostname": hostname, "definition": definition,
        "provisioned": provisioned, "ready": ready, "score": score,
        "labels": dict(labels), "annotations": dict(annotations), "taints": [dict(t) for t in taints],
        "allocatable": dict(allocatable), "conditions": {k: dict(v) for k, v in conditions.items()},
        "cordoned": bool(holds), "holds": [{"id": h.id, "effect": h.effect, "actor": h.actor} for h in holds],
        "metadata": {"name": node_id, "labels": dict(labels), "annotations": dict(annotations)},
    }


# Compiled programs by (kind, expression): compiled and checked once per process, whatever
# the number of rule sets, snapshots or config versions that repeat the same text.
_programs: dict[tuple[str, str], cel.Program] = {}


def program(rule: RuleExpressionSpec) -> cel.Program:
    key = (rule.kind, rule.expression)
    found = _programs.get(key)
    if found is None:
        found = _programs[key] = compile_expression(rule.expression, [RULE_VARIABLES[rule.kind]])
    return found


def matches(rule_set: RuleSetSpec, bindings: Bindings) -> bool:
    if not rule_set.enabled:
        return False
    for rule in rule_set.all:
        if not bindings.test(program(rule)):
            return False
    if rule_set.any:
        return any(bindings.test(program(rule)) for rule in rule_set.any)
    return True


def matching(rule_sets: Sequence[RuleSetSpec], event: dict[str, Any], node: dict[str, Any]) -> list[RuleSetSpec]:
    """Every enabled rule set the event matches on this node, in configuration order."""
    if not rule_sets:
        return []
    bindings = Bindings({"event": event, "node": node})
    return [r for r in rule_sets if matches(r, bindings)]


def resolve_label(current: Applied | None, rule_set: RuleSetSpec) -> Applied | None:
    """The label the key should carry after ``rule_set`` matched, or None when it loses."""
    if rule_set.label_key is None:
        return None
    if current is not None and not current.yields_to(rule_set):
        return None
    return Applied(rule_set.label_value, rule_set.name, rule_set.priority, rule_set.order)


def resolve_taint(current: Applied | None, rule_set: RuleSetSpec) -> Applied | None:
    """The effect the taint ``key=value`` should have after ``rule_set`` matched, or None."""
    if rule_set.taint_key is None:
        return None
    if current is not None and not current.yields_to(rule_set):
        return None
    return Applied(rule_set.taint_effect, rule_set.name, rule_set.priority, rule_set.order)


def taint_id(rule_set: RuleSetSpec) -> str:
    return f"{rule_set.taint_key}={rule_set.taint_value}"


def compile_all(rule_sets: Sequence[RuleSetSpec]) -> None:
    """Compile every expression now (config time), so the first fault pays nothing."""
    for rule_set in rule_sets:
        for rule in (*rule_set.all, *rule_set.any):
            program(rule)
