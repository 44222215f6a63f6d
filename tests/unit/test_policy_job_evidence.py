"""JOB-3 in policy, pure: a node flagged by its job outcomes alone (``job_failures_anomalous``) is
not taken out of service before the validation run that evidence started has a verdict; a
failed run takes it the ordinary way, a pass clears it, and a node that passed and still fails
jobs is for a person (NODE_NEEDS_ATTENTION, eviction's), never drained (docs/jobs.md)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthplane.contracts.config import parse_cluster_config
from healthplane_policy import evidence
from healthplane_policy.rules import policy_config
from tests.support.policy import (
    CLUSTER,
    Driver,
    at,
    condition,
    fleet,
    only,
    refold_after_crash,
    score,
    view,
)

SUITES = {"suites": {"diag": {"command": ["dcgmi", "diag", "-r", "2"], "timeoutSeconds": 600, "gpus": 8}},
          "defaultSuite": "diag"}
JOB = "job_failures_anomalous"


def config(mode: str = "drain", validation: dict[str, Any] | None = None) -> Any:
    return policy_config(parse_cluster_config({
        "cluster": CLUSTER, "nodeHealth": {"mode": mode, "maxUnavailablePercent": 100},
        "validation": SUITES if validation is None else validation}), 1)


def flagged(node: str, minute: float, reason: str = "JobFailuresAnomalous", severity: str = "warning") -> Any:
    return condition(node, "CONDITION_RAISED", JOB, at(minute), severity=severity, reason=reason)


# ---------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(("conditions", "validates", "wait"), [
    ([], True, None),
    ([(JOB, "JobFailuresAnomalous", "warning")], True, "validating"),
    ([(JOB, "JobFailuresAnomalous", "warning")], False, None),  # no default suite: nothing to wait for
    ([(JOB, "JobFailuresAnomalous", "warning"), ("gpu_xid_errors", "GpuXidHardware", "critical")], True, None),
    ([(JOB, "JobFailuresAnomalous", "warning"), ("validation_failed", "ValidationFailed", "critical")], True, None),
    ([(JOB, "JobFailuresAnomalous", "warning"), ("disk_smart", "SmartAttributeFailing", "warning")], True,
     "validating"),
    ([(JOB, "JobFailuresAfterValidation", "critical")], True, "needs-attention"),
    ([(JOB, "JobFailuresAfterValidation", "critical")], False, "needs-attention"),
    ([(JOB, "JobFailuresAfterValidation", "critical"), ("memory_errors", "UncorrectableMemoryErrors", "critical")],
     True, None),
    ([("gpu_xid_errors", "GpuXidHardware", "critical")], True, None),
])
def test_job3_what_the_job_evidence_waits_for(conditions: list[tuple[str, str, str]], validates: bool,
                                              wait: str | None) -> None:
    """JOB-3: the table of the rule."""
    assert evidence.job_evidence_wait(conditions, validates) == wait


_KINDS = st.sampled_from([JOB, "gpu_xid_errors", "memory_errors", "disk_smart", "validation_failed"])
_REASONS = st.sampled_from(["JobFailuresAnomalous", "JobFailuresAfterValidation", "Other"])
_SEVERITIES = st.sampled_from(["info", "warning", "critical"])


@settings(max_examples=300, deadline=None)
@given(conditions=st.dictionaries(_KINDS, st.tuples(_REASONS, _SEVERITIES), max_size=5), validates=st.booleans())
def test_job3_the_rule_waits_only_on_job_evidence_alone(conditions: dict[str, tuple[str, str]],
                                                        validates: bool) -> None:
    """JOB-3: it waits exactly when the job condition is the node's only reason to act (no other
    critical condition): for the verdict where a default suite runs one, for a person after a pass."""
    rows = [(kind, reason, severity) for kind, (reason, severity) in conditions.items()]
    wait = evidence.job_evidence_wait(rows, validates)
    alone = JOB in conditions and not any(s == "critical" for k, (_, s) in conditions.items() if k != JOB)
    after = alone and conditions[JOB][0] == "JobFailuresAfterValidation"
    assert wait == ("needs-attention" if after else "validating" if alone and validates else None)


# ---------------------------------------------------------------------------- in the fold


def test_job3_no_drain_before_the_verdict_and_a_failed_validation_drains() -> None:
    """JOB-3: score 40 from job evidence alone is halted (once, however many reports), naming the
    wait; VALIDATION_FAILED's critical condition then takes the ordinary drain path."""
    drive = Driver(config(), *fleet(4))
    drive.feed(flagged("n0", 1), score("n0", 40, 100, at(1)), view("n0", 40, at(2)), view("n0", 40, at(3)))
    assert drive.commands() == []
    halted = only(drive.events())
    assert (halted.type, halted.action) == ("POLICY_HALTED", "ACTION_DRAIN")
    assert halted.message.startswith("drain: score 40; halted until the validation run started for "
                                     "job_failures_anomalous has a verdict (JOB-3)")
    drive.feed(condition("n0", "CONDITION_RAISED", "validation_failed", at(4), severity="critical",
                         reason="ValidationFailed"), score("n0", 0, 40, at(4)))
    assert [c.verb for c in drive.commands()] == ["drain"]
    assert drive.events()[-1].type == "POLICY_ACTED" and drive.events()[-1].message == "drain: score 0"


