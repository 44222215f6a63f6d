"""The policy's rules (POL-1..POL-4, POL-6, POL-7, DOM-2, DOM-3) as a pure fold: no I/O, no clock.

``decide(state, record, now, origin)`` folds one input record and returns what the policy
concludes from it: node events (POLICY_RECOMMENDED / POLICY_ACTED / POLICY_HALTED, actor
``policy``) and commands for eviction (``cordon``, passive ``drain``, ``replace``; never
``uncordon``). ``origin`` names the input (stream and sequence) so every output gets an id
that is the same on every replay.

What the policy knows about a node comes from records other services own: its score
(SCORE_CHANGED, and the scorer's per-report view to re-check on every report), its conditions,
its holds (whoever placed them), its running allocations, its registration (definition,
provisioned) and the provisioner's answers. docs/policy.md explains each rule and the
decisions taken where the references are silent.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Final, Literal, cast

import msgspec

from healthplane.contracts import automation, wire
from healthplane.contracts.config import ClusterConfig, NodeHealth
from healthplane.contracts.subjects import domain_node_id, domain_of_node_id, node_key
from healthplane.runtime import heap
from healthplane_policy import breaker, domains, evidence, rulesets
from healthplane_policy.breaker import BreakerSettings, BreakerState
from healthplane_policy.domains import Domain, FaultSettings, LimitSettings
from healthplane_policy.rulesets import Applied, RuleExpressionSpec, RuleSetSpec

ACTOR = automation.POLICY
# Automation's own holds (healthplane.contracts.automation, which `node show` explains from): a node
# either took out of service is one "automation itself took out of service" (POL-4): in
# replace mode a fault-evicted provisioned instance is replaced, as reference 000 describes.
AUTOMATION = automation.AUTOMATION
REPLACEMENT_WINDOW = timedelta(hours=1)
RETRY_REPLACE_AFTER = timedelta(minutes=1)  # doubled per rejection, capped below
RETRY_REPLACE_CAP = timedelta(minutes=30)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Action = Literal["cordon", "drain", "replace", "taint", "label", "remediate"]
# The modes that take work off a node: a fault with a ladder is remediated there (REM-1).
REMEDIATING_MODES: Final = ("drain", "replace")
Output = wire.NodeEvent | wire.Command


# ---------------------------------------------------------------------------- config


class Settings(msgspec.Struct, frozen=True):
    """The nodeHealth fields the policy reads, for one definition (or the cluster)."""

    mode: wire.PolicyMode = "observe"
    cordon_below: int = 60
    drain_below: int = 45
    max_unavailable_percent: int = 20
    cordon_suppression_minutes: int = 30
    max_replacements_per_hour: int = 3


class PolicyConfig(msgspec.Struct, frozen=True):
    version: int = 0
    cluster: Settings = Settings()
    definitions: dict[str, Settings] = {}
    breaker: BreakerSettings = BreakerSettings()
    rule_sets: tuple[RuleSetSpec, ...] = ()
    ladders: tuple[str, ...] = ()  # condition types a remediation ladder is configured for (REM-1)
    domain_limits: dict[str, LimitSettings] = {}  # kind -> its budget (DOM-2)
    domain_faults: dict[str, FaultSettings] = {}  # kind -> its share-in-window rule (DOM-3)
    validates: bool = False  # a default suite is configured: job evidence is validated before a drain (JOB-3)

    def settings_for(self, definition: str | None) -> Settings:
        """A definition's setting replaces the cluster's (POL-1)."""
        if definition is not None:
            found = self.definitions.get(definition)
            if found is not None:
                return found
        return self.cluster


def _settings(health: NodeHealth) -> Settings:
    return Settings(mode=health.mode, cordon_below=health.cordon_below, drain_below=health.drain_below,
                    max_unavailable_percent=health.max_unavailable_percent,
                    cordon_suppression_minutes=health.cordon_suppression_minutes,
                    max_replacements_per_hour=health.max_replacements_per_hour)


def policy_config(config: ClusterConfig, version: int) -> PolicyConfig:
    """What the policy keeps of an applied cluster config."""
    health = config.node_health
    cb = health.circuit_breaker
    rule_sets = tuple(
        RuleSetSpec(name=r.name, order=i, priority=r.priority, enabled=r.enabled,
                    all=tuple(RuleExpressionSpec(e.kind, e.expression) for e in r.match.all),
                    any=tuple(RuleExpressionSpec(e.kind, e.expression) for e in r.match.any),
                    cordon=r.cordon.should_cordon,
                    taint_key=r.taint.key if r.taint else None, taint_value=r.taint.value if r.taint else "",
                    taint_effect=r.taint.effect if r.taint else "NoSchedule",
                    label_key=r.label.key if r.label else None, label_value=r.label.value if r.label else "")
        for i, r in enumerate(health.rule_sets))
    return PolicyConfig(
        version=version, cluster=_settings(health),
        definitions={name: _settings(config.node_health_for(name)) for name in config.provisioner_definitions},
        breaker=BreakerSettings(enabled=cb.enabled, percentage=cb.percentage, max_nodes=cb.max_nodes,
                                max_cordoned_nodes=cb.max_cordoned_nodes,
                                max_cordoned_percentage=cb.max_cordoned_percentage,
                                duration_s=float(cb.duration_seconds)),
        rule_sets=rule_sets,
        ladders=tuple(sorted({ladder.fault_class.lower() for ladder in config.remediation.ladders})),
        domain_limits={limit.kind: LimitSettings(kind=limit.kind, max_unavailable=limit.max_unavailable,
                                                 max_unavailable_percent=limit.max_unavailable_percent)
                       for limit in health.domain_limits},
        domain_faults={rule.kind: FaultSettings(kind=rule.kind, share=rule.share, window_s=rule.window_seconds,
                                                min_members=rule.min_members,
                                                recover_after_s=rule.recover_after_seconds, action=rule.action)
                       for rule in health.domain_faults},
        validates=config.validation.default_suite is not None)


# ---------------------------------------------------------------------------- state


class ConditionFact(msgspec.Struct, frozen=True):
    reason: str
    severity: str
    message: str


class Session(msgspec.Struct):
    """A rule-set quarantine session: what matched (by scope: the condition it raised, or the
    score) and the labels and taints it owns. It ends when every scope has recovered."""

    scopes: list[str] = []
    labels: dict[str, Applied] = {}
    taints: dict[str, Applied] = {}
    dry_run: bool = False
    cordoned_by: str | None = None
    halted: dict[str, str] = {}  # rule set -> the guardrail that last blocked its cordon


class Node(msgspec.Struct):
    # Its dicts share heap.EMPTY while empty (most nodes, most of the time): a fold replaces
    # them, never changes them in place.
    cluster: str
    node_id: str
    hostname: str | None = None
    definition: str | None = None
    provisioned: bool = False
    ready: bool = True
    annotations: dict[str, str] = msgspec.field(default_factory=heap.empty)
    allocatable: dict[str, int] = msgspec.field(default_factory=heap.empty)
    score: int | None = None
    # Evaluation starts at a node's second scored report (POL-3): a score that replaced an
    # earlier one, or a second report the scorer viewed with a score.
    second_reading: bool = False
    scored_reports: int = 0
    last_report_at: datetime | None = None
    conditions: dict[str, ConditionFact] = msgspec.field(default_factory=heap.empty)
    holds: dict[str, wire.Hold] = msgspec.field(default_factory=heap.empty)
    running: dict[str, str] = msgspec.field(default_factory=heap.empty)  # allocation id -> its state (placed/started)
    pending: dict[str, str] = msgspec.field(default_factory=heap.empty)  # command id -> verb: cordon/drain sent, its hold not seen yet
    drained: bool = False  # automation drained it (sent or applied)
    suppressed_until: datetime | None = None
    replacing: str | None = None  # id of the replace command in flight
    replace_attempts: int = 0
    retry_replace_at: datetime | None = None
    last_rejection: str | None = None
    episode: str | None = None  # the conclusion last recorded (POL-2)
    issued: int = 0  # outputs so far: numbers this node's event and command ids
    labels: dict[str, str] = msgspec.field(default_factory=heap.empty)  # applied by rule sets (not in dry run)
    taints: dict[str, str] = msgspec.field(default_factory=heap.empty)  # "key=value" -> effect, applied by rule sets
    session: Session | None = None
    domains: dict[str, str] = msgspec.field(default_factory=heap.empty)  # DOM-1, from the scorer's view
    failing_since: datetime | None = None  # DOM-3: silent or degraded since


class Pool(msgspec.Struct):
    """One provisioner definition's nodes in one cluster (``maxUnavailablePercent``,
    ``maxReplacementsPerHour`` are per definition)."""

    members: set[str] = set()
    unavailable: set[str] = set()  # out of service, whoever took them out
    replacing: set[str] = set()
    replaced_at: list[datetime] = []  # accepted replacements, oldest first


class PolicyState(msgspec.Struct):
    clock: datetime | None = None
    config: PolicyConfig = PolicyConfig()
    nodes: dict[str, Node] = {}
    gone: set[str] = set()  # replaced or deprovisioned: late records about them change nothing
    pools: dict[str, Pool] = {}
    breakers: dict[str, BreakerState] = {}
    fleet: dict[str, int] = {}  # cluster -> nodes
    automated: dict[str, set[str]] = {}  # cluster -> nodes automation holds out of service
    domains: dict[str, Domain] = {}  # domain key -> its members and episode (DOM-2, DOM-3)
    degraded: set[str] = set()  # domain keys with DOMAIN_DEGRADED in force


def pool_key(node: Node) -> str:
    return f"{node.cluster}\x00{node.definition or ''}"


def pool_name(node: Node) -> str:
    return node.definition or f"cluster {node.cluster} (no definition)"


# ---------------------------------------------------------------------------- indexes
# Counting unavailable nodes per definition and automation's nodes per cluster must not scan
# the fleet on every decision (a correlated fault decides for thousands of nodes at once), so
# the state keeps them as sets, updated around every change to a node's holds or definition.


def _out_of_service(node: Node) -> bool:
    return bool(node.holds) or bool(node.pending)


def _automation_holds(node: Node) -> bool:
    return bool(node.pending) or any(h.actor in AUTOMATION for h in node.holds.values())


def _unindex(state: PolicyState, node: Node) -> None:
    key = node_key(node.cluster, node.node_id)
    pool = state.pools.get(pool_key(node))
    if pool is not None:
        pool.members.discard(key)
        pool.unavailable.discard(key)
        pool.replacing.discard(key)
    state.automated.get(node.cluster, set()).discard(key)
    if node.domains:
        domains.leave(state.domains, node.cluster, key, node.domains)


def _index(state: PolicyState, node: Node) -> None:
    key = node_key(node.cluster, node.node_id)
    pool = state.pools.setdefault(pool_key(node), Pool())
    pool.members.add(key)
    if _out_of_service(node):
        pool.unavailable.add(key)
    if node.replacing is not None:
        pool.replacing.add(key)
    if _automation_holds(node):
        state.automated.setdefault(node.cluster, set()).add(key)
    if node.domains:
        domains.join(state.domains, node.cluster, key, node.domains, _facts(node))


def _facts(node: Node) -> domains.MemberFacts:
    """What a node's domains keep of it (DOM-2's budget, DOM-3's share)."""
    return domains.MemberFacts(out_of_service=_out_of_service(node), failing_since=node.failing_since,
                               silent="heartbeat_missed" in node.conditions)


