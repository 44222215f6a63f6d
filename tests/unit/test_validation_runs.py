"""Validation runs through eviction's and the reference scheduler's pure cores, folding each
other's records as the Processors do (VAL-1..4): eviction appends a validation job, the
scheduler runs it pinned to its nodes and reports each step, eviction judges the run."""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import parse_cluster_config
from healthplane.runtime.fold import Emit, Inbound
from healthplane_eviction.fold import EvictionCore
from healthplane_scheduler.fold import SchedulerCore

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
CLUSTER = "default"
SUITE = {"command": ["dcgmi", "diag", "-r", "2"], "timeoutSeconds": 60, "gpus": 8}


def names(count: int) -> list[str]:
    return [f"gpu-{i:02d}" for i in range(count)]


class Loop:
    """Eviction and the reference scheduler, each folding the other's records in order."""

    def __init__(self, nodes: Iterable[str], *, validation: dict[str, Any] | None = None, gpus: int = 8,
                 validation_s: float = 5.0, remediation: dict[str, Any] | None = None,
                 domains: dict[str, Any] | None = None) -> None:
        self.eviction, self.scheduler = EvictionCore(), SchedulerCore(1, validation_s)
        self.es, self.ss = self.eviction.initial_state(), self.scheduler.initial_state()
        self.now = T0
        self.seq = 0
        self.events: list[wire.NodeEvent] = []
        self.outcomes: list[wire.CommandOutcome] = []
        self.allocations: list[wire.Allocation] = []
        self.validation_jobs: list[wire.Job] = []
        self.remediations: list[wire.RemediationRequest] = []
        config = parse_cluster_config({"validation": validation or {
            "suites": {"diag": SUITE}, "defaultSuite": "diag", "validateBeforeReturn": True},
            "remediation": remediation or {}, "domains": domains or {}}).to_wire()
        envelope = wire.ConfigEnvelope(version=1, applied_at=T0, actor="test", config=config)
        self.to_eviction("HP_CONFIG", subjects.CONFIG, envelope)
        self.to_scheduler("HP_CONFIG", subjects.CONFIG, envelope)
        for node in nodes:
            devices = [wire.ResourceDevice(kind="gpu", vendor="nvidia", index=i, pci_bus_id=f"0000:{i:02x}:00.0")
                       for i in range(gpus)]
            self.to_eviction("HP_RESOURCES", subjects.resource(CLUSTER, node), wire.ResourceReport(
                node_id=node, cluster=CLUSTER, hostname=node, sent_at=T0, ready=True, cores=64,
                memory_bytes=1 << 30, devices=devices))
            self.to_scheduler("HP_NODES", subjects.node_view(CLUSTER, node), wire.NodeView(
                node_id=node, cluster=CLUSTER, hostname=node, status="READY", health="HEALTHY",
                last_reported_at=T0, score=100, score_explanation=None, conditions=[],
                attributed_failures=wire.AttributedFailures(), holds=[]))

    def _inbound(self, stream: str, subject: str, payload: bytes) -> Inbound:
        self.seq += 1
        return Inbound(stream, self.seq, subject, payload, {}, self.now, True)

    def to_eviction(self, stream: str, subject: str, record: wire.Record | bytes) -> None:
        payload = record if isinstance(record, bytes) else wire.encode(record)
        self.es, emits, _ = self.eviction.step(self.es, self._inbound(stream, subject, payload))
        for emit in emits:
            self._from_eviction(emit)

    def to_scheduler(self, stream: str, subject: str, record: wire.Record | bytes) -> None:
        payload = record if isinstance(record, bytes) else wire.encode(record)
        self.ss, emits, _ = self.scheduler.step(self.ss, self._inbound(stream, subject, payload))
        assert not emits

    def _from_eviction(self, emit: Emit) -> None:
        kind = emit.subject.split(".")[1]
        if kind == "job":
            job = wire.decode(wire.Job, emit.payload)
            self.validation_jobs.append(job)
            self.to_scheduler("HP_ALLOCATIONS", emit.subject, emit.payload)
        elif kind == "directive":
            self.to_scheduler("HP_DIRECTIVES", emit.subject, emit.payload)
        elif kind == "event":
            self.events.append(wire.decode(wire.NodeEvent, emit.payload))
        elif kind == "outcome":
            self.outcomes.append(wire.decode(wire.CommandOutcome, emit.payload))
        elif kind == "remediate":
            self.remediations.append(wire.decode(wire.RemediationRequest, emit.payload))

    def run(self, seconds: float) -> None:
        """The scheduler ticks once a second; its records reach both folds at once."""
        end = self.now + timedelta(seconds=seconds)
        while self.now < end:
            self.now += timedelta(seconds=1)
            self.es, ticked, _ = self.eviction.tick(self.es, self.now)
            for emit in ticked:
                self._from_eviction(emit)
            self.ss, emits, _ = self.scheduler.tick(self.ss, self.now)
            for emit in emits:
                if emit.subject.startswith("hp.jobend."):
                    continue  # JOB-1's job outcomes: HP_JOB_OUTCOMES, which neither folds
                self.to_scheduler("HP_ALLOCATIONS", emit.subject, emit.payload)
                alloc = wire.decode(wire.Allocation, emit.payload)
                self.allocations.append(alloc)
                self.to_eviction("HP_ALLOCATIONS", emit.subject, emit.payload)

    def until(self, done: Any, limit_s: float = 600) -> None:
        waited = 0.0
        while not done():
            assert waited < limit_s, "never happened"
            self.run(1)
            waited += 1

    def plant(self, node: str, gpus: list[int]) -> None:
        self.to_scheduler("HP_COMMANDS", subjects.hardware(CLUSTER, node), wire.SimHardware(
            node_id=node, cluster=CLUSTER, failing_gpus=gpus, set_at=self.now, actor="test"))

    def submit(self, job_id: str, steps: int, duration: float = 10) -> None:
        self.to_scheduler("HP_ALLOCATIONS", subjects.job(CLUSTER, job_id), wire.Job(
            id=job_id, cluster=CLUSTER, steps=steps, duration_seconds=duration, submitted_at=self.now,
            submitted_by="test"))

    def command(self, verb: wire.CommandVerb, node: str, **fields: Any) -> str:
        command_id = f"cmd-{self.seq}"
        self.to_eviction("HP_COMMANDS", subjects.command(CLUSTER, node, verb, "alice"), wire.Command(
            id=command_id, node_id=node, cluster=CLUSTER, verb=verb, actor="alice", issued_at=self.now, **fields))
        return command_id

    def outcome(self, command_id: str) -> wire.CommandOutcome | None:
        return next((o for o in self.outcomes if o.command_id == command_id), None)

    def raise_fault(self, node: str, kind: str = "gpu_xid_errors", message: str = "GPU 0000:18:00.0: Xid 79") -> None:
        self.to_eviction("HP_NODE_EVENTS", subjects.event(CLUSTER, node, "CONDITION_RAISED"), wire.NodeEvent(
            id=f"e{self.seq}", node_id=node, cluster=CLUSTER, type="CONDITION_RAISED", occurred_at=self.now,
            message="", actor="health-ingest", condition=wire.ConditionChange(
                type=kind, reason="GpuXidHardware", severity="critical", message=message)))  # type: ignore[arg-type]

    def clear_fault(self, node: str, kind: str = "gpu_xid_errors") -> None:
        self.to_eviction("HP_NODE_EVENTS", subjects.event(CLUSTER, node, "CONDITION_CLEARED"), wire.NodeEvent(
            id=f"e{self.seq}", node_id=node, cluster=CLUSTER, type="CONDITION_CLEARED", occurred_at=self.now,
            message="", actor="health-ingest", condition=wire.ConditionChange(
                type=kind, reason="GpuXidHardware", severity="critical", message="")))  # type: ignore[arg-type]

    def agent_says(self, node: str, request: wire.RemediationRequest, result: str = "succeeded",
                   reason: str = "done", boot_id: str = "boot-1", boot_id_before: str | None = None) -> None:
        """The node's agent answers in its next resource report (REM-2)."""
        outcome = wire.RemediationOutcome(request_id=request.id, action=request.action, result=result,  # type: ignore[arg-type]
                                          reason=reason, finished_at=self.now, boot_id=boot_id,
                                          boot_id_before=boot_id_before)
        devices = [wire.ResourceDevice(kind="gpu", vendor="nvidia", index=i, pci_bus_id=f"0000:{i:02x}:00.0")
                   for i in range(8)]
        self.to_eviction("HP_RESOURCES", subjects.resource(CLUSTER, node), wire.ResourceReport(
            node_id=node, cluster=CLUSTER, hostname=node, sent_at=self.now, ready=True, cores=64,
            memory_bytes=1 << 30, devices=devices, boot_id=boot_id, remediation=outcome))

    def of(self, kind: str) -> list[wire.NodeEvent]:
        return [e for e in self.events if e.type == kind]

    def job_failed(self, job_id: str) -> bool:
        return any(a.job_id == job_id and a.state == "failed" for a in self.allocations)

    def isolate_planted(self, node: str = "gpu-05", job_id: str = "train-9", steps: int = 8) -> wire.CommandOutcome:
        """A silent fault on GPU 1 of ``node``, a job over ``steps`` nodes failing on it, then
        ``isolate`` of that job until it ends: its outcome."""
        self.plant(node, [1])
        self.submit(job_id, steps=steps)
        self.until(lambda: self.job_failed(job_id))
        self.run(15)
        command = self.command("isolate", "gpu-00", job_id=job_id)
        self.until(lambda: self.outcome(command) is not None)
        outcome = self.outcome(command)
        assert outcome is not None
        return outcome


