"""The cluster config as an event: appended to ``hp.config``, read back as the latest *valid*
record.

Any client that may publish on ``hp.config`` can append bytes that are not a config. The
services fold such a record, reject it and keep the config they had; readers here do the
same: the newest record that decodes and validates is the config in force, and every newer
one is reported as skipped (with its sequence and why), so one bad record never stops
``up``, ``config show`` or ``config apply``.
"""

from __future__ import annotations

import getpass
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError
from prometheus_client import Counter

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import ClusterConfig, ConfigError, decode_config

STREAM = "HP_CONFIG"

SKIPPED = Counter(
    "healthplane_config_records_skipped_total",
    "hp.config records passed over because they do not decode or validate (REL-3)",
)


class ConfigConflict(RuntimeError):
    """Another ``config apply`` landed between reading the version and appending."""


@dataclass(frozen=True, slots=True)
class SkippedRecord:
    seq: int
    reason: str

    def line(self) -> str:
        """How a reader names a passed-over record, once."""
        return f"hp.config record {self.seq} skipped: {self.reason}"


@dataclass(frozen=True, slots=True)
class InForce:
    envelope: wire.ConfigEnvelope
    config: ClusterConfig
    seq: int


@dataclass(frozen=True, slots=True)
class ConfigRead:
    """What ``hp.config`` says now: the config in force (the newest valid record; ``None``
    when none is), every newer record passed over, and the newest sequence, valid or not,
    which is where a reader resumes and what the next apply expects."""

    in_force: InForce | None
    skipped: list[SkippedRecord] = field(default_factory=list)
    last_seq: int = 0


def validated(data: bytes) -> tuple[wire.ConfigEnvelope, ClusterConfig]:
    """One ``hp.config`` record as an envelope and its config; ``ValueError`` names what is wrong."""
    envelope = wire.decode(wire.ConfigEnvelope, data)
    try:
        return envelope, decode_config(envelope)
    except ConfigError as exc:
        raise ValueError(str(exc).splitlines()[0]) from exc


async def read(js: JetStreamContext) -> ConfigRead:
    """Read back from the newest record until one is valid. The stream keeps at most a
    hundred records, and the walk goes past the newest only when that one is bad."""
    try:
        raw = await js.get_last_msg(STREAM, subjects.CONFIG)
    except NotFoundError:
        return ConfigRead(None)
    last_seq = seq = raw.seq or 0
    skipped: list[SkippedRecord] = []
    first_seq: int | None = None
    while True:
        try:
            envelope, config = validated(raw.data or b"")
            return ConfigRead(InForce(envelope, config, seq), skipped, last_seq)
        except ValueError as exc:
            skipped.append(SkippedRecord(seq, str(exc)))
            SKIPPED.inc()
        if first_seq is None:
            first_seq = max(1, (await js.stream_info(STREAM)).state.first_seq)
        found = None
        while found is None:
            seq -= 1
            if seq < first_seq:
                return ConfigRead(None, skipped, last_seq)
            try:
                found = await js.get_msg(STREAM, seq)
            except NotFoundError:
                continue  # deleted: keep walking back
        raw = found


async def apply(js: JetStreamContext, config: ClusterConfig, actor: str | None = None,
                on_skipped: Callable[[SkippedRecord], None] | None = None) -> int:
    """Append ``config`` as the next version after the one in force; returns that version.
    ``on_skipped`` is told of each bad record passed over to find the version in force."""
    current = await read(js)
    if on_skipped is not None:
        for record in current.skipped:
            on_skipped(record)
    version = current.in_force.envelope.version + 1 if current.in_force else 1
    envelope = wire.ConfigEnvelope(
        version=version,
        applied_at=datetime.now(UTC),
        actor=actor or _whoami(),
        config=config.to_wire(),
    )
    # Optimistic concurrency: two operators applying at once cannot both get version N.
    try:
        await js.publish(subjects.CONFIG, wire.encode(envelope), stream=STREAM,
                         headers={"Nats-Expected-Last-Subject-Sequence": str(current.last_seq)})
    except APIError as exc:
        if exc.err_code == 10071:
            raise ConfigConflict("another config was applied at the same time; apply again") from exc
        raise
    return version


def _whoami() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"
