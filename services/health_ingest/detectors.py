"""Custom failure detectors (POL-8, reference 003): named CEL expressions over the node
object, and Python plug-ins, that raise a condition through health-ingest's own path.

A detector's finding joins the report's built-in findings before the condition set is
diffed, so CONDITION_RAISED / CONDITION_CLEARED, the assessment, the score, policy, eviction
and webhooks see it like any other condition. It is a *state* finding: raised on every
report on which the expression holds, cleared on the first on which it does not.

Plug-ins are callables registered under the entry-point group ``healthplane.detectors``:
``detect(node: Mapping[str, Any]) -> Iterable[Detection]``. They must be pure functions of
the node object (health-ingest replays reports after a restart and must reach the same
conditions). One that raises is skipped for that report, logged and counted; it never stops
the report.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, Final

import msgspec

from healthplane.contracts import domains, wire
from healthplane.contracts.expressions import Bindings, compile_expression
from healthplane.runtime import heap

ENTRY_POINT_GROUP: Final = "healthplane.detectors"


class DetectorSpec(msgspec.Struct, frozen=True):
    """One ``nodeHealth.detectors`` entry, as health-ingest keeps it in its state."""

    name: str
    expression: str
    condition: str
    severity: str = "warning"
    message: str | None = None


class Detection(msgspec.Struct, frozen=True):
    """What a plug-in reports: a condition type of the vocabulary, a reason code, a severity."""

    condition: str
    reason: str
    severity: str
    message: str


Plugin = Callable[[Mapping[str, Any]], Iterable[Detection]]


class NodeFacts(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a detector may read from the node's latest resource report, kept compact (one per
    node in health-ingest's state)."""

    definition: str | None = None
    provisioned: bool = False
    cores: int = 0
    memory_bytes: int = 0
    gpus: int = 0
    annotations: dict[str, str] = msgspec.field(default_factory=heap.empty)  # none: shared, never changed
    # DOM-1: what the report tells of the node's domains (its NVLink domain, told annotations),
    # for correlated silence (silence.py); the config's rules add the rest.
    hardware_domains: dict[str, str] = msgspec.field(default_factory=heap.empty)

    @classmethod
    def of(cls, resources: wire.ResourceReport) -> NodeFacts:
        definition = sys.intern(resources.definition) if resources.definition else resources.definition
        return cls(definition, resources.provisioned, resources.cores, resources.memory_bytes,
                   sum(1 for d in resources.devices if d.kind == "gpu"), dict(resources.annotations) or heap.EMPTY,
                   domains.hardware_domains(resources) or heap.EMPTY)


def node_object(report: wire.HealthReport, facts: NodeFacts | None,
                conditions: Mapping[str, wire.Condition]) -> dict[str, Any]:
    """The ``node`` a detector reads: identity, labels/annotations, allocatable resources,
    the conditions the built-in rules found on this report, and the report's signals. The
    Kubernetes-style ``metadata`` keys are there too so reference 003's expressions run as is."""
    facts = facts or NodeFacts()
    labels = dict(facts.annotations)  # a copy: a plug-in that changed it must not change the state
    return {
        "id": report.node_id, "name": report.node_id, "cluster": report.cluster, "hostname": report.hostname,
        "definition": facts.definition, "provisioned": facts.provisioned,
        "labels": labels, "annotations": labels,
        "allocatable": {"cpu": facts.cores, "memory": facts.memory_bytes, "gpu": facts.gpus},
        "conditions": {kind: {"reason": c.reason, "severity": c.severity, "message": c.message}
                       for kind, c in conditions.items()},
        "signals": msgspec.to_builtins(report.signals),
        "metadata": {"name": report.node_id, "labels": labels, "annotations": labels},
    }


def evaluate(specs: Sequence[DetectorSpec], plugins: Sequence[tuple[str, Plugin]], node: Mapping[str, Any],
             on_error: Callable[[str, Exception], None] | None = None) -> list[Detection]:
    """Every detection for one report: the configured expressions first, then the plug-ins."""
    found: list[Detection] = []
    if specs:
        bindings = Bindings({"node": node})
        for spec in specs:
            if bindings.test(compile_expression(spec.expression, ["node"])):
                found.append(Detection(spec.condition, spec.name, spec.severity,
                                       spec.message or f"detector {spec.name} matched"))
    for name, plugin in plugins:
        try:
            found.extend(_checked(name, plugin(node)))
        except Exception as exc:  # a plug-in's bug never stops a report
            if on_error is not None:
                on_error(name, exc)
    return found


def _checked(name: str, detections: Iterable[Detection]) -> list[Detection]:
    out = []
    for detection in detections:
        if detection.condition not in wire.CONDITION_TYPES or detection.severity not in wire.SEVERITY_LEVEL:
            raise ValueError(f"detector {name} reported {detection.condition!r}/{detection.severity!r}: "
                             f"not a condition type and severity of the vocabulary")
        out.append(detection)
    return out


def load_plugins(on_error: Callable[[str, Exception], None] | None = None) -> list[tuple[str, Plugin]]:
    """Every installed ``healthplane.detectors`` entry point, loaded once at start."""
    loaded: list[tuple[str, Plugin]] = []
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded.append((entry.name, entry.load()))
        except Exception as exc:
            if on_error is not None:
                on_error(entry.name, exc)
    return loaded