# ---------------------------------------------------------------------------- the fold


class _Decision:
    """The outputs of one input, with ids derived from the input (same on every replay)."""

    def __init__(self, state: PolicyState, now: datetime, origin: str, act: bool) -> None:
        self.state, self.now, self.origin, self.act = state, now, origin, act
        self.out: list[Output] = []

    @staticmethod
    def _id(node: Node) -> str:
        # Numbered per node: the same decision always gets the same id, whichever input
        # happened to trigger it (a decision repeated after a crash is de-duplicated).
        node.issued += 1
        return f"{ACTOR}:{node.cluster}:{node.node_id}:{node.issued}"

    def event(self, node: Node, kind: wire.EventType, action: Action, message: str,
              command_id: str | None = None) -> None:
        mode = self.state.config.settings_for(node.definition).mode
        record = wire.NodeEvent(
            id=self._id(node), node_id=node.node_id, cluster=node.cluster, type=kind, occurred_at=self.now,
            message=message, actor=ACTOR, action=f"ACTION_{action.upper()}", score=node.score, policy_mode=mode,
            definition=node.definition, config_version=self.state.config.version or None, command_id=command_id)
        # The event goes before its command: in HP_NODE_EVENTS it then precedes the hold
        # eviction creates for the command, which is the order a replay folds them in.
        where = next((i for i, o in enumerate(self.out) if isinstance(o, wire.Command) and o.id == command_id),
                     len(self.out))
        self.out.insert(where, record)

    def domain_event(self, domain: Domain, kind: wire.EventType, message: str, record: wire.DomainRecord,
                     at: int | None = None) -> None:
        """A domain's own event (DOM-3), on its reserved node id, numbered per domain."""
        domain.issued += 1
        node_id = domain_node_id(domain.kind, domain.value)
        self.out.insert(len(self.out) if at is None else at, wire.NodeEvent(
            id=f"{ACTOR}:{domain.cluster}:{node_id}:{domain.issued}", node_id=node_id, cluster=domain.cluster,
            type=kind, occurred_at=self.now, message=message, actor=ACTOR,
            config_version=self.state.config.version or None, domain=record))

    def command(self, node: Node, verb: wire.CommandVerb, reason: str) -> str:
        command = wire.Command(id=self._id(node), node_id=node.node_id, cluster=node.cluster, verb=verb,
                               actor=ACTOR, issued_at=self.now, reason=reason, active=False)
        self.out.append(command)
        return command.id


