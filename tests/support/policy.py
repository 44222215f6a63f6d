"""Records the policy reads, and a small driver that folds them through the pure core the way
the service does (plus the part of eviction that answers a policy command with its holds)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from healthplane.contracts import wire
from healthplane.contracts.config import parse_cluster_config
from healthplane_policy.rules import Output, PolicyState, Record, decide, policy_config

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
CLUSTER = "lab"


def at(minutes: float = 0, seconds: float = 0) -> datetime:
    return T0 + timedelta(minutes=minutes, seconds=seconds)


def event(node: str, kind: str, when: datetime = T0, *, actor: str = "scorer", **fields: Any) -> wire.NodeEvent:
    return wire.NodeEvent(id=f"{kind}:{node}:{when.isoformat()}:{sorted(fields)}", node_id=node, cluster=CLUSTER,
                          type=kind, occurred_at=when, message=kind.lower(), actor=actor, **fields)  # type: ignore[arg-type]


def registered(node: str, definition: str | None = "gpu-pool", provisioned: bool = False) -> wire.NodeEvent:
    return event(node, "NODE_REGISTERED", actor="substrate-bridge", definition=definition, provisioned=provisioned,
                 hostname=node)


def score(node: str, value: int, previous: int | None, when: datetime = T0) -> wire.NodeEvent:
    return event(node, "SCORE_CHANGED", when, score=value, previous_score=previous)


def condition(node: str, kind: str, condition_type: str, when: datetime = T0, severity: str = "warning",
              reason: str = "Reason") -> wire.NodeEvent:
    change = wire.ConditionChange(type=condition_type, reason=reason, severity=severity,  # type: ignore[arg-type]
                                  message=f"{condition_type} {severity}")
    return event(node, kind, when, actor="health-ingest", condition=change)


def hold(node: str, kind: str, hold_id: str, actor: str, when: datetime = T0, effect: str = "cordon",
         command_id: str | None = None) -> wire.NodeEvent:
    record = wire.Hold(id=hold_id, effect=effect, reason=None, actor=actor, created_at=when)  # type: ignore[arg-type]
    return event(node, kind, when, actor=actor, hold=record, command_id=command_id)


def view(node: str, value: int | None, reported: datetime, definition: str | None = "gpu-pool") -> wire.NodeView:
    return wire.NodeView(node_id=node, cluster=CLUSTER, hostname=node, status="READY", health="DEGRADED",
                         last_reported_at=reported, score=value, score_explanation=None, conditions=[],
                         attributed_failures=wire.AttributedFailures(), holds=[], definition=definition)


def allocation(node: str, alloc: str, state: str, when: datetime = T0) -> wire.Allocation:
    return wire.Allocation(id=alloc, job_id=f"job-{alloc}", node_id=node, cluster=CLUSTER, state=state,  # type: ignore[arg-type]
                           at=when)


def termination(node: str, accepted: bool, when: datetime = T0, message: str = "") -> wire.TerminationResult:
    return wire.TerminationResult(directive_id=f"d-{node}", node_id=node, cluster=CLUSTER, accepted=accepted,
                                  message=message or ("terminated" if accepted else "quota exceeded"), at=when)


def config(node_health: dict[str, Any] | None = None, definitions: dict[str, Any] | None = None,
           version: int = 1, remediation: dict[str, Any] | None = None) -> Record:
    data: dict[str, Any] = {"cluster": CLUSTER, "nodeHealth": node_health or {}, "remediation": remediation or {}}
    if definitions:
        data["provisionerDefinitions"] = {k: {"nodeHealth": v} for k, v in definitions.items()}
    return policy_config(parse_cluster_config(data), version)


class Driver:
    """Feeds records to the core and keeps every output. With ``echo`` it also plays the part
    of eviction that matters here: a policy cordon/drain becomes a hold by ``policy``."""

    def __init__(self, *records: Record, echo: bool = True) -> None:
        self.state = PolicyState()
        self.outputs: list[Output] = []
        self.echo = echo
        self._seq = 0
        self.feed(*records)

    def feed(self, *records: Record, act: bool = True) -> list[Output]:
        produced: list[Output] = []
        for record in records:
            self._seq += 1
            when = _time_of(record)
            self.state, out = decide(self.state, record, when, f"TEST:{self._seq}", act=act)
            produced += out
            self.outputs += out
            # The service reads its own events back (REL-1); decided live, they change nothing.
            for item in out:
                if isinstance(item, wire.NodeEvent):
                    self.state, again = decide(self.state, item, item.occurred_at, f"TEST:{self._seq}:own")
                    assert again == []
            if self.echo:
                for item in out:
                    if isinstance(item, wire.Command) and item.verb in ("cordon", "drain", "replace"):
                        effect = "deprovision" if item.verb == "replace" else "cordon"
                        produced += self.feed(hold(item.node_id, "HOLD_CREATED", f"h-{item.id}", "policy",
                                                   item.issued_at, effect=effect, command_id=item.id))
                        if item.verb == "drain":
                            produced += self.feed(event(item.node_id, "NODE_DRAINED", item.issued_at, actor="policy"))
        return produced

    def events(self, kind: str | None = None) -> list[wire.NodeEvent]:
        return [o for o in self.outputs if isinstance(o, wire.NodeEvent) and (kind is None or o.type == kind)]

    def commands(self, verb: str | None = None) -> list[wire.Command]:
        return [o for o in self.outputs if isinstance(o, wire.Command) and (verb is None or o.verb == verb)]


def _time_of(record: Record) -> datetime | None:
    if isinstance(record, wire.NodeEvent):
        return record.occurred_at
    if isinstance(record, wire.NodeView):
        return record.last_reported_at
    if isinstance(record, wire.Allocation | wire.TerminationResult):
        return record.at
    return None


def fleet(count: int, definition: str | None = "gpu-pool", provisioned: bool = False,
          prefix: str = "n") -> list[wire.NodeEvent]:
    """Registered nodes, each with a first score of 100 (so its next score is its second)."""
    out: list[wire.NodeEvent] = []
    for i in range(count):
        out += [registered(f"{prefix}{i}", definition, provisioned), score(f"{prefix}{i}", 100, None)]
    return out


def only(items: Iterable[Any]) -> Any:
    found = list(items)
    assert len(found) == 1, found
    return found[0]


def refold_after_crash(setup: Iterable[Record], records: list[Record], cut: int,
                       snapshot: bool = False) -> tuple[list[str], list[str]]:
    """The output ids of an uninterrupted run, and of one that crashed after ``records[:cut]``
    and restarted: it refolds those as facts only (their outputs are in the streams), reads its
    own events back (through a snapshot's JSON with ``snapshot``) and decides the rest (REL-1)."""
    import msgspec

    setup = list(setup)
    whole = Driver(*setup, *records)
    before = Driver(*setup, *records[:cut])
    restarted = Driver(*setup)
    restarted.feed(*records[:cut], act=False)
    restarted.feed(*[o for o in before.outputs if isinstance(o, wire.NodeEvent)])
    if snapshot:
        restarted.state = msgspec.json.decode(msgspec.json.encode(restarted.state), type=PolicyState)
    restarted.feed(*records[cut:])
    return [o.id for o in whole.outputs], [o.id for o in before.outputs + restarted.outputs]
