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
from datetime import UTC, datetime
from typing import Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.cli.common import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_RETRY,
    EXIT_USAGE,
    CommandFailed,
    acked_or_refused,
    actor,
    connection_flags,
    fail,
    nats_client,
    one_of,
)
from healthplane.cli.lookup import find_node, views_of
from healthplane.client import federation
from healthplane.contracts import subjects, wire
from healthplane.runtime.publish import Publisher, PublishError
from healthplane.runtime.replay import read_payloads

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
    verb = args.node_command
    if verb == "hold":
        if args.hold_ids and args.all:
            raise CommandFailed("name hold ids or use --all, not both", EXIT_USAGE)
        if not args.hold_ids and not args.all:
            raise CommandFailed("name the hold id(s) to release, or use --all (with --node, --effect)", EXIT_USAGE)
        return
    if verb in ("drain", "evict", "deprovision"):
        if args.all and args.node:
            raise CommandFailed(f"{verb}: name a node or use --all, not both", EXIT_USAGE)
        if not args.all and not args.node:
            raise CommandFailed(f"{verb}: name a node, or use --all", EXIT_USAGE)
    if verb == "deprovision" and args.force and (args.all or args.evict):
        raise CommandFailed("--force cannot be combined with --all or --evict", EXIT_USAGE)
    if verb == "service" and not args.reason:
        raise CommandFailed("service: say what was done with --reason", EXIT_USAGE)
    if getattr(args, "federation", False) and getattr(args, "all", False):
        raise CommandFailed(f"{verb} --federation: name one node; --all belongs to the node's own cluster",
                            EXIT_USAGE)


def confirm(question: str) -> bool:
    """Ask on stdout, read stdin even without a terminal; EOF or anything but yes is No."""
    print(f"{question} [y/N] ", end="", flush=True)
    answer = sys.stdin.readline()
    if not sys.stdin.isatty():
        print()  # a piped answer is not echoed: end the question's line ourselves
    return answer.strip().lower() in ("y", "yes")


# ---------------------------------------------------------------------------- sending


def command_for(args: argparse.Namespace, node_id: str, cluster: str, batch_id: str | None) -> wire.Command:
    verb: wire.CommandVerb = "hold-release" if args.node_command == "hold" else args.node_command
    return wire.Command(
        id=str(uuid.uuid4()), node_id=node_id, cluster=cluster, verb=verb, actor=actor(args),
        issued_at=datetime.now(UTC), reason=getattr(args, "reason", None),
        active=getattr(args, "active", False), evict=getattr(args, "evict", False),
        force=getattr(args, "force", False), batch_id=batch_id,
        hold_ids=list(getattr(args, "hold_ids", []) or []), effect=getattr(args, "effect", None))


async def send(nc: NATS, args: argparse.Namespace, commands: list[wire.Command],
               wait_s: float) -> dict[str, wire.CommandOutcome]:
    """Append every command and collect the outcomes that arrive within ``wait_s`` seconds."""
    wanted = {c.id for c in commands}
    outcomes: dict[str, wire.CommandOutcome] = {}
    done = asyncio.Event()
    clusters = {c.cluster for c in commands}
    filters = ([subjects.command_outcome(commands[0].cluster, commands[0].node_id)] if len(commands) == 1
               else [f"{subjects.PREFIX}.outcome.{subjects.encode_token(c)}.>" for c in clusters])

    async def on_outcome(msg: Any) -> None:
        try:
            outcome = wire.decode(wire.CommandOutcome, msg.data)
        except wire.WireError:
            return
        if outcome.command_id in wanted:
            outcomes[outcome.command_id] = outcome
            if len(outcomes) == len(wanted):
                done.set()

    subscriptions = [await nc.subscribe(f, cb=on_outcome) for f in filters]
    try:
        publisher = Publisher(nc)
        for command in commands:
            await publisher.publish(subjects.command(command.cluster, command.node_id, command.verb, command.actor),
                                    wire.encode(command), {"Nats-Msg-Id": command.id})
        try:
            await acked_or_refused(nc, args, f"send {commands[0].verb} commands (publish hp.cmd)", publisher.flush())
        except PublishError as exc:  # nothing stored it (no responders, no ack): nothing was done
            raise CommandFailed(f"{commands[0].verb} {commands[0].node_id}: not stored ({exc}); retry",
                                EXIT_RETRY) from exc
        try:
            await asyncio.wait_for(done.wait(), wait_s)
        except TimeoutError:
            pass
    finally:
        for subscription in subscriptions:
            await subscription.unsubscribe()
    return outcomes


