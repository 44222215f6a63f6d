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
    action: str | None = None  # XID-1: the Xid catalog's bucket the condition carries (RUL-1's too)


# XID-2: where NVIDIA's catalog says to start. A human (CONTACT_SUPPORT, CHECK_MECHANICALS) is
# asked at once; a reboot starts at the ladder's reboot (a GPU reset would not do); a GPU reset
# at its first rung. With no ladder configured for the fault, the catalog's own.
HUMAN_BUCKETS: Final = frozenset({"CONTACT_SUPPORT", "CHECK_MECHANICALS"})
REBOOT_BUCKETS: Final = frozenset({"RESTART_BM", "RESTART_VM"})
_STEP_DEFAULTS: Final = {"gpu-reset": 600, "reboot": 900}
CATALOG_LADDERS: Final[dict[str, tuple[str, ...]]] = {
    "RESET_GPU": ("gpu-reset", "reboot", "needs-attention"),
    "RESTART_BM": ("reboot", "needs-attention"), "RESTART_VM": ("reboot", "needs-attention"),
    "CONTACT_SUPPORT": ("needs-attention",), "CHECK_MECHANICALS": ("needs-attention",),
}


def ladder_for(ladders: list[LadderSpec], faults: dict[str, Fault], order: list[str]) -> LadderSpec | None:
    """The ladder for the node's worst fault that has one (``order``: its faults, worst
    first); among a class's ladders the most specific that matches (Xids, reasons), started
    where the catalog's action says (XID-2: ``by_catalog``); a fault the catalog names an
    action for has the catalog's ladder when none is configured."""
    for condition in order:
        fault = faults.get(condition)
        if fault is None:
            continue
        xids = {int(x) for x in _XID.findall(fault.message)}
        fitting = [ladder for ladder in ladders if ladder.condition == condition
                   and (not ladder.xids or xids & set(ladder.xids))
                   and (not ladder.reasons or fault.reason in ladder.reasons)]
        if fitting:
            return by_catalog(max(fitting, key=lambda ladder: (bool(ladder.xids), bool(ladder.reasons))), fault.action)
        steps = CATALOG_LADDERS.get(fault.action or "")
        if steps is not None:
            return LadderSpec(fault_class=condition.upper(), rungs=tuple(
                remediation.Rung(step, _STEP_DEFAULTS.get(step, 600), 2, 30) for step in steps))
    return None


def by_catalog(ladder: LadderSpec, action: str | None) -> LadderSpec:
    """``ladder`` started where the catalog's action says: a human at once, a reboot at its
    first reboot rung (when it has one); anything else as configured."""
    if action in HUMAN_BUCKETS:
        return msgspec.structs.replace(ladder, rungs=(remediation.Rung("needs-attention", 600, 0, 30),))
    if action in REBOOT_BUCKETS:
        reboot = next((i for i, rung in enumerate(ladder.rungs) if rung.action == "reboot"), None)
        if reboot is not None:
            return msgspec.structs.replace(ladder, rungs=ladder.rungs[reboot:])
    return ladder


def started(action: str, attempt: int, fault_class: str) -> str:
    return f"remediation started: {action} (attempt {attempt}) for {wire.condition_title(fault_class.lower())}"


def failed(action: str, attempt: int, reason: str) -> str:
    return f"remediation failed: {action} (attempt {attempt}): {reason}"


def succeeded(action: str, attempt: int, reason: str) -> str:
    return f"remediation succeeded: {action} (attempt {attempt}): {reason}"


def needs_attention(why: str) -> str:
    return (f"needs attention: {why}; nothing automatic touches this node again until service is recorded "
            "(`healthplane node service`)")