# ---------------------------------------------------------------------------- VAL-3


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=2, max_value=16).flatmap(
    lambda n: st.tuples(st.just(n), st.sets(st.integers(min_value=0, max_value=n - 1), min_size=1))))
def test_val3_isolation_names_exactly_the_planted_faulty_nodes(case: tuple[int, set[int]]) -> None:
    """For any set of silently faulty nodes among n, the job's failure is attributed to exactly
    them; every other node is cleared; one faulty node takes at most ceil(log2 n) rounds."""
    n, bad = case
    nodes = names(n)
    loop = Loop(nodes)
    for i in bad:
        loop.plant(nodes[i], [3])
    loop.submit("train-1", steps=n)
    loop.until(lambda: loop.job_failed("train-1"))
    loop.run(15)  # every step has ended
    command = loop.command("isolate", nodes[0], job_id="train-1")
    loop.until(lambda: loop.outcome(command) is not None)
    outcome = loop.outcome(command)
    assert outcome is not None and outcome.result == "applied"
    faulty = sorted(nodes[i] for i in bad)
    assert outcome.faulty == faulty
    assert outcome.cleared == sorted(set(nodes) - set(faulty))
    assert sorted(e.node_id for e in loop.of("JOB_FAILURE_ATTRIBUTED")) == faulty
    rounds = max(e.validation.round or 0 for e in loop.of("VALIDATION_STARTED") if e.validation)
    if len(bad) == 1:
        assert rounds <= math.ceil(math.log2(n))
    # Only single-node failures say a node failed validation (health-ingest raises on those).
    alone = sorted(e.node_id for e in loop.of("VALIDATION_FAILED") if e.validation and e.validation.nodes == 1)
    assert alone == faulty


