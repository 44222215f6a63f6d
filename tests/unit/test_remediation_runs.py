"""The remediation ladder through eviction's and the reference scheduler's pure cores (REM-1,
REM-2's outcomes): drained first, each step a request on the node's own subject and a node
event, the agent's word and the node's conditions decide, and it never loops."""

from __future__ import annotations

from typing import Any

from healthplane.contracts import subjects
from tests.unit.test_validation_runs import SUITE, Loop

LADDER = {"ladders": [{"faultClass": "GPU_XID_ERRORS", "xids": [79], "steps": [
    {"action": "gpu-reset", "timeoutSeconds": 10, "retries": 0}, {"action": "reboot", "timeoutSeconds": 20, "retries": 0},
    {"action": "needs-attention"}]}]}
NODE = "gpu-00"


def remediating(remediation: dict[str, Any] = LADDER, **loop: Any) -> Loop:
    run = Loop([NODE, "gpu-01"], remediation=remediation, **loop)
    run.submit("work", steps=2, duration=600)
    run.run(3)  # one step runs on each node
    run.raise_fault(NODE)
    return run


def kinds(run: Loop) -> list[str]:
    return [e.type for e in run.events if e.type.startswith(("REMEDIATION", "NODE_NEEDS"))]


def test_rem1_xid79_drained_reset_rebooted_then_needs_attention_and_no_fifth_action() -> None:
    run = remediating()
    command = run.command("remediate", NODE)
    outcome = run.outcome(command)
    assert outcome is not None and outcome.result == "applied"
    assert outcome.message == ("remediating gpu-00 for GPU Xid Errors: gpu-reset → reboot → needs-attention; "
                               "drained: 1 allocation(s) requeued")
    assert not run.remediations  # nothing runs while its work is still there
    run.until(lambda: bool(run.remediations))  # the scheduler requeued it: drained
    [reset] = run.remediations
    assert (reset.action, reset.node_id, reset.attempt, reset.timeout_seconds) == ("gpu-reset", NODE, 1, 10)
    run.agent_says(NODE, reset)  # the driver took the reset; the sticky Xid stays raised
    run.until(lambda: len(run.remediations) == 2, limit_s=30)
    reboot = run.remediations[1]
    assert reboot.action == "reboot"
    run.agent_says(NODE, reboot, boot_id="boot-2", boot_id_before="boot-1", reason="rebooted: boot-1 → boot-2")
    run.run(3600)  # however long it runs
    assert kinds(run) == ["REMEDIATION_STARTED", "REMEDIATION_FAILED", "REMEDIATION_STARTED", "REMEDIATION_FAILED",
                          "NODE_NEEDS_ATTENTION"]
    assert len(run.remediations) == 2
    failed = [e for e in run.events if e.type == "REMEDIATION_FAILED"]
    assert failed[0].message == "remediation failed: gpu-reset (attempt 1): GPU Xid Errors persisted 10s after it"
    [stop] = [e for e in run.events if e.type == "NODE_NEEDS_ATTENTION"]
    assert stop.message.startswith("needs attention: GPU_XID_ERRORS: every step of its ladder was tried; nothing "
                                   "automatic touches this node again until service is recorded")
    again = run.outcome(run.command("remediate", NODE))
    assert again is not None and again.result == "refused" and "needs attention" in again.message
    run.command("service", NODE, reason="replaced GPU 0")
    assert run.es.nodes[subjects.node_key("default", NODE)].needs_attention is None


def test_rem1_a_reset_that_clears_the_fault_returns_the_node_through_validation() -> None:
    run = remediating()
    run.command("remediate", NODE)
    run.until(lambda: bool(run.remediations))
    run.agent_says(NODE, run.remediations[0])
    run.clear_fault(NODE)  # the next report shows it gone (a non-sticky fault)
    assert kinds(run) == ["REMEDIATION_STARTED", "REMEDIATION_SUCCEEDED"]
    # validateBeforeReturn: the episode's cordon is released only once the suite passes.
    assert [j.validation.name for j in run.validation_jobs if j.validation] == ["diag"]
    node = run.es.nodes[subjects.node_key("default", NODE)]
    assert len(node.holds) == 1
    run.until(lambda: not run.es.nodes[subjects.node_key("default", NODE)].holds, limit_s=30)
    assert [e.type for e in run.events][-2:] == ["VALIDATION_PASSED", "HOLD_RELEASED"]


