"""JOB-3: a node flagged by its job outcomes alone is validated before any drain (pure).

``job_failures_anomalous`` is health-ingest's statistical verdict on a node's job failures
(JOB-2). It takes the node's score below ``drainBelow`` (its penalty gates new placements), and
eviction starts a validation run of the default suite on the node when it is raised. Policy
does not take the node out of service on that evidence before the run has a verdict:

- the run **fails**: health-ingest raises ``validation_failed`` (critical), and the node goes
  the ordinary way (a drain in drain mode, its guardrails deciding);
- the run **passes**: health-ingest clears the condition and counts the node's runs afresh;
  flagged again by runs after the pass, it comes back as ``JobFailuresAfterValidation``
  (critical): eviction stops the node at NODE_NEEDS_ATTENTION, and policy does not drain it
  (the diagnostics found nothing a drain and a remediation could fix: a person decides).

The rule holds only while the job evidence is all there is: another critical condition takes
the node the ordinary way, and without a default suite there is no run to wait for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

JOB_CONDITION: Final = "job_failures_anomalous"
AFTER_VALIDATION: Final = "JobFailuresAfterValidation"

Wait = Literal["validating", "needs-attention"]


def job_evidence_wait(conditions: Iterable[tuple[str, str, str]], validates: bool) -> Wait | None:
    """Why policy leaves a node in service on its job evidence, from its conditions as
    ``(type, reason, severity)``: ``validating`` until the validation run has a verdict,
    ``needs-attention`` once it passed and the jobs still fail; None when the ordinary path
    applies (no job evidence, another critical condition, or no default suite to validate with)."""
    job_reason: str | None = None
    for kind, reason, severity in conditions:
        if kind == JOB_CONDITION:
            job_reason = reason
        elif severity == "critical":
            return None
    if job_reason is None:
        return None
    if job_reason == AFTER_VALIDATION:
        return "needs-attention"
    return "validating" if validates else None


def halted_message(wait: Wait, action: str, score: int | None) -> str:
    """POLICY_HALTED's words (API-4 shows them as why automation is not acting)."""
    if wait == "validating":
        return (f"{action}: score {score}; halted until the validation run started for job_failures_anomalous has "
                "a verdict (JOB-3): a failure takes the node out of service, a pass clears the condition")
    return (f"{action}: score {score}; halted: its jobs still fail after a passed validation (JOB-3): the node "
            "needs attention (NODE_NEEDS_ATTENTION), not a drain; `healthplane node service` once a person has "
            "looked")
