"""The scorer's fold: the Processor core (assessments and attributed failures in, SCORE_CHANGED
out only when the score moves, SCO-5)."""

from __future__ import annotations

import sys
import zlib
from datetime import datetime
from typing import Final

import msgspec

from healthplane.contracts import domains, subjects, views, wire
from healthplane.contracts.config import ClusterConfig, decode_config
from healthplane.runtime import heap
from healthplane.runtime.fold import (
    Emit,
    Inbound,
    Input,
    Reject,
    Step,
    decoder,
    node_record,
    record_of,
)
from healthplane_scorer.rules import PenaltyTable, Tally, score

SERVICE = "scorer"
INPUTS = (
    Input("HP_ASSESSMENTS"),
    Input("HP_NODE_EVENTS", tuple(f"hp.event.*.*.{t}" for t in (
        "JOB_FAILURE_ATTRIBUTED", "HOLD_CREATED", "HOLD_RELEASED", "NODE_REGISTERED", "NODE_DEPROVISIONED",
        "NODE_REPLACED", "NODE_NEEDS_ATTENTION", "NODE_SERVICED"))),
    Input("HP_RESOURCES"),
    Input("HP_ALLOCATIONS", ("hp.alloc.>",)),
    Input("HP_CONFIG"),
)
OUTPUTS = ("HP_NODE_EVENTS", "HP_NODES")
CODECS: Final = {"HP_ASSESSMENTS": node_record(wire.Assessment), "HP_NODE_EVENTS": node_record(wire.NodeEvent),
                 "HP_RESOURCES": node_record(wire.ResourceReport), "HP_ALLOCATIONS": node_record(wire.Allocation),
                 "HP_CONFIG": decoder(wire.ConfigEnvelope)}


class ScorerConfig(msgspec.Struct, frozen=True):
    degraded_at_or_below: int = 95
    penalties: dict[str, int] = {}
    tally_penalty: int = 5
    half_life_hours: float = 168.0
    # A definition's table replaces the cluster's: built-in defaults + its own (SCO-2).
    definition_penalties: dict[str, dict[str, int]] = {}
    # DOM-1: the config's domains section, and a digest of it that each node's resolved
    # domains are checked against (a new config re-resolves a node at its next view).
    domain_spec: domains.Spec = domains.Spec()
    domains_digest: int = 0


class NodeScore(msgspec.Struct):
    cluster: str
    node_id: str
    # Tuples and heap.EMPTY: a node without conditions, holds or allocations holds nothing
    # for them (the empty tuple is one object); all are replaced, never changed in place.
    conditions: tuple[wire.Condition, ...] = ()
    definition: str | None = None
    tally: Tally = msgspec.field(default_factory=Tally)
    score: int | None = None
    assessed: bool = False
    # The node read model (SPEC.md "Node status"): folded here, published on hp.node.
    hostname: str | None = None
    ready: bool = True
    holds: dict[str, wire.Hold] = msgspec.field(default_factory=heap.empty)
    health: str = "UNKNOWN"
    last_report_at: datetime | None = None
    report_interval_s: int | None = None
    allocations: tuple[str, ...] = ()  # placed or started here: the view's job count
    view_digest: int = 0  # of the last view written, less its lastReportedAt
    view_reported_at: datetime | None = None  # the lastReportedAt of the last view written
    reports: int = 0  # assessments of a newer report folded: the refresh's phase
    attention: wire.NeedsAttention | None = None  # NODE_NEEDS_ATTENTION until NODE_SERVICED (REM-1)
    # DOM-1: what the latest resource report's hardware tells (domains.hardware_domains), the
    # domains resolved from it and the config, and the config digest they were resolved with
    # (-1: resolve again).
    hardware_domains: dict[str, str] = msgspec.field(default_factory=heap.empty)
    domains: dict[str, str] = msgspec.field(default_factory=heap.empty)
    domains_digest: int = -1


