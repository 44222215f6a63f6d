"""DOM-3 sooner: a domain's members falling silent together, told by their peers' reports.

ING-4 declares one node silent after ``heartbeatMissThreshold`` intervals (3 by default, at
least 15 s): alone, a node that misses a report may be slow, not gone. A rack that loses
power is not slow: its members stop together while the rest of the fleet goes on reporting.
So a member of a domain that a ``nodeHealth.domainFaults`` entry watches is *overdue* once
:data:`OVERDUE_INTERVALS` of its intervals have passed since its last report, read on the
clock of the reports folded since (the newest stored time of any report folded, never the
wall clock: a health-ingest behind its stream sees no one overdue, and one that folds no
report at all leaves every node to ING-4). Once the overdue members of one domain reach
DOM-3's threshold (``share`` % of its members rounded up, never fewer than 2, in a domain of
at least ``minMembers``), each of them misses its heartbeat at once: the HEARTBEAT_MISSED the
ordinary deadline would give it later, with the same id, its message naming the domain. The
policy's DOM-3 rule then counts the domain failing about one interval after its first
missing report, not three (docs/domains.md, "How soon a silent domain is seen").

Pure, and derived from the state like the heartbeat deadlines (:mod:`deadlines`): rebuilt
from the nodes and their facts after a restart or a config change, which at worst delays a
domain's detection by one more overdue window."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Final

from healthplane.contracts import domains
from healthplane_health_ingest.deadlines import Deadlines
from healthplane_health_ingest.detectors import NodeFacts
from healthplane_health_ingest.rules import INTERVAL_CAP_S, IngestState, NodeState, SilenceWatch

# (cluster, kind, value)
Domain = tuple[str, str, str]
# One interval and a half: the report one interval after the last did not come, and half an
# interval more for a report late in the normal way (a busy node, a retried publish).
OVERDUE_INTERVALS: Final = 1.5


def overdue_at(node: NodeState) -> datetime | None:
    """When the node, silent since its last report, is overdue; None if it never reported."""
    if node.last_report_at is None:
        return None
    window = _WINDOWS.get(node.interval_s)
    if window is None:  # a fleet has a few intervals: one timedelta each, not one per report
        window = timedelta(seconds=OVERDUE_INTERVALS * min(max(node.interval_s, 1), INTERVAL_CAP_S))
        if len(_WINDOWS) < 1024:
            _WINDOWS[node.interval_s] = window
    return node.last_report_at + window


_WINDOWS: dict[int, timedelta] = {}


class Silence:
    """Per watched domain its members and those overdue, and every member's overdue deadline."""

    def __init__(self, state: IngestState) -> None:
        self.watches: dict[str, SilenceWatch] = {watch.kind: watch for watch in state.config.silence}
        self.resolver = domains.resolver_for(state.config.domain_spec)
        self.members: dict[Domain, set[str]] = {}  # node keys
        self.domains_of: dict[str, tuple[Domain, ...]] = {}  # node key -> its watched domains
        self.overdue: dict[Domain, set[str]] = {}  # members overdue
        self.late: set[str] = set()  # every node overdue in one of them
        for key, node in state.nodes.items():
            self.place(key, node, state.facts.get(key))
        self.deadlines = Deadlines(self._due, state.nodes)

    def _due(self, key: str, node: NodeState) -> datetime | None:
        return overdue_at(node) if key in self.domains_of else None

    def place(self, key: str, node: NodeState, facts: NodeFacts | None) -> None:
        """The node's watched domains now (new, its facts changed): left and joined as needed."""
        resolved = self.resolver.resolve(node.node_id, facts.hardware_domains if facts is not None else {})
        found = tuple((node.cluster, kind, value) for kind, value in resolved.items() if kind in self.watches)
        if found == self.domains_of.get(key, ()):
            return
        self.forget(key)
        for domain in found:
            self.members.setdefault(domain, set()).add(key)
        if found:
            self.domains_of[key] = found

    def forget(self, key: str) -> None:
        """The node left its domains (gone, or placed anew)."""
        for domain in self.domains_of.pop(key, ()):
            members = self.members[domain]
            members.discard(key)
            self.overdue.get(domain, set()).discard(key)
            self.late.discard(key)
            if not members:
                del self.members[domain]
                self.overdue.pop(domain, None)

    def reported(self, key: str, node: NodeState, later: bool = False) -> None:
        """A report: the node is overdue no more, and its overdue deadline moves on
        (:meth:`Deadlines.schedule`, ``later``)."""
        if key in self.late:
            self.late.discard(key)
            for domain in self.domains_of.get(key, ()):
                self.overdue[domain].discard(key)
        self.deadlines.schedule(key, node, later)

    def sweep(self, nodes: Mapping[str, NodeState], seen: datetime) -> list[tuple[NodeState, str]]:
        """Members overdue by ``seen`` (the newest report's stored time) counted; for each
        domain at its threshold, its overdue members not yet missed, with what to say of it."""
        touched: set[Domain] = set()
        for key, _ in self.deadlines.due(seen, nodes):
            self.late.add(key)
            for domain in self.domains_of.get(key, ()):
                self.overdue.setdefault(domain, set()).add(key)
                touched.add(domain)
        declared: list[tuple[NodeState, str]] = []
        for domain in sorted(touched):
            overdue, members = self.overdue[domain], len(self.members[domain])
            _, kind, value = domain
            watch = self.watches[kind]
            if members < watch.min_members or len(overdue) < domains.fault_threshold(watch.share, members):
                continue
            why = f"{len(overdue)} of {members} members of {kind}={value} silent together"
            declared += [(node, why) for key in sorted(overdue)
                         if (node := nodes.get(key)) is not None and not node.missed]
        return declared
