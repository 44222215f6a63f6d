"""The reliability score: the reference's worked examples, and its invariants (SCO-1..SCO-5)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthplane.client import reads
from healthplane.contracts import subjects, wire
from healthplane.runtime import gzipped
from healthplane.runtime.fold import Inbound
from healthplane_scorer.fold import ScorerCore, node_view
from healthplane_scorer.rules import DEFAULT_PENALTIES, PenaltyTable, Tally, score, tally_deduction
from tests.support.records import subject_for

T0 = datetime(2026, 8, 11, 9, 14, 2, tzinfo=UTC)
CLUSTER = PenaltyTable.build()


def cond(condition_type: str, reason: str, severity: str = "warning") -> wire.Condition:
    return wire.Condition(type=condition_type, reason=reason, severity=severity, message="m",  # type: ignore[arg-type]
                          first_seen=T0)


def assessment(*conditions: wire.Condition, node: str = "gpu-14") -> bytes:
    return wire.encode(wire.Assessment(node_id=node, cluster="c", assessed_at=T0, report_sent_at=T0,
                                       health="DEGRADED" if conditions else "HEALTHY", conditions=list(conditions)))


def test_gpu_ecc_100_90_55() -> None:
    # Reference: correctable ECC -> "score 100 -> 90"; uncorrectable -> "score 90 -> 55".
    core, state = ScorerCore(), ScorerCore().initial_state()
    messages = []
    for seq, data in enumerate([assessment(),
                                assessment(cond("gpu_ecc_errors", "GpuEccCorrectable")),
                                assessment(cond("gpu_ecc_errors", "GpuEccUncorrectable", "critical")),
                                assessment(cond("gpu_ecc_errors", "GpuEccUncorrectable", "critical"))], 1):
        state, emits, _ = core.step(state, Inbound("HP_ASSESSMENTS", seq, subject_for("HP_ASSESSMENTS", data), data, {}, T0, True))
        messages += [wire.decode(wire.NodeEvent, e.payload).message for e in emits if ".event." in e.subject]
    assert messages == ["score 100", "score 100 -> 90", "score 90 -> 55"]  # and nothing on no change (SCO-5)


def test_smart_failing_60_back_to_100_one_report_after_recovery() -> None:
    core, state = ScorerCore(), ScorerCore().initial_state()
    scores = []
    for seq, data in enumerate([assessment(cond("disk_degraded", "SmartFailing", "critical")), assessment()], 1):
        state, emits, _ = core.step(state, Inbound("HP_ASSESSMENTS", seq, subject_for("HP_ASSESSMENTS", data), data, {}, T0, True))
        scores += [wire.decode(wire.NodeEvent, e.payload).score for e in emits if ".event." in e.subject]
    assert scores == [60, 100]


@pytest.mark.parametrize(("weeks", "deduction"), [(0, 15), (1, 7), (2, 4), (4, 1), (5, 0)])
def test_failure_tally_decays_from_the_latest_failure(weeks: int, deduction: int) -> None:
    # "15 points ... roughly 7 a week later, 4 the week after, rounds to nothing after about five weeks"
    tally = Tally(count=3, last_failure_at=T0)
    assert tally_deduction(tally, T0 + timedelta(weeks=weeks), 5, 168) == deduction


def test_a_new_failure_restores_the_whole_tally() -> None:
    tally = Tally(count=3, last_failure_at=T0)
    assert tally_deduction(tally, T0 + timedelta(weeks=3), 5, 168) == 2
    tally = Tally(count=4, last_failure_at=T0 + timedelta(weeks=3))
    assert tally_deduction(tally, T0 + timedelta(weeks=3), 5, 168) == 20


def test_node_show_example_55_with_its_contributions() -> None:
    # "Score: 55/100 (penalties: cluster)  -40 SmartFailing  -5 attributed job failures"
    value, contributions = score([cond("disk_degraded", "SmartFailing", "critical")],
                                 Tally(count=1, last_failure_at=T0), T0, CLUSTER, 5, 168)
    assert value == 55
    assert [(c.points, c.reason) for c in contributions] == [(-40, "SmartFailing"), (-5, "attributed job failures")]


def test_definition_table_replaces_the_clusters() -> None:
    from healthplane_scorer.fold import ScorerConfig, table_for

    config = ScorerConfig(penalties={"SmartFailing": 30}, definition_penalties={"gpu-pool": {"GpuXidHardware": 60}})
    assert table_for(config, None).points["SmartFailing"] == 30
    gpu = table_for(config, "gpu-pool")
    assert (gpu.source, gpu.points["SmartFailing"], gpu.points["GpuXidHardware"]) == ("gpu-pool", 40, 60)


def test_unscored_node_stays_unscored_until_assessed() -> None:
    # SCO-4: a failure attributed before any report does not invent a score.
    core, state = ScorerCore(), ScorerCore().initial_state()
    failure = wire.encode(wire.NodeEvent(id="f1", node_id="n", cluster="c", type="JOB_FAILURE_ATTRIBUTED",
                                         occurred_at=T0, message="m", actor="eviction", fault_class="DISK_DEGRADED"))
    state, emits, _ = core.step(state, Inbound("HP_NODE_EVENTS", 1, subject_for("HP_NODE_EVENTS", failure), failure, {}, T0, True))
    assert [e for e in emits if ".event." in e.subject] == [] and state.nodes["c\x00n"].score is None
    state, emits, _ = core.step(state, Inbound("HP_ASSESSMENTS", 2, subject_for("HP_ASSESSMENTS", assessment(node="n")), assessment(node="n"), {}, T0, True))
    assert wire.decode(wire.NodeEvent, emits[0].payload).score == 95
    view = wire.decode(wire.NodeView, emits[1].payload)
    # 95 is at the default degradedAtOrBelow: the node reads Degraded (ING-5).
    assert (view.score, view.health, view.attributed_failures.by_fault) == (95, "DEGRADED", {"DISK_DEGRADED": 1})


reasons = st.sampled_from(sorted(DEFAULT_PENALTIES))


@given(st.lists(st.tuples(st.sampled_from(["memory_errors", "disk_degraded", "gpu_xid_errors", "collector_failed"]),
                          reasons, st.sampled_from(["warning", "critical"])), max_size=8),
       st.integers(min_value=0, max_value=50), st.integers(min_value=0, max_value=2000))
def test_score_within_0_100_and_equal_to_its_contributions(conditions, failures: int, hours: int) -> None:  # type: ignore[no-untyped-def]
    # SCO-1, SCO-4: always 0..100, and 100 + the listed contributions unless clamped at 0.
    active = [cond(t, r, s) for t, r, s in conditions]
    value, contributions = score(active, Tally(count=failures, last_failure_at=T0), T0 + timedelta(hours=hours),
                                 CLUSTER, 5, 168)
    assert 0 <= value <= 100
    assert value == max(0, 100 + sum(c.points for c in contributions))
    assert all(c.points < 0 for c in contributions)


@pytest.mark.parametrize(("missed", "ready", "holds", "status"), [
    (True, False, True, "OFFLINE"), (False, False, True, "NOT_READY"), (False, True, True, "CORDONED"),
    (False, True, False, "READY")])
def test_status_precedence(missed: bool, ready: bool, holds: bool, status: str) -> None:
    # SPEC.md: OFFLINE, then NOT_READY, then CORDONED, else READY.
    from healthplane_scorer.fold import NodeScore, node_status

    node = NodeScore(cluster="c", node_id="n", ready=ready,
                     conditions=[cond("heartbeat_missed", "HeartbeatMissed")] if missed else [],
                     holds={"h1": wire.Hold(id="h1", effect="cordon", reason=None, actor="op", created_at=T0)} if holds else {})
    assert node_status(node) == status


def test_view_counts_the_allocations_running_on_the_node() -> None:
    """SPEC.md node shape: ``jobs`` is what runs on the node now (placed or started)."""
    core, state = ScorerCore(), ScorerCore().initial_state()

    def alloc(seq: int, alloc_id: str, alloc_state: str) -> int:
        nonlocal state
        record = wire.Allocation(id=alloc_id, job_id=alloc_id, node_id="n", cluster="c", state=alloc_state,  # type: ignore[arg-type]
                                 at=T0)
        state, emits, _ = core.step(state, Inbound("HP_ALLOCATIONS", seq, subject_for("HP_ALLOCATIONS", wire.encode(record)), wire.encode(record), {}, T0, True))
        views = [wire.decode(wire.NodeView, e.payload) for e in emits]
        return views[-1].jobs if views else -1

    assert alloc(1, "a", "placed") == 1
    assert alloc(2, "a", "started") == -1  # no change, no new view
    assert alloc(3, "b", "started") == 2
    assert alloc(4, "a", "requeued") == 1
    assert alloc(5, "b", "finished") == 0


def test_a_decommissioned_node_leaves_the_read_model_and_stays_gone() -> None:
    """NODE_DEPROVISIONED purges the node's view; late records about the instance are ignored,
    and only a resource report sent afterwards (a new instance, same id) brings it back."""
    core, state = ScorerCore(), ScorerCore().initial_state()
    state, _, _ = core.step(state, Inbound("HP_ASSESSMENTS", 1, subject_for("HP_ASSESSMENTS", assessment(node="n")), assessment(node="n"), {}, T0, True))
    gone = wire.NodeEvent(id="g", node_id="n", cluster="c", type="NODE_DEPROVISIONED", occurred_at=T0,
                          message="deprovisioned", actor="eviction")
    state, emits, _ = core.step(state, Inbound("HP_NODE_EVENTS", 2, subject_for("HP_NODE_EVENTS", wire.encode(gone)), wire.encode(gone), {}, T0, True))
    assert [(e.subject, e.purge_stream) for e in emits] == [(subjects.node_view("c", "n"), "HP_NODES")]
    assert not state.nodes
    state, emits, _ = core.step(state, Inbound("HP_ASSESSMENTS", 3, subject_for("HP_ASSESSMENTS", assessment(node="n")), assessment(node="n"), {}, T0, True))
    assert emits == [] and not state.nodes

    def resources(sent_at: datetime) -> bytes:
        return wire.encode(wire.ResourceReport(node_id="n", cluster="c", hostname="n", sent_at=sent_at, ready=True,
                                               cores=1, memory_bytes=1))

    state, emits, _ = core.step(state, Inbound("HP_RESOURCES", 4, subject_for("HP_RESOURCES", resources(T0)), resources(T0), {}, T0, True))
    assert emits == []
    later = T0 + timedelta(hours=1)
    state, emits, _ = core.step(state, Inbound("HP_RESOURCES", 5, subject_for("HP_RESOURCES", resources(later)), resources(later), {}, later, True))
    assert [wire.decode(wire.NodeView, e.payload).node_id for e in emits] == ["n"]


def test_rem1_needs_attention_shows_in_the_view_node_show_and_a_series_until_service() -> None:
    from healthplane.cli.node_cmd import show_text
    from healthplane_scorer.metrics import NodeSeries

    core, state = ScorerCore(), ScorerCore().initial_state()
    state, _, _ = core.step(state, Inbound("HP_ASSESSMENTS", 1, subject_for("HP_ASSESSMENTS", assessment(node="n")), assessment(node="n"), {}, T0, True))

    def event(seq: int, kind: str, message: str) -> wire.NodeView:
        nonlocal state
        record = wire.NodeEvent(id=f"e{seq}", node_id="n", cluster="c", type=kind,  # type: ignore[arg-type]
                                occurred_at=T0, message=message, actor="eviction")
        state, emits, _ = core.step(state, Inbound("HP_NODE_EVENTS", seq, subject_for("HP_NODE_EVENTS", wire.encode(record)), wire.encode(record), {}, T0, True))
        return wire.decode(wire.NodeView, emits[-1].payload)

    def series() -> str:
        return b"".join(map(gzipped.inflate, NodeSeries(lambda: [state]).render())).decode()

    view = event(2, "NODE_NEEDS_ATTENTION", "needs attention: GPU_XID_ERRORS: every step of its ladder was tried")
    assert view.needs_attention == wire.NeedsAttention(
        since=T0, reason="needs attention: GPU_XID_ERRORS: every step of its ladder was tried")
    assert (f"Needs attention since {wire.rfc3339(T0)}: needs attention: GPU_XID_ERRORS: every step of its ladder "
            "was tried") in show_text(view, T0).splitlines()
    assert 'healthplane_node_needs_attention{cluster="c",node_id="n"} 1.0' in series()
    view = event(3, "NODE_SERVICED", "serviced: replaced GPU 0")
    assert view.needs_attention is None and "Needs attention" not in show_text(view, T0)
    assert "healthplane_node_needs_attention{" not in series()


def _report(seq: int, at: datetime, *conditions: wire.Condition, node: str = "n") -> Inbound:
    record = wire.Assessment(node_id=node, cluster="c", assessed_at=at, report_sent_at=at, last_report_at=at,
                             interval_seconds=30, health="DEGRADED" if conditions else "HEALTHY",
                             conditions=list(conditions))
    return Inbound("HP_ASSESSMENTS", seq, subjects.assessment("c", node), wire.encode(record), {}, at, True)


def test_issue25_a_quiet_nodes_view_is_rewritten_every_third_report_a_watched_nodes_at_each() -> None:
    core, state = ScorerCore(), ScorerCore().initial_state()
    written = []
    for seq in range(1, 31):  # 15 minutes of a quiet node at a 30 s interval
        state, emits, _ = core.step(state, _report(seq, T0 + timedelta(seconds=30 * seq)))
        written += [seq for e in emits if e.subject.startswith("hp.node.")]
    gaps = [b - a for a, b in itertools.pairwise(written)]
    assert written[0] == 1 and 1 <= gaps[0] <= 3, written  # the first report; its refresh at the node's phase
    assert set(gaps[1:]) == {3}, written  # then every third
    ecc = cond("gpu_ecc_errors", "GpuEccCorrectable")
    for seq in range(31, 36):  # a condition: policy re-checks on every report (POL-3's second reading)
        state, emits, _ = core.step(state, _report(seq, T0 + timedelta(seconds=30 * seq), ecc))
        assert [e for e in emits if e.subject.startswith("hp.node.")], seq


@given(jitters=st.lists(st.floats(min_value=0, max_value=10), min_size=2, max_size=40),
       faulty=st.sets(st.integers(min_value=0, max_value=39)))
def test_issue25_the_view_written_is_current_and_never_stale_between_reports(
        jitters: list[float], faulty: set[int]) -> None:
    """Whatever the reports carry, the newest view written says what the scorer folded (all but
    ``lastReportedAt``), and is never old enough for ``node show`` to call the pipeline stalled."""
    core, state = ScorerCore(), ScorerCore().initial_state()
    latest: wire.NodeView | None = None
    ecc = cond("gpu_ecc_errors", "GpuEccCorrectable")
    times = [T0 + timedelta(seconds=30 * i + jitter) for i, jitter in enumerate(jitters)]
    for seq, at in enumerate(times, start=1):
        state, emits, _ = core.step(state, _report(seq, at, *([ecc] if seq - 1 in faulty else [])))
        latest = next((wire.decode(wire.NodeView, e.payload) for e in emits if e.subject.startswith("hp.node.")), latest)
        assert latest is not None
        folded = node_view(state, state.nodes[subjects.node_key("c", "n")])
        assert msgspec.structs.replace(latest, last_reported_at=None) == msgspec.structs.replace(
            folded, last_reported_at=None)
        next_report = times[seq] if seq < len(times) else at + timedelta(seconds=40)
        assert reads.stale_for(latest, next_report - timedelta(microseconds=1)) is None


def test_issue25_a_fleet_that_came_up_at_once_refreshes_its_views_evenly() -> None:
    # 3,000 nodes whose first reports fell in the same interval (a startup wave): their quiet
    # refreshes spread over the next reports instead of all landing in every third interval.
    core, state = ScorerCore(), ScorerCore().initial_state()
    per_round = []
    for round_ in range(1, 8):
        views = 0
        for index in range(3000):
            state, emits, _ = core.step(state, _report(round_ * 3000 + index, T0 + timedelta(seconds=30 * round_),
                                                    node=f"node-{index:04d}"))
            views += sum(e.subject.startswith("hp.node.") for e in emits)
        per_round.append(views)
    assert per_round[0] == 3000  # every node's first view
    assert all(800 <= views <= 1200 for views in per_round[1:]), per_round
