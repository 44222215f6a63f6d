"""Pure helpers of the bridge: which cap is in force, when to log a rejected put, and the
registration event the fold asks for. No I/O, no clock: times arrive as arguments."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from healthplane.contracts import wire
from healthplane.contracts.config import clamp_nodes_bucket_cap

REJECTION_LOG_INTERVAL_S = 30.0


@dataclass(frozen=True, slots=True)
class CapDecision:
    in_force: int | None  # None: leave the bucket as it is
    configured: int | None
    clamped: bool


def decide_cap(configured: int | None) -> CapDecision:
    """BRG-1: unset changes nothing; a value outside 64 MiB..2 GiB is clamped, not fatal."""
    if configured is None:
        return CapDecision(None, None, False)
    in_force = clamp_nodes_bucket_cap(configured)
    return CapDecision(in_force, configured, in_force != configured)


def registration_event(report: wire.ResourceReport, occurred_at: datetime) -> wire.NodeEvent:
    """NODE_REGISTERED for the first resource report of a node (BRG-3)."""
    kind = "provisioned" if report.provisioned else "static"
    definition = f", definition {report.definition}" if report.definition else ""
    return wire.NodeEvent(
        id=registration_event_id(report.cluster, report.node_id),
        node_id=report.node_id,
        cluster=report.cluster,
        type="NODE_REGISTERED",
        occurred_at=occurred_at,
        message=f"Node {report.node_id} registered ({report.hostname}, {kind}{definition})",
        actor="substrate-bridge",
        hostname=report.hostname,
        definition=report.definition,
        provisioned=report.provisioned,
    )


def registration_event_id(cluster: str, node_id: str) -> str:
    # One registration per node ever: the id is derived from the node, so a retry after a
    # crash is de-duplicated by JetStream and recognised by the existence check.
    return f"registered:{cluster}:{node_id}"