Record = (wire.NodeEvent | wire.NodeView | wire.Allocation | wire.ResourceReport | wire.TerminationResult
          | wire.CommandOutcome | wire.PolicyCommand | PolicyConfig)


def decide(state: PolicyState, record: Record, now: datetime | None, origin: str,
           act: bool = True) -> tuple[PolicyState, list[Output]]:
    """Fold one record; return the new state and what the policy concluded from it. ``now`` is
    the time the record carries (None for records whose time decides nothing). ``act=False``
    folds the facts only: a restart refolding an input whose decisions are already in the
    streams, where the policy's own events (folded as inputs) say what was decided."""
    # One clock for every window: records carry their own times, and time never runs back.
    if now is not None and (state.clock is None or now > state.clock):
        state.clock = now
    decision = _Decision(state, state.clock or _EPOCH, origin, act)
    match record:
        case wire.NodeEvent():
            _on_event(decision, record)
        case wire.NodeView():
            _on_view(decision, record)
        case wire.Allocation():
            _on_allocation(decision, record)
        case wire.ResourceReport():
            _on_resources(decision, record)
        case wire.TerminationResult():
            _on_termination(decision, record)
        case wire.CommandOutcome():
            _on_outcome(decision, record)
        case wire.PolicyCommand():
            if record.action == "breaker-reset":
                breaker.reset(state.breakers.setdefault(record.cluster, BreakerState()), record.issued_at)
        case PolicyConfig():
            state.config = record
            rulesets.compile_all(record.rule_sets)
    # Not on the policy's own events: read back after a crash, they come before the facts that
    # followed them, and a recovery is decided on facts.
    own = isinstance(record, wire.NodeEvent) and record.actor == ACTOR and (
        record.type in POLICY_EVENT_TYPES or record.type in DOMAIN_EVENT_TYPES)
    if state.degraded and act and not own:
        _recoveries(decision)
    return state, decision.out


def _node(state: PolicyState, cluster: str, node_id: str, *, create: bool) -> Node | None:
    key = node_key(cluster, node_id)
    found = state.nodes.get(key)
    if found is None and create:
        state.gone.discard(key)
        found = state.nodes[key] = Node(cluster=sys.intern(cluster), node_id=node_id)  # one copy for the fleet
        state.fleet[cluster] = state.fleet.get(cluster, 0) + 1
        _index(state, found)
    return found


def _forget(state: PolicyState, node: Node) -> None:
    key = node_key(node.cluster, node.node_id)
    _unindex(state, node)
    del state.nodes[key]
    state.gone.add(key)
    state.fleet[node.cluster] = max(0, state.fleet.get(node.cluster, 1) - 1)


def _creates(state: PolicyState, cluster: str, node_id: str) -> bool:
    """Records that make a node part of the fleet, unless it is gone (a late record about a
    replaced instance must not bring it back)."""
    return node_key(cluster, node_id) not in state.gone


def _on_event(d: _Decision, event: wire.NodeEvent) -> None:
    state = d.state
    kind = event.type
    if kind in DOMAIN_EVENT_TYPES:
        if event.actor == ACTOR:
            _on_own_domain_event(state, event)
        return
    if kind == "NODE_REGISTERED":
        node = _node(state, event.cluster, event.node_id, create=True)
        assert node is not None
        _unindex(state, node)
        node.hostname = event.hostname or node.hostname
        node.definition = event.definition or node.definition
        node.provisioned = bool(event.provisioned) if event.provisioned is not None else node.provisioned
        _index(state, node)
        return
    creates = kind in ("SCORE_CHANGED", "CONDITION_RAISED") and _creates(state, event.cluster, event.node_id)
    node = _node(state, event.cluster, event.node_id, create=creates)
    if node is None:
        return
    if kind == "SCORE_CHANGED":
        node.score = event.score
        if event.previous_score is not None:
            node.second_reading = True
        _domain_facts(d, node)  # a domain fault holds its members before any is acted on alone
        _evaluate(d, node)
        _rule_sets(d, node, event)
    elif kind in ("CONDITION_RAISED", "CONDITION_CLEARED") and event.condition is not None:
        condition = event.condition
        if kind == "CONDITION_RAISED":
            node.conditions = {**node.conditions, condition.type: ConditionFact(
                condition.reason, condition.severity, condition.message)}
        else:
            node.conditions = {k: v for k, v in node.conditions.items() if k != condition.type}
        _domain_facts(d, node)
        _rule_sets(d, node, event)
    elif kind in POLICY_EVENT_TYPES and event.actor == ACTOR:
        _on_own_event(state, node, event)
    elif kind in ("HOLD_CREATED", "HOLD_RELEASED") and event.hold is not None:
        _on_hold(d, node, event, event.hold)
    elif kind == "NODE_UNCORDONED" and event.actor != ACTOR:
        _on_manual_uncordon(d, node, event)
    elif kind == "NODE_DRAINED" and event.actor == ACTOR:
        _evaluate(d, node)  # replace mode: the next step may be due now
    elif kind in ("NODE_REPLACED", "NODE_DEPROVISIONED"):
        if kind == "NODE_REPLACED" and event.actor == ACTOR:
            pool = state.pools.setdefault(pool_key(node), Pool())
            pool.replaced_at = [*_recent(pool.replaced_at, d.now), d.now]
        _forget(state, node)