async def _views(nc: NATS, js: JetStreamContext, cluster: str | None) -> list[wire.NodeView]:
    payloads = await read_payloads(nc, js, "HP_NODES", subjects.node_views(cluster), last_per_subject=True)
    return sorted(views_of(payloads), key=lambda v: (v.cluster, v.node_id))


async def target(nc: NATS, js: JetStreamContext, node_id: str, cluster: str | None) -> tuple[str, str]:
    """(node, cluster) for a named node. A node without a view yet is still sent (to the named
    or default cluster): eviction is the one that knows, and refuses an unknown node."""
    try:
        view = await find_node(nc, js, node_id, cluster)
    except CommandFailed as exc:
        if exc.code == EXIT_USAGE:
            raise
        return node_id, cluster or "default"
    return view.node_id, view.cluster


async def _federated_target(nc: NATS, js: JetStreamContext, node_id: str, cluster: str | None,
                            verb: str) -> tuple[str, str]:
    """FED-3 on a hub: the node's own cluster, if the hub can reach it now; else nothing is
    sent and the command is retryable."""
    members = await federation.members(nc)
    view = await find_node(nc, js, node_id, cluster, [m.stream for m in members])
    member = federation.member_named(members, view.cluster)
    if not member.reachable(datetime.now(UTC), federation.unreachable_after_s()):
        raise CommandFailed(f"{verb} {view.node_id}: {member.why_no_health()}; only its own cluster executes "
                            "commands for its nodes, so nothing was sent; retry when it is back", EXIT_RETRY)
    return view.node_id, view.cluster


async def _run(args: argparse.Namespace) -> int:
    async with nats_client(args) as nc:
        js = nc.jetstream()
        verb = args.node_command
        if verb == "hold":
            return await _release(nc, js, args)
        if getattr(args, "all", False):
            return await _all(nc, js, args)
        if args.federation:
            node_id, cluster = await _federated_target(nc, js, args.node, args.cluster, args.node_command)
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
    views = await _views(nc, js, args.cluster)
    batch = str(uuid.uuid4())
    commands = [command_for(args, v.node_id, v.cluster, batch) for v in views]
    outcomes = await send(nc, args, commands, args.timeout) if commands else {}
    return report_all(args, commands, outcomes)


def report_all(args: argparse.Namespace, commands: list[wire.Command],
               outcomes: dict[str, wire.CommandOutcome]) -> int:
    answered = [outcomes[c.id] for c in commands if c.id in outcomes]
    pending = [c for c in commands if c.id not in outcomes]
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
    views = await _views(nc, js, args.cluster)
    if args.node:
        views = [v for v in views if v.node_id == args.node]
        if not views:
            raise CommandFailed(f"node {args.node} not found")
    commands: list[wire.Command] = []
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
            args.hold_ids = ids
            commands.append(command_for(args, node_id, cluster, batch))
    elif args.node:  # eviction holds the truth about this node's holds: ask it directly
        commands.append(command_for(args, views[0].node_id, views[0].cluster, batch))
    else:
        for view in _holding(views, args.effect):
            commands.append(command_for(args, view.node_id, view.cluster, batch))
    if not commands:
        print("0 hold(s) released: none matched")
        return EXIT_OK
    outcomes = await send(nc, args, commands, args.timeout)
    if len(commands) == 1:
        return report_one(args, commands[0], outcomes.get(commands[0].id))
    return report_all(args, commands, outcomes)


def _holding(views: Iterable[wire.NodeView], effect: str | None) -> list[wire.NodeView]:
    return [v for v in views if any(effect is None or h.effect == effect for h in v.holds)]
