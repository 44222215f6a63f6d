"""The Slurm adapter's pure core against a small model of Slurm: our drains follow the holds
and the gate and converge in one pass (SLU-2, SLU-5), allocations follow squeue and are never
recorded twice (SLU-3), directives become Slurm commands and their answers (SLU-4), validation
jobs become one reserved ``sbatch`` each and their records (VAL-1, VAL-4).

No Slurm and no NATS: an :class:`Observation` is what ``sinfo --json`` / ``squeue --json``
would show, and :func:`slurmctld` plays what slurmctld does with our ``scontrol update``.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthplane.contracts import subjects, wire
from healthplane.runtime.fold import Emit, Inbound
from healthplane_slurm_adapter.fold import (
    Action,
    AdapterCore,
    Cancel,
    CancelRun,
    Drain,
    Pass,
    PowerDown,
    Requeue,
    Reserve,
    Resume,
    Submit,
    Unreserve,
)
from healthplane_slurm_adapter.records import (
    AllocatedNode,
    JobResources,
    SlurmError,
    SlurmJob,
    SlurmNode,
)
from healthplane_slurm_adapter.rules import (
    AdapterState,
    NodeNames,
    NodeWant,
    Observation,
    OurDrain,
    batch_script,
    run_end,
    time_limit_minutes,
)
from healthplane_slurm_adapter.slurm import read_tail

T0 = datetime(2026, 8, 11, 9, 0, tzinfo=UTC)
PREFIX = "healthplane:"
CONFIRM_S = 10.0
SETTLE_S = 30.0
NAMES = ("hpn1", "hpn2", "hpn3", "hpn4")
HOLD_IDS = ("h-1", "h-2", "h-3")
DEFINITIONS = ("a3-highgpu", "h100-spot")
# Reasons an administrator types: none starts with our prefix, some come close.
HAND_REASONS = ("bad PSU, ticket 4711", "healthplane maintenance", "Healthplane: by hand", " healthplane: x")
# Our drains as an older adapter (or an older view) left them.
OUR_REASONS = (f"{PREFIX} hold h-9 (cordon)", f"{PREFIX} score 3 below drainBelow 45", PREFIX)
STALE_ONE = f"{PREFIX} hold h-1 (cordon)"
HELD = "node hpn1 was held: GPU 2 ECC; work moved to another node"  # eviction's words (EVI-3)
OUTPUT_DIR = "/shared/healthplane/validation"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def unix(when: datetime) -> int:
    return int(when.timestamp())


# ---------------------------------------------------------------------------- builders


def hold(hold_id: str, created: float = 0, effect: str = "cordon", reason: str | None = None) -> wire.Hold:
    return wire.Hold(id=hold_id, effect=effect, reason=reason, actor="alice", created_at=at(created))  # type: ignore[arg-type]


def node(name: str, state: str = "idle", reason: str = "", drained: bool = False,
         changed_at: datetime = T0) -> SlurmNode:
    return SlurmNode(name=name, state=state, state_flags=["DRAIN"] if drained else [], reason=reason,
                     reason_set_by_user="root" if reason else None,
                     reason_changed_at=unix(changed_at) if reason else 0)


def job(job_id: int = 7, state: str = "RUNNING", nodes: Sequence[str] = ("hpn1",), restart: int = 0,
        requeue: bool = True, exit_code: int = 0, reason: str = "None") -> SlurmJob:
    return SlurmJob(job_id=job_id, job_state=state, user_name="alice", partition="gpu", name="train",
                    nodes=",".join(nodes), state_reason=reason, requeue=requeue, restart_cnt=restart,
                    exit_code=exit_code,
                    job_resources=JobResources([AllocatedNode(n) for n in nodes]) if nodes else None)


def observe(nodes: Sequence[SlurmNode] = (), jobs: Sequence[SlurmJob] = (), ended: dict[int, str] | None = None,
            when: datetime = T0) -> Observation:
    return Observation(list(nodes), list(jobs), dict(ended or {}), when)


def slurmctld(nodes: Sequence[SlurmNode], actions: Iterable[Action], when: datetime) -> list[SlurmNode]:
    """What slurmctld makes of our commands: a drain sets DRAIN, the reason and its time; a
    resume clears all three. Nothing else changes."""
    by_name = {n.name: n for n in nodes}
    for action in actions:
        match action:
            case Drain(name, reason):
                was = by_name[name]
                by_name[name] = msgspec.structs.replace(
                    was, state_flags=[*(f for f in was.state_flags if f != "DRAIN"), "DRAIN"], reason=reason,
                    reason_set_by_user="slurm", reason_changed_at=unix(when))
            case Resume(name):
                by_name[name] = resumed(by_name[name])
    return list(by_name.values())


def resumed(was: SlurmNode) -> SlurmNode:
    """``scontrol update state=resume``, whoever types it."""
    return msgspec.structs.replace(was, state_flags=[f for f in was.state_flags if f != "DRAIN"], reason="",
                                   reason_set_by_user=None, reason_changed_at=0)


def drains(found: Pass) -> list[Drain | Resume]:
    return [a for a in found.actions if isinstance(a, Drain | Resume)]


def allocations(emits: Sequence[Emit]) -> list[wire.Allocation]:
    return [wire.decode(wire.Allocation, e.payload) for e in emits if e.subject.startswith("hp.alloc.")]


def answers(emits: Sequence[Emit]) -> list[wire.TerminationResult]:
    return [wire.decode(wire.TerminationResult, e.payload) for e in emits if e.subject.startswith("hp.provision.")]


def commands(emits: Sequence[Emit]) -> list[wire.Command]:
    return [wire.decode(wire.Command, e.payload) for e in emits if e.subject.startswith("hp.cmd.")]


def states(emits: Sequence[Emit]) -> list[tuple[str, str]]:
    return [(a.id, a.state) for a in allocations(emits)]


class Adapter:
    """The core with its state, fed the way the Processor and the Reconciler feed it."""

    def __init__(self, names: NodeNames | None = None, state: AdapterState | None = None) -> None:
        self.core = AdapterCore("default", names, reason_prefix=PREFIX, confirm_s=CONFIRM_S, settle_s=SETTLE_S,
                                output_dir=OUTPUT_DIR, user="hpadm")
        self.state = state or self.core.initial_state()
        self.seq = 0
        self.emitted: list[Emit] = []

    def feed(self, stream: str, subject: str, data: bytes) -> None:
        self.seq += 1
        inbound = Inbound(stream=stream, seq=self.seq, subject=subject, data=data, headers={}, at=at(self.seq),
                          caught_up=True)
        self.state, emits, _ = self.core.step(self.state, inbound)
        assert list(emits) == []  # the fold only folds; the pass writes

    def refold(self, emits: Iterable[Emit]) -> None:
        """Its own records back from the streams, as after a restart without a snapshot."""
        for emit in emits:
            if emit.subject.startswith("hp.alloc."):
                self.feed("HP_ALLOCATIONS", emit.subject, emit.payload)
            elif emit.subject.startswith("hp.provision."):  # its input filter on HP_COMMANDS
                self.feed("HP_COMMANDS", emit.subject, emit.payload)

    def directive(self, action: str, node_id: str, allocation_id: str | None = None,
                  message: str = "") -> wire.Directive:
        record = wire.Directive(id=f"d-{self.seq + 1}", node_id=node_id, cluster="default", action=action,  # type: ignore[arg-type]
                                message=message or HELD, issued_at=T0, allocation_id=allocation_id)
        self.feed("HP_DIRECTIVES", subjects.directive("default", node_id), wire.encode(record))
        return record

    def reconcile(self, seen: Observation, now: datetime | None = None) -> Pass:
        self.state, found = self.core.reconcile(self.state, seen, now or seen.at)
        self.emitted += found.emits
        return found

    def settle(self, outcomes: Sequence[tuple[Action, SlurmError | None]], now: datetime) -> list[Emit]:
        self.state, emits, _ = self.core.settle(self.state, outcomes, now)
        self.emitted += emits
        return emits


# ---------------------------------------------------------------------------- drains: generated fleets


@dataclass
class Fleet:
    """Node views and thresholds the adapter folded, and the Slurm nodes it will find."""

    wants: dict[str, NodeWant]
    nodes: list[SlurmNode]
    drain_below: int
    by_definition: dict[str, int]
    our_drains: dict[str, OurDrain] = field(default_factory=dict)  # what a previous pass saw

    def adapter(self) -> Adapter:
        state = AdapterState(nodes={k: msgspec.structs.replace(v) for k, v in self.wants.items()},
                             drain_below=self.drain_below, drain_below_by_definition=dict(self.by_definition),
                             our_drains=dict(self.our_drains))
        return Adapter(state=state)

    def hand_drained(self) -> dict[str, str]:
        """Drained, or DOWN with a reason, by someone else (an administrator, Slurm itself)."""
        return {n.name: n.reason for n in self.nodes
                if (n.drained or (n.down and n.reason)) and not n.reason.startswith(PREFIX)}


holds_st = st.lists(
    st.builds(hold, st.sampled_from(HOLD_IDS), st.integers(0, 3), st.sampled_from(["cordon", "evict", "deprovision"]),
              st.none() | st.sampled_from(["GPU 2 ECC", "  xid 79:\n fell off  the bus", "x" * 300])),
    max_size=3, unique_by=lambda h: h.id)
wants_st = st.builds(NodeWant, holds=holds_st, score=st.none() | st.integers(0, 100),
                     definition=st.none() | st.sampled_from([*DEFINITIONS, "unknown-definition"]))


@st.composite
def slurm_nodes(draw: st.DrawFn, name: str) -> SlurmNode:
    state = draw(st.sampled_from(["idle", "allocated", "mixed", "down"]))
    drain = draw(st.sampled_from(["none", "ours", "hand"]))
    changed_at = at(-draw(st.integers(0, 120)))
    if drain == "ours":
        return node(name, state, draw(st.sampled_from([*OUR_REASONS, STALE_ONE])), True, changed_at)
    if drain == "hand":
        return node(name, state, draw(st.sampled_from(HAND_REASONS)), True, changed_at)
    return node(name, state, "Not responding" if state == "down" else "", False, changed_at)


@st.composite
def fleets(draw: st.DrawFn, history: bool = True) -> Fleet:
    """Up to four Slurm nodes, each with or without a view; a view of a node Slurm does not
    have; with ``history``, what an earlier pass saw of our drains."""
    names = NAMES[:draw(st.integers(1, len(NAMES)))]
    nodes = [draw(slurm_nodes(name)) for name in names]
    wants = {name: draw(wants_st) for name in names if draw(st.booleans())}
    if draw(st.booleans()):
        wants["not-in-slurm"] = draw(wants_st)
    by_definition = draw(st.dictionaries(st.sampled_from(DEFINITIONS), st.integers(0, 100), max_size=2))
    our_drains: dict[str, OurDrain] = {}
    if history:
        for name in names:
            if draw(st.booleans()):
                set_at = unix(at(-draw(st.integers(0, 120))))
                our_drains[name] = OurDrain(set_at, set_at + draw(st.floats(0, 30)))
    return Fleet(wants, nodes, draw(st.integers(0, 100)), by_definition, our_drains)


def expected_causes(fleet: Fleet, name: str) -> tuple[list[str], int | None]:
    """The test's own reading of SLU-2: the holds by age, then the gate (POL-5), with the
    threshold of the node's definition when the config has one."""
    want = fleet.wants.get(name)
    if want is None:
        return [], None
    threshold = fleet.by_definition.get(want.definition or "", fleet.drain_below)
    ids = [h.id for h in sorted(want.holds, key=lambda h: (h.created_at, h.id))]
    gated = want.score is not None and want.score < threshold
    return ids + (["score"] if gated else []), threshold


