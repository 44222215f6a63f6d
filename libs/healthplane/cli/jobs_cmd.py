"""``healthplane jobs impact --since T [--cluster C] [-o json]`` (JOB-1, JOB-4): every job that
failed since T, with its nodes and the conditions each node carried when the job ended there
(the tenant-facing "who was hit" report). Argument parsing and printing only; the read is
``client.jobs``."""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import UTC, datetime
from typing import Any

from healthplane.cli.common import connection_flags, fail, nats_client, output_flag
from healthplane.client import jobs
from healthplane.client.errors import CommandFailed
from healthplane.client.reads import parse_since
from healthplane.contracts import wire


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    hit = actions.add_parser("impact", help="failed jobs since a time, their nodes and those nodes' conditions then")
    hit.add_argument("--since", default="24h", help="a duration back (24h, 30m, 7d) or an RFC 3339 time (default 24h)")
    hit.add_argument("--cluster", help="only this cluster's jobs")
    output_flag(hit)
    connection_flags(hit)


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_impact(args))
    except CommandFailed as exc:
        return fail(exc)


async def _impact(args: argparse.Namespace) -> int:
    since = parse_since(args.since, datetime.now(UTC))
    async with nats_client(args) as nc:
        found = await jobs.impact(nc, nc.jetstream(), since, args.cluster)
    if args.output == "json":
        print(json.dumps(found.to_json(), indent=2))
        return 0
    print(text(found))
    return 0


def _how(job: dict[str, Any]) -> str:
    if job["signal"] is not None:
        return f"{job['outcome']} (signal {job['signal']})"
    if job["exitCode"] not in (None, 0):
        return f"{job['outcome']} (exit code {job['exitCode']})"
    return str(job["outcome"])


def _conditions(node: dict[str, Any]) -> str:
    found = node["conditions"]
    if not found:
        return "no conditions"
    return "; ".join(f"{wire.condition_title(c['type'])} [{c['severity'].title()}] {c['message']}" for c in found)


def text(found: jobs.Impact) -> str:
    if not found.jobs:
        return f"no failed jobs since {wire.rfc3339(found.since)}"
    lines = [f"{len(found.jobs)} failed job(s) since {wire.rfc3339(found.since)}"]
    for job in found.jobs:
        who = "/".join(part for part in (job["user"], job["account"]) if part) or "-"
        lines.append(f"job {job['jobId']} {_how(job)} at {job['endedAt']}: {job['size']} node(s), "
                     f"partition {job['partition'] or '-'}, user {who}" + (f": {job['reason']}" if job["reason"] else ""))
        lines += [f"  {node['nodeId']}: {_conditions(node)}" for node in job["nodes"]]
    if found.skipped:
        lines.append(f"({found.skipped} record(s) could not be read and were passed over)")
    return "\n".join(lines)
