"""Eviction's rules and every message of reference 002 and the eviction parts of reference 000,
held as golden strings, through the pure core (EVI-1 … EVI-7)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import ClusterConfig
from healthplane.runtime.fold import Emit, IdentityMismatch, Inbound
from healthplane_eviction import rules
from healthplane_eviction.fold import EvictionCore, EvictionState

T0 = datetime(2026, 8, 11, 9, 0, tzinfo=UTC)
NODE = "10.0.0.42/9100"


class Harness:
    """Feeds records to the core the way the Processor does, keeping every emitted record."""

    def __init__(self) -> None:
        self.core = EvictionCore()
        self.state = self.core.initial_state()
        self.seq = 0
        self.emitted: list[Emit] = []
        self.inputs: list[Inbound] = []

    def feed(self, stream: str, subject: str, record: wire.Record) -> list[Emit]:
        self.seq += 1
        inbound = Inbound(stream=stream, seq=self.seq, subject=subject, data=wire.encode(record), headers={},
                          at=T0 + timedelta(seconds=self.seq), caught_up=True)
        self.inputs.append(inbound)
        self.state, emits, _ = self.core.step(self.state, inbound)
        self.emitted += emits
        return list(emits)

    def resources(self, node: str = NODE, provisioned: bool = False, ready: bool = True) -> None:
        self.feed("HP_RESOURCES", subjects.resource("default", node), wire.ResourceReport(
            node_id=node, cluster="default", hostname=f"host-{node}", sent_at=T0, cores=192, memory_bytes=1 << 40,
            devices=[], ready=ready, provisioned=provisioned))

    def command(self, verb: str, node: str = NODE, **fields: Any) -> wire.CommandOutcome:
        command = wire.Command(id=f"cmd-{self.seq}", node_id=node, cluster="default", verb=verb,  # type: ignore[arg-type]
                               actor="alice", issued_at=T0, **fields)
        emits = self.feed("HP_COMMANDS", subjects.command("default", node, verb, "alice"), command)
        outcomes = [wire.decode(wire.CommandOutcome, e.payload) for e in emits if ".outcome." in e.subject]
        assert len(outcomes) == 1
        return outcomes[0]

    def alloc(self, alloc_id: str, state: str = "started", node: str = NODE, **fields: Any) -> list[Emit]:
        return self.feed("HP_ALLOCATIONS", subjects.allocation("default", node, alloc_id), wire.Allocation(
            id=alloc_id, job_id=alloc_id.split(".")[0], node_id=node, cluster="default", state=state,  # type: ignore[arg-type]
            at=T0, **fields))

    def event(self, kind: str, node: str = NODE, **fields: Any) -> list[Emit]:
        return self.feed("HP_NODE_EVENTS", subjects.event("default", node, kind), wire.NodeEvent(
            id=f"e{self.seq}", node_id=node, cluster="default", type=kind, occurred_at=T0,  # type: ignore[arg-type]
            message="", actor="health-ingest", **fields))

    def raised(self, kind: str, severity: str, node: str = NODE) -> list[Emit]:
        return self.event("CONDITION_RAISED", node, condition=wire.ConditionChange(
            type=kind, reason="x", severity=severity, message="m"))  # type: ignore[arg-type]

    def config(self, **node_health: Any) -> None:
        config = ClusterConfig.model_validate({"nodeHealth": node_health})
        self.feed("HP_CONFIG", subjects.CONFIG, wire.ConfigEnvelope(version=self.seq + 1, applied_at=T0, actor="t",
                                                                   config=config.to_wire()))

    def provider(self, directive_id: str, accepted: bool, message: str, node: str = NODE) -> list[Emit]:
        return self.feed("HP_COMMANDS", subjects.provision("default", node), wire.TerminationResult(
            directive_id=directive_id, node_id=node, cluster="default", accepted=accepted, message=message, at=T0))


def directives(emits: Sequence[Emit]) -> list[wire.Directive]:
    return [wire.decode(wire.Directive, e.payload) for e in emits if ".directive." in e.subject]


def events(emits: Sequence[Emit]) -> list[wire.NodeEvent]:
    return [wire.decode(wire.NodeEvent, e.payload) for e in emits if ".event." in e.subject]


# ---------------------------------------------------------------------------- golden strings


def test_evi3_the_three_evict_message_forms() -> None:
    reason = "GPU 2 throwing uncorrectable ECC"
    assert rules.held_message(NODE, reason, "move", 0) == (
        "node 10.0.0.42/9100 was held: GPU 2 throwing uncorrectable ECC; work moved to another node")
    assert rules.held_message(NODE, reason, "fail", 0) == (
        "node 10.0.0.42/9100 was held: GPU 2 throwing uncorrectable ECC; job failed. Set\n"
        "policy.retry.on to node for work that is safe to run again from the beginning").replace("\n", " ")
    assert rules.held_message(NODE, reason, "fail-budget", 3) == (
        "node 10.0.0.42/9100 was held: GPU 2 throwing uncorrectable ECC; job failed after 3 node restart(s), "
        "the limit for this step")


def test_evi5_fault_eviction_message_forms() -> None:
    assert rules.fault_message("gpu-14", "gpu_ecc_errors", "fail", 0) == (
        "node gpu-14: GPU ECC errors; job failed and the node cordoned. Set policy.restart to on-node-fault "
        "for work that is safe to run again from the beginning")
    assert rules.fault_message("gpu-14", "gpu_ecc_errors", "move", 0) == (
        "node gpu-14: GPU ECC errors; work moved off the node and the node cordoned")


def test_evi6_node_gone_messages_name_a_fault_only_when_real() -> None:
    assert rules.offline_message(NODE, None, "fail", 0) == (
        "node 10.0.0.42/9100 went offline; job failed. Set policy.restart to on-node-fault for work that is "
        "safe to run again from the beginning")
    assert rules.offline_message(NODE, "memory_errors", "fail", 0) == (
        "node 10.0.0.42/9100: memory errors; job stopped responding on this node")
    assert rules.worst_fault({"heartbeat_missed": "critical", "collector_failed": "warning"}) is None
    assert rules.worst_fault({"heartbeat_missed": "critical", "memory_errors": "warning"}) == "memory_errors"


def test_evi4_refusal_messages() -> None:
    assert rules.static_node("cn-042") == "cannot deprovision static node cn-042"
    assert rules.static_skipped("cn-042") == (
        "skipped cn-042: statically provisioned; Healthplane did not create this instance")
    assert rules.provisioning_unknown("cn-042") == (
        "rpc error: code = Unavailable desc = node cn-042 has not reported its resources yet, so whether "
        "Healthplane provisioned it is not known; retry")
    assert rules.not_drainable(NODE, "NOT_READY") == (
        "node 10.0.0.42/9100 is NOT_READY and cannot be drained: only a READY or already cordoned node can be "
        "taken out of service")


# ---------------------------------------------------------------------------- holds


def test_evi1_cordon_then_uncordon_reports_what_remains() -> None:
    h = Harness()
    h.resources()
    cordon = h.command("cordon", reason="flaky NIC")
    assert cordon.result == "applied"
    assert cordon.message == f"cordon hold created for {NODE}: {cordon.hold_ids[0]}"
    evict = h.command("evict", reason="GPU 2 throwing uncorrectable ECC")
    assert evict.message == f"evict hold created for {NODE}: {evict.hold_ids[0]}"
    assert h.command("uncordon").message == f"1 cordon hold(s) released for {NODE}: 1 hold(s) remain (evict)"
    assert h.command("uncordon").message == f"0 cordon hold(s) released for {NODE}: 1 hold(s) remain (evict)"
    released = h.command("hold-release", effect="evict")
    assert released.message == f"1 hold(s) released for {NODE}: 0 hold(s) remain"
    assert not h.state.nodes[f"default\x00{NODE}"].holds


def test_evi1_hold_events_carry_the_hold_and_actor() -> None:
    h = Harness()
    h.resources()
    outcome = h.command("cordon", reason="maintenance")
    created = [e for e in events(h.emitted) if e.type == "HOLD_CREATED"]
    assert created[0].hold is not None and created[0].hold.id == outcome.hold_ids[0]
    assert (created[0].hold.effect, created[0].hold.reason, created[0].actor) == ("cordon", "maintenance", "alice")
    assert {e.type for e in events(h.emitted)} == {"HOLD_CREATED", "NODE_CORDONED"}


def test_unknown_node_and_unknown_hold_are_refused() -> None:
    h = Harness()
    assert h.command("cordon", node="ghost").message == "node ghost not found"
    h.resources()
    refused = h.command("hold-release", hold_ids=["nope"])
    assert (refused.result, refused.message) == ("refused", f"hold nope not found on {NODE}")


# ---------------------------------------------------------------------------- drain


def test_evi2_drain_passive_leaves_work_running() -> None:
    h = Harness()
    h.resources()
    h.alloc("j1.0.0")
    outcome = h.command("drain")
    assert (outcome.result, outcome.message) == ("applied", "Cordoned 1 node(s)")
    drained = next(e for e in events(h.emitted) if e.type == "NODE_DRAINED")
    assert (drained.drain_mode, drained.moved) == ("passive", 0)
    assert not directives(h.emitted)


def test_evi2_drain_active_requeues_every_running_allocation() -> None:
    h = Harness()
    h.resources()
    h.alloc("j1.0.0")
    h.alloc("j2.0.0")
    outcome = h.command("drain", active=True, reason="failing disk")
    assert outcome.message == "Cordoned 1 node(s); requeued 2 allocation(s)"
    sent = directives(h.emitted)
    assert [(d.action, d.allocation_id) for d in sent] == [("requeue", "j1.0.0"), ("requeue", "j2.0.0")]
    assert sent[0].message == f"node {NODE} was drained: failing disk; work moved to another node"


def test_evi2_only_ready_or_cordoned_nodes_drain() -> None:
    h = Harness()
    h.resources(ready=False)
    refused = h.command("drain")
    assert (refused.result, refused.message) == ("refused", rules.not_drainable(NODE, "NOT_READY"))
    h.resources(ready=True)
    h.event("HEARTBEAT_MISSED")
    assert h.command("drain").message == rules.not_drainable(NODE, "OFFLINE")
    h.event("HEARTBEAT_RESUMED")
    h.command("cordon")
    assert h.command("drain").result == "applied"  # already cordoned: allowed


def test_evi2_drain_all_skips_what_is_not_ready() -> None:
    h = Harness()
    h.resources()
    h.command("cordon")
    skipped = h.command("drain", batch_id="b1")
    assert (skipped.result, skipped.skipped) == ("refused", True)


# ---------------------------------------------------------------------------- evict


def test_evi3_evict_moves_declared_work_fails_the_rest_and_respects_the_budget() -> None:
    h = Harness()
    h.resources()
    h.alloc("declared.0.0", retry_on=["node"], retry_attempts=5, node_fault_restarts=1)
    h.alloc("undeclared.0.0")
    h.alloc("spent.0.0", retry_on=["node"], retry_attempts=5, node_fault_restarts=3)  # maxEvictionRestarts 3
    h.alloc("own-limit.0.0", retry_on=["node"], retry_attempts=1, node_fault_restarts=1)
    outcome = h.command("evict", reason="GPU 2 throwing uncorrectable ECC")
    assert (outcome.moved, outcome.failed) == (1, 3)
    by_alloc = {d.allocation_id: d for d in directives(h.emitted)}
    reason = "GPU 2 throwing uncorrectable ECC"
    assert by_alloc["declared.0.0"].action == "requeue"
    assert by_alloc["declared.0.0"].message == rules.held_message(NODE, reason, "move", 1)
    assert by_alloc["undeclared.0.0"].message == rules.held_message(NODE, reason, "fail", 0)
    assert by_alloc["spent.0.0"].message.endswith("job failed after 3 node restart(s), the limit for this step")
    assert by_alloc["own-limit.0.0"].message.endswith("job failed after 1 node restart(s), the limit for this step")
    evicted = next(e for e in events(h.emitted) if e.type == "NODE_EVICTED")
    assert (evicted.moved, evicted.failed, evicted.fault_class) == (1, 3, None)


def test_evi3_the_evict_hold_outlives_the_eviction() -> None:
    h = Harness()
    h.resources()
    h.command("evict", reason="bad GPU")
    late = directives(h.alloc("late.0.0", state="placed"))
    assert [(d.action, d.allocation_id) for d in late] == [("fail", "late.0.0")]
    assert h.command("uncordon").message == f"0 cordon hold(s) released for {NODE}: 1 hold(s) remain (evict)"


# ---------------------------------------------------------------------------- deprovision


def test_evi4_static_and_unknown_provisioning() -> None:
    h = Harness()
    h.event("CONDITION_CLEARED", condition=wire.ConditionChange(type="memory_errors", reason="x", severity="info",
                                                               message="m"))  # known, resources not reported
    unknown = h.command("deprovision")
    assert (unknown.result, unknown.message) == ("retry", rules.provisioning_unknown(NODE))
    assert h.command("deprovision", batch_id="b").message == rules.provisioning_unknown_skipped(NODE)
    h.resources(provisioned=False)
    static = h.command("deprovision", evict=True)
    assert (static.result, static.message) == ("refused", "cannot deprovision static node 10.0.0.42/9100")
    assert not h.state.nodes[f"default\x00{NODE}"].holds  # refused having changed nothing
    skipped = h.command("deprovision", batch_id="b", evict=True)
    assert (skipped.skipped, skipped.message) == (True, rules.static_skipped(NODE))


def test_evi4_deprovision_waits_for_the_node_to_empty_then_tears_down() -> None:
    h = Harness()
    h.resources(provisioned=True)
    h.alloc("five-day.0.0")
    outcome = h.command("deprovision", reason="scaling down")
    assert outcome.message == f"deprovision hold created for {NODE}: {outcome.hold_ids[0]}"
    assert not directives(h.emitted)  # still running its work
    finished = directives(h.alloc("five-day.0.0", state="finished"))
    assert [d.action for d in finished] == ["terminate"]
    result = events(h.provider(finished[0].id, True, "instance i-0abc terminating"))
    assert [e.type for e in result] == ["NODE_DEPROVISIONED"]
    assert h.command("cordon").message == f"node {NODE} not found"  # the instance is gone


def test_evi4_deprovision_evict_places_two_holds_deprovision_first() -> None:
    h = Harness()
    h.resources(provisioned=True)
    h.alloc("job.0.0", retry_on=["node"], retry_attempts=2)
    outcome = h.command("deprovision", evict=True, reason="scaling down")
    deprovision_id, evict_id = outcome.hold_ids
    assert outcome.message == (f"deprovision hold created for {NODE}: {deprovision_id}\n"
                               f"evict hold created for {NODE}: {evict_id}")
    assert [d.action for d in directives(h.emitted)] == ["requeue"]
    # the scheduler ends the allocation; the node is then empty and torn down
    assert [d.action for d in directives(h.alloc("job.0.0", state="requeued"))] == ["terminate"]


def test_evi4_releasing_the_deprovision_hold_cancels_the_teardown() -> None:
    h = Harness()
    h.resources(provisioned=True)
    h.alloc("job.0.0")
    h.command("deprovision")
    h.command("hold-release", effect="deprovision")
    assert not directives(h.alloc("job.0.0", state="finished"))


def test_evi4_force_tears_down_now_and_prints_the_providers_answer() -> None:
    h = Harness()
    h.resources(provisioned=True)
    h.alloc("job.0.0")
    emits = h.feed("HP_COMMANDS", subjects.command("default", NODE, "deprovision", "alice"), wire.Command(
        id="force-1", node_id=NODE, cluster="default", verb="deprovision", actor="alice", issued_at=T0, force=True))
    terminate = directives(emits)
    assert [d.action for d in terminate] == ["terminate"] and not [e for e in emits if ".outcome." in e.subject]
    answer = h.provider(terminate[0].id, True, "TerminateInstances: i-0abc shutting-down")
    outcome = next(wire.decode(wire.CommandOutcome, e.payload) for e in answer if ".outcome." in e.subject)
    assert (outcome.command_id, outcome.message) == ("force-1", "TerminateInstances: i-0abc shutting-down")
    assert [d.action for d in directives(answer)] == ["fail"]  # its work ended with the instance


def test_pol4_replace_ends_in_node_replaced_and_a_rejection_changes_nothing() -> None:
    h = Harness()
    h.resources(provisioned=True)
    h.command("replace")
    terminate = directives(h.emitted)[0]
    assert events(h.provider(terminate.id, False, "InsufficientInstanceCapacity")) == []
    assert h.state.nodes[f"default\x00{NODE}"].holds  # still out of service
    retried = h.command("replace")  # automation asks again: a new terminate, not a second hold
    assert retried.message.startswith(f"deprovision hold already in place for {NODE}: ")
    assert len(h.state.nodes[f"default\x00{NODE}"].holds) == 1
    again = directives(h.emitted)[-1]
    assert again.id != terminate.id and again.action == "terminate"
    assert [e.type for e in events(h.provider(again.id, True, "ok"))] == ["NODE_REPLACED"]


# ---------------------------------------------------------------------------- faults, node loss, attribution


def test_evi5_fault_eviction_cordons_moves_and_records_the_fault_class() -> None:
    h = Harness()
    h.config(evictOnFaultClasses=["GPU_ECC_ERRORS"])
    h.resources(node="gpu-14")
    h.alloc("safe.0.0", node="gpu-14", restart="on-node-fault")
    h.alloc("plain.0.0", node="gpu-14")
    emits = h.raised("gpu_ecc_errors", "critical", node="gpu-14")
    sent = {d.allocation_id: d for d in directives(emits)}
    assert sent["safe.0.0"].message == "node gpu-14: GPU ECC errors; work moved off the node and the node cordoned"
    assert sent["plain.0.0"].action == "fail"
    kinds = [e.type for e in events(emits)]
    assert kinds == ["HOLD_CREATED", "NODE_CORDONED", "NODE_EVICTED"]
    evicted = events(emits)[-1]
    assert (evicted.fault_class, evicted.moved, evicted.failed) == ("GPU_ECC_ERRORS", 1, 1)


def test_evi5_nothing_evicts_until_a_class_is_named_and_warnings_never_do() -> None:
    h = Harness()
    h.resources()
    h.alloc("a.0.0")
    assert not directives(h.raised("gpu_ecc_errors", "critical"))
    h.config(evictOnFaultClasses=["GPU_XID_ERRORS"])
    assert not directives(h.raised("gpu_xid_errors", "warning"))  # an application Xid: the job's own bug


def test_evi6_node_gone_releases_work_at_once() -> None:
    h = Harness()
    h.resources()
    h.alloc("restartable.0.0", restart="on-node-fault")
    h.alloc("plain.0.0")
    sent = {d.allocation_id: d for d in directives(h.event("HEARTBEAT_MISSED"))}
    assert sent["restartable.0.0"].action == "requeue"
    assert sent["plain.0.0"].message == rules.offline_message(NODE, None, "fail", 0)


def test_evi6_and_evi7_a_real_fault_is_named_and_the_failure_attributed() -> None:
    h = Harness()
    h.resources()
    h.raised("memory_errors", "warning")
    h.alloc("plain.0.0")
    sent = directives(h.event("HEARTBEAT_MISSED"))
    assert sent[0].message == "node 10.0.0.42/9100: memory errors; job stopped responding on this node"
    attributed = events(h.alloc("plain.0.0", state="failed", reason=sent[0].message))
    assert [(e.type, e.fault_class) for e in attributed] == [("JOB_FAILURE_ATTRIBUTED", "MEMORY_ERRORS")]


def test_evi7_operator_evictions_and_clean_nodes_are_not_attributed() -> None:
    h = Harness()
    h.resources()
    h.alloc("clean.0.0")
    assert not events(h.alloc("clean.0.0", state="failed"))  # no fault on the node
    h.raised("gpu_ecc_errors", "critical")
    h.alloc("evicted.0.0")
    h.command("evict", reason="operator")
    assert not [e for e in events(h.alloc("evicted.0.0", state="failed")) if e.type == "JOB_FAILURE_ATTRIBUTED"]
    h.alloc("crashed.0.0")
    attributed = events(h.alloc("crashed.0.0", state="failed"))
    assert [e.fault_class for e in attributed] == []  # evict hold: "crashed" was failed by the hold itself


def test_rel3_sec7_a_command_on_the_wrong_subject_is_rejected() -> None:
    """SEC-7: the subject is the identity; a command for NODE on another node's subject, or
    from another actor than the one nats-server bound to the subject, is never applied."""
    h = Harness()
    h.resources()
    command = wire.Command(id="x", node_id=NODE, cluster="default", verb="cordon", actor="a", issued_at=T0)
    for subject in (subjects.command("default", "other", "cordon", "a"),
                    subjects.command("default", NODE, "cordon", "someone-else")):
        inbound = Inbound(stream="HP_COMMANDS", seq=1, subject=subject, data=wire.encode(command), headers={}, at=T0,
                          caught_up=True)
        with pytest.raises(IdentityMismatch):
            h.core.step(h.state, inbound)
    assert h.state.nodes[subjects.node_key("default", NODE)].holds == {}


# ---------------------------------------------------------------------------- replay


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["cordon", "uncordon", "drain", "evict", "alloc", "end", "fault", "gone", "back"]),
                max_size=25))
def test_rel1_replaying_the_inputs_rebuilds_the_same_state(script: list[str]) -> None:
    """The state is a pure fold: refolding the same inputs (a restart) gives the same state and
    the same records, and it survives a snapshot round trip."""
    h = Harness()
    h.config(evictOnFaultClasses=["GPU_ECC_ERRORS"])
    h.resources(provisioned=True)
    for index, action in enumerate(script):
        if action in ("cordon", "uncordon", "drain", "evict"):
            h.command(action, active=action == "drain")
        elif action == "alloc":
            h.alloc(f"j{index}.0.0", retry_on=["node"], retry_attempts=2, restart="on-node-fault")
        elif action == "end":
            running = h.state.nodes[f"default\x00{NODE}"].running
            if running:
                h.alloc(next(iter(running)), state="finished")
        elif action == "fault":
            h.raised("gpu_ecc_errors", "critical")
        elif action == "gone":
            h.event("HEARTBEAT_MISSED")
        else:
            h.event("HEARTBEAT_RESUMED")
    again = EvictionCore()
    state = again.initial_state()
    records: list[Emit] = []
    for inbound in h.inputs:
        state, emits, _ = again.step(state, inbound)
        records += emits
    assert msgspec.json.encode(state) == msgspec.json.encode(h.state)
    assert [e.payload for e in records] == [e.payload for e in h.emitted]
    restored = msgspec.json.decode(msgspec.json.encode(h.state), type=EvictionState)
    assert msgspec.json.encode(restored) == msgspec.json.encode(h.state)