def run_passes(adapter: Adapter, nodes: list[SlurmNode], passes: int) -> tuple[list[Pass], list[SlurmNode]]:
    """Pass after pass, ten seconds apart, each pass's drains and resumes carried out."""
    found: list[Pass] = []
    for k in range(passes):
        now = at(10 * k)
        found.append(adapter.reconcile(observe(nodes, when=now)))
        nodes = slurmctld(nodes, found[-1].actions, now)
    return found, nodes


@settings(max_examples=200, deadline=None)
@given(fleets())
def test_slu5_drains_converge_in_one_pass_and_stay_put(fleet: Fleet) -> None:
    """SLU-5: whatever the views and whatever Slurm shows, one pass's drains and resumes,
    carried out, leave nothing to do: the next pass asks for none (a fixed point), nor does a
    third (idempotent)."""
    found, _ = run_passes(fleet.adapter(), fleet.nodes, 3)
    assert drains(found[1]) == [] and drains(found[2]) == []
    for second in found[1:]:
        assert second.emits == []  # an administrator's RESUME is written once, by the first pass


@settings(max_examples=200, deadline=None)
@given(fleets(), st.data())
def test_slu5_a_lost_command_is_asked_for_again_and_then_nothing(fleet: Fleet, data: st.DataObject) -> None:
    """SLU-5: the drains and resumes that never reached Slurm (lost, slurmctld down) are
    exactly what the next pass asks for; carried out, nothing more."""
    adapter = fleet.adapter()
    first = adapter.reconcile(observe(fleet.nodes, when=T0))
    lost = [a for a in drains(first) if data.draw(st.booleans(), label=f"lose {a}")]
    nodes = slurmctld(fleet.nodes, [a for a in first.actions if a not in lost], T0)
    second = adapter.reconcile(observe(nodes, when=at(10)))
    assert drains(second) == lost
    nodes = slurmctld(nodes, second.actions, at(10))
    assert drains(adapter.reconcile(observe(nodes, when=at(20)))) == []


@settings(max_examples=200, deadline=None)
@given(fleets(history=False))
def test_slu5_a_restarted_adapter_finds_nothing_to_do(fleet: Fleet) -> None:
    """SLU-5: an adapter restarted without its snapshot (no memory of our drains) reads the
    converged Slurm and asks for nothing."""
    _, nodes = run_passes(fleet.adapter(), fleet.nodes, 1)
    found, _ = run_passes(fleet.adapter(), nodes, 2)
    assert [drains(p) for p in found] == [[], []]


@settings(max_examples=200, deadline=None)
@given(fleets())
def test_slu2_a_drain_set_by_hand_is_never_touched(fleet: Fleet) -> None:
    """SLU-2: a node drained (or DOWN) with a reason that lacks our prefix is never the target
    of a drain or a resume, in any pass, whatever its view says; its state and reason stay
    the administrator's."""
    by_hand = fleet.hand_drained()
    found, nodes = run_passes(fleet.adapter(), fleet.nodes, 3)
    assert [a for p in found for a in p.actions if isinstance(a, Drain | Resume | PowerDown) and a.node in by_hand] == []
    assert {n.name: n.reason for n in nodes if n.name in by_hand} == by_hand
    assert all(n.drained or n.down for n in nodes if n.name in by_hand)


@settings(max_examples=200, deadline=None)
@given(fleets(history=False))
def test_slu2_a_held_or_gated_node_ends_drained_with_our_reason(fleet: Fleet) -> None:
    """SLU-2: after one pass, a node with a hold or below its definition's drainBelow is
    drained with our prefix and the first cause (the oldest hold's id, else the score and
    threshold); one with neither is not drained, unless an administrator drained it."""
    by_hand = fleet.hand_drained()
    _, nodes = run_passes(fleet.adapter(), fleet.nodes, 1)
    for slurm_node in nodes:
        if slurm_node.name in by_hand:
            continue
        causes, threshold = expected_causes(fleet, slurm_node.name)
        if not causes:
            assert not slurm_node.drained, slurm_node
            continue
        assert slurm_node.drained and slurm_node.reason.startswith(f"{PREFIX} "), slurm_node
        want = fleet.wants[slurm_node.name]
        first = (f"{PREFIX} hold {causes[0]} (" if causes[0] != "score"
                 else f"{PREFIX} score {want.score} below drainBelow {threshold}")
        assert slurm_node.reason.startswith(first), (slurm_node.reason, first)
        more = f" (+{len(causes) - 1} more)"
        assert len(slurm_node.reason) <= 200 and "\n" not in slurm_node.reason
        if len(causes) > 1 and len(slurm_node.reason) < 200:
            assert slurm_node.reason.endswith(more)


