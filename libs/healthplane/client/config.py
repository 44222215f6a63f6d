"""The config in force as every reader shows it (``config show``, ``GET /api/v1/config``)."""

from __future__ import annotations

from typing import Any

from healthplane.runtime import configstore

SECRET_MASK = "********"


def masked(config: dict[str, Any]) -> dict[str, Any]:
    """The config with every webhook secret replaced: nothing prints secrets."""
    hooks = [
        {**hook, "secret": SECRET_MASK} if "secret" in hook else hook
        for hook in config.get("nodeEventWebhooks", [])
    ]
    return {**config, "nodeEventWebhooks": hooks}


def in_force(applied: configstore.InForce) -> dict[str, Any]:
    """The version, who applied it, the config masked."""
    envelope = applied.envelope
    return {
        "version": envelope.version,
        "appliedAt": envelope.applied_at.isoformat().replace("+00:00", "Z"),
        "actor": envelope.actor,
        "config": masked(envelope.config),
    }
