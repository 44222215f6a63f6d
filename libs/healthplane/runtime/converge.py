"""Creating and converging the streams and buckets of ``contracts.streams`` on a server: done
idempotently by ``up`` and by every service at start (existing streams keep the replicas their
operator chose; a field JetStream cannot change is a ``StreamConflict`` naming it)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Final, TypeVar

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType, StreamConfig
from nats.js.errors import APIError, NotFoundError, ServiceUnavailableError

from healthplane.contracts.streams import (
    LEASE_TTL_S,
    LEASES_BUCKET,
    NODES_BUCKET,
    NODES_BUCKET_DEFAULT_MAX_BYTES,
    STREAMS,
    StreamDef,
)

T = TypeVar("T")


# Fields JetStream refuses to change on an existing stream.
_IMMUTABLE: Final = ("retention", "storage")
# Fields we own and converge on; everything else the server fills in is left alone.
_COMPARED: Final = (
    "subjects", "retention", "storage", "max_age", "max_msgs_per_subject", "max_msgs", "max_bytes",
    "num_replicas", "duplicate_window", "allow_direct", "discard", "allow_atomic", "subject_transform",
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
        if field == "allow_atomic":  # unset and false are the same to the server
            have, want = bool(have), bool(want)
        if field == "subject_transform":
            have, want = (have.src, have.dest) if have else None, (want.src, want.dest) if want else None
        if have != want:
            diffs.append(field)
    return diffs


def replicas_for(servers: int) -> int:
    """HA-1: R3 on a cluster of three or more servers (a majority survives one loss; R5 buys
    a second loss at twice the write cost, which an operator asks for with ``replicas=5``),
    R1 on one server."""
    return 3 if servers >= 3 else 1


async def ensure(
    js: JetStreamContext,
    replicas: int | None = None,
    streams: Iterable[StreamDef] = STREAMS,
    nodes_bucket_max_bytes: int = NODES_BUCKET_DEFAULT_MAX_BYTES,
    *,
    servers: int = 1,
    slotted: bool | None = None,
    nodes_bucket_cap: int | None = None,
    lease_ttl_s: float | None = None,
) -> EnsureResult:
    """Create or converge every stream and both buckets. Idempotent.

    ``replicas``: converge every stream and bucket to that many (JetStream moves R1 to R3 in
    place); ``None`` (a service starting) leaves existing ones as their operator made them
    and creates missing ones at :func:`replicas_for` the ``servers`` the client sees. More
    replicas than the cluster has servers is refused with the stream named.

    ``slotted``: the node records of the partitioned folds' streams carry their slot (HA-4,
    chosen at install); ``None`` keeps what exists and creates missing streams without.
    Changing it on a stream that holds records is refused: its records would sit under two
    layouts, and a partition would miss the old ones.

    ``nodes_bucket_cap``: the nodes bucket's size in force (BRG-1, already clamped), made or
    resized in place; ``None`` leaves an existing bucket as it is. Only stream administration
    may resize (the maintainer: ``up``, ``streams converge``; SEC-10), not the bridge.
    ``lease_ttl_s``: the leases bucket's TTL in force (HA-8), set the same way."""
    await _retried(js.account_info)  # JetStream answers for this account
    created: list[str] = []
    updated: list[str] = []
    for definition in streams:
        try:
            info = await _retried(lambda name=definition.name: js.stream_info(name))  # type: ignore[misc]
        except NotFoundError:
            await _placed(definition.name, replicas or replicas_for(servers),
                          js.add_stream(definition.config(replicas or replicas_for(servers), bool(slotted))))
            created.append(definition.name)
            continue
        has_slots = info.config.subject_transform is not None
        wanted = definition.config(replicas or info.config.num_replicas or 1,
                                   has_slots if slotted is None else slotted)
        diffs = _differences(info.config, wanted)
        if not diffs:
            continue
        if "subject_transform" in diffs and info.state.messages and definition.slot_transform is not None:
            raise StreamConflict(
                f"stream {definition.name} holds {info.state.messages} records "
                f"{'with' if has_slots else 'without'} partition slots; partitions are chosen at install "
                f"(docs/operations.md, \"Partitions\"): start from empty streams to change it")
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
        await _placed(definition.name, wanted.num_replicas or 1, js.update_stream(wanted))
        updated.append(definition.name)
    buckets = (
        KeyValueConfig(bucket=NODES_BUCKET, history=1, max_bytes=nodes_bucket_cap or nodes_bucket_max_bytes,
                       storage=StorageType.FILE, direct=True, description="latest resource report per node"),
        KeyValueConfig(bucket=LEASES_BUCKET, history=1, ttl=lease_ttl_s or LEASE_TTL_S, storage=StorageType.FILE,
                       description="leader leases of replicated services"),
    )
    for bucket in buckets:
        stream = f"KV_{bucket.bucket}"
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            bucket.replicas = replicas or replicas_for(servers)
            await _placed(stream, bucket.replicas, js.create_key_value(bucket))
            created.append(stream)
            continue
        resize = bucket.bucket == NODES_BUCKET and nodes_bucket_cap is not None \
            and info.config.max_bytes != nodes_bucket_cap
        retime = bucket.bucket == LEASES_BUCKET and lease_ttl_s is not None \
            and info.config.max_age != lease_ttl_s
        if (replicas is not None and info.config.num_replicas != replicas) or resize or retime:
            # A bucket is a stream: its replicas, size and TTL change like any stream's
            # (create_key_value on an existing bucket refuses another replica count).
            info.config.num_replicas = replicas or info.config.num_replicas
            if resize:
                info.config.max_bytes = nodes_bucket_cap
            if retime and lease_ttl_s is not None:
                info.config.max_age = lease_ttl_s
                info.config.duplicate_window = lease_ttl_s  # the server's bound: at most max_age
            await _placed(stream, info.config.num_replicas or 1, js.update_stream(info.config))
            updated.append(stream)
    return EnsureResult(tuple(created), tuple(updated))


JETSTREAM_WAIT_S: Final = 30.0


async def _retried(call: Callable[[], Awaitable[T]], timeout_s: float = JETSTREAM_WAIT_S) -> T:
    """``call()``, asked again while JetStream does not answer, up to ``timeout_s``, then the
    last error: a cluster just started (or electing its meta leader after a loss) says
    "JetStream not enabled for account" or nothing for a few seconds, and one electing a
    stream's leader answers its reads late."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            return await call()
        except (ServiceUnavailableError, NoRespondersError, NatsTimeoutError):
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _placed(stream: str, replicas: int, request: Awaitable[object]) -> None:
    """Run a create or update; the server's refusal to place ``replicas`` copies becomes one
    line naming the stream (10005 insufficient resources, 10074 not clustered)."""
    try:
        await request
    except APIError as exc:
        if replicas > 1 and exc.err_code in (10005, 10074):
            raise StreamConflict(
                f"stream {stream}: {replicas} replicas asked, but the server says \"{exc.description}\"; "
                f"R{replicas} needs a cluster of at least {replicas} JetStream servers") from exc
        raise


def _show(value: object) -> str:
    return str(getattr(value, "value", value))