class ScorerState(msgspec.Struct):
    nodes: dict[str, NodeScore] = {}
    # Decommissioned (NODE_DEPROVISIONED / NODE_REPLACED) -> when: late records about the
    # instance are ignored; only a resource report sent afterwards brings the id back.
    gone: dict[str, datetime] = {}
    config: ScorerConfig = ScorerConfig()


def table_for(config: ScorerConfig, definition: str | None) -> PenaltyTable:
    source = definition if definition is not None and definition in config.definition_penalties else None
    # Built once per config and definition, not twice per assessment: the table merges the
    # built-in defaults with the overrides, and it is the same for every node that shares them.
    cached = _TABLES.get((id(config), source))
    if cached is not None and cached[0] is config:
        return cached[1]
    if len(_TABLES) >= 256:  # configs come and go (config apply): keep the cache small
        _TABLES.clear()
    if source is not None:
        table = PenaltyTable.build(config.definition_penalties[source], source)
    else:
        table = PenaltyTable.build(config.penalties, "cluster")
    _TABLES[(id(config), source)] = (config, table)
    return table


_TABLES: dict[tuple[int, str | None], tuple[ScorerConfig, PenaltyTable]] = {}


class ScorerCore:
    def initial_state(self) -> ScorerState:
        return ScorerState()

    def step(self, state: ScorerState, inbound: Inbound) -> Step[ScorerState]:
        match record_of(CODECS, inbound):
            case wire.Assessment() as assessment:
                return self._on_assessment(state, assessment, inbound)
            case wire.NodeEvent() as event:
                return self._on_event(state, event, inbound)
            case wire.ResourceReport() as resources:
                return self._on_resources(state, resources, inbound)
            case wire.Allocation() as alloc:
                return self._on_allocation(state, alloc, inbound)
            case wire.ConfigEnvelope() as envelope:
                state.config = _config(decode_config(envelope))
                return Step(state)
        raise Reject(f"unexpected record on {inbound.stream}")

    def _on_assessment(self, state: ScorerState, assessment: wire.Assessment, inbound: Inbound) -> Step[ScorerState]:
        if subjects.node_key(assessment.cluster, assessment.node_id) in state.gone:
            return Step(state, [])
        node = self._node(state, assessment.cluster, assessment.node_id)
        node.conditions, node.assessed = tuple(assessment.conditions), True
        node.definition = assessment.definition or node.definition
        reported_at = assessment.last_report_at or assessment.assessed_at
        node.reports += reported_at != node.last_report_at
        node.health, node.last_report_at = assessment.health, reported_at
        node.report_interval_s = assessment.interval_seconds or node.report_interval_s
        return Step(state, self._rescore(state, node, inbound) + self._view(state, node, inbound))

    def _on_event(self, state: ScorerState, event: wire.NodeEvent, inbound: Inbound) -> Step[ScorerState]:
        key = subjects.node_key(event.cluster, event.node_id)
        if event.type in ("NODE_DEPROVISIONED", "NODE_REPLACED"):
            # Decommissioned: the node leaves the state, with it every node series, and its
            # view leaves HP_NODES ("its record is purged along with the instance").
            state.nodes.pop(key, None)
            state.gone = {**state.gone, key: event.occurred_at}
            return Step(state, [Emit(subjects.node_view(event.cluster, event.node_id), b"", purge_stream="HP_NODES")])
        if key in state.gone:
            return Step(state, [])
        node = self._node(state, event.cluster, event.node_id)
        if event.type in ("NODE_NEEDS_ATTENTION", "NODE_SERVICED"):
            node.attention = (wire.NeedsAttention(since=event.occurred_at, reason=event.message)
                              if event.type == "NODE_NEEDS_ATTENTION" else None)
            return Step(state, self._view(state, node, inbound))
        if event.type in ("HOLD_CREATED", "HOLD_RELEASED", "NODE_REGISTERED"):
            if event.type == "HOLD_CREATED" and event.hold is not None:
                node.holds = {**node.holds, event.hold.id: event.hold}
            elif event.type == "HOLD_RELEASED" and event.hold is not None:
                node.holds = heap.without(node.holds, event.hold.id)
            else:
                node.hostname = event.hostname or node.hostname
                node.definition = event.definition or node.definition
            return Step(state, self._view(state, node, inbound))
        node.tally.count += 1
        node.tally.last_failure_at = event.occurred_at
        fault = event.fault_class or "UNKNOWN"
        node.tally.by_fault = {**node.tally.by_fault, fault: node.tally.by_fault.get(fault, 0) + 1}
        # An unscored node stays unscored: a score needs an assessment (SCO-4).
        emits = self._rescore(state, node, inbound) if node.assessed else []
        return Step(state, emits + self._view(state, node, inbound))

    def _on_resources(self, state: ScorerState, resources: wire.ResourceReport, inbound: Inbound) -> Step[ScorerState]:
        key = subjects.node_key(resources.cluster, resources.node_id)
        if key in state.gone:
            if resources.sent_at <= state.gone[key]:
                return Step(state, [])
            state.gone = {k: v for k, v in state.gone.items() if k != key}  # a new instance, same id
        node = self._node(state, resources.cluster, resources.node_id)
        node.hostname, node.ready = resources.hostname, resources.ready
        node.definition = resources.definition or node.definition
        hardware = domains.hardware_domains(resources)
        if hardware != node.hardware_domains:
            node.hardware_domains, node.domains_digest = hardware or heap.EMPTY, -1
        return Step(state, self._view(state, node, inbound))

    def _on_allocation(self, state: ScorerState, alloc: wire.Allocation, inbound: Inbound) -> Step[ScorerState]:
        if subjects.node_key(alloc.cluster, alloc.node_id) in state.gone:
            return Step(state, [])
        node = self._node(state, alloc.cluster, alloc.node_id)
        running = alloc.state in ("placed", "started")
        if running == (alloc.id in node.allocations):
            return Step(state, [])
        node.allocations = ((*node.allocations, alloc.id) if running
                            else tuple(a for a in node.allocations if a != alloc.id))
        return Step(state, self._view(state, node, inbound))

    @staticmethod
    def _node(state: ScorerState, cluster: str, node_id: str) -> NodeScore:
        key = subjects.node_key(cluster, node_id)
        node = state.nodes.get(key)
        if node is None:
            node = state.nodes[key] = NodeScore(cluster=sys.intern(cluster), node_id=node_id)  # one copy for the fleet
        return node

    def _rescore(self, state: ScorerState, node: NodeScore, inbound: Inbound) -> list[Emit]:
        table = table_for(state.config, node.definition)
        new, contributions = score(node.conditions, node.tally, inbound.at, table,
                                   state.config.tally_penalty, state.config.half_life_hours)
        if new == node.score:
            return []
        previous, node.score = node.score, new
        return [Emit(subjects.event(node.cluster, node.node_id, "SCORE_CHANGED"), wire.encode(wire.NodeEvent(
            id=f"{SERVICE}:{inbound.stream}:{inbound.seq}:0", node_id=node.node_id, cluster=node.cluster,
            type="SCORE_CHANGED", occurred_at=inbound.at,
            message=f"score {previous} -> {new}" if previous is not None else f"score {new}",
            actor=SERVICE, score=new, previous_score=previous, contributions=contributions,
            penalties=table.source)))]



    def _view(self, state: ScorerState, node: NodeScore, inbound: Inbound) -> list[Emit]:
        """The node's folded view, appended when it changed; a newer report alone rewrites it
        only for a node policy watches, or when the refresh is due (views.VIEW_REFRESH_INTERVALS)."""
        view = node_view(state, node)
        reported_at = view.last_reported_at
        digest = zlib.crc32(wire.encode(msgspec.structs.replace(view, last_reported_at=None)))  # unlike hash(), stable
        if digest == node.view_digest and not (reported_at != node.view_reported_at and (
                _watched(node) or _refresh_due(node, reported_at))):
            return []
        node.view_digest, node.view_reported_at = digest, reported_at
        return [Emit(subjects.node_view(node.cluster, node.node_id), wire.encode(view))]


