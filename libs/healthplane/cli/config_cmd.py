"""``healthplane config validate | apply | show``."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import yaml

from healthplane.cli.common import (
    EXIT_RETRY,
    CommandFailed,
    acked_or_refused,
    actor,
    fail,
    nats_client,
    warn,
)
from healthplane.contracts.config import ConfigError, load_cluster_config
from healthplane.runtime import configstore

SECRET_MASK = "********"


def run(args: argparse.Namespace) -> int:
    if args.config_command == "validate":
        return _validate(args.file)
    if args.config_command == "apply":
        return asyncio.run(_apply(args))
    return asyncio.run(_show(args))


def _validate(path: str) -> int:
    try:
        config = load_cluster_config(path)
    except ConfigError as exc:
        return fail(CommandFailed(str(exc)))
    print(f"{path}: valid (cluster {config.cluster}, mode {config.node_health.mode})")
    return 0


async def _apply(args: argparse.Namespace) -> int:
    try:
        config = load_cluster_config(args.file)
    except ConfigError as exc:
        return fail(CommandFailed(str(exc)))
    try:
        async with nats_client(args) as nc:
            try:
                version = await acked_or_refused(nc, args, "apply config (publish hp.config)", configstore.apply(
                    nc.jetstream(), config, actor=actor(args), on_skipped=lambda r: warn(r.line())))
            except TimeoutError as exc:
                raise CommandFailed("no answer from JetStream for hp.config; retry", EXIT_RETRY) from exc
    except configstore.ConfigConflict as exc:
        return fail(CommandFailed(str(exc), EXIT_RETRY))
    except CommandFailed as exc:
        return fail(exc)
    print(f"config version {version} applied (cluster {config.cluster})")
    return 0


def masked(config: dict[str, Any]) -> dict[str, Any]:
    """The config with every webhook secret replaced: nothing prints secrets."""
    hooks = [
        {**hook, "secret": SECRET_MASK} if "secret" in hook else hook
        for hook in config.get("nodeEventWebhooks", [])
    ]
    return {**config, "nodeEventWebhooks": hooks}


def in_force(applied: configstore.InForce) -> dict[str, Any]:
    """``config show -o json`` = ``GET /api/v1/config``: the version, who applied it, the config masked."""
    envelope = applied.envelope
    return {
        "version": envelope.version,
        "appliedAt": envelope.applied_at.isoformat().replace("+00:00", "Z"),
        "actor": envelope.actor,
        "config": masked(envelope.config),
    }


async def _show(args: argparse.Namespace) -> int:
    try:
        async with nats_client(args) as nc:
            found = await configstore.read(nc.jetstream())
    except CommandFailed as exc:
        return fail(exc)
    for record in found.skipped:
        warn(record.line())
    if found.in_force is None:
        return fail(CommandFailed("no valid config applied yet; services use the built-in defaults"))
    shown = in_force(found.in_force)
    if args.output == "json":
        print(json.dumps(shown, indent=2))
    else:
        print(f"# version {shown['version']}, applied {shown['appliedAt']} by {shown['actor']}")
        print(yaml.safe_dump(shown["config"], sort_keys=False), end="")
    return 0
