"""health-ingest's fold: the Processor core (which input means what, the records it emits).

Inputs: ``HP_REPORTS`` (every report), ``HP_NODE_EVENTS`` filtered to NODE_SERVICED (clears
sticky faults), VALIDATION_PASSED/FAILED (``validation_failed``, VAL-1) and this service's
own HEARTBEAT_MISSED (so that a replay rebuilds the "missed" flag the tick set),
SCHEDULER_DRAINED/UNDRAINED (``scheduler_drained``, JOB-4), ``HP_JOB_OUTCOMES``
(``job_failures_anomalous``, JOB-2: jobs.py) and ``HP_CONFIG``. Outputs: node events and one assessment per
report (and per state change that is not a report: service, missed heartbeat).

Pure: what the fold has to say (a detector plug-in failed, a node missed its heartbeat) is a
note on the input (``Inbound.note``), which the Processor logs and counts for live inputs
only; the heartbeat deadline index lives with the state, never on the core.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Final

from healthplane.contracts import promotion, subjects, wire
from healthplane.contracts.config import JobOutcomeTest, decode_config
from healthplane.contracts.subjects import node_key
from healthplane.runtime.fold import (
    Emit,
    Inbound,
    Input,
    Note,
    Reject,
    Step,
    decoder,
    node_record,
    note,
    record_of,
)
from healthplane_health_ingest import detectors, jobs
from healthplane_health_ingest.deadlines import Deadlines
from healthplane_health_ingest.rules import (
    COUNTERS_MAX,
    STICKY_MAX,
    Change,
    Detect,
    IngestConfig,
    IngestState,
    NodeState,
    SilenceWatch,
    assess,
    counters_capped,
    fault_observations,
    health,
    job_outcome,
    job_serviced,
    job_validation,
    miss_deadline,
    missed,
    observed_changes,
    promote,
    promote_now,
    promote_on_event,
    raised_occurrences,
    scheduler_word,
    serviced,
    sticky_capped,
    validated,
)
from healthplane_health_ingest.silence import Silence

SERVICE = "health-ingest"
INPUTS = (
    Input("HP_REPORTS"),
    Input("HP_NODE_EVENTS", tuple(f"hp.event.*.*.{t}" for t in (
        "NODE_SERVICED", "HEARTBEAT_MISSED", "NODE_DEPROVISIONED", "NODE_REPLACED",
        "VALIDATION_PASSED", "VALIDATION_FAILED", "SCHEDULER_DRAINED", "SCHEDULER_UNDRAINED",
        "REMEDIATION_STARTED", "REMEDIATION_SUCCEEDED"))),
    Input("HP_RESOURCES"),
    Input("HP_JOB_OUTCOMES"),
    Input("HP_CONFIG"),
)
OUTPUTS = ("HP_NODE_EVENTS", "HP_ASSESSMENTS")
CODECS: Final = {"HP_REPORTS": node_record(wire.HealthReport), "HP_NODE_EVENTS": node_record(wire.NodeEvent),
                 "HP_RESOURCES": node_record(wire.ResourceReport), "HP_CONFIG": decoder(wire.ConfigEnvelope),
                 "HP_JOB_OUTCOMES": node_record(wire.JobOutcome)}
# The note a failing plug-in leaves, one label value per plug-in of
# ``healthplane_fold_notes_total{note}``: main.py shows it as healthplane_detector_failures_total.
DETECTOR_FAILED: Final = "detector_failed:"
HEARTBEAT_MISSED: Final = "heartbeat_missed"
# SEC-11: a node's sticky faults reached rules.STICKY_MAX and one more was refused (noted once
# per occurrence: when the map, full, first refuses one).
STICKY_CAPPED: Final = "sticky_capped"
COUNTERS_CAPPED: Final = "counters_capped"

# What the fold derives from the state and keeps beside it (IngestState.__dict__), never
# encoded: rebuilt from the nodes on first use after a restart or a config change.
_DEADLINES: Final = "deadlines"  # ING-4's heartbeat deadlines (deadlines.py)
_SILENCE: Final = "silence"  # DOM-3's watched domains and overdue members (silence.py)
_SEEN: Final = "seen"  # the newest stored time of a report folded: correlated silence's clock


class IngestCore:
    def __init__(self, plugins: Sequence[tuple[str, detectors.Plugin]] | None = None) -> None:
        # Loaded once at start (main.py loads them itself, to log and count those that fail).
        self.plugins = list(plugins) if plugins is not None else detectors.load_plugins()

    def initial_state(self) -> IngestState:
        return IngestState()

    # ------------------------------------------------------------------ inputs

    def step(self, state: IngestState, inbound: Inbound) -> Step[IngestState]:
        match record_of(CODECS, inbound):
            case wire.HealthReport() as report:
                return self._on_report(state, report, inbound)
            case wire.NodeEvent() as event:
                return self._on_event(state, event, inbound)
            case wire.ResourceReport() as resources:
                return self._on_resources(state, resources)
            case wire.JobOutcome() as outcome:
                found, changes = job_outcome(state, outcome, inbound.at)
                if found is None or not changes:
                    return Step(state, [])
                return Step(state, self._records(found, changes, inbound, assessment=True))
            case wire.ConfigEnvelope() as envelope:
                return self._on_config(state, envelope)
        raise Reject(f"unexpected record on {inbound.stream}")

    def _on_report(self, state: IngestState, report: wire.HealthReport, inbound: Inbound) -> Step[IngestState]:
        gone_at = state.gone.get(node_key(report.cluster, report.node_id))
        if gone_at is not None:
            if report.sent_at <= gone_at:
                return Step(state, [])
            state.gone = {k: v for k, v in state.gone.items() if k != node_key(report.cluster, report.node_id)}
        notes: list[Note] = []
        detect = self._detect(state, notes) if state.config.detectors or self.plugins else None
        key = node_key(report.cluster, report.node_id)
        before = state.nodes.get(key)
        capped, counting_capped, new = sticky_capped(before), counters_capped(before), before is None
        if before is None:
            before = state.nodes[key] = NodeState(cluster=sys.intern(report.cluster), node_id=report.node_id)
        # RUL-1: the faults new in this report, read against the counters the last one left,
        # and the promotion rules they make fire (their findings join this report's).
        observed = fault_observations(before, report)
        promoted = (observed_changes(observed) + promote(state, before, [promotion.of_fault(f, inbound.at) for f in observed])
                    if observed else [])
        interval = before.interval_s
        node, changes = assess(state, report, inbound.at, inbound.seq, detect)
        if raised := raised_occurrences(state, changes, inbound.at):
            changes += promote_now(state, node, raised, inbound.at)
        changes = promoted + changes
        if node.sticky_refused and not capped:
            notes.append(note("warning", "sticky faults capped: the node's further sticky faults are not held",
                              counter=STICKY_CAPPED, node_id=report.node_id, cluster=report.cluster,
                              cap=STICKY_MAX, refused=node.sticky_refused))
        if node.counters_refused and not counting_capped and counters_capped(node):
            notes.append(note("warning", "counters capped: the node's further devices are not followed",
                              counter=COUNTERS_CAPPED, node_id=report.node_id, cluster=report.cluster,
                              cap=COUNTERS_MAX, refused=node.counters_refused))
        _reported(state, key, node, inbound.at, new, later=node.interval_s >= interval)
        return Step(state, self._records(node, changes, inbound, assessment=True), notes)

    def _on_event(self, state: IngestState, event: wire.NodeEvent, inbound: Inbound) -> Step[IngestState]:
        if event.type == "NODE_SERVICED":
            found, changes = serviced(state, event.cluster, event.node_id, inbound.at)
            job_node, job_changes = job_serviced(state, event.cluster, event.node_id, inbound.at)
            found, changes = found or job_node, changes + job_changes
            if found is None or not changes:
                return Step(state, [])
            return Step(state, self._records(found, changes, inbound, assessment=True))
        if event.type in ("VALIDATION_PASSED", "VALIDATION_FAILED"):
            found, changes = validated(state, event)
            job_node, job_changes = job_validation(state, event)
            found, changes = found or job_node, changes + job_changes
            if found is None or not changes:
                return Step(state, [])
            return Step(state, self._records(found, changes, inbound, assessment=True))
        if event.type in ("REMEDIATION_STARTED", "REMEDIATION_SUCCEEDED"):
            found, changes = promote_on_event(state, event)
            if found is None or not changes:
                return Step(state, [])
            return Step(state, self._records(found, changes, inbound, assessment=True))
        if event.type in ("SCHEDULER_DRAINED", "SCHEDULER_UNDRAINED"):
            found, changes = scheduler_word(state, event)
            if found is None:
                return Step(state, [])
            return Step(state, self._records(found, changes, inbound, assessment=True))
        if event.type in ("NODE_DEPROVISIONED", "NODE_REPLACED"):
            key = node_key(event.cluster, event.node_id)
            state.nodes.pop(key, None)  # its deadline in the index goes stale and is skipped
            if (silence := state.__dict__.get(_SILENCE)) is not None:
                silence.forget(key)
            jobs.forget(state.jobs, event.cluster, event.node_id)
            state.gone = {**state.gone, key: event.occurred_at}
            return Step(state, [])
        if event.type == "HEARTBEAT_MISSED":
            silent = state.nodes.get(node_key(event.cluster, event.node_id))
            if silent is not None and not silent.missed:
                missed(silent, event.occurred_at)  # replay: the tick decided this before
            # ING-4's warning, told once: when the tick's record comes back live, not in a replay.
            last = silent.last_report_at if silent is not None else None
            return Step(state, (), (note("warning", "node missed its heartbeat", counter=HEARTBEAT_MISSED,
                                         node_id=event.node_id, cluster=event.cluster,
                                         last_report_at=last.isoformat() if last else None),))
        return Step(state, [])

    @staticmethod
    def _on_resources(state: IngestState, resources: wire.ResourceReport) -> Step[IngestState]:
        key = node_key(resources.cluster, resources.node_id)
        facts = state.facts[key] = detectors.NodeFacts.of(resources)
        silence: Silence | None = state.__dict__.get(_SILENCE)
        if silence is not None and (node := state.nodes.get(key)) is not None:
            silence.place(key, node, facts)  # its domains may have changed (DOM-1)
            silence.reported(key, node)
        return Step(state, [])

    @staticmethod
    def _on_config(state: IngestState, envelope: wire.ConfigEnvelope) -> Step[IngestState]:
        config = decode_config(envelope)
        health_config = config.node_health
        state.config = IngestConfig(
            health_config.heartbeat_miss_threshold, health_config.quiet_reports_to_clear,
            tuple(health_config.ignore_read_only_mounts),
            tuple(detectors.DetectorSpec(d.name, d.expression, d.condition, d.severity, d.message)
                  for d in health_config.detectors),
            tuple(rule.compiled() for rule in config.promotion_rules),
            _job_test(health_config.job_outcomes),
            config.domains.spec(),
            tuple(SilenceWatch(rule.kind, rule.share, rule.min_members) for rule in health_config.domain_faults))
        for node in state.nodes.values():  # RUL-1: the windows of rules no longer configured go
            if node.windows is not None:
                promotion.forget(node.windows, state.config.promotion)
        state.config_version = envelope.version
        state.__dict__.pop(_DEADLINES, None)  # the threshold moves every deadline: rebuilt
        state.__dict__.pop(_SILENCE, None)  # and the domains may be others
        return Step(state, [])

    # ------------------------------------------------------------------ detectors (POL-8)

    def _detect(self, state: IngestState, notes: list[Note]) -> Detect:
        def failed(name: str, exc: Exception) -> None:
            notes.append(note("warning", "detector plug-in failed", counter=f"{DETECTOR_FAILED}{name}",
                              detector=name, error=f"{type(exc).__name__}: {exc}"))

        def detect(report: wire.HealthReport, found: Mapping[str, wire.Condition]) -> list[detectors.Detection]:
            node = detectors.node_object(report, state.facts.get(node_key(report.cluster, report.node_id)), found)
            return detectors.evaluate(state.config.detectors, self.plugins, node, failed)

        return detect

    # ------------------------------------------------------------------ time

    def tick(self, state: IngestState, now: datetime) -> Step[IngestState]:
        emits: list[Emit] = []
        seen: datetime | None = state.__dict__.get(_SEEN)
        if state.config.silence and seen is not None:  # DOM-3: a domain's members silent together
            for node, why in _silence(state).sweep(state.nodes, min(seen, now)):
                emits += self._missed(node, now, why)
        for _, node in _deadlines(state).due(now, state.nodes):  # ING-4
            if not node.missed:
                emits += self._missed(node, now)
        return Step(state, emits)

    def _missed(self, node: NodeState, now: datetime, why: str = "") -> list[Emit]:
        changes = missed(node, now, why)  # the warning is noted when this record is folded back
        # One miss per silence: the id is the node and the report it went silent after.
        stem = f"{SERVICE}:missed:{node.cluster}:{node.node_id}:{node.last_report_seq}"
        return self._emits(node, changes, now, stem, assessment=True)

    # ------------------------------------------------------------------ outputs

    def _records(self, node: NodeState, changes: list[Change], inbound: Inbound, *, assessment: bool) -> list[Emit]:
        if not inbound.wants_output:
            return []  # a restart refolding what is already in the streams
        stem = f"{SERVICE}:{inbound.stream}:{inbound.seq}"
        return self._emits(node, changes, inbound.at, stem, assessment=assessment, deterministic=False)

    def _emits(self, node: NodeState, changes: list[Change], now: datetime, stem: str, *,
               assessment: bool, deterministic: bool = True) -> list[Emit]:
        emits = []
        for index, change in enumerate(changes):
            event = wire.NodeEvent(id=f"{stem}:{index}", node_id=node.node_id, cluster=node.cluster,
                                   type=change.type,  # type: ignore[arg-type]
                                   occurred_at=now, message=change.message, actor=SERVICE, condition=change.condition,
                                   fault=change.fault, rule=change.rule)
            emits.append(Emit(subjects.event(node.cluster, node.node_id, change.type), wire.encode(event),
                              msg_id=event.id if deterministic else None))
        if assessment:
            node_health = health(node)
            record = wire.Assessment(node_id=node.node_id, cluster=node.cluster, assessed_at=now,
                                     report_sent_at=node.report_sent_at, health=node_health,
                                     conditions=sorted(node.conditions.values(), key=lambda c: c.type),
                                     definition=node.definition,
                                     real_fault=node_health == "DEGRADED",
                                     last_report_at=node.last_report_at, interval_seconds=node.interval_s)
            emits.append(Emit(subjects.assessment(node.cluster, node.node_id), wire.encode(record),
                              msg_id=f"{stem}:assessment" if deterministic else None))
        return emits


def _job_test(settings: JobOutcomeTest) -> jobs.JobTestConfig:
    return jobs.JobTestConfig(
        enabled=settings.enabled, false_alarm_rate=settings.false_alarm_rate, window_hours=settings.window_hours,
        min_runs=settings.min_runs, min_peer_runs=settings.min_peer_runs,
        black_hole_seconds=settings.black_hole_seconds, black_hole_min_failures=settings.black_hole_min_failures,
        user_failure_rate=settings.user_failure_rate, user_min_runs=settings.user_min_runs)


# ---------------------------------------------------------------------------- derived indexes


def _deadlines(state: IngestState) -> Deadlines:
    """ING-4's deadlines (deadlines.py), built from the nodes on first use."""
    found: Deadlines | None = state.__dict__.get(_DEADLINES)
    if found is None:
        threshold = state.config.heartbeat_miss_threshold
        found = state.__dict__[_DEADLINES] = Deadlines(lambda _, node: miss_deadline(node, threshold), state.nodes)
    return found


def _silence(state: IngestState) -> Silence:
    """DOM-3's correlated silence (silence.py), built from the nodes and facts on first use."""
    found: Silence | None = state.__dict__.get(_SILENCE)
    if found is None:
        found = state.__dict__[_SILENCE] = Silence(state)
    return found


def _reported(state: IngestState, key: str, node: NodeState, at: datetime, new: bool, later: bool) -> None:
    """A report folded: the node's deadlines move on (only ``later``, unless its interval
    shrank); the clock of reports seen moves to it."""
    if (deadlines := state.__dict__.get(_DEADLINES)) is not None:
        deadlines.schedule(key, node, later)  # not built yet: built from the nodes, this one included
    if (silence := state.__dict__.get(_SILENCE)) is not None:
        if new:
            silence.place(key, node, state.facts.get(key))
        silence.reported(key, node, later)
    seen = state.__dict__.get(_SEEN)
    if seen is None or at > seen:
        state.__dict__[_SEEN] = at
