"""The scorer as a Processor core: assessments and attributed failures in, SCORE_CHANGED out
only when the score moves (SCO-5)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from healthplane import subjects, wire
from healthplane.config import ConfigError, parse_cluster_config
from healthplane.runtime.processor import Emit, Inbound, Input, Reject
from healthplane_scorer.core import PenaltyTable, Tally, score

SERVICE = "scorer"
INPUTS = (
    Input("HP_ASSESSMENTS"),
    Input("HP_NODE_EVENTS", ("hp.event.*.*.JOB_FAILURE_ATTRIBUTED",)),
    Input("HP_CONFIG"),
)
OUTPUTS = ("HP_NODE_EVENTS",)


class ScorerConfig(msgspec.Struct, frozen=True):
    penalties: dict[str, int] = {}
    tally_penalty: int = 5
    half_life_hours: float = 168.0
    # A definition's table replaces the cluster's: built-in defaults + its own (SCO-2).
    definition_penalties: dict[str, dict[str, int]] = {}


class NodeScore(msgspec.Struct):
    cluster: str
    node_id: str
    conditions: list[wire.Condition] = []
    definition: str | None = None
    tally: Tally = msgspec.field(default_factory=Tally)
    score: int | None = None
    assessed: bool = False


class ScorerState(msgspec.Struct):
    nodes: dict[str, NodeScore] = {}
    config: ScorerConfig = ScorerConfig()


def table_for(config: ScorerConfig, definition: str | None) -> PenaltyTable:
    if definition is not None and definition in config.definition_penalties:
        return PenaltyTable.build(config.definition_penalties[definition], definition)
    return PenaltyTable.build(config.penalties, "cluster")


class ScorerCore:
    def initial_state(self) -> ScorerState:
        return ScorerState()

    def step(self, state: ScorerState, inbound: Inbound) -> tuple[ScorerState, Sequence[Emit]]:
        if inbound.stream == "HP_ASSESSMENTS":
            try:
                assessment = wire.decode(wire.Assessment, inbound.data)
            except wire.WireError as exc:
                raise Reject(str(exc)) from exc
            node = self._node(state, assessment.cluster, assessment.node_id)
            node.conditions, node.definition, node.assessed = assessment.conditions, assessment.definition, True
            return state, self._rescore(state, node, inbound)
        if inbound.stream == "HP_NODE_EVENTS":
            try:
                event = wire.decode(wire.NodeEvent, inbound.data)
            except wire.WireError as exc:
                raise Reject(str(exc)) from exc
            node = self._node(state, event.cluster, event.node_id)
            node.tally.count += 1
            node.tally.last_failure_at = event.occurred_at
            fault = event.fault_class or "UNKNOWN"
            node.tally.by_fault = {**node.tally.by_fault, fault: node.tally.by_fault.get(fault, 0) + 1}
            # An unscored node stays unscored: a score needs an assessment (SCO-4).
            return state, self._rescore(state, node, inbound) if node.assessed else []
        if inbound.stream == "HP_CONFIG":
            try:
                envelope = wire.decode(wire.ConfigEnvelope, inbound.data)
                config = parse_cluster_config(envelope.config, f"config version {envelope.version}")
            except (wire.WireError, ConfigError) as exc:
                raise Reject(str(exc)) from exc
            health = config.node_health
            state.config = ScorerConfig(
                penalties=dict(health.penalties), tally_penalty=health.failure_tally_penalty,
                half_life_hours=health.failure_tally_half_life_hours,
                definition_penalties={name: dict(d.node_health.penalties)
                                      for name, d in config.provisioner_definitions.items()
                                      if d.node_health.penalties is not None})
            return state, []
        raise Reject(f"unexpected input stream {inbound.stream}")

    @staticmethod
    def _node(state: ScorerState, cluster: str, node_id: str) -> NodeScore:
        key = f"{cluster}\x00{node_id}"
        node = state.nodes.get(key)
        if node is None:
            node = state.nodes[key] = NodeScore(cluster=cluster, node_id=node_id)
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


