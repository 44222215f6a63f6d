"""``healthplane breakfix`` and ``GET /api/v1/breakfix`` (issue 41.5): the breakfix figures of
the node events stored since a time (``healthplane.contracts.breakfix`` folds them)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.client import history
from healthplane.contracts import breakfix, wire


async def figures(nc: NATS, js: JetStreamContext, since: datetime, cluster: str | None = None) -> dict[str, Any]:
    """``{"since", "events", "seconds", "figures": [per cluster and fault class]}``."""
    folded = breakfix.Breakfix()
    read = await history.fold_since(nc, js, since, breakfix.EVENT_TYPES, folded.fold, cluster)
    return {"since": wire.rfc3339(since), "events": read.events, "skipped": read.skipped,
            "seconds": round(read.seconds, 3), "figures": folded.report(cluster)}
