"""Prometheus series the node agent owns (the simulator's nodes count into the same)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Counter

from healthplane.runtime.metrics import MESSAGES_REJECTED

REMEDIATION_STREAM = "HP_REMEDIATION"

REMEDIATIONS = Counter(
    "healthplane_agent_remediations_total",
    "Remediation requests this agent answered (REM-2), by action (gpu-reset, reboot; other: outside the "
    "vocabulary) and result (succeeded, failed, refused)",
    ["action", "result"],
)


def count_remediation(action: str, result: str) -> None:
    REMEDIATIONS.labels(action=action, result=result).inc()


def rejecter(service: str) -> Callable[[], None]:
    """Counts a remediation payload too malformed to answer (no request id) for ``service``."""
    series = MESSAGES_REJECTED.labels(service=service, stream=REMEDIATION_STREAM, reason="malformed")
    return series.inc