def test_rem1_an_outcome_that_never_arrives_times_out_into_the_next_step() -> None:
    run = remediating()
    run.command("remediate", NODE)
    run.until(lambda: len(run.remediations) == 2, limit_s=60)
    failed = [e for e in run.events if e.type == "REMEDIATION_FAILED"]
    assert failed[0].message == "remediation failed: gpu-reset (attempt 1): no outcome from the agent within 10s"


def test_rem2_a_reboot_without_a_new_boot_id_did_not_happen() -> None:
    run = remediating()
    run.command("remediate", NODE)
    run.until(lambda: bool(run.remediations))
    run.agent_says(NODE, run.remediations[0], result="failed", reason="nvidia-smi: GPU is in use")
    run.until(lambda: len(run.remediations) == 2, limit_s=5)  # a step that did not run fails at once
    run.agent_says(NODE, run.remediations[1], boot_id="boot-1", boot_id_before="boot-1")
    failed = [e.message for e in run.events if e.type == "REMEDIATION_FAILED"]
    assert failed == ["remediation failed: gpu-reset (attempt 1): nvidia-smi: GPU is in use",
                      "remediation failed: reboot (attempt 2): boot id unchanged (boot-1): the reboot did not happen"]
    assert kinds(run)[-1] == "NODE_NEEDS_ATTENTION"


def test_rem1_attempts_are_bounded_per_node_and_window() -> None:
    run = remediating({**LADDER, "maxAttemptsPerNode": 1})
    run.command("remediate", NODE)
    run.until(lambda: bool(run.remediations))
    run.agent_says(NODE, run.remediations[0], result="failed", reason="no")
    assert kinds(run) == ["REMEDIATION_STARTED", "REMEDIATION_FAILED", "NODE_NEEDS_ATTENTION"]
    [stop] = [e for e in run.events if e.type == "NODE_NEEDS_ATTENTION"]
    assert "1 remediation attempt(s) within 24 h, the bound" in stop.message


def test_rem1_a_fault_without_a_ladder_is_drained_only() -> None:
    run = remediating()
    run.raise_fault("gpu-01", message="GPU 0000:18:00.0: Xid 48")  # the ladder is for Xid 79 only
    outcome = run.outcome(run.command("remediate", "gpu-01"))
    assert outcome is not None and outcome.message == (
        "no remediation ladder for the faults of gpu-01; drained: 1 allocation(s) requeued")
    run.run(60)
    assert not run.remediations


def test_rem1_the_ladders_validation_suite_must_pass_too() -> None:
    ladder = {"ladders": [{**LADDER["ladders"][0], "validateSuite": "diag"}]}
    run = remediating(ladder, validation={"suites": {"diag": SUITE}})
    run.command("remediate", NODE)
    run.until(lambda: bool(run.remediations))
    run.agent_says(NODE, run.remediations[0])
    run.clear_fault(NODE)
    assert [j.validation.name for j in run.validation_jobs if j.validation] == ["diag"]


def test_rem4_a_refused_step_is_retried_with_backoff_up_to_its_bound_then_the_next_runs() -> None:
    ladder = {"ladders": [{"faultClass": "GPU_XID_ERRORS", "steps": [
        {"action": "gpu-reset", "timeoutSeconds": 10, "retries": 2, "retryBackoffSeconds": 2},
        {"action": "reboot", "timeoutSeconds": 20, "retries": 0}, {"action": "needs-attention"}]}]}
    run = remediating(ladder)
    run.command("remediate", NODE)
    run.until(lambda: bool(run.remediations))
    started = run.now
    for tries in (1, 2, 3):
        request = run.remediations[-1]
        assert (request.action, request.attempt) == ("gpu-reset", tries)
        run.agent_says(NODE, request, result="refused", reason="busy: another remediation is running")
        run.until(lambda n=tries: len(run.remediations) == n + 1, limit_s=10)
    assert run.remediations[-1].action == "reboot"
    assert (run.now - started).total_seconds() >= 2 + 4  # backoff 2 s, then 4 s
    failed = [e.message for e in run.events if e.type == "REMEDIATION_FAILED"]
    assert failed == [
        "remediation failed: gpu-reset (attempt 1): busy: another remediation is running; retry 1 of 2 in 2s",
        "remediation failed: gpu-reset (attempt 2): busy: another remediation is running; retry 2 of 2 in 4s",
        "remediation failed: gpu-reset (attempt 3): busy: another remediation is running"]
