"""Eviction's state: every node it knows (holds, work, validation, remediation), the config it
folded, and ``Out``, the records one input produces with ids derived from that input."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from healthplane.contracts import domains as domains_spec
from healthplane.contracts import subjects, wire
from healthplane.contracts.subjects import node_key
from healthplane.runtime.fold import Emit, Inbound, Note
from healthplane_eviction import ladder as remediation
from healthplane_eviction import remediating as rem
from healthplane_eviction import validation as vrules
from healthplane_eviction.validation import Gate, Isolating, Run, SeenJob

SERVICE = "eviction"


class Limits(msgspec.Struct, frozen=True):
    max_eviction_restarts: int = 3
    evict_on_fault_classes: tuple[str, ...] = ()


class EvictionConfig(msgspec.Struct, frozen=True):
    cluster: Limits = Limits()
    definitions: dict[str, Limits] = {}
    validation: vrules.Policy = vrules.Policy()
    remediation: rem.RemediationPolicy = rem.RemediationPolicy()
    domains: domains_spec.Spec = domains_spec.Spec()  # DOM-1's config part (DOM-4 keeps members together)

    def limits(self, definition: str | None) -> Limits:
        return self.definitions.get(definition, self.cluster) if definition else self.cluster


class Node(msgspec.Struct):
    cluster: str
    node_id: str
    known: bool = False
    provisioned: bool | None = None  # None: no resource report yet (EVI-4's retryable case)
    ready: bool = True
    offline: bool = False
    definition: str | None = None
    hardware_domains: dict[str, str] = {}  # DOM-1: what the node's hardware tells (its NVLink domain)
    faults: dict[str, str] = {}  # active condition type -> severity
    holds: dict[str, wire.Hold] = {}
    running: dict[str, wire.Allocation] = {}
    ending: list[str] = []  # told to requeue or fail; still on the node until the scheduler says so
    # Allocations an operator's command ended: their failure is not the hardware's (EVI-7).
    operator_ended: list[str] = []
    teardown: str | None = None  # "deprovision" | "replace" | "force": terminate once empty
    teardown_actor: str | None = None
    terminate_directive: str | None = None  # sent, awaiting the provisioner's answer
    force_command: str | None = None  # a --force command waiting for that answer
    gone: bool = False
    gpus: int | None = None  # from its resource report: a suite that needs more excludes it (VAL-4)
    fault_seen: bool = False  # a hardware fault since its last passed validation (VAL-2)
    gate: Gate | None = None  # a release waiting for this node to pass validation (VAL-2)
    fault_details: dict[str, rem.Fault] = {}  # active condition type -> what picks its ladder (REM-1)
    climb: remediation.Climb | None = None  # the remediation episode under way or ended (REM-1)
    climb_actor: str | None = None
    climb_ladder: rem.LadderSpec | None = None
    climb_request: str | None = None  # the agent step whose outcome is awaited
    climb_hold: str | None = None  # the cordon hold the episode placed
    remediation_attempts: list[datetime] = []  # agent steps started, within the window (the bound)
    needs_attention: str | None = None  # why it stopped at NODE_NEEDS_ATTENTION, until service


class EvictionState(msgspec.Struct):
    nodes: dict[str, Node] = {}
    config: EvictionConfig = EvictionConfig()
    runs: dict[str, Run] = {}  # validation job id -> the run in flight (VAL-1)
    isolations: dict[str, Isolating] = {}  # failed job's key -> its isolation (VAL-3)
    jobs: dict[str, SeenJob] = {}  # job key -> where it ran: running jobs, and failed ones kept
    climbing: list[str] = []  # node keys with a remediation step that can time out (the tick's work)



def status(node: Node) -> wire.NodeStatus:
    """SPEC.md's precedence, from what eviction folds itself."""
    if node.offline:
        return "OFFLINE"
    if not node.ready:
        return "NOT_READY"
    return "CORDONED" if node.holds else "READY"


class Out:
    """The records one input produces, with ids derived from that input (deterministic)."""

    def __init__(self, at: datetime, stem: str, *, tick: bool = False) -> None:
        self.at = at
        self.stem = stem
        self.emits: list[Emit] = []
        self.event_ids: list[str] = []
        self.hold_ids: list[str] = []
        self.notes: list[Note] = []  # told by the Processor, for a live input only
        # A tick has no input whose position dedupes its records after a restart: its records
        # carry their (deterministic) ids as message ids instead.
        self.tick = tick

    @classmethod
    def of(cls, inbound: Inbound) -> Out:
        return cls(inbound.at, f"{SERVICE}:{inbound.stream}:{inbound.seq}")

    def _id(self) -> str:
        return f"{self.stem}:{len(self.emits)}"

    def _emit(self, subject: str, record: wire.Record, record_id: str) -> None:
        self.emits.append(Emit(subject, wire.encode(record), msg_id=record_id if self.tick else None))

    def event(self, node: Node, kind: wire.EventType, message: str, actor: str, **fields: Any) -> str:
        event = wire.NodeEvent(id=self._id(), node_id=node.node_id, cluster=node.cluster, type=kind,
                               occurred_at=self.at, message=message, actor=actor, **fields)
        self._emit(subjects.event(node.cluster, node.node_id, kind), event, event.id)
        self.event_ids.append(event.id)
        return event.id

    def directive(self, node: Node, action: wire.DirectiveAction, message: str,
                  allocation_id: str | None = None) -> str:
        directive = wire.Directive(id=self._id(), node_id=node.node_id, cluster=node.cluster, action=action,
                                   message=message, issued_at=self.at, allocation_id=allocation_id)
        self._emit(subjects.directive(node.cluster, node.node_id), directive, directive.id)
        return directive.id

    def job(self, job: wire.Job) -> None:
        self._emit(subjects.job(job.cluster, job.id), job, f"{self.stem}:job:{job.id}")

    def remediate(self, request: wire.RemediationRequest) -> None:
        self._emit(subjects.remediate(request.cluster, request.node_id), request, request.id)

    def outcome(self, command: wire.Command, result: wire.CommandResult, message: str, **fields: Any) -> None:
        outcome = wire.CommandOutcome(command_id=command.id, node_id=command.node_id, cluster=command.cluster,
                                      verb=command.verb, result=result, message=message, decided_at=self.at,
                                      event_ids=list(self.event_ids), hold_ids=list(self.hold_ids), **fields)
        self._emit(subjects.command_outcome(command.cluster, command.node_id), outcome,
                   f"{self.stem}:outcome:{command.id}")


def node_of(state: EvictionState, cluster: str, node_id: str) -> Node:
    key = node_key(cluster, node_id)
    node = state.nodes.get(key)
    if node is None:
        node = state.nodes[key] = Node(cluster=cluster, node_id=node_id)
    return node