REFRESH_EVERY_REPORTS: Final = 3  # within views.VIEW_REFRESH_INTERVALS at a steady interval


def _watched(node: NodeScore) -> bool:
    """A node policy re-checks on every report (POL-3's second reading, its guardrails)."""
    return bool(node.conditions) or (node.score is not None and node.score < 100)


def _refresh_due(node: NodeScore, reported_at: datetime | None) -> bool:
    """Every third report, at a phase of the node's own: a fleet whose nodes all came up
    within one interval (a startup wave) would otherwise rewrite every view in the same
    interval, then none for two. The time bound holds when reports come irregularly."""
    if reported_at is None or node.view_reported_at is None:
        return True
    if (node.reports + zlib.crc32(node.node_id.encode())) % REFRESH_EVERY_REPORTS == 0:
        return True
    interval = node.report_interval_s or 30
    return (reported_at - node.view_reported_at).total_seconds() >= views.VIEW_REFRESH_INTERVALS * interval


def node_status(node: NodeScore) -> wire.NodeStatus:
    """SPEC.md precedence: OFFLINE while the heartbeat is missed, NOT_READY while the resource
    report says not ready, CORDONED while any hold exists, READY otherwise."""
    if any(c.type == "heartbeat_missed" for c in node.conditions):
        return "OFFLINE"
    if not node.ready:
        return "NOT_READY"
    if node.holds:
        return "CORDONED"
    return "READY"