def test_slu2_the_reason_names_the_hold_its_effect_and_reason_or_the_score() -> None:
    """SLU-2: the drain reasons as ``sinfo -R`` shows them."""
    adapter = Adapter()
    adapter.state.drain_below_by_definition = {"a3-highgpu": 60}
    adapter.state.nodes = {
        "hpn1": NodeWant(holds=[hold("h-2", 5, "evict", "GPU 2\n ECC"), hold("h-1", 9)], score=10),
        "hpn2": NodeWant(score=50, definition="a3-highgpu"),
        "hpn3": NodeWant(score=50),  # the cluster's drainBelow is 45
    }
    found = adapter.reconcile(observe([node(n) for n in ("hpn1", "hpn2", "hpn3")]))
    assert found.actions == [Drain("hpn1", "healthplane: hold h-2 (evict: GPU 2 ECC) (+2 more)"),
                             Drain("hpn2", "healthplane: score 50 below drainBelow 60")]


def test_slu2_views_fold_into_what_each_node_needs_for_this_cluster_only() -> None:
    """SLU-2: the scorer's node views are the holds, score and definition the drains follow."""
    adapter = Adapter()
    for cluster, node_id in (("default", "hpn1"), ("other", "hpn2")):
        view = wire.NodeView(node_id=node_id, cluster=cluster, hostname=node_id, status="READY", health="DEGRADED",
                             last_reported_at=T0, score=30, score_explanation=None, conditions=[],
                             attributed_failures=wire.AttributedFailures(), holds=[hold("h-1")],
                             definition="a3-highgpu")
        adapter.feed("HP_NODES", subjects.node_view(cluster, node_id), wire.encode(view))
    assert adapter.state.nodes == {"hpn1": NodeWant(holds=[hold("h-1")], score=30, definition="a3-highgpu")}


def test_slu2_drains_follow_the_node_id_template_and_say_once_what_they_cannot_do() -> None:
    """SLU-1, SLU-2: views are node ids, drains Slurm names; a node that must be drained but
    has no Slurm node, or that an administrator drained, is said once, not every pass."""
    adapter = Adapter(NodeNames("{name}.example"))
    adapter.state.nodes = {i: NodeWant(holds=[hold("h-1")]) for i in ("hpn1.example", "hpn2.example", "hpn9")}
    nodes = [node("hpn1"), node("hpn2", reason="bad PSU, ticket 4711", drained=True)]
    first = adapter.reconcile(observe(nodes))
    assert first.actions == [Drain("hpn1", "healthplane: hold h-1 (cordon)")]
    assert sorted(n.event for n in first.notes) == ["drained by hand; left alone",
                                                    "no Slurm node for a node that must be drained"]
    again = adapter.reconcile(observe(slurmctld(nodes, first.actions, T0), when=at(10)))
    assert (again.actions, again.notes) == ([], [])


# ---------------------------------------------------------------------------- an administrator's RESUME


def drained_and_seen(adapter: Adapter, name: str, seen_after: float) -> SlurmNode:
    """Our drain, carried out at T0 and seen standing ``seen_after`` seconds later."""
    first = adapter.reconcile(observe([node(name)], when=T0))
    [drained] = slurmctld([node(name)], first.actions, T0)
    assert drained.drained
    assert drains(adapter.reconcile(observe([drained], when=at(seen_after)))) == []
    return drained


def test_slu2_an_administrators_resume_of_our_drain_releases_the_holds_as_slurm() -> None:
    """SLU-2: our drain stood long enough to be in slurmctld's saved state, then the node
    shows undrained while its holds stand: an administrator resumed it. The pass writes one
    hold-release of those holds by actor slurm and does not drain the node again."""
    adapter = Adapter()
    adapter.state.nodes["hpn1"] = NodeWant(holds=[hold("h-1"), hold("h-2", 1)], score=20)
    drained = drained_and_seen(adapter, "hpn1", CONFIRM_S)
    found = adapter.reconcile(observe([resumed(drained)], when=at(20)))
    assert drains(found) == []
    [command] = commands(found.emits)
    assert [e.subject for e in found.emits] == ["hp.cmd.default.hpn1.hold-release.slurm"]
    assert (command.verb, command.actor, command.node_id, command.hold_ids) == (
        "hold-release", "slurm", "hpn1", ["h-1", "h-2"])
    assert [n.counter for n in found.notes] == ["resumed_in_slurm"]
    # Passes later, the holds still in the view: nothing again.
    again = adapter.reconcile(observe([resumed(drained)], when=at(30)))
    assert (again.emits, again.actions) == ([], [])
    # The holds released: nothing; a new hold afterwards drains the node again.
    adapter.state.nodes["hpn1"] = NodeWant(score=80)
    assert adapter.reconcile(observe([resumed(drained)], when=at(40))).actions == []
    adapter.state.nodes["hpn1"] = NodeWant(holds=[hold("h-3")], score=80)
    assert adapter.reconcile(observe([resumed(drained)], when=at(50))).actions == [
        Drain("hpn1", "healthplane: hold h-3 (cordon)")]


def test_slu2_a_resume_of_a_gate_only_drain_writes_no_command_and_holds_the_gate_off() -> None:
    """SLU-2: the gate alone has no hold to release; the administrator's word stands until
    the gate lifts."""
    adapter = Adapter()
    adapter.state.nodes["hpn1"] = NodeWant(score=20)
    drained = drained_and_seen(adapter, "hpn1", 60)
    found = adapter.reconcile(observe([resumed(drained)], when=at(70)))
    assert (found.emits, found.actions) == ([], [])
    assert adapter.reconcile(observe([resumed(drained)], when=at(80))).actions == []
    adapter.state.nodes["hpn1"] = NodeWant(score=80)  # the gate lifts
    assert adapter.reconcile(observe([resumed(drained)], when=at(90))).actions == []
    adapter.state.nodes["hpn1"] = NodeWant(score=20)  # and falls again: a new cause
    assert adapter.reconcile(observe([resumed(drained)], when=at(100))).actions == [
        Drain("hpn1", "healthplane: score 20 below drainBelow 45")]


def test_slu2_a_young_drain_lost_by_slurmctld_is_drained_again() -> None:
    """SLU-2: a drain younger than confirm_s that vanished (slurmctld killed -9 before it
    saved its state) is no administrator's RESUME: the node is drained again, no command."""
    adapter = Adapter()
    adapter.state.nodes["hpn1"] = NodeWant(holds=[hold("h-1")])
    drained = drained_and_seen(adapter, "hpn1", CONFIRM_S - 1)
    found = adapter.reconcile(observe([node("hpn1")], when=at(CONFIRM_S)))
    assert found.emits == []
    assert found.actions == [Drain("hpn1", drained.reason)]


# ---------------------------------------------------------------------------- allocations (SLU-3)


