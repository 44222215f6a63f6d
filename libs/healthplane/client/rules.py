"""``healthplane rules backtest`` (RUL-3): what promotion rules would have raised and done over
the node events stored since a time, writing nothing.

The fold is the one health-ingest runs (``healthplane.contracts.promotion``), over the same
events: FAULT_OBSERVED, REMEDIATION_STARTED, REMEDIATION_SUCCEEDED and CONDITION_RAISED, read
in stream order by direct gets (a reader's rights suffice: SEC-8). A raise whose reason is one
of the file's rules is that rule's own record, not an occurrence, and is passed over.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.contracts import promotion, subjects, wire
from healthplane.runtime.replay import StoredMsg, read_all

STREAM = "HP_NODE_EVENTS"
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


def fold_events(rules: Sequence[promotion.Rule], events: Iterable[wire.NodeEvent]) -> Backtest:
    """The backtest of ``events`` (pure: the CLI's read feeds the same fold)."""
    found = Backtest(tuple(rules), {rule.name: [] for rule in rules})
    for event in events:
        found.fold(event)
    return found


async def backtest(nc: NATS, js: JetStreamContext, rules: Sequence[promotion.Rule], since: datetime,
                   cluster: str | None = None) -> Backtest:
    """Read the stored events since ``since`` (of ``cluster``, else every cluster) and fold them.
    One subject filter, the types picked by the subject's last token before any decode: a
    stream order merge of four filters would hold every record read in memory first."""
    found = Backtest(tuple(rules), {rule.name: [] for rule in rules})
    decode = msgspec.json.Decoder(wire.NodeEvent).decode
    started = time.perf_counter()

    def sink(msg: StoredMsg) -> None:
        if msg.subject.rpartition(".")[2] not in COUNTED_TYPES:
            return
        try:
            event = decode(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            found.skipped += 1
            return
        found.fold(event)

    filter_ = f"hp.event.{subjects.encode_token(cluster)}.>" if cluster else "hp.event.>"
    await read_all(nc, js, STREAM, filter_, start_time=since, sink=sink)
    found.seconds = time.perf_counter() - started
    return found
