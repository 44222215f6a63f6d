"""``healthplane streams converge`` (SEC-10): stream administration, as the maintainer.

Creates what is missing of the stream table and both buckets, converges what differs, and
sizes the nodes bucket to the cap in force (BRG-1: HEALTHPLANE_NODES_BUCKET_MAX_BYTES, else
the applied config's ``substrate.nodesBucketMaxBytes``), in place. ``healthplane up`` does the
same at each start; a deployment that starts its services another way (compose, systemd)
runs this once before them. The admin who commands and applies config may not (SEC-10)."""

from __future__ import annotations

import argparse
import asyncio
import os

from healthplane.cli.common import connection_flags, fail, nats_client, who
from healthplane.client.connection import acked_or_refused
from healthplane.client.errors import EXIT_USAGE, CommandFailed
from healthplane.contracts.config import (
    LEASE_TTL_ENV,
    NODES_BUCKET_ENV,
    lease_ttl,
    nodes_bucket_cap,
)
from healthplane.runtime import configstore, converge


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="streams_command", required=True, metavar="ACTION")
    run_ = actions.add_parser("converge", help="create and converge the streams and buckets, size the nodes bucket")
    run_.add_argument("--replicas", type=int, metavar="N",
                      help="replicas of every stream and bucket, 1, 3 or 5 (default: keep what exists; new ones R3 "
                           "on a cluster of three or more, R1 on one server; more than the servers is refused)")
    connection_flags(run_)


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_converge(args))
    except CommandFailed as exc:
        return fail(exc)
    except converge.StreamConflict as exc:
        return fail(CommandFailed(str(exc)))


async def _converge(args: argparse.Namespace) -> int:
    if args.replicas is not None and args.replicas not in (1, 3, 5):
        raise CommandFailed(f"--replicas {args.replicas}: 1, 3 or 5", EXIT_USAGE)
    async with nats_client(args) as nc:
        js = nc.jetstream()
        found = await configstore.read(js)
        config = found.in_force.config if found.in_force else None
        done = await acked_or_refused(nc, who(args), "administer streams (the maintainer's credentials do, SEC-10)",
                                      converge.ensure(js, args.replicas, servers=len(nc.servers),
                                                      nodes_bucket_cap=nodes_bucket_cap(
                                                          config, os.environ.get(NODES_BUCKET_ENV)),
                                                      lease_ttl_s=lease_ttl(config, os.environ.get(LEASE_TTL_ENV))))
    print(f"streams converged: created {', '.join(done.created) or 'none'}; updated {', '.join(done.updated) or 'none'}")
    return 0