@pytest.mark.parametrize("template", ["", "hpn", "{name}{name}", "{name}.{cluster}", "{nam}", "{{name}}"])
def test_slu1_a_node_id_template_needs_name_exactly_once(template: str) -> None:
    """SLU-1: a mapping error is a clear message."""
    with pytest.raises(ValueError, match="exactly once"):
        NodeNames(template)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["{name}", "{name}.example", "gpu-{name}", "{name}/9100"]),
       st.text("abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1, max_size=12))
def test_slu1_node_names_map_both_ways(template: str, name: str) -> None:
    """SLU-1: a Slurm node name becomes a node id by the template and back."""
    names = NodeNames(template)
    assert names.slurm_name(names.node_id(name)) == name


def test_slu1_a_node_id_the_template_cannot_make_has_no_slurm_node() -> None:
    """SLU-1: ``{name}.example`` both ways."""
    names = NodeNames("{name}.example")
    assert names.node_id("hpn1") == "hpn1.example"
    assert names.slurm_name("hpn1.example") == "hpn1"
    assert [names.slurm_name(i) for i in ("hpn1", ".example", "hpn1.example.org")] == [None, None, None]


@pytest.mark.parametrize("template", ["{name}", "{name}.example"])
def test_slu3_a_running_job_is_one_started_allocation_per_node(template: str) -> None:
    """SLU-3: a RUNNING job is an allocation per node, with its user, partition, nodes (as node
    ids) and its retry declaration from Slurm's requeue flag; the same squeue again writes
    nothing."""
    names = NodeNames(template)
    adapter = Adapter(names)
    seen = observe(jobs=[job(7, nodes=["hpn1", "hpn2"])])
    found = adapter.reconcile(seen)
    records = allocations(found.emits)
    ids = [names.node_id("hpn1"), names.node_id("hpn2")]
    assert [(r.id, r.state, r.node_id) for r in records] == [
        ("slurm-7-0-hpn1", "started", ids[0]), ("slurm-7-0-hpn2", "started", ids[1])]
    assert [e.subject for e in found.emits] == [subjects.allocation("default", i, r.id) for i, r in zip(ids, records, strict=True)]
    first = records[0]
    assert (first.job_id, first.user, first.partition, first.nodes, first.requeueable) == (
        "7", "alice", "gpu", ids, True)
    assert (first.restart, first.retry_on, first.node_fault_restarts) == ("on-node-fault", ["node"], 0)
    assert adapter.reconcile(seen, at(10)).emits == []


def test_slu3_a_job_submitted_no_requeue_declares_no_retry() -> None:
    """SLU-3/SLU-4: the job's own retry declaration maps from Slurm's requeue flag."""
    [record] = allocations(Adapter().reconcile(observe(jobs=[job(requeue=False)])).emits)
    assert (record.requeueable, record.restart, record.retry_on, record.retry_attempts) == (False, "never", [], 0)


@pytest.mark.parametrize(("slurm_state", "exit_code", "reason", "down", "state", "why"), [
    ("COMPLETED", 0, "None", False, "finished", None),
    ("FAILED", 768, "NonZeroExitCode", False, "failed", "FAILED: exit code 3"),
    ("FAILED", 9, "NonZeroExitCode", False, "failed", "FAILED: killed by signal 9"),
    ("NODE_FAIL", 0, "None", True, "failed", "NODE_FAIL: node hpn2 failed"),
    ("NODE_FAIL", 0, "None", False, "failed", "NODE_FAIL: Slurm lost a node of the job"),
    ("TIMEOUT", 0, "TimeLimit", False, "failed", "TIMEOUT: TimeLimit"),
    ("CANCELLED", 0, "None", False, "failed", "CANCELLED"),
    ("PREEMPTED", 0, "None", False, "failed", "PREEMPTED"),
])
def test_slu3_end_states_map_to_allocation_states(slurm_state: str, exit_code: int, reason: str,
                                                   down: bool, state: str, why: str | None) -> None:
    """SLU-3: Slurm's end states become finished or failed, with why; NODE_FAIL names its node."""
    adapter = Adapter()
    nodes = [node("hpn1"), node("hpn2", "down", "Not responding") if down else node("hpn2")]
    adapter.reconcile(observe(nodes, [job(7, nodes=["hpn1", "hpn2"])]))
    ended = job(7, slurm_state, ["hpn1", "hpn2"], exit_code=exit_code, reason=reason)
    found = adapter.reconcile(observe(nodes, [ended], when=at(10)))
    assert [(r.id, r.state, r.reason) for r in allocations(found.emits)] == [
        ("slurm-7-0-hpn1", state, why), ("slurm-7-0-hpn2", state, why)]
    assert adapter.reconcile(observe(nodes, [ended], when=at(20))).emits == []
    assert adapter.state.open == {}


def test_slu3_a_job_run_again_by_slurm_ends_the_old_allocation_as_requeued() -> None:
    """SLU-3: a higher restart count is a new run: the old allocation requeued, the new one
    started."""
    adapter = Adapter()
    adapter.reconcile(observe(jobs=[job(7, nodes=["hpn1"])]))
    found = adapter.reconcile(observe(jobs=[job(7, nodes=["hpn2"], restart=1)], when=at(10)))
    assert [(r.id, r.state, r.reason) for r in allocations(found.emits)] == [
        ("slurm-7-0-hpn1", "requeued", "requeued by Slurm (None)"), ("slurm-7-1-hpn2", "started", None)]
    assert allocations(found.emits)[1].node_fault_restarts == 1


@pytest.mark.parametrize(("accounting", "state", "why"), [
    ({7: "CANCELLED"}, "failed", "CANCELLED (from Slurm accounting)"),
    ({7: "COMPLETED"}, "finished", "COMPLETED (from Slurm accounting)"),
    ({}, "finished", "left Slurm's queue unobserved; end state unknown (no Slurm accounting)"),
])
def test_slu3_a_job_that_left_the_queue_unseen_ends_as_accounting_says(accounting: dict[int, str], state: str,
                                                                       why: str) -> None:
    """SLU-3: a job gone from squeue while the adapter was away ends as sacct says, else as
    finished with an end state unknown."""
    adapter = Adapter()
    adapter.reconcile(observe(jobs=[job(7, nodes=["hpn1"])]))
    found = adapter.reconcile(observe(jobs=[], ended=accounting, when=at(600)))
    assert [(r.id, r.state, r.reason) for r in allocations(found.emits)] == [("slurm-7-0-hpn1", state, why)]
    assert adapter.reconcile(observe(jobs=[], ended=accounting, when=at(610))).emits == []


RUNNING_STATES = ("RUNNING", "SUSPENDED")
END_STATES = ("COMPLETED", "FAILED", "NODE_FAIL", "TIMEOUT", "CANCELLED", "PREEMPTED", "OUT_OF_MEMORY")


@st.composite
def queues(draw: st.DrawFn) -> list[Observation]:
    """What squeue shows pass after pass for a few jobs, each living a life Slurm allows:
    pending, running, requeued (its restart count up), ended (listed a while), then gone, with
    or without accounting to say how it ended."""
    passes = draw(st.integers(1, 5))
    listed: list[list[SlurmJob]] = [[] for _ in range(passes)]
    ended: list[dict[int, str]] = [{} for _ in range(passes)]
    for job_id in range(100, 100 + draw(st.integers(1, 3))):
        nodes = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True))
        requeue = draw(st.booleans())
        restart, status = draw(st.integers(0, 1)), "PENDING"
        for k in range(passes):
            move = draw(st.sampled_from(["stay", "run", "requeue", "end", "leave"]))
            if status == "GONE" or (move == "leave" and status in END_STATES + RUNNING_STATES):
                status = "GONE"
                if draw(st.booleans()):
                    ended[k][job_id] = draw(st.sampled_from(END_STATES))
                continue
            if status not in END_STATES:
                if move == "run":
                    status = draw(st.sampled_from(RUNNING_STATES))
                elif move == "requeue" and status in RUNNING_STATES:
                    restart, status = restart + 1, "PENDING"
                elif move == "end" and status in RUNNING_STATES:
                    status = draw(st.sampled_from(END_STATES))
            placed = nodes if status != "PENDING" else []
            listed[k].append(job(job_id, status, placed, restart, requeue, draw(st.sampled_from([0, 256, 9]))))
    return [observe([node(n) for n in NAMES], listed[k], ended[k], at(10 * k)) for k in range(passes)]


@settings(max_examples=200, deadline=None)
@given(queues())
def test_slu3_no_allocation_record_is_written_twice_even_after_a_restart(seen: list[Observation]) -> None:
    """SLU-3, SLU-5: pass after pass no record is written twice, each allocation starts at
    most once and ends at most once; the same squeue again writes nothing; an adapter that
    restarts, folds its own records back and reads the same squeue writes nothing."""
    adapter = Adapter()
    for observation in seen:
        adapter.reconcile(observation)
    ids = [e.msg_id for e in adapter.emitted]
    assert len(ids) == len(set(ids))
    ended: dict[str, str] = {}
    for alloc_id, state in states(adapter.emitted):
        assert alloc_id not in ended, (alloc_id, state, ended[alloc_id])
        if state != "started":
            ended[alloc_id] = state
    again = seen[-1]
    assert adapter.reconcile(Observation(again.nodes, again.jobs, again.ended, at(1000))).emits == []
    restarted = Adapter()
    restarted.refold(adapter.emitted)
    assert restarted.reconcile(again).emits == []


