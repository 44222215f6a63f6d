"""``healthplane breakfix [--since 30d] [--cluster C] [-o json]`` (issue 41.5): per cluster and
fault class, the time from a fault to out of service, to remediated, to back in service
(MTTR), and between incidents per node, from the stored node events. Parsing and printing;
the reading is ``healthplane.client.breakfix``'s."""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import UTC, datetime

from healthplane.cli.common import connection_flags, fail, nats_client, output_flag, who
from healthplane.client import breakfix
from healthplane.client.connection import acked_or_refused
from healthplane.client.errors import CommandFailed
from healthplane.client.reads import parse_since
from healthplane.contracts import wire

_COLUMNS = ("outOfService", "remediated", "backInService", "betweenIncidents")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", default="30d", help="events stored since: 30d (default), 24h or an RFC 3339 time")
    parser.add_argument("--cluster", help="only this cluster")
    output_flag(parser)
    connection_flags(parser)


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(args))
    except CommandFailed as exc:
        return fail(exc)


async def _run(args: argparse.Namespace) -> int:
    since = parse_since(args.since, datetime.now(UTC))
    async with nats_client(args) as nc:
        found = await acked_or_refused(nc, who(args), "read node events",
                                       breakfix.figures(nc, nc.jetstream(), since, args.cluster))
    if args.output == "json":
        print(json.dumps(found, indent=2))
        return 0
    print(f"breakfix since {wire.rfc3339(since)}: {found['events']} events")
    rows = [("CLUSTER", "FAULT CLASS", "INCIDENTS", "TO OUT OF SERVICE", "TO REMEDIATED", "TO BACK (MTTR)",
             "BETWEEN INCIDENTS")]
    for row in found["figures"]:
        rows.append((row["cluster"], wire.condition_title(row["faultClass"]), str(row["incidents"]),
                     *(_mean(row[column]) for column in _COLUMNS)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("   ".join(cell.ljust(width) for cell, width in zip(r, widths, strict=True)).rstrip())
    if len(rows) == 1:
        print("no incidents")
    return 0


def _mean(stage: dict[str, object]) -> str:
    seconds = stage["meanSeconds"]
    if not isinstance(seconds, int | float):
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit} (n={stage['count']})"
    return f"{seconds:.0f}s (n={stage['count']})"
