"""``healthplane webhooks list | replay`` (INT-2): the webhook endpoints and how far behind each
is; sending an endpoint's dead-lettered deliveries again.

``replay ENDPOINT --since T`` sends again the deliveries to ENDPOINT that ended as dead
letters (attempts spent, or refused with a 4xx) recorded since T — what its receiver missed,
not the events it already got. The dispatcher signs each afresh with the same event id.
ENDPOINT is the label ``webhooks list``, the logs and the metrics show (the URL without
credentials)."""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import UTC, datetime

from healthplane.cli.common import connection_flags, fail, nats_client, output_flag, who
from healthplane.client import webhooks
from healthplane.client.errors import CommandFailed
from healthplane.client.reads import parse_since
from healthplane.contracts import wire


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="webhooks_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="endpoints with their consumer slot and lag")
    again = actions.add_parser("replay", help="send an endpoint's dead-lettered deliveries again")
    again.add_argument("endpoint", metavar="ENDPOINT", help="the endpoint's label (`webhooks list`)")
    again.add_argument("--since", required=True,
                       help="dead letters recorded since: 24h, 30m, 7d or an RFC 3339 time")
    for sub in (listing, again):
        connection_flags(sub)
        output_flag(sub)


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_list(args) if args.webhooks_command == "list" else _replay(args))
    except CommandFailed as exc:
        return fail(exc)


async def _list(args: argparse.Namespace) -> int:
    async with nats_client(args) as nc:
        found = await webhooks.endpoints(nc)
    if args.output == "json":
        print(json.dumps([state.to_json() for state in found], indent=2))
        return 0
    if not found:
        print("no webhook endpoints")
        return 0
    rows = [("SLOT", "UNREAD", "HELD", "ENDPOINT")]
    rows += [(str(s.slot), str(s.unread), str(s.held), s.endpoint) for s in found]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("   ".join(cell.rjust(width) for cell, width in zip(row[:3], widths, strict=True)) + "   " + row[3])
    return 0


async def _replay(args: argparse.Namespace) -> int:
    since = parse_since(args.since, datetime.now(UTC))
    async with nats_client(args) as nc:
        answer = await webhooks.replay(nc, who(args), args.endpoint, since)
    if args.output == "json":
        print(json.dumps({"endpoint": answer.endpoint, "since": wire.rfc3339(since), "queued": answer.queued}))
    else:
        print(f"{answer.queued} dead-lettered deliveries to {answer.endpoint} since {wire.rfc3339(since)} "
              "queued for delivery again")
    return 0
