"""``healthplane node validate NODE… [--suite NAME]`` (VAL-1) and ``healthplane isolate JOB``
(VAL-3): commands like any other (``hp.cmd``), answered by eviction when the run has ended.

A validation takes as long as its suite (minutes for ``dcgmi diag -r 2``), so these wait up to
``--timeout`` (default one hour); past it the run goes on and the CLI says how to follow it
(``node events``). Exit: 0 every node passed (isolate: it ended), 1 a node failed or the
command was refused, 3 retry.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from typing import Any

from healthplane.cli.common import connection_flags, fail, nats_client, one_of, who
from healthplane.client import commands, jobs
from healthplane.client.errors import EXIT_OK, EXIT_REFUSED, EXIT_RETRY, CommandFailed
from healthplane.client.nodes import target
from healthplane.contracts import wire

DEFAULT_TIMEOUT_S = 3600.0


def add_validate(actions: Any) -> None:
    parser: argparse.ArgumentParser = actions.add_parser(
        "validate", help="run a diagnostic suite on nodes, each on its own, and record the verdict (VAL-1)")
    parser.add_argument("nodes", nargs="+", metavar="NODE")
    _common(parser)


def add_isolate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="the failed job whose nodes are the suspects")
    _common(parser)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suite", help="the suite (default: the config's validation.defaultSuite)")
    parser.add_argument("--cluster")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"seconds to wait for the verdict (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("-o", "--output", **one_of(["text", "json"]), default="text")
    connection_flags(parser)


def run_validate(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_validate(args))
    except CommandFailed as exc:
        return fail(exc)


def run_isolate(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_isolate(args))
    except CommandFailed as exc:
        return fail(exc)


def _command(args: argparse.Namespace, verb: wire.CommandVerb, node_id: str, cluster: str,
             batch_id: str | None = None, job_id: str | None = None) -> wire.Command:
    return commands.command(verb, node_id, cluster, who(args), suite=args.suite, batch_id=batch_id, job_id=job_id)


async def _validate(args: argparse.Namespace) -> int:
    async with nats_client(args) as nc:
        js = nc.jetstream()
        batch = str(uuid.uuid4()) if len(args.nodes) > 1 else None
        sent = []
        for name in dict.fromkeys(args.nodes):
            node_id, cluster = await target(nc, js, name, args.cluster)
            sent.append(_command(args, "validate", node_id, cluster, batch))
        outcomes = await commands.send_and_wait(nc, who(args), sent, args.timeout)
    answered = [outcomes[c.id] for c in sent if c.id in outcomes]
    pending = [c for c in sent if c.id not in outcomes]
    if args.output == "json":
        print(json.dumps({"outcomes": [wire.to_builtins(o) for o in answered],
                          "pending": [{"commandId": c.id, "nodeId": c.node_id} for c in pending]}, indent=2))
    else:
        for outcome in answered:
            ok = outcome.result == "applied" and outcome.passed is not False
            print(outcome.message if ok else f"Error: {outcome.message}", file=sys.stdout if ok else sys.stderr)
        for command in pending:
            print(f"validate {command.node_id}: still running after {args.timeout:g}s (command {command.id}); "
                  f"follow it with `healthplane node events {command.node_id}`")
    if any(o.result == "retry" for o in answered):
        return EXIT_RETRY
    failed = [o for o in answered if o.result != "applied" or o.passed is False]
    return EXIT_REFUSED if failed else EXIT_OK


async def _isolate(args: argparse.Namespace) -> int:
    cluster = args.cluster or "default"
    async with nats_client(args) as nc:
        js = nc.jetstream()
        # The command travels on one of the job's nodes' subjects; eviction knows the rest.
        nodes = await jobs.job_nodes(nc, js, cluster, args.job)
        if not nodes:
            raise jobs.no_allocations(cluster, args.job)
        command = _command(args, "isolate", nodes[0], cluster, job_id=args.job)
        outcomes = await commands.send_and_wait(nc, who(args), [command], args.timeout)
    outcome = outcomes.get(command.id)
    if outcome is None:
        print(f"isolate {args.job}: still running after {args.timeout:g}s (command {command.id}); each step is a "
              f"node event (VALIDATION_*) on the job's nodes")
        return EXIT_OK
    if args.output == "json":
        print(json.dumps(wire.to_builtins(outcome), indent=2))
    elif outcome.result == "applied":
        print(outcome.message)
        for node, why in sorted((outcome.excluded or {}).items()):
            print(f"excluded {node}: {why}")
    else:
        print(f"Error: {outcome.message}", file=sys.stderr)
        for node, why in sorted((outcome.excluded or {}).items()):
            print(f"excluded {node}: {why}", file=sys.stderr)
    return {"applied": EXIT_OK, "refused": EXIT_REFUSED, "retry": EXIT_RETRY}[outcome.result]