def test_slu3_a_restarted_adapter_that_folded_its_records_writes_nothing_twice() -> None:
    """SLU-3: started, requeued and ended records, folded back, keep a restarted adapter
    from writing any of them again."""
    adapter = Adapter()
    seen = [observe(jobs=[job(7, nodes=["hpn1", "hpn2"]), job(8, nodes=["hpn3"])]),
            observe(jobs=[job(7, nodes=["hpn2"], restart=1), job(8, "FAILED", ["hpn3"], exit_code=256)],
                    when=at(10))]
    for observation in seen:
        adapter.reconcile(observation)
    assert sorted(states(adapter.emitted)) == [
        ("slurm-7-0-hpn1", "requeued"), ("slurm-7-0-hpn1", "started"), ("slurm-7-0-hpn2", "requeued"),
        ("slurm-7-0-hpn2", "started"), ("slurm-7-1-hpn2", "started"), ("slurm-8-0-hpn3", "failed"),
        ("slurm-8-0-hpn3", "started")]
    restarted = Adapter()
    restarted.refold(adapter.emitted)
    assert sorted(restarted.state.open) == ["slurm-7-1-hpn2"]
    assert restarted.reconcile(seen[-1], at(20)).emits == []


# ---------------------------------------------------------------------------- directives (SLU-4)


def running(adapter: Adapter, *jobs: SlurmJob) -> Observation:
    """The jobs running, their allocations started."""
    seen = observe([node(n) for n in NAMES], jobs)
    adapter.reconcile(seen)
    return seen


def test_slu4_a_requeue_directive_requeues_the_job_once_and_ends_its_allocations_as_requeued() -> None:
    """SLU-4: requeue → ``scontrol requeue`` for a requeueable job, not sent again before
    settle_s; once Slurm shows the new run, the directive is done and the old allocations end
    as requeued with the directive's message."""
    adapter = Adapter()
    seen = running(adapter, job(7, nodes=["hpn1", "hpn2"]))
    directive = adapter.directive("requeue", "hpn1", "slurm-7-0-hpn1", HELD)
    first = adapter.reconcile(seen, at(1))
    assert (first.actions, first.emits) == ([Requeue(7, directive.id)], [])
    assert adapter.reconcile(seen, at(1 + SETTLE_S - 1)).actions == []
    assert adapter.settle([(first.actions[0], None)], at(2)) == []
    requeued = observe([node(n) for n in NAMES], [job(7, "PENDING", [], restart=1, reason="BeginTime")], when=at(40))
    found = adapter.reconcile(requeued)
    assert [(r.id, r.state, r.reason) for r in allocations(found.emits)] == [
        ("slurm-7-0-hpn1", "requeued", HELD), ("slurm-7-0-hpn2", "requeued", HELD)]
    assert (found.actions, found.notes, adapter.state.pending) == ([], [], [])


def test_slu4_a_requeue_not_seen_in_slurm_after_settle_s_is_sent_again() -> None:
    """SLU-4, SLU-5: a command whose effect never shows in Slurm is sent again, not dropped."""
    adapter = Adapter()
    seen = running(adapter, job(7))
    directive = adapter.directive("requeue", "hpn1", "slurm-7-0-hpn1", HELD)
    assert adapter.reconcile(seen, at(1)).actions == [Requeue(7, directive.id)]
    assert adapter.reconcile(seen, at(1 + SETTLE_S)).actions == [Requeue(7, directive.id)]


FAILED_AFTER = ("slurm-7-1-hpn2", "failed", "FAILED: exit code 1")


@pytest.mark.parametrize(("next_run", "ends"), [
    ([job(7, "RUNNING", ["hpn2"], restart=1), job(7, "FAILED", ["hpn2"], restart=1, exit_code=256)],
     [FAILED_AFTER]),
    ([job(7, "FAILED", ["hpn2"], restart=1, exit_code=256)], [FAILED_AFTER]),  # over before a pass saw it run
    ([job(7, "RUNNING", ["hpn2"], restart=1), job(7, "PENDING", [], restart=2, reason="Prolog")],
     [("slurm-7-1-hpn2", "requeued", "requeued by Slurm (Prolog)")]),  # Slurm requeued it again, on its own
])
def test_slu4_a_later_run_of_a_requeued_job_does_not_carry_the_directives_reason(
        next_run: list[SlurmJob], ends: list[tuple[str, str, str]]) -> None:
    """SLU-3, SLU-4: the directive's message is the reason of the run it requeued, not of the
    next: that run's end, or Slurm's own requeue of it, says what Slurm says."""
    adapter = Adapter()
    seen = running(adapter, job(7))
    adapter.directive("requeue", "hpn1", "slurm-7-0-hpn1", HELD)
    adapter.reconcile(seen, at(1))
    found = [adapter.reconcile(observe(jobs=[j], when=at(40 + 10 * k))) for k, j in enumerate(next_run)]
    records = [(r.id, r.state, r.reason) for p in found for r in allocations(p.emits) if r.state != "started"]
    assert records == [("slurm-7-0-hpn1", "requeued", HELD), *ends]


def test_slu4_a_requeue_of_a_job_slurm_cannot_requeue_cancels_it_and_says_so() -> None:
    """SLU-4: a job submitted ``--no-requeue`` is cancelled instead; its failed records say why."""
    adapter = Adapter()
    seen = running(adapter, job(8, requeue=False))
    directive = adapter.directive("requeue", "hpn1", "slurm-8-0-hpn1", HELD)
    assert adapter.reconcile(seen, at(1)).actions == [Cancel(8, directive.id)]
    found = adapter.reconcile(observe(jobs=[job(8, "CANCELLED", requeue=False)], when=at(5)))
    assert [(r.id, r.state, r.reason) for r in allocations(found.emits)] == [
        ("slurm-8-0-hpn1", "failed", f"{HELD}; job 8 is not requeueable in Slurm, so it was cancelled")]
    assert adapter.state.pending == []


def test_slu4_a_fail_directive_cancels_the_job_with_its_reason() -> None:
    """SLU-4: fail → ``scancel``, the reason recorded."""
    adapter = Adapter()
    seen = running(adapter, job(9))
    message = "node hpn1: GPU ECC errors; job failed and the node cordoned"
    directive = adapter.directive("fail", "hpn1", "slurm-9-0-hpn1", message)
    assert adapter.reconcile(seen, at(1)).actions == [Cancel(9, directive.id)]
    found = adapter.reconcile(observe(jobs=[job(9, "CANCELLED")], when=at(5)))
    assert [(r.state, r.reason) for r in allocations(found.emits)] == [("failed", message)]


def test_slu4_directives_for_two_nodes_of_one_job_are_one_command() -> None:
    """SLU-4: a job is requeued once, whatever its node count: in the pass that decides it,
    and in the passes after while that command settles; once it shows, both directives are
    done, neither said to be disobeyed."""
    adapter = Adapter()
    seen = running(adapter, job(7, nodes=["hpn1", "hpn2"]))
    first = adapter.directive("requeue", "hpn1", "slurm-7-0-hpn1", HELD)
    adapter.directive("requeue", "hpn2", "slurm-7-0-hpn2", HELD.replace("hpn1", "hpn2"))
    assert adapter.reconcile(seen, at(1)).actions == [Requeue(7, first.id)]
    assert adapter.reconcile(seen, at(11)).actions == []
    found = adapter.reconcile(observe(jobs=[job(7, "PENDING", [], restart=1)], when=at(21)))
    assert states(found.emits) == [("slurm-7-0-hpn1", "requeued"), ("slurm-7-0-hpn2", "requeued")]
    assert (found.actions, found.notes, adapter.state.pending) == ([], [], [])


