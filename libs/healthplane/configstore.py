"""The cluster config as an event: appended to ``hp.config``, read back as the latest record."""

from __future__ import annotations

import getpass
from datetime import UTC, datetime

from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from healthplane import subjects, wire
from healthplane.config import ClusterConfig, parse_cluster_config

STREAM = "HP_CONFIG"


class ConfigConflict(RuntimeError):
    """Another ``config apply`` landed between reading the version and appending."""


async def latest(js: JetStreamContext) -> tuple[wire.ConfigEnvelope, int] | None:
    """The config in force and its stream sequence, or ``None`` before the first apply."""
    try:
        raw = await js.get_last_msg(STREAM, subjects.CONFIG)
    except NotFoundError:
        return None
    return wire.decode(wire.ConfigEnvelope, raw.data or b""), raw.seq or 0


async def apply(js: JetStreamContext, config: ClusterConfig, actor: str | None = None) -> int:
    """Append ``config`` as the next version; returns the version number."""
    current = await latest(js)
    version = current[0].version + 1 if current else 1
    envelope = wire.ConfigEnvelope(
        version=version,
        applied_at=datetime.now(UTC),
        actor=actor or _whoami(),
        config=config.to_wire(),
    )
    # Optimistic concurrency: two operators applying at once cannot both get version N.
    expected = str(current[1]) if current else "0"
    try:
        await js.publish(subjects.CONFIG, wire.encode(envelope), stream=STREAM,
                         headers={"Nats-Expected-Last-Subject-Sequence": expected})
    except APIError as exc:
        if exc.err_code == 10071:
            raise ConfigConflict("another config was applied at the same time; apply again") from exc
        raise
    return version


def decode_config(envelope: wire.ConfigEnvelope) -> ClusterConfig:
    return parse_cluster_config(envelope.config, f"hp.config version {envelope.version}")


def _whoami() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"