POLICY_EVENT_TYPES = frozenset({"POLICY_RECOMMENDED", "POLICY_ACTED", "POLICY_HALTED"})
_VERB_OF_ACTION: dict[str, wire.CommandVerb] = {
    "ACTION_CORDON": "cordon", "ACTION_DRAIN": "drain", "ACTION_REPLACE": "replace",
    "ACTION_REMEDIATE": "remediate"}


def _number(output_id: str | None) -> int:
    tail = (output_id or "").rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


def _on_own_event(state: PolicyState, node: Node, event: wire.NodeEvent) -> None:
    """The policy's own event, read back. Decided live, it is already in the state (its number
    is not above the node's count); after a crash it is how a refold learns what was decided
    (the inputs behind it are refolded with ``act=False``)."""
    number = max(_number(event.id), _number(event.command_id))
    if number <= node.issued:
        return
    node.issued = number
    if not event.message.startswith("rule set"):
        node.episode = episode_key(event.type, event.action or "", event.message)
    if event.type == "POLICY_HALTED":
        _restore_trip(state, node.cluster, event)  # a trip holds until reset, its window long gone
    verb = _VERB_OF_ACTION.get(event.action or "")
    if event.command_id is None or verb is None:
        return
    _unindex(state, node)
    if verb == "replace":
        node.replacing = event.command_id
        node.replace_attempts += 1
    else:
        if not _automation_holds(node):
            breaker.record(state.breakers.setdefault(node.cluster, BreakerState()), node.node_id,
                           event.occurred_at)
        node.pending = {**node.pending, event.command_id: verb}
        node.drained = node.drained or verb in ("drain", "remediate")
    _index(state, node)


def _on_hold(d: _Decision, node: Node, event: wire.NodeEvent, hold: wire.Hold) -> None:
    state = d.state
    _unindex(state, node)
    if event.type == "HOLD_CREATED":
        node.holds = {**node.holds, hold.id: hold}
        if event.command_id is not None and event.command_id in node.pending:
            node.pending = {k: v for k, v in node.pending.items() if k != event.command_id}
    else:
        node.holds = {k: v for k, v in node.holds.items() if k != hold.id}
        if not any(h.actor == ACTOR for h in node.holds.values()) and not node.pending:
            node.drained = False  # automation no longer holds it: its drain is undone
        if hold.effect == "deprovision" and hold.actor == ACTOR and node.replacing is not None:
            node.replacing = None  # releasing the deprovision hold cancels the replacement
    _index(state, node)


def _on_manual_uncordon(d: _Decision, node: Node, event: wire.NodeEvent) -> None:
    """A human overruled the policy: leave the node alone for cordonSuppressionMinutes (POL-3),
    and count what follows as a new episode."""
    settings = d.state.config.settings_for(node.definition)
    node.suppressed_until = d.now + timedelta(minutes=settings.cordon_suppression_minutes)
    node.episode = None
    node.drained = False
    if node.session is not None:
        # The reference: a manual uncordon ends the tracking; applied labels and taints stay.
        node.session = None


def _on_view(d: _Decision, view: wire.NodeView) -> None:
    """The scorer's view after each report: a re-check with a score that belongs to that report,
    and the node's domains (DOM-1), whatever the view was written for."""
    state = d.state
    _view_domains(d, view)
    if view.score is None or view.last_reported_at is None:
        return
    node = _node(state, view.cluster, view.node_id, create=_creates(state, view.cluster, view.node_id))
    if node is None:
        return
    if node.last_report_at is not None and view.last_reported_at <= node.last_report_at:
        return  # a view for a hold or status change, not a new report
    node.last_report_at = view.last_reported_at
    node.scored_reports += 1
    if node.scored_reports >= 2:
        node.second_reading = True
    if node.definition is None and view.definition is not None:
        _unindex(state, node)
        node.definition = view.definition
        _index(state, node)
    if view.score == node.score:  # else its SCORE_CHANGED is still on the way: decide then
        _evaluate(d, node)


def _on_resources(d: _Decision, report: wire.ResourceReport) -> None:
    state = d.state
    node = _node(state, report.cluster, report.node_id, create=_creates(state, report.cluster, report.node_id))
    if node is None:
        return
    _unindex(state, node)
    node.hostname, node.ready = report.hostname, report.ready
    node.definition = report.definition or node.definition
    node.provisioned = report.provisioned
    node.annotations = dict(report.annotations) or heap.EMPTY
    node.allocatable = {"cpu": report.cores, "memory": report.memory_bytes,
                        "gpu": sum(1 for device in report.devices if device.kind == "gpu")}
    _index(state, node)


def _on_allocation(d: _Decision, allocation: wire.Allocation) -> None:
    # Created if need be: allocations and registrations arrive on different streams, in no
    # order relative to each other, and a drain must still know the work it waits on.
    node = _node(d.state, allocation.cluster, allocation.node_id,
                 create=_creates(d.state, allocation.cluster, allocation.node_id))
    if node is None:
        return
    if allocation.state in ("placed", "started"):
        node.running = {**node.running, allocation.id: allocation.state}
    elif allocation.id in node.running:
        node.running = {k: v for k, v in node.running.items() if k != allocation.id}
        if not node.running:
            _evaluate(d, node)  # replace mode waits for exactly this


def _on_termination(d: _Decision, result: wire.TerminationResult) -> None:
    node = _node(d.state, result.cluster, result.node_id, create=False)
    if node is None or node.replacing is None or result.accepted:
        return  # accepted: still in flight until NODE_REPLACED, which is what counts
    # A rejection spends nothing (POL-4): out of flight, tried again after a backoff.
    _unindex(d.state, node)
    node.replacing = None
    node.last_rejection = result.message
    backoff = min(RETRY_REPLACE_AFTER * 2 ** max(0, node.replace_attempts - 1), RETRY_REPLACE_CAP)
    node.retry_replace_at = d.now + backoff
    _index(d.state, node)