def test_slu4_a_requeue_slurm_refuses_is_dropped_a_transient_failure_retried() -> None:
    """SLU-4, SLU-5: a command that could not reach Slurm is sent at the next pass; one Slurm
    refused is not sent again."""
    adapter = Adapter()
    seen = running(adapter, job(7))
    directive = adapter.directive("requeue", "hpn1", "slurm-7-0-hpn1", HELD)
    [requeue] = adapter.reconcile(seen, at(1)).actions
    adapter.settle([(requeue, SlurmError("scontrol requeue", "Unable to contact slurm controller", transient=True))],
                   at(2))
    assert adapter.reconcile(seen, at(3)).actions == [Requeue(7, directive.id)]
    adapter.settle([(requeue, SlurmError("scontrol requeue", "Job is no longer pending execution", transient=False))],
                   at(4))
    assert adapter.reconcile(seen, at(5 + SETTLE_S)).actions == []
    assert adapter.state.pending == []


def test_slu4_a_command_slurm_refused_leaves_no_reason_on_the_jobs_own_end() -> None:
    """SLU-3, SLU-4: a cancel Slurm refused (the job was already completing) ended nothing:
    the job's own end says what Slurm says, not the directive's message."""
    adapter = Adapter()
    seen = running(adapter, job(9))
    adapter.directive("fail", "hpn1", "slurm-9-0-hpn1", "node hpn1: GPU ECC errors; job failed")
    [cancel] = adapter.reconcile(seen, at(1)).actions
    refused = SlurmError("scancel", "Job/step already completing or completed", transient=False)
    adapter.settle([(cancel, refused)], at(2))
    found = adapter.reconcile(observe(jobs=[job(9, "COMPLETED")], when=at(5)))
    assert [(r.state, r.reason) for r in allocations(found.emits)] == [("finished", None)]


def test_slu4_terminate_a_node_not_in_slurm_is_answered_refused() -> None:
    """SLU-4: terminate of a node this Slurm cluster does not have: refused at once."""
    adapter = Adapter()
    directive = adapter.directive("terminate", "hpn9", message="replace hpn9")
    found = adapter.reconcile(observe([node("hpn1")], when=at(1)))
    assert found.actions == []
    [answer] = answers(found.emits)
    assert [e.subject for e in found.emits] == [subjects.provision("default", "hpn9")]
    assert (answer.directive_id, answer.node_id, answer.accepted, answer.message) == (
        directive.id, "hpn9", False, "hpn9 is not a node of this Slurm cluster")
    assert adapter.reconcile(observe([node("hpn1")], when=at(2))).emits == []


@pytest.mark.parametrize(("error", "accepted", "message"), [
    (None, True, "hpn1 powered down (Slurm node hpn1, POWER_DOWN)"),
    (SlurmError("scontrol update", "Invalid node state specified", transient=False), False,
     "Slurm refused to power down hpn1: Invalid node state specified"),
])
def test_slu4_terminate_powers_the_node_down_and_answers_what_slurm_said(error: SlurmError | None, accepted: bool,
                                                                           message: str) -> None:
    """SLU-4: terminate (a cloud node) → Slurm's power-down; the answer carries Slurm's word."""
    adapter = Adapter()
    directive = adapter.directive("terminate", "hpn1", message="replace hpn1")
    seen = observe([node("hpn1")], when=at(1))
    found = adapter.reconcile(seen)
    assert (found.actions, found.emits) == ([PowerDown("hpn1", directive)], [])
    [answer] = answers(adapter.settle([(found.actions[0], error)], at(2)))
    assert (answer.directive_id, answer.accepted, answer.message) == (directive.id, accepted, message)
    assert adapter.reconcile(seen, at(3 + SETTLE_S)).actions == []


def test_slu4_terminate_that_could_not_reach_slurm_is_sent_again_unanswered() -> None:
    """SLU-4, SLU-5: a transient failure is no answer: the next pass powers the node down again."""
    adapter = Adapter()
    directive = adapter.directive("terminate", "hpn1", message="replace hpn1")
    seen = observe([node("hpn1")], when=at(1))
    [power_down] = adapter.reconcile(seen).actions
    error = SlurmError("scontrol update", "Socket timed out on send/recv operation", transient=True)
    assert adapter.settle([(power_down, error)], at(2)) == []
    assert adapter.reconcile(seen, at(3)).actions == [PowerDown("hpn1", directive)]


def test_slu4_a_terminate_answer_folded_back_is_not_answered_again() -> None:
    """SLU-4: the answer, folded back after a restart, keeps the directive answered."""
    adapter = Adapter()
    adapter.directive("terminate", "hpn9", message="replace hpn9")
    adapter.reconcile(observe([node("hpn1")], when=at(1)))
    restarted = Adapter()
    restarted.directive("terminate", "hpn9", message="replace hpn9")
    restarted.refold(adapter.emitted)
    found = restarted.reconcile(observe([node("hpn1")], when=at(2)))
    assert (found.actions, found.emits) == ([], [])


# ---------------------------------------------------------------------------- validation runs (VAL-1, VAL-4)

RUN = "val-0123456789abcdef"
RESERVATION = f"healthplane-{RUN}"
PASS_SUITE = wire.ValidationSuite(name="smoke", command=["sh", "-c", "echo Result: PASS"], timeout_seconds=90)


def validation(adapter: Adapter, nodes: Sequence[str] = ("hpn1",), run_id: str = RUN,
               suite: wire.ValidationSuite = PASS_SUITE, cluster: str = "default") -> wire.Job:
    """Eviction's validation job (VAL-1), folded: step i on nodes[i]."""
    record = wire.Job(id=run_id, cluster=cluster, steps=len(nodes), duration_seconds=0, submitted_at=T0,
                      submitted_by="eviction", nodes=list(nodes), validation=suite)
    adapter.feed("HP_ALLOCATIONS", subjects.job(cluster, run_id), wire.encode(record))
    return record


def run_job(job_id: int, state: str = "PENDING", nodes: Sequence[str] = ("hpn1",), exit_code: int = 0,
            reason: str = "None", name: str = RUN) -> SlurmJob:
    """The Slurm job of a validation run: named after it, never requeued."""
    placed = nodes if state != "PENDING" else []
    return msgspec.structs.replace(job(job_id, state, placed, requeue=False, exit_code=exit_code, reason=reason),
                                   name=name, user_name="hpadm", partition="batch")


@dataclass
class Site:
    """A small Slurm for validation runs: the nodes, the jobs and the reservations it shows,
    and what it makes of the adapter's commands (each sbatch a new PENDING job)."""

    nodes: list[SlurmNode]
    jobs: list[SlurmJob] = field(default_factory=list)
    reservations: set[str] = field(default_factory=set)
    outputs: dict[str, str] = field(default_factory=dict)
    submitted: list[Submit] = field(default_factory=list)
    next_job: int = 40

    def observe(self, when: datetime) -> Observation:
        return Observation(list(self.nodes), list(self.jobs), {}, when, reservations=frozenset(self.reservations),
                           outputs=dict(self.outputs))

    def obey(self, actions: Sequence[Action], when: datetime) -> None:
        self.nodes = slurmctld(self.nodes, actions, when)
        for action in actions:
            match action:
                case Reserve(name, _, _):
                    self.reservations.add(name)
                case Unreserve(name):
                    self.reservations.discard(name)
                case Submit(run_id, _, _):
                    self.submitted.append(action)
                    self.jobs.append(run_job(self.next_job, name=run_id))
                    self.next_job += 1

    def move(self, job_id: int, state: str, exit_code: int = 0, reason: str = "None",
             nodes: Sequence[str] = ("hpn1",)) -> None:
        self.jobs = [run_job(job_id, state, nodes, exit_code, reason, j.name) if j.job_id == job_id else j
                     for j in self.jobs]

    def passes(self, adapter: Adapter, start: float, count: int = 1) -> list[Pass]:
        """Passes ten seconds apart, each one's commands carried out."""
        found = []
        for k in range(count):
            when = at(start + 10 * k)
            found.append(adapter.reconcile(self.observe(when)))
            self.obey(found[-1].actions, when)
        return found


def steps(emits: Sequence[Emit]) -> list[tuple[str, str, str, str]]:
    return [(a.job_id, a.id, a.node_id, a.state) for a in allocations(emits)]


