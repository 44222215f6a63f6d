"""The bridge's state and what it decides for a batch of resource reports (BRG-1, BRG-3).

The state is what the bridge knows of its two outputs: the bucket keys that hold a report,
and the nodes ``HP_NODE_EVENTS`` has a NODE_REGISTERED for. :func:`decide` turns a batch of
reports into a :class:`Plan`: registrations first (a node in the bucket always has its
NODE_REGISTERED), then one put per report. The state moves only on what was stored
(:func:`evolve`): ``main`` tells it, once JetStream acked. Pure: no I/O, no clock, no logs;
what was skipped, and why, comes back in the plan for ``main`` to log.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, NamedTuple

from healthplane.contracts import subjects, wire
from healthplane_substrate_bridge.rules import registration_event

SkipReason = Literal["already registered", "registration not stored"]


@dataclass(slots=True)
class BridgeState:
    known: set[str] = field(default_factory=set)       # bucket keys that hold a report
    registered: set[str] = field(default_factory=set)  # NODE_REGISTERED subjects in HP_NODE_EVENTS


class Report(NamedTuple):
    """One decoded resource report, where it sits in HP_RESOURCES and when JetStream got it."""

    seq: int
    timestamp_ns: int
    report: wire.ResourceReport


class Put(NamedTuple):
    at: int         # the report's place in the batch
    key: str        # in the bucket
    newcomer: bool  # not in the bucket yet: put only once the registrations are stored


@dataclass(frozen=True, slots=True)
class Register:
    subject: str
    event: wire.NodeEvent
    seq: int  # of the report that caused it (its causation)


@dataclass(frozen=True, slots=True)
class Skip:
    key: str
    reason: SkipReason


@dataclass(frozen=True, slots=True)
class Plan:
    registrations: tuple[Register, ...]  # stored before any put of a newcomer
    puts: tuple[Put, ...]                # one per report, in batch order
    skipped: tuple[Skip, ...]            # registrations not asked for

    def without_newcomers(self) -> tuple[tuple[Put, ...], tuple[Put, ...], tuple[Skip, ...]]:
        """The registrations were not stored: (the puts that may still go, those left for
        redelivery, why) — a newcomer's report waits, not to land without its registration."""
        waiting = tuple(put for put in self.puts if put.newcomer)
        return (tuple(put for put in self.puts if not put.newcomer), waiting,
                tuple(Skip(put.key, "registration not stored") for put in waiting))


@dataclass(frozen=True, slots=True)
class Registered:
    subjects: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Stored:
    keys: tuple[str, ...]


def decide(state: BridgeState, reports: Sequence[Report]) -> Plan:
    """Registration for each node the bucket has not seen, unless the event stream already has
    one (a put failed after registering, or the bucket lost the key); a put for every report."""
    keys = [subjects.kv_node_key(r.report.cluster, r.report.node_id) for r in reports]
    newcomers: dict[str, Report] = {}  # by first place in the batch, the latest report wins
    for key, entry in zip(keys, reports, strict=True):
        if key not in state.known:
            newcomers[key] = entry
    registrations: list[Register] = []
    skipped: list[Skip] = []
    for key, (seq, timestamp_ns, report) in newcomers.items():
        subject = subjects.event(report.cluster, report.node_id, "NODE_REGISTERED")
        if subject in state.registered:
            skipped.append(Skip(key, "already registered"))
            continue
        occurred_at = datetime.fromtimestamp(timestamp_ns / 1e9, UTC)
        registrations.append(Register(subject, registration_event(report, occurred_at), seq))
    puts = tuple(Put(at, key, key in newcomers) for at, key in enumerate(keys))
    return Plan(tuple(registrations), puts, tuple(skipped))


def evolve(state: BridgeState, stored: Registered | Stored) -> BridgeState:
    match stored:
        case Registered(subjects=registered):
            state.registered.update(registered)
        case Stored(keys=keys):
            state.known.update(keys)
    return state


def initial_state(known: Iterable[str], registered: Iterable[str]) -> BridgeState:
    """From the bucket's keys and the registrations read at start."""
    return BridgeState(set(known), set(registered))
