"""The remediation ladder in eviction's state (REM-1), as pure rules: which ladder a node's
faults call for, and the sentences of each step.

Eviction runs the ladder because every rung is an action eviction already owns or reads:
the drain before the first step (EVI-2), the request on the node's remediation subject, the
agent's outcome and boot id in the node's resource report, the fault's condition clearing,
replacement (EVI-4) and the return to service through validation (VAL-2). Policy decides
*whether* a node is remediated (its mode, guardrails and breaker); eviction decides *how*.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final

import msgspec

from healthplane.contracts import wire
from healthplane.contracts.config import ClusterConfig
from healthplane_eviction import ladder as remediation

_XID: Final = re.compile(r"\bXid (\d+)\b")


class LadderSpec(msgspec.Struct, frozen=True, kw_only=True):
    fault_class: str
    xids: list[int] = []
    reasons: list[str] = []
    rungs: tuple[remediation.Rung, ...]
    validate_suite: str | None = None

    @property
    def condition(self) -> str:
        return self.fault_class.lower()

    def describe(self) -> str:
        return " → ".join(r.action for r in self.rungs)


class RemediationPolicy(msgspec.Struct, frozen=True, kw_only=True):
    ladders: list[LadderSpec] = []
    max_attempts: int = 4
    window_s: int = 24 * 3600

    @property
    def window(self) -> timedelta:
        return timedelta(seconds=self.window_s)


def policy_of(config: ClusterConfig) -> RemediationPolicy:
    found = config.remediation
    return RemediationPolicy(
        ladders=[LadderSpec(fault_class=ladder.fault_class, xids=list(ladder.xids), reasons=list(ladder.reasons),
                            rungs=tuple(remediation.Rung(step.action, step.timeout_seconds, step.retries,
                                                          step.retry_backoff_seconds) for step in ladder.steps),
                            validate_suite=ladder.validate_suite)
                 for ladder in found.ladders],
        max_attempts=found.max_attempts_per_node, window_s=found.window_minutes * 60)


class Fault(msgspec.Struct, frozen=True, array_like=True):
    """What eviction keeps of an active condition: enough to pick a ladder."""

    severity: str
    reason: str
    message: str


def ladder_for(ladders: list[LadderSpec], faults: dict[str, Fault], order: list[str]) -> LadderSpec | None:
    """The ladder for the node's worst fault that has one (``order``: its faults, worst
    first); among a class's ladders the most specific that matches (Xids, reasons)."""
    for condition in order:
        fault = faults.get(condition)
        if fault is None:
            continue
        xids = {int(x) for x in _XID.findall(fault.message)}
        fitting = [ladder for ladder in ladders if ladder.condition == condition
                   and (not ladder.xids or xids & set(ladder.xids))
                   and (not ladder.reasons or fault.reason in ladder.reasons)]
        if fitting:
            return max(fitting, key=lambda ladder: (bool(ladder.xids), bool(ladder.reasons)))
    return None


def started(action: str, attempt: int, fault_class: str) -> str:
    return f"remediation started: {action} (attempt {attempt}) for {wire.condition_title(fault_class.lower())}"


def failed(action: str, attempt: int, reason: str) -> str:
    return f"remediation failed: {action} (attempt {attempt}): {reason}"


def succeeded(action: str, attempt: int, reason: str) -> str:
    return f"remediation succeeded: {action} (attempt {attempt}): {reason}"


def needs_attention(why: str) -> str:
    return (f"needs attention: {why}; nothing automatic touches this node again until service is recorded "
            "(`healthplane node service`)")