def _on_outcome(d: _Decision, outcome: wire.CommandOutcome) -> None:
    if not outcome.command_id.startswith(f"{ACTOR}:") or outcome.result == "applied":
        return
    node = _node(d.state, outcome.cluster, outcome.node_id, create=False)
    if node is None:
        return
    _unindex(d.state, node)
    verb = node.pending.get(outcome.command_id)
    node.pending = heap.without(node.pending, outcome.command_id)
    if verb == "drain" or (verb == "remediate" and not _automation_holds(node)):
        node.drained = False
    # A remediate refused while automation holds the node (EVI-5's fault eviction climbing its
    # ladder already, or a node stopped at NODE_NEEDS_ATTENTION) is eviction's in hand: asked
    # again at every score change it would only be refused again. It is asked anew once
    # automation's hold is gone (HOLD_RELEASED resets ``drained``).
    if node.replacing == outcome.command_id:
        node.replacing = None
        node.retry_replace_at = d.now + RETRY_REPLACE_AFTER
    _index(d.state, node)


def _recent(times: Iterable[datetime], now: datetime) -> list[datetime]:
    return [t for t in times if t > now - REPLACEMENT_WINDOW]


# ---------------------------------------------------------------------------- score policy


def _level(score: int, settings: Settings) -> int:
    if score < settings.drain_below:
        return 2
    if score < settings.cordon_below:
        return 1
    return 0


_EPISODE_TAGS = (("has a verdict (JOB-3)", "validating"), ("after a passed validation (JOB-3)", "attention"),
                 ("domainLimits", "domain"), ("maxUnavailablePercent", "ceiling"), ("circuit breaker", "breaker"), ("by hand", "manual"),
                 ("maxReplacementsPerHour", "budget"), ("before replacing", "waiting"),
                 ("replacing once drained", "waiting"), ("waiting for", "waiting"))
_ATTEMPT = re.compile(r"\(attempt (\d+);")


def episode_key(kind: str, action: str, message: str) -> str:
    """The conclusion an event records, read from the event itself (so that reading it back
    after a crash gives the same key): its type, its action and which guardrail or step it
    names; not the score, which moves inside an episode."""
    tag = next((name for marker, name in _EPISODE_TAGS if marker in message), "")
    if tag == "waiting":
        action = "ACTION_REPLACE"  # draining to replace and waiting to replace are one conclusion
    attempt = _ATTEMPT.search(message)
    if attempt is not None:
        tag = attempt.group(1)
    return f"{kind}:{action}:{tag}"


def _conclude(d: _Decision, node: Node, kind: wire.EventType, action: Action, message: str,
              command_id: str | None = None) -> None:
    """One event per conclusion (POL-2): a repeat of the conclusion in force says nothing,
    unless a command went with it (every command has its event)."""
    key = episode_key(kind, f"ACTION_{action.upper()}", message)
    if node.episode == key and command_id is None:
        return
    node.episode = key
    d.event(node, kind, action, message, command_id)


def _evaluate(d: _Decision, node: Node) -> None:
    state = d.state
    settings = state.config.settings_for(node.definition)
    if node.score is None or not node.second_reading:
        return
    if _held_by_domain(state, node) is not None:
        return  # DOM-3: its domain is one fault, decided as one (DOMAIN_DEGRADED says so, once)
    if automation.blinding((kind, fact.reason) for kind, fact in node.conditions.items()):
        return  # no action and no event while the node cannot be fully seen (POL-3, XID-2)
    level = _level(node.score, settings)
    if level == 0:
        node.episode = None  # recovered: the next degradation is a new episode
        return
    if not d.act:
        return  # refolding: what was decided here comes back as the policy's own events
    score = node.score
    action: Action = "drain" if level == 2 else "cordon"
    if settings.mode == "observe":
        _conclude(d, node, "POLICY_RECOMMENDED", action, f"{action}: score {score}")
        return
    if settings.mode == "cordon":
        action = "cordon"
    if not node.ready:
        return  # NOT_READY (maintenance, starting): not in service, nothing to take out
    wait = evidence.job_evidence_wait(((kind, fact.reason, fact.severity) for kind, fact in node.conditions.items()),
                                      state.config.validates)
    if wait is not None:
        # JOB-3: job outcomes alone take no node out before its validation's verdict, nor after a pass.
        if not any(h.actor not in AUTOMATION for h in node.holds.values()):
            _conclude(d, node, "POLICY_HALTED", action, evidence.halted_message(wait, action, score))
        return
    replacing = settings.mode == "replace" and level == 2 and node.provisioned
    if settings.mode in REMEDIATING_MODES and any(c in state.config.ladders for c in node.conditions):
        # REM-1: its fault has a ladder: eviction drains it and climbs the ladder, whose last
        # rung (replace or needs-attention) is the end; automation does not replace it besides.
        action, replacing = "remediate", False
    others = sorted({h.actor for h in node.holds.values() if h.actor not in AUTOMATION})
    if others:
        # Someone took the node out of service by hand: theirs to work on (POL-4).
        if replacing and node.replacing is None:
            _conclude(d, node, "POLICY_HALTED", "replace",
                      f"replace: score {score}; halted: {', '.join(others)} took the node out of service by hand, "
                      f"so automation will not terminate it")
        return
    if not _automation_holds(node):
        _take_out_of_service(d, node, settings, action, replacing)
        return
    if action in ("drain", "remediate") and not node.drained:
        node.drained = True
        verb: wire.CommandVerb = "remediate" if action == "remediate" else "drain"
        command_id = d.command(node, verb, _why(node, settings, action))
        message = f"{action}: score {score}" + (_waiting(node) if replacing else "")
        _conclude(d, node, "POLICY_ACTED", action, message, command_id)
        return
    if replacing and node.drained:
        _replace(d, node, settings)


def _waiting(node: Node) -> str:
    if node.running:
        return f"; waiting for {len(node.running)} allocation(s) to finish before replacing"
    return "; replacing once drained"