def test_val3_sixteen_nodes_one_silent_fault_four_rounds_and_the_cap_holds() -> None:
    nodes = names(16)
    loop = Loop(nodes, validation={"suites": {"diag": SUITE}, "defaultSuite": "diag",
                                   "isolation": {"maxConcurrent": 2}})
    loop.plant("gpu-11", [5])
    loop.submit("train-2", steps=16)
    loop.until(lambda: loop.job_failed("train-2"))
    loop.run(15)
    command = loop.command("isolate", "gpu-00", job_id="train-2")
    running: set[str] = set()
    most = 0
    while loop.outcome(command) is None:
        loop.run(1)
        for alloc in loop.allocations:
            if alloc.job_id.startswith("val-"):
                (running.add if alloc.state in ("placed", "started") else running.discard)(alloc.job_id)
        most = max(most, len(running))
    outcome = loop.outcome(command)
    assert outcome is not None
    assert outcome.faulty == ["gpu-11"]
    assert "in 4 round(s), 8 validation(s)" in outcome.message
    assert most <= 2
    [attributed] = loop.of("JOB_FAILURE_ATTRIBUTED")
    assert attributed.node_id == "gpu-11" and attributed.fault_class == "VALIDATION_FAILED"
    assert attributed.allocation_id is not None and attributed.allocation_id.startswith("train-2.")