def test_job3_a_pass_clears_it_and_jobs_failing_after_it_are_needs_attention_not_a_drain() -> None:
    """JOB-3: the pass clears the condition (score back to 100: nothing to do); flagged again
    after the pass (JobFailuresAfterValidation, critical), the node is halted for a person."""
    drive = Driver(config(), *fleet(4))
    drive.feed(flagged("n0", 1), score("n0", 40, 100, at(1)),
               condition("n0", "CONDITION_CLEARED", JOB, at(2), reason="JobFailuresAnomalous"),
               score("n0", 100, 40, at(2)),
               flagged("n0", 30, "JobFailuresAfterValidation", "critical"), score("n0", 40, 100, at(30)),
               view("n0", 40, at(31)))
    assert drive.commands() == []
    assert [e.type for e in drive.events()] == ["POLICY_HALTED", "POLICY_HALTED"]
    assert "its jobs still fail after a passed validation (JOB-3): the node needs attention" in \
        drive.events()[-1].message


@pytest.mark.parametrize("mode", ["cordon", "replace"])
def test_job3_no_mode_that_acts_takes_the_node_out_before_the_verdict(mode: str) -> None:
    """JOB-3 in cordon and replace mode too: job evidence alone is validated first."""
    drive = Driver(config(mode), *fleet(4, provisioned=True))
    drive.feed(flagged("n0", 1), score("n0", 40, 100, at(1)))
    assert drive.commands() == [] and only(drive.events()).type == "POLICY_HALTED"


def test_job3_observe_mode_still_recommends_on_the_score() -> None:
    """JOB-3, POL-1: observe mode recommends on the score as ever (it acts on nothing)."""
    drive = Driver(config("observe"), *fleet(4))
    drive.feed(flagged("n0", 1), score("n0", 40, 100, at(1)))
    assert only(drive.events()).type == "POLICY_RECOMMENDED"


def test_job3_without_a_default_suite_or_beside_a_critical_fault_the_ordinary_path() -> None:
    """No run to wait for (no default suite), or another critical fault: drained on the score."""
    plain = Driver(config(validation={}), *fleet(4))
    plain.feed(flagged("n0", 1), score("n0", 40, 100, at(1)))
    assert [c.verb for c in plain.commands()] == ["drain"]
    both = Driver(config(), *fleet(4))
    both.feed(flagged("n0", 1), condition("n0", "CONDITION_RAISED", "gpu_xid_errors", at(1), severity="critical"),
              score("n0", 0, 100, at(1)))
    assert [c.verb for c in both.commands()] == ["drain"]


def test_job3_rel1_a_refold_after_a_crash_repeats_no_halt_and_drains_once() -> None:
    """REL-1 with JOB-3's halt: cut anywhere, the restarted policy decides what an uninterrupted
    one did, with the same ids."""
    setup = [config(), *fleet(4)]
    records = [flagged("n0", 1), score("n0", 40, 100, at(1)), view("n0", 40, at(2)),
               condition("n0", "CONDITION_RAISED", "validation_failed", at(4), severity="critical",
                         reason="ValidationFailed"), score("n0", 0, 40, at(4)), view("n0", 0, at(5))]
    for cut in range(len(records) + 1):
        uninterrupted, restarted = refold_after_crash(setup, records, cut)
        assert restarted == uninterrupted
