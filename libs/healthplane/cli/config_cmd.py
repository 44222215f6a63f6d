"""``healthplane config validate | apply | show``."""

from __future__ import annotations

import argparse
import asyncio
import json

import yaml

from healthplane.cli.common import fail, nats_client, who
from healthplane.client.config import in_force
from healthplane.client.connection import acked_or_refused, warn
from healthplane.client.errors import EXIT_RETRY, CommandFailed
from healthplane.contracts.config import ConfigError, load_cluster_config
from healthplane.runtime import configstore


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
                version = await acked_or_refused(nc, who(args), "apply config (publish hp.config)", configstore.apply(
                    nc.jetstream(), config, actor=who(args).actor, on_skipped=lambda r: warn(r.line())))
            except TimeoutError as exc:
                raise CommandFailed("no answer from JetStream for hp.config; retry", EXIT_RETRY) from exc
    except configstore.ConfigConflict as exc:
        return fail(CommandFailed(str(exc), EXIT_RETRY))
    except CommandFailed as exc:
        return fail(exc)
    print(f"config version {version} applied (cluster {config.cluster})")
    return 0


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