def test_val3_configured_isolation_starts_by_itself_after_a_multi_node_failure() -> None:
    nodes = names(8)
    loop = Loop(nodes, validation={"suites": {"diag": SUITE}, "defaultSuite": "diag",
                                   "isolation": {"auto": True}})
    loop.plant("gpu-02", [0])
    loop.submit("train-3", steps=8)
    loop.until(lambda: bool(loop.of("JOB_FAILURE_ATTRIBUTED")))
    assert [e.node_id for e in loop.of("JOB_FAILURE_ATTRIBUTED")] == ["gpu-02"]
    assert {e.actor for e in loop.of("VALIDATION_STARTED")} == {"eviction"}


def test_val3_a_job_eviction_never_saw_is_refused_in_one_line() -> None:
    loop = Loop(names(2))
    command = loop.command("isolate", "gpu-00", job_id="nope")
    outcome = loop.outcome(command)
    assert outcome is not None and outcome.result == "refused"
    assert outcome.message.startswith("cannot isolate job nope: no record of job nope in cluster default")


# ---------------------------------------------------------------------------- VAL-1, VAL-4


def test_val1_node_validate_answers_when_the_run_ends_with_suite_duration_and_reason() -> None:
    loop = Loop(["gpu-00", "gpu-01"])
    loop.plant("gpu-01", [2])
    good, bad = loop.command("validate", "gpu-00"), loop.command("validate", "gpu-01")
    assert loop.outcome(good) is None  # nothing to say before the run ends
    loop.until(lambda: loop.outcome(good) is not None and loop.outcome(bad) is not None)
    passed, failed = loop.outcome(good), loop.outcome(bad)
    assert passed is not None and failed is not None
    assert passed.passed is True and passed.message.startswith("gpu-00: validation passed: suite diag in ")
    assert failed.passed is False
    assert failed.message.endswith("exit status 1 (passes with 0): simulated diag: FAIL: GPU 2 on gpu-01 failed "
                                   "the diagnostic")
    [record] = [e.validation for e in loop.of("VALIDATION_FAILED")]
    assert record is not None and record.suite == "diag" and record.duration_seconds == 5.0
    assert record.job.startswith("val-")


def test_val4_a_run_queued_behind_running_work_is_not_timed_out_and_too_few_gpus_exclude() -> None:
    loop = Loop(["gpu-00"], validation={"suites": {"diag": {**SUITE, "timeoutSeconds": 10}}, "defaultSuite": "diag"})
    loop.submit("long", steps=1, duration=120)
    loop.run(2)
    command = loop.command("validate", "gpu-00")
    loop.until(lambda: loop.outcome(command) is not None)
    outcome = loop.outcome(command)
    assert outcome is not None and outcome.passed is True  # it waited 2 minutes, ran 5 s: within its 10 s
    [record] = [e.validation for e in loop.of("VALIDATION_PASSED")]
    assert record is not None and record.duration_seconds == 5.0

    few = Loop(["gpu-00"], gpus=4)
    refused = few.outcome(few.command("validate", "gpu-00"))
    assert refused is not None and refused.result == "refused"
    assert refused.excluded == {"gpu-00": "has 4 GPU(s); suite diag needs 8"}
    assert not few.validation_jobs


def test_val1_a_run_past_its_timeout_fails_as_timed_out() -> None:
    loop = Loop(["gpu-00"], validation={"suites": {"diag": {**SUITE, "timeoutSeconds": 3}}, "defaultSuite": "diag"})
    command = loop.command("validate", "gpu-00")
    loop.until(lambda: loop.outcome(command) is not None)
    outcome = loop.outcome(command)
    assert outcome is not None and outcome.passed is False and "timed out after 3s" in outcome.message


def test_val1_an_unknown_suite_is_refused_naming_the_configured_ones() -> None:
    loop = Loop(["gpu-00"])
    outcome = loop.outcome(loop.command("validate", "gpu-00", suite="burn"))
    assert outcome is not None and outcome.result == "refused"
    assert outcome.message == "cannot validate gpu-00: no suite named 'burn' (configured: diag)"


# ---------------------------------------------------------------------------- VAL-2


def held_node(loop: Loop, node: str) -> None:
    loop.command("cordon", node, reason="Xid 79")
    loop.raise_fault(node)


def holds_of(loop: Loop, node: str) -> int:
    return len(loop.es.nodes[subjects.node_key(CLUSTER, node)].holds)