def _take_out_of_service(d: _Decision, node: Node, settings: Settings, action: Action, replacing: bool) -> None:
    state, now, score = d.state, d.now, node.score
    if node.suppressed_until is not None and now < node.suppressed_until:
        return  # an operator's uncordon wins for cordonSuppressionMinutes (POL-3)
    halt = _guardrail(d, node, settings)
    if halt is not None:
        _conclude(d, node, "POLICY_HALTED", action, f"{action}: score {score}; {halt[1]}")
        return
    verb: wire.CommandVerb = action if action in ("drain", "remediate") else "cordon"
    _unindex(state, node)
    command_id = d.command(node, verb, _why(node, settings, action))
    node.pending = {**node.pending, command_id: verb}
    node.drained = verb in ("drain", "remediate")
    _index(state, node)
    breaker.record(state.breakers.setdefault(node.cluster, BreakerState()), node.node_id, now)
    message = f"{action}: score {score}" + (_waiting(node) if replacing else "")
    _conclude(d, node, "POLICY_ACTED", action, message, command_id)


def _why(node: Node, settings: Settings, action: Action) -> str:
    if action == "remediate":
        return f"score {node.score}: {', '.join(sorted(node.conditions))}: remediation ladder"
    if action == "drain":
        return f"score {node.score} below drainBelow {settings.drain_below}"
    return f"score {node.score} below cordonBelow {settings.cordon_below}"


def _guardrail(d: _Decision, node: Node, settings: Settings) -> tuple[str, str] | None:
    """What blocks taking this node out of service, if anything: the budget of each of its
    domains (DOM-2), the unavailable ceiling of its definition (every cordon counts, whoever
    placed it, in both), then the circuit breaker. Any one that is full refuses, so the lowest
    binds."""
    state = d.state
    for kind, value in node.domains.items():  # DOM-2: a domain's budget beside the cluster's
        limit = state.config.domain_limits.get(kind)
        domain = state.domains.get(domains.domain_key(node.cluster, kind, value))
        why = domains.over_budget(limit, domain, node_key(node.cluster, node.node_id)) if limit and domain else None
        if why is not None:
            return "domain", why
    pool = state.pools.setdefault(pool_key(node), Pool())
    members, unavailable = len(pool.members), len(pool.unavailable)
    if (unavailable + 1) * 100 > settings.max_unavailable_percent * members:
        return "ceiling", (f"halted: {unavailable} of {members} nodes of {pool_name(node)} are out of service "
                           f"and one more would pass maxUnavailablePercent {settings.max_unavailable_percent}%")
    breaker_state = state.breakers.setdefault(node.cluster, BreakerState())
    verdict = breaker.admit(breaker_state, state.config.breaker, node_id=node.node_id,
                            fleet=state.fleet.get(node.cluster, 0),
                            standing=len(state.automated.get(node.cluster, ())), now=d.now)
    if not verdict.allowed:
        return "breaker", (f"halted: {_tripped(verdict.count, verdict.threshold)}; "
                           f"reset with `healthplane policy breaker reset --cluster {node.cluster}`")
    return None


# A trip in words (a POLICY_HALTED's message), and the same words read back after a crash
# (_restore_trip): one is the other's inverse, so they live together.
_TRIPPED = re.compile(r"circuit breaker TRIPPED \((\d+) automated cordon\(s\) against (?:(\w+) (\d+) node\(s\)|a bound)\)")


def _tripped(count: int, threshold: breaker.Threshold | None) -> str:
    bound = f"{threshold.bound} {threshold.nodes} node(s)" if threshold is not None else "a bound"
    return f"circuit breaker TRIPPED ({count} automated cordon(s) against {bound})"


def _restore_trip(state: PolicyState, cluster: str, event: wire.NodeEvent) -> None:
    found = _TRIPPED.search(event.message)
    if found is None:
        return
    count, bound, nodes = found.groups()
    threshold = breaker.Threshold(int(nodes), cast(breaker.Bound, bound)) if bound is not None else None
    breaker.restore_trip(state.breakers.setdefault(cluster, BreakerState()), threshold, int(count), event.occurred_at)


def _replace(d: _Decision, node: Node, settings: Settings) -> None:
    """POL-4: terminate a drained, provisioned node automation took out of service, once empty,
    within maxReplacementsPerHour of its definition."""
    state, now, score = d.state, d.now, node.score
    if node.replacing is not None:
        return
    if node.running:
        _conclude(d, node, "POLICY_ACTED", "replace",
                  f"replace: score {score}; waiting for {len(node.running)} allocation(s) to finish")
        return
    if node.retry_replace_at is not None and now < node.retry_replace_at:
        return
    pool = state.pools.setdefault(pool_key(node), Pool())
    pool.replaced_at = _recent(pool.replaced_at, now)
    used = len(pool.replaced_at) + len(pool.replacing)
    if used >= settings.max_replacements_per_hour:
        _conclude(d, node, "POLICY_HALTED", "replace",
                  f"replace: score {score}; halted: maxReplacementsPerHour {settings.max_replacements_per_hour} "
                  f"reached for {pool_name(node)} ({used} replacement(s) in the last hour)")
        return
    _unindex(state, node)
    node.replace_attempts += 1
    node.replacing = d.command(node, "replace", f"score {score} below drainBelow {settings.drain_below}")
    _index(state, node)
    message = f"replace: score {score}"
    if node.last_rejection is not None:
        message += f" (attempt {node.replace_attempts}; the provider rejected the last: {node.last_rejection})"
    _conclude(d, node, "POLICY_ACTED", "replace", message, node.replacing)


# ---------------------------------------------------------------------------- failure domains (DOM-2, DOM-3)
# The pure rules are healthplane_policy.domains; here they meet the nodes. A member is failing
# when it is silent (heartbeat missed), carries a critical condition, or scores below its
# cordonBelow (what automation would act on): a view's DEGRADED (a score at or below 95, one
# warning) is too little to call a whole rack down.

DOMAIN_EVENT_TYPES: Final = frozenset({"DOMAIN_DEGRADED", "DOMAIN_RECOVERED"})


def _failing(state: PolicyState, node: Node) -> bool:
    if "heartbeat_missed" in node.conditions or any(c.severity == "critical" for c in node.conditions.values()):
        return True
    return node.score is not None and node.score < state.config.settings_for(node.definition).cordon_below


def _held_by_domain(state: PolicyState, node: Node) -> Domain | None:
    """The degraded domain that holds per-node automation on ``node``, if any."""
    if not state.degraded:
        return None
    for kind, value in node.domains.items():
        key = domains.domain_key(node.cluster, kind, value)
        if key in state.degraded:
            return state.domains.get(key)
    return None


