"""``healthplane rules backtest`` (RUL-3): what promotion rules would have raised and done over
the node events stored since a time, writing nothing.

The fold is the one health-ingest runs (``healthplane.contracts.promotion``), over the same
events: FAULT_OBSERVED, REMEDIATION_STARTED, REMEDIATION_SUCCEEDED and CONDITION_RAISED, read
in stream order by direct gets (a reader's rights suffice: SEC-8). A raise whose reason is one
of the file's rules is that rule's own record, not an occurrence, and is passed over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.client import history
from healthplane.contracts import promotion, subjects, wire

COUNTED_TYPES = frozenset({"FAULT_OBSERVED", "REMEDIATION_STARTED", "REMEDIATION_SUCCEEDED", "CONDITION_RAISED"})


@dataclass(frozen=True, slots=True)
class NodeFiring:
    cluster: str
    node_id: str
    firing: promotion.Firing


@dataclass(slots=True)
class Backtest:
    """What the rules would have done: per rule (in the file's order) its firings, in time order."""

    rules: tuple[promotion.Rule, ...]
    firings: dict[str, list[NodeFiring]]
    read: int = 0  # events read from the stream
    counted: int = 0  # of them, occurrences the rules looked at
    skipped: int = 0  # records that did not decode
    first_at: datetime | None = None
    last_at: datetime | None = None
    seconds: float = 0.0
    windows: dict[str, promotion.NodeWindows] = field(default_factory=dict)

    def fold(self, event: wire.NodeEvent) -> None:
        """One stored event: its occurrences through every rule, per node."""
        self.read += 1
        self.first_at = self.first_at or event.occurred_at
        self.last_at = event.occurred_at
        if event.type == "CONDITION_RAISED" and event.condition is not None and event.condition.reason in self.firings:
            return  # a rule's own raise
        occurrences = promotion.occurrences_of(event)
        if not occurrences:
            return
        key = subjects.node_key(event.cluster, event.node_id)
        windows = self.windows.get(key)
        if windows is None:
            windows = self.windows[key] = promotion.NodeWindows()
        for occurrence in occurrences:
            self.counted += 1
            for firing in promotion.observe(self.rules, windows, occurrence):
                self.firings[firing.rule].append(NodeFiring(event.cluster, event.node_id, firing))


async def backtest(nc: NATS, js: JetStreamContext, rules: Sequence[promotion.Rule], since: datetime,
                   cluster: str | None = None) -> Backtest:
    """Read the stored events since ``since`` (of ``cluster``, else every cluster) and fold them."""
    found = Backtest(tuple(rules), {rule.name: [] for rule in rules})
    read = await history.fold_since(nc, js, since, COUNTED_TYPES, found.fold, cluster)
    found.skipped, found.seconds = read.skipped, read.seconds
    return found