def node_health(node: NodeScore, degraded_at_or_below: int) -> wire.Health:
    """ING-5 with the score: Unknown stays Unknown; a score at or below the threshold degrades."""
    if node.health == "HEALTHY" and node.score is not None and node.score <= degraded_at_or_below:
        return "DEGRADED"
    return node.health  # type: ignore[return-value]


def node_domains(config: ScorerConfig, node: NodeScore) -> dict[str, str]:
    """DOM-1: the node's domains, resolved once per config and per hardware change, then kept."""
    if node.domains_digest != config.domains_digest:
        resolver = domains.resolver_for(config.domain_spec)
        node.domains = resolver.resolve(node.node_id, node.hardware_domains) or heap.EMPTY
        node.domains_digest = config.domains_digest
    return node.domains


def node_view(state: ScorerState, node: NodeScore) -> wire.NodeView:
    table = table_for(state.config, node.definition)
    explanation = None
    if node.score is not None and node.last_report_at is not None:
        _, contributions = score(node.conditions, node.tally, node.last_report_at, table,
                                 state.config.tally_penalty, state.config.half_life_hours)
        explanation = wire.ScoreExplanation(penalties=table.source, contributions=contributions)
    return wire.NodeView(
        node_id=node.node_id, cluster=node.cluster, hostname=node.hostname, status=node_status(node),
        health=node_health(node, state.config.degraded_at_or_below), last_reported_at=node.last_report_at,
        score=node.score, score_explanation=explanation, conditions=list(node.conditions),
        attributed_failures=wire.AttributedFailures(count=node.tally.count, last=node.tally.last_failure_at,
                                                    by_fault=dict(node.tally.by_fault)),
        holds=sorted(node.holds.values(), key=lambda h: h.created_at), jobs=len(node.allocations),
        definition=node.definition, report_interval_seconds=node.report_interval_s,
        needs_attention=node.attention, domains=dict(node_domains(state.config, node)),
    )


def _config(config: ClusterConfig) -> ScorerConfig:
    health = config.node_health
    return ScorerConfig(
        degraded_at_or_below=health.degraded_at_or_below,
        penalties=dict(health.penalties), tally_penalty=health.failure_tally_penalty,
        half_life_hours=health.failure_tally_half_life_hours,
        definition_penalties={name: dict(d.node_health.penalties)
                              for name, d in config.provisioner_definitions.items()
                              if d.node_health.penalties is not None},
        domain_spec=(spec := config.domains.spec()), domains_digest=zlib.crc32(msgspec.json.encode(spec)))
