"""Breakfix figures (issue 41.5): per cluster and fault class, how long from a fault to out of
service, to remediated, to back in service (MTTR), and the mean time between incidents per
node — folded from node events alone, so every reader (``healthplane breakfix``, the API)
gets the same answer from the same stored events.

An *incident* opens at a node's first critical ``CONDITION_RAISED`` of a real fault (not the
control plane's own blindness: heartbeat, telemetry, collector, the scheduler's word) while
none is open; its class is that condition. It is *out of service* at the first hold on the
node after that (``HOLD_CREATED``: a cordon, a drain, a remediation's), *remediated* at the
first ``REMEDIATION_SUCCEEDED`` or ``NODE_SERVICED``, and *back in service* when its last
hold is released (``HOLD_RELEASED``); it closes then. A fault that clears with the node never
taken out closes at its ``CONDITION_CLEARED`` and counts as an incident only. A node
deprovisioned or replaced closes it where it stands. *Between incidents* is the time from one
incident's opening to the next on the same node.

Bounded: per node its hold ids (a handful), the open incident and the last opening; per
cluster and class six sums. Pure: times come with the events.
"""

from __future__ import annotations

from typing import Final

import msgspec
from pydantic.alias_generators import to_camel

from healthplane.contracts import wire
from healthplane.contracts.subjects import node_key

# The control plane's own conditions: absence of evidence, or another's word, not a fault.
NOT_A_FAULT: Final = frozenset({"heartbeat_missed", "telemetry_stale", "collector_failed", "scheduler_drained"})
STAGES: Final = ("out_of_service", "remediated", "back_in_service", "between_incidents")
EVENT_TYPES: Final = ("CONDITION_RAISED", "CONDITION_CLEARED", "HOLD_CREATED", "HOLD_RELEASED",
                      "REMEDIATION_SUCCEEDED", "NODE_SERVICED", "NODE_DEPROVISIONED", "NODE_REPLACED")
WANTED: Final = frozenset(EVENT_TYPES)


class Incident(msgspec.Struct, omit_defaults=True):
    fault_class: str
    opened: float
    out: float | None = None
    remediated: float | None = None


class NodeTrack(msgspec.Struct, omit_defaults=True):
    cluster: str
    holds: list[str] = []
    incident: Incident | None = None
    last_opened: float | None = None


class Stage(msgspec.Struct, omit_defaults=True):
    count: int = 0
    seconds: float = 0.0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.seconds += max(0.0, seconds)

    @property
    def mean(self) -> float | None:
        return self.seconds / self.count if self.count else None


class Figures(msgspec.Struct):
    incidents: int = 0
    out_of_service: Stage = msgspec.field(default_factory=Stage)
    remediated: Stage = msgspec.field(default_factory=Stage)
    back_in_service: Stage = msgspec.field(default_factory=Stage)
    between_incidents: Stage = msgspec.field(default_factory=Stage)


class Breakfix(msgspec.Struct):
    nodes: dict[str, NodeTrack] = {}
    figures: dict[str, Figures] = {}  # "cluster\x00fault class"

    def of(self, cluster: str, fault_class: str) -> Figures:
        key = f"{cluster}\x00{fault_class}"
        found = self.figures.get(key)
        if found is None:
            found = self.figures[key] = Figures()
        return found

    def fold(self, event: wire.NodeEvent) -> None:
        """One node event (any type: those that say nothing here pass)."""
        kind, at = event.type, event.occurred_at.timestamp()
        key = node_key(event.cluster, event.node_id)
        track = self.nodes.get(key)
        if kind == "CONDITION_RAISED":
            condition = event.condition
            if condition is None or condition.severity != "critical" or condition.type in NOT_A_FAULT:
                return
            if track is None:
                track = self.nodes[key] = NodeTrack(event.cluster)
            if track.incident is not None:
                return  # one incident at a time: a second fault is part of it
            figures = self.of(event.cluster, condition.type)
            figures.incidents += 1
            if track.last_opened is not None:
                figures.between_incidents.add(at - track.last_opened)
            track.incident, track.last_opened = Incident(condition.type, at), at
            if track.holds:  # out of service already when the fault came (a cordon by hand)
                track.incident.out = at
                figures.out_of_service.add(0.0)
            return
        if track is None:
            if kind == "HOLD_CREATED" and event.hold is not None:
                self.nodes[key] = NodeTrack(event.cluster, holds=[event.hold.id])
            return
        incident = track.incident
        if kind == "HOLD_CREATED" and event.hold is not None:
            track.holds = [*track.holds, event.hold.id]
            if incident is not None and incident.out is None:
                incident.out = at
                self.of(track.cluster, incident.fault_class).out_of_service.add(at - incident.opened)
        elif kind == "HOLD_RELEASED" and event.hold is not None:
            track.holds = [h for h in track.holds if h != event.hold.id]
            if incident is not None and incident.out is not None and not track.holds:
                self.of(track.cluster, incident.fault_class).back_in_service.add(at - incident.opened)
                track.incident = None
        elif kind in ("REMEDIATION_SUCCEEDED", "NODE_SERVICED"):
            if incident is not None and incident.remediated is None:
                incident.remediated = at
                self.of(track.cluster, incident.fault_class).remediated.add(at - incident.opened)
        elif kind == "CONDITION_CLEARED":
            if incident is not None and incident.out is None and event.condition is not None \
                    and event.condition.type == incident.fault_class:
                track.incident = None  # cleared by itself, never taken out
        elif kind in ("NODE_DEPROVISIONED", "NODE_REPLACED"):
            del self.nodes[key]
        if track.incident is None and not track.holds and track.last_opened is None:
            self.nodes.pop(key, None)

    def report(self, cluster: str | None = None) -> list[dict[str, object]]:
        """Per cluster and fault class: incidents, and each stage's count and mean seconds."""
        rows = []
        for key, figures in sorted(self.figures.items()):
            row_cluster, fault_class = key.split("\x00", 1)
            if cluster is not None and row_cluster != cluster:
                continue
            row: dict[str, object] = {"cluster": row_cluster, "faultClass": fault_class, "incidents": figures.incidents}
            for stage in STAGES:
                found: Stage = getattr(figures, stage)
                row[to_camel(stage)] = {"count": found.count, "meanSeconds": None if found.mean is None
                                      else round(found.mean, 1)}
            rows.append(row)
        return rows