def test_val2_a_node_that_carried_a_fault_returns_only_after_it_passes() -> None:
    loop = Loop(["gpu-00", "gpu-01"])
    for node in ("gpu-00", "gpu-01"):
        held_node(loop, node)
    loop.plant("gpu-01", [7])  # the repair did not fix gpu-01
    ok, still_bad = loop.command("uncordon", "gpu-00"), loop.command("uncordon", "gpu-01")
    for command, node in ((ok, "gpu-00"), (still_bad, "gpu-01")):
        outcome = loop.outcome(command)
        assert outcome is not None and outcome.result == "applied"
        assert outcome.message.startswith(f"{node} carried a hardware fault: it returns to service once suite diag "
                                          "passes (validation job val-")
        assert holds_of(loop, node) == 1  # not released yet
    again = loop.outcome(loop.command("uncordon", "gpu-00"))
    assert again is not None and again.result == "refused" and "is being validated before it returns" in again.message
    loop.until(lambda: len(loop.of("VALIDATION_PASSED")) + len(loop.of("VALIDATION_FAILED")) == 2)
    assert holds_of(loop, "gpu-00") == 0
    assert [e.node_id for e in loop.of("NODE_UNCORDONED")] == ["gpu-00"]
    assert holds_of(loop, "gpu-01") == 1
    [failed] = loop.of("VALIDATION_FAILED")
    assert failed.node_id == "gpu-01" and failed.validation is not None
    assert "GPU 7 on gpu-01 failed the diagnostic" in (failed.validation.reason or "")


def test_val2_a_node_without_a_fault_or_with_gating_off_returns_at_once() -> None:
    loop = Loop(["gpu-00"])
    loop.command("cordon", "gpu-00", reason="maintenance")
    outcome = loop.outcome(loop.command("uncordon", "gpu-00"))
    assert outcome is not None and outcome.message.startswith("1 cordon hold(s) released for gpu-00")

    off = Loop(["gpu-00"], validation={"suites": {"diag": SUITE}, "defaultSuite": "diag"})
    held_node(off, "gpu-00")
    outcome = off.outcome(off.command("uncordon", "gpu-00"))
    assert outcome is not None and outcome.message.startswith("1 cordon hold(s) released for gpu-00")
    assert not off.validation_jobs


def test_val2_a_pass_clears_the_fault_so_the_next_release_is_not_gated_again() -> None:
    loop = Loop(["gpu-00"])
    held_node(loop, "gpu-00")
    loop.command("uncordon", "gpu-00")
    loop.until(lambda: bool(loop.of("VALIDATION_PASSED")))
    loop.command("cordon", "gpu-00", reason="maintenance")
    outcome = loop.outcome(loop.command("uncordon", "gpu-00"))
    assert outcome is not None and outcome.message.startswith("1 cordon hold(s) released for gpu-00")


def test_val4_an_isolation_excludes_a_cordoned_suspect_with_the_reason_and_never_names_it() -> None:
    nodes = names(4)
    loop = Loop(nodes, validation={"suites": {"diag": SUITE}, "defaultSuite": "diag"})
    loop.plant("gpu-01", [0])
    loop.submit("train-4", steps=4)
    loop.until(lambda: loop.job_failed("train-4"))
    loop.run(15)
    loop.command("cordon", "gpu-03", reason="maintenance")
    command = loop.command("isolate", "gpu-00", job_id="train-4")
    loop.until(lambda: loop.outcome(command) is not None)
    outcome = loop.outcome(command)
    assert outcome is not None and outcome.faulty == ["gpu-01"]
    assert outcome.excluded == {"gpu-03": "cordoned: it is already out of service"}
    assert outcome.cleared == ["gpu-00", "gpu-02"]
    assert not [e for e in loop.of("VALIDATION_STARTED") if e.node_id == "gpu-03"]