def test_val1_a_validation_is_reserved_then_submitted_once_pinned_to_its_node() -> None:
    """VAL-1: eviction's validation job → a reservation of its node first (nothing submitted
    before it stands), then one sbatch named after the run, pinned to the node, in the
    reservation, for the suite's timeout in minutes, its output where the adapter reads it,
    the suite's argv quoted word by word; never submitted again while Slurm lists it."""
    adapter, site = Adapter(), Site([node(n) for n in NAMES])
    validation(adapter)
    [first] = site.passes(adapter, 0)
    assert (first.actions, first.emits) == ([Reserve(RESERVATION, ("hpn1",), "hpadm")], [])
    [second] = site.passes(adapter, 10)
    [submit] = second.actions
    assert submit == Submit(RUN, (
        "sbatch", "--parsable", f"--job-name={RUN}", "--nodes=1", "--nodelist=hpn1", f"--reservation={RESERVATION}",
        "--time=2", "--exclusive", "--no-requeue", f"--output={OUTPUT_DIR}/{RUN}.out", f"--chdir={OUTPUT_DIR}",
        "--wrap", "exec sh -c 'echo Result: PASS'"), OUTPUT_DIR)
    third, fourth = site.passes(adapter, 20, 2)
    assert steps(third.emits) == [(RUN, "slurm-40-0-hpn1", "hpn1", "placed")]
    assert (third.actions, fourth.actions, fourth.emits) == ([], [], [])
    assert len(site.submitted) == 1


def test_val1_the_run_ends_with_its_exit_status_and_output_on_every_node() -> None:
    """VAL-1: running → started; ended → one record per node with Slurm's exit code of the batch
    job, the output's tail and no timeout; the reservation goes once the run has ended."""
    adapter, site = Adapter(), Site([node(n) for n in NAMES])
    validation(adapter, ("hpn1", "hpn2"))
    site.passes(adapter, 0, 3)
    assert site.submitted[0].argv[-1] == "exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 sh -c 'echo Result: PASS'"
    assert "--nodes=2" in site.submitted[0].argv and "--nodelist=hpn1,hpn2" in site.submitted[0].argv
    site.move(40, "RUNNING", nodes=("hpn1", "hpn2"))
    [running_pass] = site.passes(adapter, 30)
    assert steps(running_pass.emits) == [(RUN, "slurm-40-0-hpn1", "hpn1", "started"),
                                         (RUN, "slurm-40-0-hpn2", "hpn2", "started")]
    site.move(40, "FAILED", exit_code=3 << 8, reason="NonZeroExitCode", nodes=("hpn1", "hpn2"))
    site.outputs[RUN] = "GPU 0: ok\nGPU 1: FAIL (row remap)\n"
    ended, after = site.passes(adapter, 40, 2)
    records = allocations(ended.emits)
    assert [(r.node_id, r.state, r.exit_code, r.timed_out, r.output, r.reason) for r in records] == [
        (n, "failed", 3, False, "GPU 0: ok\nGPU 1: FAIL (row remap)\n", "FAILED: exit code 3") for n in ("hpn1", "hpn2")]
    assert records[0].nodes == ["hpn1", "hpn2"] and records[0].requeueable is False
    assert ended.actions == [Unreserve(RESERVATION)] and site.reservations == set()
    assert (after.actions, after.emits) == ([], [])


@pytest.mark.parametrize(("slurm_state", "status", "reason", "record_state", "exit_code", "timed_out", "why"), [
    ("COMPLETED", 0, "None", "finished", 0, False, None),
    ("FAILED", 3 << 8, "NonZeroExitCode", "failed", 3, False, "FAILED: exit code 3"),
    ("FAILED", 9, "JobLaunchFailure", "failed", None, False, "FAILED: killed by signal 9"),
    ("FAILED", 0, "JobLaunchFailure", "failed", None, False, "FAILED: exit code 0"),
    ("TIMEOUT", 15, "TimeLimit", "failed", None, True, "TIMEOUT: TimeLimit"),
    ("CANCELLED", 15, "None", "failed", None, False, "CANCELLED"),
    ("NODE_FAIL", 0, "None", "failed", None, False, "NODE_FAIL"),
    ("OUT_OF_MEMORY", 0, "OutOfMemory", "failed", None, False, "OUT_OF_MEMORY: OutOfMemory"),
])
def test_val1_slurms_end_of_a_run_is_its_verdicts_input(slurm_state: str, status: int, reason: str,
                                                        record_state: str, exit_code: int | None, timed_out: bool,
                                                        why: str | None) -> None:
    """VAL-1: only COMPLETED and FAILED carry the suite's exit status (the wait status's high
    byte); TIMEOUT is the suite's timeout; any other end has no exit status, so that it is
    never judged as a pass."""
    end = run_end(slurm_state, status, reason)
    assert (end.state, end.exit_code, end.timed_out, end.reason) == (record_state, exit_code, timed_out, why)


def test_val1_a_held_node_is_validated_without_our_drain_and_drained_again_before_its_reservation_goes() -> None:
    """VAL-1, SLU-2: a held node is drained with our reason; a validation reserves it, and only
    then is our drain lifted (a DRAIN node runs nothing, reservation or not); it stays undrained
    while the run waits and runs; once it has ended the node is drained again, and the
    reservation goes only after Slurm shows that drain, so no user job lands between."""
    adapter, site = Adapter(), Site([node(n) for n in NAMES])
    adapter.state.nodes["hpn1"] = NodeWant(holds=[hold("h-1")])
    site.passes(adapter, 0)
    assert site.nodes[0].drained
    validation(adapter)
    [reserving] = site.passes(adapter, 10)
    assert reserving.actions == [Reserve(RESERVATION, ("hpn1",), "hpadm")] and site.nodes[0].drained
    [lifting] = site.passes(adapter, 20)
    assert [type(a) for a in lifting.actions] == [Submit, Resume] and not site.nodes[0].drained
    site.move(40, "RUNNING")
    waiting = site.passes(adapter, 30, 2)
    assert [p.actions for p in waiting] == [[], []]
    site.move(40, "COMPLETED")
    [ended] = site.passes(adapter, 50)
    assert [type(a) for a in ended.actions] == [Drain] and RESERVATION in site.reservations
    assert steps(ended.emits) == [(RUN, "slurm-40-0-hpn1", "hpn1", "finished")]
    [unreserving, after] = site.passes(adapter, 60, 2)
    assert unreserving.actions == [Unreserve(RESERVATION)] and site.nodes[0].drained
    assert site.nodes[0].reason == f"{PREFIX} hold h-1 (cordon)"
    assert (after.actions, after.emits) == ([], [])
    assert adapter.state.overridden == {}  # our own resume is no administrator's


def test_val4_a_run_on_a_node_drained_by_hand_waits_queued_and_says_so_once() -> None:
    """VAL-4, SLU-2: an administrator's drain is never lifted: the run waits (placed, never
    failed) and the adapter says once why."""
    adapter, site = Adapter(), Site([node("hpn1", reason="bad PSU, ticket 4711", drained=True)])
    validation(adapter)
    found = site.passes(adapter, 0, 4)
    assert [a for p in found for a in p.actions if isinstance(a, Resume | Drain)] == []
    assert steps([e for p in found for e in p.emits]) == [(RUN, "slurm-40-0-hpn1", "hpn1", "placed")]
    said = [n.event for p in found for n in p.notes]
    assert said == ["validation waits: node drained by hand"]


def test_val1_a_restarted_adapter_finds_its_run_by_name_and_never_submits_twice() -> None:
    """VAL-1, SLU-5: an adapter that submitted and was restarted before it wrote any record
    finds the job by its name; one that wrote records knows it from their ids; neither submits."""
    adapter, site = Adapter(), Site([node(n) for n in NAMES])
    validation(adapter)
    site.passes(adapter, 0, 2)
    assert len(site.submitted) == 1
    unrecorded = Adapter()
    validation(unrecorded)
    [found] = site.passes(unrecorded, 20)
    assert found.actions == [] and steps(found.emits) == [(RUN, "slurm-40-0-hpn1", "hpn1", "placed")]
    site.move(40, "RUNNING")
    site.passes(unrecorded, 30)
    refolded = Adapter()
    validation(refolded)
    refolded.refold(unrecorded.emitted)
    assert refolded.state.validations[RUN].slurm_job == 40
    [again] = site.passes(refolded, 40)
    assert (again.actions, again.emits) == ([], [])
    assert len(site.submitted) == 1