def _view_domains(d: _Decision, view: wire.NodeView) -> None:
    """DOM-1's domains, as the scorer resolved them into the node's view."""
    state = d.state
    node = state.nodes.get(node_key(view.cluster, view.node_id))
    if node is None and view.domains and view.score is not None:
        node = _node(state, view.cluster, view.node_id, create=_creates(state, view.cluster, view.node_id))
    if node is None or node.domains == view.domains:
        return
    _unindex(state, node)
    node.domains = {sys.intern(k): sys.intern(v) for k, v in view.domains.items()} or heap.EMPTY
    _index(state, node)
    _domain_facts(d, node)


def _domain_facts(d: _Decision, node: Node) -> None:
    """A node's facts changed: keep its domains' index current, and see whether one of them
    has just become one fault."""
    state = d.state
    failing = _failing(state, node)
    if failing != (node.failing_since is not None):
        node.failing_since = d.now if failing else None  # kept without domains: a view may add them
    if not node.domains:
        return
    domains.refresh(state.domains, node.cluster, node_key(node.cluster, node.node_id), node.domains, _facts(node))
    for kind, value in node.domains.items():
        settings = state.config.domain_faults.get(kind)
        key = domains.domain_key(node.cluster, kind, value)
        domain = state.domains.get(key)
        if settings is None or domain is None:
            continue
        domains.track(domain, settings, d.now)
        # Not on a refold: the policy's own DOMAIN_* events say what was decided.
        if failing and d.act and key not in state.degraded and domains.assess(domain, settings, d.now) == "degraded":
            _degrade(d, key, domain, settings)


def _domain_record(state: PolicyState, domain: Domain, settings: FaultSettings,
                   drained: list[str] | None = None) -> wire.DomainRecord:
    cap = wire.DOMAIN_MEMBERS_MAX
    members = sorted(k.partition("\x00")[2] for k in domain.members)
    failing = sorted(k.partition("\x00")[2] for k in domain.failing)
    conditions = domains.shared_conditions(
        state.nodes[k].conditions.keys() for k in domain.failing if k in state.nodes)
    return wire.DomainRecord(
        kind=domain.kind, value=domain.value, members=members[:cap], member_count=len(members),
        failing=failing[:cap], failing_count=len(failing), silent_count=len(domain.silent),
        conditions=conditions, threshold=domains.threshold(settings, len(members)), share=settings.share,
        window_seconds=settings.window_s, action=settings.action, drained=(drained or [])[:cap])


def _degrade(d: _Decision, key: str, domain: Domain, settings: FaultSettings) -> None:
    """DOM-3: one DOMAIN_DEGRADED for the domain; its members' per-node automation is held from
    now on; with ``action: drain`` every member automation may take out goes at once."""
    state = d.state
    domain.degraded_since = d.now
    state.degraded.add(key)
    failing, members = len(domain.failing), len(domain.members)
    window = _duration(settings.window_s)
    message = (f"domain {domain.name}: {failing} of {members} members silent or degraded within {window} "
               f"(domainFaults {domain.kind}: share {settings.share}% = {domains.threshold(settings, members)}, "
               f"{len(domain.silent)} silent); per-node automation on its members is held")
    drained: list[str] = []
    first = len(d.out)
    if settings.action == "drain":
        drained = _drain_domain(d, domain)
        message += f"; draining the domain: {len(drained)} member(s) drained passively at once"
    else:
        message += "; needs attention: a person decides what to do with the domain"
    # The domain's event before its members' drains: it is what their events refer to.
    d.domain_event(domain, "DOMAIN_DEGRADED", message, _domain_record(state, domain, settings, drained), at=first)


def _drain_domain(d: _Decision, domain: Domain) -> list[str]:
    """Every member automation may take out, at once: a passive drain (a cordon in cordon mode;
    nothing in observe mode), each with its POLICY_ACTED so a restart knows it was sent.
    Members taken out by hand stay theirs; NOT_READY members are not in service."""
    state = d.state
    sent: list[str] = []
    for key in sorted(domain.members):
        node = state.nodes.get(key)
        if node is None or not node.ready:
            continue
        mode = state.config.settings_for(node.definition).mode
        if mode == "observe" or any(h.actor not in AUTOMATION for h in node.holds.values()):
            continue
        verb: Literal["cordon", "drain"] = "cordon" if mode == "cordon" else "drain"
        held = _automation_holds(node)
        if held and (verb == "cordon" or node.drained):
            continue
        _unindex(state, node)
        command_id = d.command(node, verb, f"domain {domain.name} degraded (DOM-3)")
        node.pending = {**node.pending, command_id: verb}
        node.drained = node.drained or verb == "drain"
        _index(state, node)
        if not held:
            breaker.record(state.breakers.setdefault(node.cluster, BreakerState()), node.node_id, d.now)
        _conclude(d, node, "POLICY_ACTED", verb, f"{verb}: domain {domain.name} degraded", command_id)
        sent.append(node.node_id)
    return sent


def _recoveries(d: _Decision) -> None:
    """Degraded domains whose failing share has stayed below the threshold for recoverAfter
    (or whose rule is no longer configured): DOMAIN_RECOVERED; per-node automation resumes."""
    state = d.state
    for key in sorted(state.degraded):
        domain = state.domains.get(key)
        settings = state.config.domain_faults.get(domain.kind) if domain is not None else None
        if domain is None:
            state.degraded.discard(key)
            continue
        if settings is not None and domains.assess(domain, settings, d.now) != "recovered":
            continue
        settings = settings or FaultSettings(kind=domain.kind)
        failing, members = len(domain.failing), len(domain.members)
        why = (f"{failing} of {members} members silent or degraded, below {domains.threshold(settings, members)} "
               f"for {_duration(settings.recover_after_s)}"
               if domain.kind in state.config.domain_faults else "no domainFaults rule for its kind any more")
        domain.degraded_since = None
        state.degraded.discard(key)
        d.domain_event(domain, "DOMAIN_RECOVERED",
                       f"domain {domain.name} recovered: {why}; per-node automation on its members resumes "
                       f"(what automation took out stays out until uncordoned)",
                       _domain_record(state, domain, settings))


