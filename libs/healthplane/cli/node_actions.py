"""``healthplane node cordon | uncordon | drain | evict | deprovision | hold release | service``.

Each action appends a command to ``HP_COMMANDS`` and waits for eviction's outcome on
``hp.outcome.*``: the message it printed is the reference's, the exit code follows the result
(applied 0, refused 1, retry 3). Past ``--timeout`` the command is still in the stream and
eviction will act on it when it runs: the CLI says so and exits 0. ``--all`` forms send one
command per node (one batch id) and report what each did.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import Iterable
from typing import Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.cli.common import connection_flags, fail, nats_client, one_of, who
from healthplane.client import commands, federation
from healthplane.client.errors import EXIT_OK, EXIT_REFUSED, EXIT_RETRY, CommandFailed
from healthplane.client.nodes import node_views, target
from healthplane.contracts import wire

ACTIONS = ("cordon", "uncordon", "drain", "evict", "deprovision", "hold", "service", "remediate")
DEFAULT_TIMEOUT_S = 10.0

QUESTIONS = {
    "evict": "Take running work off every node in the cluster?",
    "deprovision": "Tear down every node Healthplane provisioned in the cluster once it is empty?",
    "deprovision-evict": "Take running work off and tear down every node Healthplane provisioned in the cluster?",
}


def add_arguments(actions: Any) -> None:
    def action(name: str, help_text: str, *, node: str = "required", all_form: bool = False,
               reason: bool = True) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = actions.add_parser(name, help=help_text)
        if node == "required":
            parser.add_argument("node")
        elif node == "optional":
            parser.add_argument("node", nargs="?")
        if all_form:
            parser.add_argument("--all", action="store_true", help="every node in the cluster")
            parser.add_argument("--yes", action="store_true", help="do not ask for confirmation (scripts)")
        if reason:
            parser.add_argument("--reason")
        parser.add_argument("--cluster")
        parser.add_argument("--federation", action="store_true",
                            help="on a federation hub: the node's own cluster executes it (FED-3)")
        parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                            help=f"seconds to wait for the outcome (default {DEFAULT_TIMEOUT_S:g})")
        parser.add_argument("-o", "--output", **one_of(["text", "json"]), default="text")
        connection_flags(parser)
        return parser

    action("cordon", "stop new work reaching a node (a cordon hold)")
    action("uncordon", "release a node's cordon holds", reason=False)
    drain = action("drain", "cordon a node; --active also requeues its running work", node="optional",
                   all_form=True)
    drain.add_argument("--active", action="store_true", help="requeue running work now")
    action("evict", "take running work off a node (an evict hold)", node="optional", all_form=True)
    deprovision = action("deprovision", "tear the instance down once it is empty (a deprovision hold)",
                         node="optional", all_form=True)
    deprovision.add_argument("--evict", action="store_true", help="also take its running work off")
    deprovision.add_argument("--force", action="store_true", help="tear down now, no hold, ending its work")
    action("remediate", "drain a node, then climb the remediation ladder its fault calls for (REM-1)")
    service = action("service", "record that a node was serviced (clears sticky conditions)")
    service.set_defaults(reason_required=True)
    hold = actions.add_parser("hold", help="holds: release")
    hold_actions = hold.add_subparsers(dest="hold_command", required=True, metavar="ACTION")
    release: argparse.ArgumentParser = hold_actions.add_parser("release", help="release holds by id or in bulk")
    release.add_argument("hold_ids", nargs="*", metavar="HOLD_ID")
    release.add_argument("--all", action="store_true", help="every matching hold (with --node: that node's)")
    release.add_argument("--node")
    release.add_argument("--effect", **one_of(["cordon", "evict", "deprovision"]))
    release.add_argument("--yes", action="store_true")
    release.add_argument("--cluster")
    release.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    release.add_argument("-o", "--output", **one_of(["text", "json"]), default="text")
    connection_flags(release)


def run(args: argparse.Namespace) -> int:
    try:
        usage_error(args)
        if getattr(args, "all", False) and args.node_command in ("evict", "deprovision") and not args.yes:
            question = QUESTIONS["deprovision-evict" if getattr(args, "evict", False) else args.node_command]
            if not confirm(question):
                print("Nothing changed. Pass --yes to skip this question.", file=sys.stderr)
                return EXIT_REFUSED
        return asyncio.run(_run(args))
    except CommandFailed as exc:
        return fail(exc)


def usage_error(args: argparse.Namespace) -> None:
    """Flag combinations that are refused before anything is sent (exit 2)."""
    commands.check(_verb(args), node=getattr(args, "node", None), all_nodes=getattr(args, "all", False),
                   reason=getattr(args, "reason", None), evict=getattr(args, "evict", False),
                   force=getattr(args, "force", False), federation=getattr(args, "federation", False),
                   hold_ids=getattr(args, "hold_ids", None) or ())


def _verb(args: argparse.Namespace) -> wire.CommandVerb:
    return "hold-release" if args.node_command == "hold" else args.node_command


def confirm(question: str) -> bool:
    """Ask on stdout, read stdin even without a terminal; EOF or anything but yes is No."""
    print(f"{question} [y/N] ", end="", flush=True)
    answer = sys.stdin.readline()
    if not sys.stdin.isatty():
        print()  # a piped answer is not echoed: end the question's line ourselves
    return answer.strip().lower() in ("y", "yes")


# ---------------------------------------------------------------------------- sending


def command_for(args: argparse.Namespace, node_id: str, cluster: str, batch_id: str | None,
                hold_ids: list[str] | None = None) -> wire.Command:
    return commands.command(_verb(args), node_id, cluster, who(args), reason=getattr(args, "reason", None),
                            active=getattr(args, "active", False), evict=getattr(args, "evict", False),
                            force=getattr(args, "force", False), batch_id=batch_id,
                            hold_ids=hold_ids if hold_ids is not None else getattr(args, "hold_ids", None) or (),
                            effect=getattr(args, "effect", None))


async def send(nc: NATS, args: argparse.Namespace, sent: list[wire.Command], wait_s: float
               ) -> dict[str, wire.CommandOutcome]:
    return await commands.send_and_wait(nc, who(args), sent, wait_s)


async def _run(args: argparse.Namespace) -> int:
    async with nats_client(args) as nc:
        js = nc.jetstream()
        verb = args.node_command
        if verb == "hold":
            return await _release(nc, js, args)
        if getattr(args, "all", False):
            return await _all(nc, js, args)
        if args.federation:
            node_id, cluster = await federation.command_target(nc, js, args.node, args.cluster, args.node_command)
        else:
            node_id, cluster = await target(nc, js, args.node, args.cluster)
        command = command_for(args, node_id, cluster, None)
        outcomes = await send(nc, args, [command], args.timeout)
        return report_one(args, command, outcomes.get(command.id))


def report_one(args: argparse.Namespace, command: wire.Command, outcome: wire.CommandOutcome | None) -> int:
    if outcome is None:
        pending = (f"{command.verb} {command.node_id}: command {command.id} accepted; eviction has not "
                   "answered yet, it will act on it when it runs (pending)")
        if args.output == "json":
            print(json.dumps({"commandId": command.id, "nodeId": command.node_id, "result": "pending"}, indent=2))
        else:
            print(pending)
        return EXIT_OK
    if args.output == "json":
        print(json.dumps(wire.to_builtins(outcome), indent=2))
    elif outcome.result == "applied":
        print(outcome.message)
    elif outcome.result == "retry":
        print(outcome.message, file=sys.stderr)
    else:
        print(f"Error: {outcome.message}", file=sys.stderr)
    return {"applied": EXIT_OK, "refused": EXIT_REFUSED, "retry": EXIT_RETRY}[outcome.result]


async def _all(nc: NATS, js: JetStreamContext, args: argparse.Namespace) -> int:
    views = await node_views(nc, js, args.cluster)
    batch = str(uuid.uuid4())
    sent = [command_for(args, v.node_id, v.cluster, batch) for v in views]
    outcomes = await send(nc, args, sent, args.timeout) if sent else {}
    return report_all(args, sent, outcomes)


def report_all(args: argparse.Namespace, sent: list[wire.Command],
               outcomes: dict[str, wire.CommandOutcome]) -> int:
    answered = [outcomes[c.id] for c in sent if c.id in outcomes]
    pending = [c for c in sent if c.id not in outcomes]
    applied = [o for o in answered if o.result == "applied"]
    skipped = [o for o in answered if o.skipped]
    failed = [o for o in answered if o.result != "applied" and not o.skipped]
    if args.output == "json":
        print(json.dumps({
            "applied": len(applied), "moved": sum(o.moved or 0 for o in applied),
            "outcomes": [wire.to_builtins(o) for o in answered],
            "pending": [{"commandId": c.id, "nodeId": c.node_id} for c in pending]}, indent=2))
    else:
        _print_all(args, applied, skipped, failed, pending)
    return EXIT_REFUSED if failed else EXIT_OK


def _print_all(args: argparse.Namespace, applied: list[wire.CommandOutcome], skipped: list[wire.CommandOutcome],
               failed: list[wire.CommandOutcome], pending: list[wire.Command]) -> None:
    if args.node_command == "drain":
        moved = sum(o.moved or 0 for o in applied)
        print(f"Cordoned {len(applied)} node(s)" + (f"; requeued {moved} allocation(s)" if args.active else ""))
    else:
        for outcome in applied:
            print(outcome.message)
        for outcome in skipped:
            print(outcome.message)
    for outcome in failed:
        print(f"Error: {outcome.message}", file=sys.stderr)
    if pending:
        print(f"{len(pending)} command(s) accepted and pending: eviction will act on them when it runs")


async def _release(nc: NATS, js: JetStreamContext, args: argparse.Namespace) -> int:
    """``hold release ID…`` finds the node holding each id; ``--all [--node N] [--effect E]``
    releases every matching hold, on one node or across the cluster."""
    views = await node_views(nc, js, args.cluster)
    if args.node:
        views = [v for v in views if v.node_id == args.node]
        if not views:
            raise CommandFailed(f"node {args.node} not found")
    sent: list[wire.Command] = []
    batch = str(uuid.uuid4()) if args.all and not args.node else None
    if args.hold_ids:
        owners = {h.id: v for v in views for h in v.holds}
        unknown = [h for h in args.hold_ids if h not in owners]
        if unknown:
            raise CommandFailed(f"hold {unknown[0]} not found")
        by_node: dict[tuple[str, str], list[str]] = {}
        for hold_id in args.hold_ids:
            view = owners[hold_id]
            by_node.setdefault((view.cluster, view.node_id), []).append(hold_id)
        for (cluster, node_id), ids in by_node.items():
            sent.append(command_for(args, node_id, cluster, batch, hold_ids=ids))
    elif args.node:  # eviction holds the truth about this node's holds: ask it directly
        sent.append(command_for(args, views[0].node_id, views[0].cluster, batch))
    else:
        for view in _holding(views, args.effect):
            sent.append(command_for(args, view.node_id, view.cluster, batch))
    if not sent:
        print("0 hold(s) released: none matched")
        return EXIT_OK
    outcomes = await send(nc, args, sent, args.timeout)
    if len(sent) == 1:
        return report_one(args, sent[0], outcomes.get(sent[0].id))
    return report_all(args, sent, outcomes)


def _holding(views: Iterable[wire.NodeView], effect: str | None) -> list[wire.NodeView]:
    return [v for v in views if any(effect is None or h.effect == effect for h in v.holds)]