def test_dom4_an_nvlink_domain_is_isolated_as_one_and_named_whole() -> None:
    """DOM-4: eight suspects, gpu-04..gpu-07 one NVLink domain (from the config here; the
    hardware's fabric info where it tells): the fault planted on gpu-05 names the whole domain,
    no validation ever splits it, and gpu-00..gpu-03 are cleared."""
    nodes = names(8)
    loop = Loop(nodes, domains={"rules": [{"kind": "nvlink", "regex": r"gpu-0[4-7]", "value": "nvl-1"}]})
    outcome = loop.isolate_planted()
    assert outcome.result == "applied"
    domain = ["gpu-04", "gpu-05", "gpu-06", "gpu-07"]
    assert outcome.faulty == domain and outcome.cleared == ["gpu-00", "gpu-01", "gpu-02", "gpu-03"]
    assert loop.validation_jobs
    for job in loop.validation_jobs:  # every validation holds the whole domain or none of it
        members = set(job.nodes or [])
        assert members >= set(domain) or not members & set(domain), job.nodes


# ---------------------------------------------------------------------------- RUL-2, JOB-3


def _fired(loop: Loop, node: str, action: str, mode: str = "act") -> None:
    loop.to_eviction("HP_NODE_EVENTS", subjects.event(CLUSTER, node, "RULE_FIRED"), wire.NodeEvent(
        id=f"e{loop.seq}", node_id=node, cluster=CLUSTER, type="RULE_FIRED", occurred_at=loop.now,
        message="", actor="health-ingest", rule=wire.RuleFiring(
            rule="xid31-same-gpu", mode=mode, action=action, count=2, first_at=loop.now)))  # type: ignore[arg-type]


def test_rul2_a_validate_rule_in_act_mode_runs_the_default_suite_on_its_node_once() -> None:
    loop = Loop(["gpu-00", "gpu-01", "gpu-02"])
    loop.plant("gpu-00", [3])
    _fired(loop, "gpu-00", "validate")
    _fired(loop, "gpu-00", "validate")  # fired again while the run is on: not a second run
    _fired(loop, "gpu-01", "validate", mode="record")  # recorded only: nothing acts
    _fired(loop, "gpu-02", "needs-attention")  # another action: not a validation
    [started] = loop.of("VALIDATION_STARTED")
    assert (started.node_id, started.actor) == ("gpu-00", "eviction")
    loop.until(lambda: bool(loop.of("VALIDATION_FAILED")))
    [failed] = loop.of("VALIDATION_FAILED")
    assert failed.node_id == "gpu-00" and failed.validation is not None and failed.validation.suite == "diag"


def test_job3_anomalous_job_failures_start_a_validation_and_a_pass_is_recorded() -> None:
    loop = Loop(["gpu-00"])
    loop.raise_fault("gpu-00", kind="job_failures_anomalous", message="9 of 10 jobs failed")
    [started] = loop.of("VALIDATION_STARTED")
    assert started.node_id == "gpu-00" and started.actor == "eviction"
    loop.until(lambda: bool(loop.of("VALIDATION_PASSED")))


def test_job3_without_a_default_suite_the_evidence_starts_nothing() -> None:
    loop = Loop(["gpu-00"], validation={"suites": {"diag": SUITE}})
    loop.raise_fault("gpu-00", kind="job_failures_anomalous", message="9 of 10 jobs failed")
    _fired(loop, "gpu-00", "validate")
    assert loop.of("VALIDATION_STARTED") == [] and loop.validation_jobs == []


def test_job3_jobs_failing_after_a_passed_validation_stop_the_node_at_needs_attention_without_a_hold() -> None:
    """JOB-3: JobFailuresAfterValidation is for a person: NODE_NEEDS_ATTENTION once, no
    validation run, no hold, no drain (its score keeps new work off it)."""
    loop = Loop(["gpu-00"])
    for _ in range(2):  # raised again (an escalation): still one NODE_NEEDS_ATTENTION
        loop.to_eviction("HP_NODE_EVENTS", subjects.event(CLUSTER, "gpu-00", "CONDITION_RAISED"), wire.NodeEvent(
            id=f"e{loop.seq}", node_id="gpu-00", cluster=CLUSTER, type="CONDITION_RAISED", occurred_at=loop.now,
            message="", actor="health-ingest", condition=wire.ConditionChange(
                type="job_failures_anomalous", reason="JobFailuresAfterValidation", severity="critical",
                message="9 of 10 runs failed; after a passed validation")))
    [attention] = loop.of("NODE_NEEDS_ATTENTION")
    assert attention.actor == "eviction" and "its jobs still fail after a passed validation" in attention.message
    assert loop.of("VALIDATION_STARTED") == [] and loop.of("HOLD_CREATED") == []