def _on_own_domain_event(state: PolicyState, event: wire.NodeEvent) -> None:
    """The policy's own DOMAIN_* event, read back: decided live it is already in the state;
    after a crash it restores the episode and the domain's event numbering."""
    named = domain_of_node_id(event.node_id)
    if named is None:
        return
    kind, value = named
    key = domains.domain_key(event.cluster, kind, value)
    domain = state.domains.get(key)
    if domain is None:
        domain = state.domains[key] = Domain(cluster=sys.intern(event.cluster), kind=kind, value=value)
    number = _number(event.id)
    if number <= domain.issued:
        return
    domain.issued = number
    if event.type == "DOMAIN_DEGRADED":
        domain.degraded_since = event.occurred_at
        state.degraded.add(key)
        # A refold takes the views (which carry the domains) and the node events from two
        # streams in no fixed order: the event's members hold them even before their views.
        for member in event.domain.members if event.domain is not None else ():
            node = _node(state, event.cluster, member, create=_creates(state, event.cluster, member))
            if node is not None and kind not in node.domains:
                _unindex(state, node)
                node.domains = {**node.domains, kind: value}
                _index(state, node)
        settings = state.config.domain_faults.get(kind)
        if settings is not None:
            domains.track(domain, settings, event.occurred_at)
    else:
        domain.degraded_since = None
        state.degraded.discard(key)


def _duration(seconds: float) -> str:
    whole = int(seconds)
    for unit, size in (("h", 3600), ("m", 60)):
        if whole >= size and whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


# ---------------------------------------------------------------------------- rule sets


def node_object(node: Node) -> dict[str, object]:
    return rulesets.node_object(
        node_id=node.node_id, cluster=node.cluster, hostname=node.hostname, definition=node.definition,
        provisioned=node.provisioned, ready=node.ready, labels=node.labels, annotations=node.annotations,
        taints=[{"key": k.partition("=")[0], "value": k.partition("=")[2], "effect": e} for k, e in node.taints.items()],
        allocatable=node.allocatable,
        conditions={t: {"type": t, "reason": c.reason, "severity": c.severity, "message": c.message}
                    for t, c in node.conditions.items()},
        score=node.score, holds=list(node.holds.values()))


def _rule_sets(d: _Decision, node: Node, event: wire.NodeEvent) -> None:
    rule_sets = d.state.config.rule_sets
    if not rule_sets or not d.act:
        return
    if event.type in rulesets.RECOVERY_EVENT_TYPES:
        _recovered(d, node, rulesets.scope_of(event))
        return
    if event.type not in rulesets.HEALTH_EVENT_TYPES:
        return
    matched = rulesets.matching(rule_sets, rulesets.event_object(event), node_object(node))
    if not matched:
        if event.type == "SCORE_CHANGED":
            _recovered(d, node, "score")
        return
    settings = d.state.config.settings_for(node.definition)
    dry_run = settings.mode == "observe"
    session = node.session if node.session is not None else Session(dry_run=dry_run)
    node.session = session
    scope = rulesets.scope_of(event)
    if scope not in session.scopes:
        session.scopes = [*session.scopes, scope]
    kind: wire.EventType = "POLICY_RECOMMENDED" if session.dry_run else "POLICY_ACTED"
    for rule_set in matched:
        if rule_set.label_key is not None:
            current = session.labels.get(rule_set.label_key)
            label = rulesets.resolve_label(current, rule_set)
            if label is not None:
                session.labels = {**session.labels, rule_set.label_key: label}
                if current is None or current.value != label.value:
                    if not session.dry_run:
                        node.labels = {**node.labels, rule_set.label_key: label.value}
                    d.event(node, kind, "label", f"rule set {rule_set.name}: label {rule_set.label_key}={label.value}")
        if rule_set.taint_key is not None:
            taint = rulesets.taint_id(rule_set)
            current = session.taints.get(taint)
            effect = rulesets.resolve_taint(current, rule_set)
            if effect is not None:
                session.taints = {**session.taints, taint: effect}
                if current is None or current.value != effect.value:
                    if not session.dry_run:
                        node.taints = {**node.taints, taint: effect.value}
                    d.event(node, kind, "taint", f"rule set {rule_set.name}: taint {taint}:{effect.value}")
        if rule_set.cordon:
            _rule_cordon(d, node, session, rule_set, settings)


def _rule_cordon(d: _Decision, node: Node, session: Session, rule_set: RuleSetSpec, settings: Settings) -> None:
    if session.cordoned_by is not None or _out_of_service(node):
        return  # already out of service: one cordon per session
    if _held_by_domain(d.state, node) is not None:
        return  # DOM-3: held with its degraded domain
    message = f"rule set {rule_set.name}: cordon"
    if session.dry_run:
        session.cordoned_by = rule_set.name
        d.event(node, "POLICY_RECOMMENDED", "cordon", message)
        return
    if node.suppressed_until is not None and d.now < node.suppressed_until:
        return
    halt = _guardrail(d, node, settings)
    if halt is not None:
        guardrail, why = halt
        if session.halted.get(rule_set.name) != guardrail:
            session.halted = {**session.halted, rule_set.name: guardrail}
            d.event(node, "POLICY_HALTED", "cordon", f"{message}; {why}")
        return
    _unindex(d.state, node)
    command_id = d.command(node, "cordon", f"rule set {rule_set.name}")
    node.pending = {**node.pending, command_id: "cordon"}
    _index(d.state, node)
    breaker.record(d.state.breakers.setdefault(node.cluster, BreakerState()), node.node_id, d.now)
    session.cordoned_by = rule_set.name
    d.event(node, "POLICY_ACTED", "cordon", message, command_id)


def _recovered(d: _Decision, node: Node, scope: str) -> None:
    """A tracked fault recovered; when the last one has, the session's labels and taints go
    (its cordon stays: automation never uncordons)."""
    session = node.session
    if session is None or scope not in session.scopes:
        return
    session.scopes = [s for s in session.scopes if s != scope]
    if session.scopes:
        return
    node.session = None
    removed = [f"label {k}" for k in session.labels] + [f"taint {t}" for t in session.taints]
    if not session.dry_run:
        node.labels = {k: v for k, v in node.labels.items() if k not in session.labels}
        node.taints = {k: v for k, v in node.taints.items() if k not in session.taints}
    if removed:
        kind: wire.EventType = "POLICY_RECOMMENDED" if session.dry_run else "POLICY_ACTED"
        action: Action = "label" if session.labels else "taint"
        d.event(node, kind, action, f"rule sets: every tracked fault recovered; removed {', '.join(removed)}")
