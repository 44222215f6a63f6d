"""The streams and the KV bucket of ARCHITECTURE.md, in one table, and ``ensure()``.

``ensure()`` is what ``healthplane up`` and every service call at start: it creates what is
missing, updates what differs and can be updated, and refuses with a message naming the
stream and the field when an existing stream conflicts in a way JetStream cannot update
(another retention policy or storage type): changing those silently would lose records.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BucketNotFoundError, NotFoundError

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


@dataclass(frozen=True, slots=True)
class StreamDef:
    name: str
    subjects: tuple[str, ...]
    retention: RetentionPolicy = RetentionPolicy.LIMITS
    max_age: float = 0.0  # seconds, 0 = forever
    max_msgs_per_subject: int = -1
    max_msgs: int = -1
    max_bytes: int = -1
    description: str = ""

    def config(self, replicas: int) -> StreamConfig:
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
        )


STREAMS: Final[tuple[StreamDef, ...]] = (
    StreamDef("HP_REPORTS", ("hp.report.>",), max_age=DAY, max_msgs_per_subject=64,
              description="health reports from collectors"),
    StreamDef("HP_RESOURCES", ("hp.resource.>",), max_msgs_per_subject=1,
              description="latest resource report per node"),
    StreamDef("HP_ASSESSMENTS", ("hp.assess.>",), max_msgs_per_subject=1,
              description="latest condition set per node"),
    StreamDef("HP_NODE_EVENTS", ("hp.event.>",), max_age=90 * DAY,
              description="append-only node events, 90 days"),
    StreamDef("HP_NODES", ("hp.node.>",), max_msgs_per_subject=1,
              description="latest folded view per node (node list / node show)"),
    StreamDef("HP_COMMANDS", ("hp.cmd.>", "hp.outcome.>", "hp.provision.>", "hp.policy.>",
                              "hp.provider.>"), max_age=7 * DAY,
              description="operator and automation commands with their outcomes"),
    StreamDef("HP_ALLOCATIONS", ("hp.alloc.>", "hp.job.>"), max_age=7 * DAY,
              description="submitted jobs and the allocation lifecycle from the scheduler"),
    # Limits, not a work queue: eviction reads its own directives back after a restart (REL-1),
    # and a work queue would delete them once the scheduler acked them.
    StreamDef("HP_DIRECTIVES", ("hp.directive.>",), max_age=7 * DAY,
              description="instructions to the scheduler and provisioner"),
    StreamDef("HP_CONFIG", ("hp.config",), max_msgs=100,
              description="history of applied cluster configs"),
    StreamDef("HP_SNAPSHOTS", ("hp.snapshot.>",), max_msgs_per_subject=1,
              description="latest snapshot per service and partition"),
    # Bounded in bytes as well as age: a peer that floods garbage fills it, never the disk.
    StreamDef("HP_DEAD_LETTERS", ("hp.dead.>",), max_age=30 * DAY, max_bytes=256 * 1024 * 1024,
              description="inputs a service could not process, with the error (30 days)"),
)
STREAMS_BY_NAME: Final = {s.name: s for s in STREAMS}

# Fields JetStream refuses to change on an existing stream.
_IMMUTABLE: Final = ("retention", "storage")
# Fields we own and converge on; everything else the server fills in is left alone.
_COMPARED: Final = (
    "subjects", "retention", "storage", "max_age", "max_msgs_per_subject", "max_msgs", "max_bytes",
    "num_replicas", "duplicate_window", "allow_direct", "discard",
)


class StreamConflict(RuntimeError):
    """An existing stream differs from the definition in a way that cannot be updated."""


@dataclass(frozen=True, slots=True)
class EnsureResult:
    created: tuple[str, ...]
    updated: tuple[str, ...]


def _differences(existing: StreamConfig, wanted: StreamConfig) -> list[str]:
    diffs = []
    for field in _COMPARED:
        have, want = getattr(existing, field), getattr(wanted, field)
        if field == "subjects":
            have, want = sorted(have or []), sorted(want or [])
        if field in ("max_age", "duplicate_window"):
            have, want = round(float(have or 0), 3), round(float(want or 0), 3)
        if have != want:
            diffs.append(field)
    return diffs


async def ensure(
    js: JetStreamContext,
    replicas: int = 1,
    streams: Iterable[StreamDef] = STREAMS,
    nodes_bucket_max_bytes: int = NODES_BUCKET_DEFAULT_MAX_BYTES,
) -> EnsureResult:
    """Create or converge every stream and the nodes bucket. Idempotent."""
    created: list[str] = []
    updated: list[str] = []
    for definition in streams:
        wanted = definition.config(replicas)
        try:
            info = await js.stream_info(definition.name)
        except NotFoundError:
            await js.add_stream(wanted)
            created.append(definition.name)
            continue
        diffs = _differences(info.config, wanted)
        if not diffs:
            continue
        blocked = [f for f in diffs if f in _IMMUTABLE]
        if blocked:
            detail = ", ".join(
                f"{f} is {_show(getattr(info.config, f))}, want {_show(getattr(wanted, f))}"
                for f in blocked
            )
            raise StreamConflict(
                f"stream {definition.name} exists with a conflicting configuration ({detail}); "
                f"JetStream cannot change this in place: back up and delete the stream, "
                f"or point Healthplane at another server"
            )
        await js.update_stream(wanted)
        updated.append(definition.name)
    try:
        await js.key_value(NODES_BUCKET)
    except BucketNotFoundError:
        # The bridge resizes the bucket to the configured cap (BRG-1); here we only make
        # sure it exists so that readers never race its creation.
        await js.create_key_value(
            KeyValueConfig(
                bucket=NODES_BUCKET,
                history=1,
                max_bytes=nodes_bucket_max_bytes,
                storage=StorageType.FILE,
                replicas=replicas,
                direct=True,
                description="latest resource report per node",
            )
        )
        created.append(f"KV_{NODES_BUCKET}")
    try:
        await js.key_value(LEASES_BUCKET)
    except BucketNotFoundError:
        await js.create_key_value(KeyValueConfig(
            bucket=LEASES_BUCKET, history=1, ttl=LEASE_TTL_S, storage=StorageType.FILE, replicas=replicas,
            description="leader leases of replicated services"))
        created.append(f"KV_{LEASES_BUCKET}")
    return EnsureResult(tuple(created), tuple(updated))


def _show(value: object) -> str:
    return str(getattr(value, "value", value))
