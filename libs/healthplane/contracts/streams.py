"""The streams and the KV bucket of ARCHITECTURE.md, in one table.

The table says, per stream, every channel it holds (address, record, writer): the streams'
subjects are derived from it, and so is ``proto/asyncapi.json`` (``healthplane.contracts.proto``), so
the bus and its description cannot drift apart.

``runtime.converge.ensure()`` is what ``healthplane up`` and every service call at start: it creates what is
missing, updates what differs and can be updated, and refuses with a message naming the
stream and the field when an existing stream conflicts in a way JetStream cannot update
(another retention policy or storage type): changing those silently would lose records.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

# The server's own config types (data classes, no I/O): the table is written in them.
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig, SubjectTransform

HOUR: Final = 3600.0
DAY: Final = 24 * HOUR

# Nats-Msg-Id de-duplication window. Exactly-once emit does not rely on it alone (a service
# also skips inputs already reflected in its output), but it catches the common case of a
# crash between publish and snapshot cheaply.
DUPLICATE_WINDOW: Final = 120.0

NODES_BUCKET: Final = "substrate-nodes"
NODES_BUCKET_DEFAULT_MAX_BYTES: Final = 64 * 1024 * 1024
LEASES_BUCKET: Final = "healthplane-leases"
LEASE_TTL_S: Final = 10.0
# A lease holder answers requests here while it holds (runtime.lease): core NATS, never
# stored. No subscriber anywhere means no connection of the holder's left on the bus.
LEASE_PRESENCE_PREFIX: Final = "hp.lease"

# HA-4: the per-node records the partitioned folds read carry one more token, last: the
# node's slot, ``{{partition(PARTITION_SLOTS, cluster, node)}}``, written by the stream itself
# (a subject transform), so publishers keep the contract's subjects and a node's records all
# land in one slot. A fold replica owns the slots of its partitions (``slots_of``): P of them
# can change without moving a record, as long as P <= PARTITION_SLOTS. 24 divides by 1, 2, 3,
# 4, 6, 8 and 12, so the usual P split the nodes evenly. Whether an install has slots is
# chosen when its streams are created (``ensure(slotted=True)``, ``up --partitions``).
PARTITION_SLOTS: Final = 24
# The services that may run as P partitions (up --partitions): their durable consumers carry
# the partition's index, and the permissions name every index a partition may have (SEC-8).
PARTITIONED: Final = ("health-ingest", "scorer")
# Services that hold no durable consumer: the api's read model follows its streams by direct
# gets, so the most exposed process gets no consumer grant at all (SEC-8).
READ_MODELS: Final = ("api",)
# Durable consumers a service names after itself alone (the others are consumer_name's). The
# webhook dispatcher's is the single durable it read through before INT-2: it deletes it at start.
NAMED_DURABLES: Final[dict[str, tuple[str, ...]]] = {"webhook-dispatcher": ("HP_NODE_EVENTS",)}
# INT-2: one durable consumer per webhook endpoint. nats-server grants consumers by whole name
# (no prefix wildcard), and an endpoint is no name a permission can hold, so the dispatcher
# has a fixed set of slots, ``consumer_name("webhook-dispatcher", "HP_NODE_EVENTS", i)`` for
# i < WEBHOOK_SLOTS, each endpoint holding one (recorded in the consumer's metadata): the cap
# on endpoints, which `config apply` enforces (docs/webhooks.md).
WEBHOOK_SLOTS: Final = 64
WEBHOOK_SLOT_OWNER: Final = "healthplane-webhook-endpoint"  # the metadata key naming its endpoint (a label)
SLOTTED_DURABLES: Final[dict[str, dict[str, int]]] = {"webhook-dispatcher": {"HP_NODE_EVENTS": WEBHOOK_SLOTS}}


@dataclass(frozen=True, slots=True)
class Channel:
    """One subject tree: ``address`` with ``{parameters}``, the record it carries (a kind of
    ``wire.RECORDS``; ``None``: any bytes, a dead letter being its input), who writes it."""

    address: str
    record: str | None
    writer: str
    description: str
    # The identities (healthplane.contracts.permissions roles) nats-server lets publish here; a
    # ``{type}`` address takes its writers from EVENT_WRITERS instead, an ``{actor}`` or
    # ``{service}`` parameter is bound to the publisher's own identity.
    writers: tuple[str, ...] = ()

    @property
    def subject(self) -> str:
        """The stream subject that holds it: the fixed tokens, then ``>`` for the parameters."""
        fixed = [token for token in self.address.split(".") if not token.startswith("{")]
        return ".".join(fixed) + (".>" if "{" in self.address else "")


@dataclass(frozen=True, slots=True)
class StreamDef:
    name: str
    channels: tuple[Channel, ...]
    retention: RetentionPolicy = RetentionPolicy.LIMITS
    max_age: float = 0.0  # seconds, 0 = forever
    max_msgs_per_subject: int = -1
    max_msgs: int = -1
    max_bytes: int = -1
    description: str = ""
    # The services that read it (consumers, direct gets); viewers and admins read every stream.
    readers: tuple[str, ...] = ()
    # Whether its readers consume it with durable consumers (SEC-8 names those in the
    # permissions); False: read only now and then, by direct gets (snapshots, dead letters).
    durable: bool = True
    # The per-node channel whose records get the slot token in a partitioned install (HA-4).
    slotted: str | None = None

    @property
    def subjects(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(channel.subject for channel in self.channels))

    def config(self, replicas: int, slotted: bool = False) -> StreamConfig:
        return StreamConfig(
            name=self.name,
            description=self.description,
            subjects=list(self.subjects),
            retention=self.retention,
            max_age=self.max_age,
            max_msgs_per_subject=self.max_msgs_per_subject,
            max_msgs=self.max_msgs,
            max_bytes=self.max_bytes,
            storage=StorageType.FILE,
            num_replicas=replicas,
            discard=DiscardPolicy.OLD,
            duplicate_window=DUPLICATE_WINDOW,
            allow_direct=True,
            # A lease holder's records go as atomic batches bound to its fence mark
            # (runtime.fencing); nats-server 2.12 or later.
            allow_atomic=True if self.fenced else None,
            subject_transform=self.slot_transform if slotted else None,
        )

    @property
    def slot_transform(self) -> SubjectTransform | None:
        """``hp.report.*.*`` -> ``hp.report.{{wildcard(1)}}.{{wildcard(2)}}.{{partition(24,1,2)}}``:
        the channel's subject with its node's slot appended (cluster and node are always its
        first two parameters). Other subjects of the stream (fence marks, jobs) pass as they are."""
        if self.slotted is None:
            return None
        tokens = self.slotted.split(".")
        params = [i for i, t in enumerate(tokens) if t.startswith("{")]
        source = ".".join("*" if t.startswith("{") else t for t in tokens)
        dest = [f"{{{{wildcard({params.index(i) + 1})}}}}" if i in params else t for i, t in enumerate(tokens)]
        return SubjectTransform(src=source, dest=".".join([*dest, f"{{{{partition({PARTITION_SLOTS},1,2)}}}}"]))

    @property
    def fenced(self) -> bool:
        return any(c.address.startswith(FENCE_PREFIX) for c in self.channels)


# Who may publish what (SEC-1): the identities of healthplane.contracts.permissions. A collector writes
# for its own node only, the simulated fleet for its own cluster.
WRITES_NODE: Final = ("collector", "sim")
# The control plane's services (registry.CONTROL_PLANE; the library does not import it).
SERVICES: Final = ("health-ingest", "scorer", "policy", "eviction", "webhook-dispatcher", "substrate-bridge",
                   "scheduler", "slurm-adapter", "api")
# The scheduler integrations (EVI-8, registry.SCHEDULERS): one runs in a stack, each writing
# the same channels.
SCHEDULERS: Final = ("scheduler", "slurm-adapter")
# How a service's command subjects are bound beyond its own name as the actor: the Slurm
# adapter records an administrator's RESUME in Slurm as actor ``slurm``, and may only release
# holds that way, never cordon or deprovision (SLU-2).
COMMAND_BINDINGS: Final[dict[str, dict[str, str]]] = {"slurm-adapter": {"actor": "slurm", "verb": "hold-release"}}
# The one writer of each node event type (ARCHITECTURE.md): nats-server lets no other
# identity append it, and the webhook dispatcher names it as the CloudEvent's source.
EVENT_WRITERS: Final[dict[str, str]] = {
    "CONDITION_RAISED": "health-ingest",
    "CONDITION_CLEARED": "health-ingest",
    "HEARTBEAT_MISSED": "health-ingest",
    "HEARTBEAT_RESUMED": "health-ingest",
    "SCORE_CHANGED": "scorer",
    "POLICY_RECOMMENDED": "policy",
    "POLICY_ACTED": "policy",
    "POLICY_HALTED": "policy",
    "NODE_REGISTERED": "substrate-bridge",
    "NODE_CORDONED": "eviction",
    "NODE_UNCORDONED": "eviction",
    "NODE_DRAINED": "eviction",
    "NODE_EVICTED": "eviction",
    "NODE_DEPROVISIONED": "eviction",
    "NODE_REPLACED": "eviction",
    "NODE_SERVICED": "eviction",
    "HOLD_CREATED": "eviction",
    "HOLD_RELEASED": "eviction",
    "JOB_FAILURE_ATTRIBUTED": "eviction",
    "VALIDATION_STARTED": "eviction",
    "VALIDATION_PASSED": "eviction",
    "VALIDATION_FAILED": "eviction",
    # REM: eviction sends each step to the node's agent and reads the agent's outcome and boot
    # id in its resource reports, beside the conditions it already folds.
    "REMEDIATION_STARTED": "eviction",
    "REMEDIATION_SUCCEEDED": "eviction",
    "REMEDIATION_FAILED": "eviction",
    "NODE_NEEDS_ATTENTION": "eviction",
    "FAULT_OBSERVED": "health-ingest",  # RUL-1
    "RULE_FIRED": "health-ingest",
    # JOB-4: the scheduler's own drains, read where the scheduler is (health-ingest turns them
    # into the scheduler_drained condition).
    "SCHEDULER_DRAINED": "slurm-adapter",
    "SCHEDULER_UNDRAINED": "slurm-adapter",
    # DOM-3: the policy folds every node's domains and health; a domain's events are its own.
    "DOMAIN_DEGRADED": "policy",
    "DOMAIN_RECOVERED": "policy",
}

FENCE_PREFIX: Final = "hp.fence"


def _fence(token: str) -> Channel:
    """The writer in force of a stream a replicated service writes (HA-3): the lease holder
    appends one record here when it takes over, and each of its outputs expects this subject's
    last sequence to still be that record (``Nats-Expected-Last-Subject-Sequence-Subject``).
    A holder fenced off by a newer one is refused by the server itself, whatever its clock."""
    return Channel(f"{FENCE_PREFIX}.{token}.{{service}}.{{partition}}", None, "a replicated service's lease holder",
                   "The lease holder in force; outputs are refused once another holder has written here",
                   SERVICES)


STREAMS: Final[tuple[StreamDef, ...]] = (
    StreamDef("HP_REPORTS", (
        Channel("hp.report.{cluster}.{node}", "report", "collector", "Health report, periodic or out-of-band", WRITES_NODE),),
        max_age=DAY, max_msgs_per_subject=64, description="health reports from collectors",
        readers=("health-ingest",), slotted="hp.report.{cluster}.{node}"),
    StreamDef("HP_RESOURCES", (
        Channel("hp.resource.{cluster}.{node}", "resource", "collector", "Resource report: inventory and readiness", WRITES_NODE),),
        max_msgs_per_subject=1, description="latest resource report per node",
        readers=("health-ingest", "scorer", "policy", "eviction", "substrate-bridge"),
        slotted="hp.resource.{cluster}.{node}"),
    StreamDef("HP_ASSESSMENTS", (
        Channel("hp.assess.{cluster}.{node}", "assess", "health-ingest",
                "The node's complete active condition set after one report", ("health-ingest",)),
        _fence("assess"),),
        max_msgs_per_subject=1, description="latest condition set per node", readers=("scorer",),
        slotted="hp.assess.{cluster}.{node}"),
    StreamDef("HP_NODE_EVENTS", (
        Channel("hp.event.{cluster}.{node}.{type}", "event", "the service that owns the type",
                "Node event, the durable record"),
        _fence("event"),),
        max_age=90 * DAY, description="append-only node events, 90 days",
        readers=("health-ingest", "scorer", "policy", "eviction", "webhook-dispatcher", "substrate-bridge",
                 "slurm-adapter"),
        slotted="hp.event.{cluster}.{node}.{type}"),
    StreamDef("HP_NODES", (
        Channel("hp.node.{cluster}.{node}", "node", "scorer", "Latest folded view of a node", ("scorer",)),
        _fence("node"),),
        max_msgs_per_subject=1, description="latest folded view per node (node list / node show)",
        readers=("policy", *SCHEDULERS)),
    StreamDef("HP_COMMANDS", (
        Channel("hp.cmd.{cluster}.{node}.{verb}.{actor}", "cmd", "CLI, policy",
                "Operator or automation command; the last token is the sender's identity",
                ("admin", "policy", "slurm-adapter")),
        Channel("hp.outcome.{cluster}.{node}", "outcome", "eviction",
                "What became of a command: applied, refused, retry", ("eviction",)),
        Channel("hp.provision.{cluster}.{node}", "provision", "provisioner",
                "The provisioner's answer to a terminate directive", SCHEDULERS),
        Channel("hp.policy.{cluster}.{action}.{actor}", "policy", "CLI",
                "Instruction to the policy service: breaker-reset; the last token is the sender's identity", ("admin",)),
        Channel("hp.provider.{cluster}.{node}", "provider", "sim provider",
                "How the simulated provisioner answers terminations of one node", ("admin",)),
        Channel("hp.hardware.{cluster}.{node}", "hardware", "sim inject",
                "A simulated node's hidden hardware truth (a silent bad GPU) for the reference scheduler",
                ("admin",)),
        _fence("cmd")),
        max_age=7 * DAY, description="operator and automation commands with their outcomes",
        readers=("eviction", "policy", *SCHEDULERS)),
    StreamDef("HP_ALLOCATIONS", (
        Channel("hp.alloc.{cluster}.{node}.{alloc}", "alloc", "scheduler", "Allocation lifecycle", SCHEDULERS),
        Channel("hp.job.{cluster}.{job}", "job", "sim submit, eviction",
                "Work submitted to the reference scheduler; eviction's validation runs (VAL-1)", ("admin", "eviction")),
        _fence("alloc")),
        max_age=7 * DAY, description="submitted jobs and the allocation lifecycle from the scheduler",
        readers=("scorer", "policy", "eviction", *SCHEDULERS, "sim"), slotted="hp.alloc.{cluster}.{node}.{alloc}"),
    # JOB-1: one record per job run and node, once it ended. Bounded by age and bytes: the folds
    # keep a bounded recent history per node (health-ingest's JOB-2 test), the CLI reads a
    # window (`jobs impact`).
    StreamDef("HP_JOB_OUTCOMES", (
        Channel("hp.jobend.{cluster}.{node}.{job}", "jobend", "scheduler",
                "How a job's run ended on a node: completed, failed, node_fail, timeout, cancelled, ...",
                SCHEDULERS),
        _fence("jobend")),
        max_age=30 * DAY, max_bytes=1024 * 1024 * 1024,
        description="job outcomes per node from the scheduler (30 days)",
        readers=("scorer", "health-ingest"), slotted="hp.jobend.{cluster}.{node}.{job}"),
    # Limits, not a work queue: eviction reads its own directives back after a restart (REL-1),
    # and a work queue would delete them once the scheduler acked them.
    StreamDef("HP_DIRECTIVES", (
        Channel("hp.directive.{cluster}.{node}", "directive", "eviction",
                "Instruction to the scheduler or provisioner", ("eviction",)),
        _fence("directive"),),
        max_age=7 * DAY, description="instructions to the scheduler and provisioner", readers=SCHEDULERS),
    # REM-2: one subject per node, written by eviction only, read live by that node's agent
    # alone (its permissions); kept 7 days for the record, never replayed to an agent.
    StreamDef("HP_REMEDIATION", (
        Channel("hp.remediate.{cluster}.{node}", "remediate", "eviction",
                "One step of a node's remediation ladder, for that node's agent", ("eviction",)),
        _fence("remediate"),),
        max_age=7 * DAY, description="remediation requests, one subject per node (7 days)", readers=()),
    StreamDef("HP_CONFIG", (
        Channel("hp.config", "config", "config apply", "The whole validated cluster config, versioned", ("admin",)),),
        max_msgs=100, description="history of applied cluster configs", readers=SERVICES),
    StreamDef("HP_SNAPSHOTS", (
        Channel("hp.snapshot.{service}.{partition}", "snapshot", "every stateful service",
                "Latest folded state per service and partition", SERVICES),
        _fence("snapshot"),),
        max_msgs_per_subject=1, description="latest snapshot per service and partition", readers=SERVICES,
        durable=False),
    # Bounded in bytes as well as age: a peer that floods garbage fills it, never the disk.
    StreamDef("HP_DEAD_LETTERS", (
        Channel("hp.dead.{service}.{stream}", None, "every service",
                "An input the service could not process, byte for byte; what happened in Hp-Dead-* headers",
                SERVICES),),
        max_age=30 * DAY, max_bytes=256 * 1024 * 1024,
        description="inputs a service could not process, with the error (30 days)", readers=SERVICES,
        durable=False),
)
CHANNELS: Final[tuple[Channel, ...]] = tuple(c for s in STREAMS for c in s.channels)
STREAMS_BY_NAME: Final = {s.name: s for s in STREAMS}
_FENCES: Final = {s.name: c.address for s in STREAMS for c in s.channels if c.address.startswith(FENCE_PREFIX)}


def fence_subject(stream: str, service: str, partition: int | str = 0) -> str | None:
    """Where ``service``'s holder of ``partition`` marks itself in ``stream``; ``None`` for a
    stream no replicated service writes."""
    address = _FENCES.get(stream)
    if address is None:
        return None
    return address.replace("{service}", service).replace("{partition}", str(partition))


def lease_presence_subject(lease_name: str) -> str:
    """Where the holder of lease ``lease_name`` (``scorer``, ``scorer.2of4``) answers while it
    holds it."""
    return f"{LEASE_PRESENCE_PREFIX}.{lease_name}"


def slots_of(partition: int, partitions: int) -> tuple[int, ...]:
    """The slots partition ``partition`` of ``partitions`` owns: every P-th one, so that any
    P <= PARTITION_SLOTS covers each slot exactly once."""
    if not 0 < partitions <= PARTITION_SLOTS or not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} of {partitions}: P must be 1..{PARTITION_SLOTS}")
    return tuple(range(partition, PARTITION_SLOTS, partitions))


def _matches(pattern: list[str], tokens: list[str]) -> bool:
    return len(pattern) == len(tokens) and all(a == b or "*" in (a, b) for a, b in zip(pattern, tokens, strict=True))


def stored_filters(stream: str, filters: Iterable[str], slots: Iterable[int] | None = None) -> tuple[str, ...]:
    """The consumer filters that select ``filters`` (written for the contract's subjects) in
    ``stream`` as it stores them (HA-4): with ``slots``, only those slots' records; without,
    every record whichever the install (with slots or without), so a reader never needs to
    know. A filter a partition cannot split (not a node subject) is a ValueError."""
    wanted = tuple(filters)
    definition = STREAMS_BY_NAME.get(stream)
    slotted = definition.slot_transform if definition is not None else None
    if slotted is None:
        return wanted
    channel = slotted.src.split(".")
    if slots is None:
        out: list[str] = []
        for subject in wanted:
            out.append(subject)
            if not subject.endswith(">") and _matches(channel, subject.split(".")):
                out.append(f"{subject}.*")
        return tuple(out)
    per_node: list[str] = []
    for subject in wanted or (slotted.src,):
        tokens = subject.split(".")
        if tokens[-1] == ">" and channel[: len(tokens) - 1] == tokens[:-1]:
            tokens = channel  # hp.alloc.> -> hp.alloc.*.*.*
        if not _matches(channel, tokens):
            raise ValueError(f"{stream}: filter {subject} does not select node records, a partition cannot split it")
        per_node.append(".".join(t if t != "*" or c == "*" else c for t, c in zip(tokens, channel, strict=True)))
    return tuple(f"{subject}.{slot}" for subject in per_node for slot in slots)


def consumer_name(service: str, stream: str, partition: int = 0) -> str:
    """The durable consumer of partition ``partition`` of ``service`` on ``stream``: the only
    consumers of a stream, each its service's alone (SEC-8; readers use direct gets). Named by
    the partition's index, not its layout (``2``, not ``2of4``), so that the permissions can
    name every consumer a service may ever hold: one per slot at most. Two layouts of one
    service never run at once (each folds every slot: they would write each view twice)."""
    return f"{service}_{partition}-{stream}".replace(".", "_")


def durables_of(service: str) -> tuple[tuple[str, str], ...]:
    """Every (stream, consumer) ``service`` may hold: one per stream it reads and partition it
    may run as (or slot it holds, ``SLOTTED_DURABLES``), and the ones it names after itself."""
    if service in READ_MODELS:
        return ()
    partitions = PARTITION_SLOTS if service in PARTITIONED else 1
    slotted = SLOTTED_DURABLES.get(service, {})
    found = [(s.name, consumer_name(service, s.name, p)) for s in STREAMS if service in s.readers and s.durable
             for p in range(slotted.get(s.name, partitions))]
    found += [(stream, service) for stream in NAMED_DURABLES.get(service, ())]
    return tuple(found)