@pytest.mark.parametrize(("accounting", "status", "submitted"), [
    ({40: "FAILED"}, 3 << 8, 1),
    ({}, 0, 2),
])
def test_val1_a_run_that_left_the_queue_unseen_ends_as_accounting_says_else_runs_again(
        accounting: dict[int, str], status: int, submitted: int) -> None:
    """VAL-1, VAL-4: a run whose job left squeue while the adapter was away ends as sacct says,
    with its exit code; with no accounting its end is unknown, and it is submitted again rather
    than judged on a guess (no verdict without an exit status)."""
    adapter, site = Adapter(), Site([node(n) for n in NAMES])
    validation(adapter)
    site.passes(adapter, 0, 3)
    site.jobs = []
    seen = Observation(site.nodes, [], accounting, at(600), exits={40: status},
                       reservations=frozenset(site.reservations), outputs={RUN: "FAIL\n"} if accounting else {})
    found = adapter.reconcile(seen)
    site.obey(found.actions, at(600))
    if accounting:
        [record] = allocations(found.emits)
        assert (record.state, record.exit_code, record.reason, record.output) == (
            "failed", 3, "FAILED: exit code 3 (from Slurm accounting)", "FAIL\n")
    else:
        assert found.emits == [] and [n.event for n in found.notes] == [
            "validation job left Slurm's queue unobserved; submitted again"]
        site.passes(adapter, 610)
    assert len(site.submitted) == submitted


def test_val1_a_validation_job_in_slurm_is_no_ones_allocation_but_its_own() -> None:
    """VAL-1, SLU-3: the run's Slurm job is recorded under the run's id only, never as a user
    job of the node (which eviction would count, drain around or attribute), also once ended."""
    adapter, site = Adapter(), Site([node(n) for n in NAMES])
    validation(adapter)
    site.passes(adapter, 0, 2)
    site.move(40, "RUNNING")
    site.jobs.append(job(7, nodes=["hpn2"]))
    site.passes(adapter, 20)
    site.move(40, "COMPLETED")
    site.passes(adapter, 30, 3)
    assert sorted({a.job_id for a in allocations(adapter.emitted)}) == ["7", RUN]


def test_val1_a_second_job_of_one_run_is_cancelled() -> None:
    """VAL-1: an sbatch that timed out yet landed, then sent again: the second job is cancelled."""
    adapter, site = Adapter(), Site([node(n) for n in NAMES], reservations={RESERVATION})
    validation(adapter)
    site.jobs = [run_job(40), run_job(41)]
    [found] = site.passes(adapter, 0)
    assert found.actions == [CancelRun(41, RUN)]
    assert steps(found.emits) == [(RUN, "slurm-40-0-hpn1", "hpn1", "placed")]


def test_val1_a_node_slurm_does_not_have_fails_the_run_at_once_naming_it() -> None:
    """VAL-1, SLU-1: a run on a node this Slurm cluster does not have cannot run: its steps end
    failed, without exit status, naming the node; nothing is reserved or submitted."""
    adapter, site = Adapter(), Site([node("hpn1")])
    validation(adapter, ("hpn1", "hpn9"))
    [found] = site.passes(adapter, 0)
    assert found.actions == []
    assert [(r.node_id, r.state, r.exit_code, r.reason) for r in allocations(found.emits)] == [
        (n, "failed", None, "not a node of this Slurm cluster: hpn9") for n in ("hpn1", "hpn9")]


def test_val1_only_our_reservations_that_no_run_needs_are_deleted() -> None:
    """VAL-1, SLU-5: a reservation of ours left by a run this adapter no longer has (a crash
    between the end and the delete) goes; a site's own reservations stay."""
    adapter = Adapter()
    seen = observe([node("hpn1")])
    seen = Observation(seen.nodes, [], {}, T0, reservations=frozenset(
        {"healthplane-val-ffffffffffffffff", "weekly-maint", "healthplane-other"}))
    assert adapter.reconcile(seen).actions == [Unreserve("healthplane-val-ffffffffffffffff")]


def test_val1_other_jobs_and_other_clusters_runs_are_not_this_adapters() -> None:
    """VAL-1: a job with no validation (``sim submit``'s) and another cluster's run are ignored."""
    adapter = Adapter()
    plain = wire.Job(id="job-1", cluster="default", steps=1, duration_seconds=5, submitted_at=T0, submitted_by="sim")
    adapter.feed("HP_ALLOCATIONS", subjects.job("default", "job-1"), wire.encode(plain))
    validation(adapter, cluster="other")
    assert adapter.state.validations == {}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["PENDING", "RUNNING", "COMPLETED", "FAILED", "TIMEOUT", "gone"]), min_size=1,
                max_size=6), st.booleans())
def test_val1_no_run_record_is_written_twice_even_after_a_restart(lives: list[str], drained: bool) -> None:
    """VAL-1, SLU-5: whatever Slurm shows of a run pass after pass, each step is placed,
    started and ended at most once, never after its end; a restarted adapter that folds its
    records back writes nothing again and submits nothing."""
    adapter, site = Adapter(), Site([node(n) for n in NAMES])
    if drained:
        adapter.state.nodes["hpn1"] = NodeWant(holds=[hold("h-1")])
    validation(adapter)
    site.passes(adapter, 0, 3)
    for k, life in enumerate(lives):
        if life == "gone":
            site.jobs = []
        elif site.jobs and site.jobs[0].job_state not in ("COMPLETED", "FAILED", "TIMEOUT"):
            site.move(site.jobs[0].job_id, life, exit_code=256 if life == "FAILED" else 0)
        site.passes(adapter, 30 + 10 * k)
    ids = [e.msg_id for e in adapter.emitted]
    assert len(ids) == len(set(ids))
    order = {"placed": 0, "started": 1, "finished": 2, "failed": 2}
    for alloc_id in {a.id for a in allocations(adapter.emitted)}:
        seen = [order[s] for i, s in states(adapter.emitted) if i == alloc_id]
        assert seen == sorted(seen) and seen.count(2) <= 1
    restarted = Adapter(state=AdapterState(nodes=dict(adapter.state.nodes)))
    validation(restarted)
    restarted.refold(adapter.emitted)
    found = restarted.reconcile(site.observe(at(500)))
    assert found.emits == [] and not [a for a in found.actions if isinstance(a, Submit)]


@pytest.mark.parametrize(("seconds", "minutes"), [(1, 1), (60, 1), (61, 2), (600, 10), (86400, 1440)])
def test_val1_the_suites_timeout_is_slurms_time_limit_rounded_up(seconds: int, minutes: int) -> None:
    assert time_limit_minutes(seconds) == minutes


@pytest.mark.parametrize("command", [
    ["dcgmi", "diag", "-r", "2"],
    ["sh", "-c", "echo 'it''s' \"$HOME\"; exit 3"],
    ["burn", "--label", "a b;c|d`e`$(f)"],
])
def test_val1_the_suites_argv_reaches_the_node_word_for_word(command: list[str]) -> None:
    """VAL-1: no shell reading of the suite's own: the batch script's words are its argv."""
    script = batch_script(command, 1)
    assert shlex.split(script) == ["exec", *command]
    assert shlex.split(batch_script(command, 3))[:4] == ["exec", "srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]


def test_val1_the_output_is_read_from_its_end_never_more_than_the_bound(tmp_path: Path) -> None:
    """VAL-1: the tail of a large output, at most the bound in bytes, a character cut by the
    bound dropped; a short one whole; a missing file is no output."""
    big = tmp_path / "big.out"
    big.write_bytes(("é" * 5000 + "\nResult: FAIL\n").encode())
    tail = read_tail(str(big), wire.OUTPUT_TAIL_BYTES)
    assert tail is not None and tail.endswith("\nResult: FAIL\n") and "\ufffd" not in tail
    assert len(tail.encode()) <= wire.OUTPUT_TAIL_BYTES
    small = tmp_path / "small.out"
    small.write_text("Result: PASS\n")
    assert read_tail(str(small), wire.OUTPUT_TAIL_BYTES) == "Result: PASS\n"
    assert read_tail(str(tmp_path / "none.out"), wire.OUTPUT_TAIL_BYTES) is None
