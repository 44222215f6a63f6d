"""``healthplane node list | show | events`` (EVT-1, the reference's layouts, SPEC.md shapes).

Reads only: ``list`` takes the latest view per node from ``HP_NODES`` (one record per node,
never the history); ``show`` one view; ``events`` replays the node's own subjects in
``HP_NODE_EVENTS`` (never a scan of every node's events), oldest first, in pages.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.cli import node_actions, validate_cmd
from healthplane.cli.common import connection_flags, fail, nats_client, one_of
from healthplane.client import federation, reads
from healthplane.client.errors import EXIT_USAGE, CommandFailed
from healthplane.client.nodes import find_node
from healthplane.client.reads import detail
from healthplane.contracts import domains, views, wire


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="node_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="every node: status, health, score, jobs")
    listing.add_argument("--cluster")
    listing.add_argument("--domain", action="append", default=[], metavar="KIND=VALUE",
                         help="only nodes in this failure domain, e.g. rack=r12 (repeatable: in all of them; "
                              "DOM-1, docs/domains.md)")
    show = actions.add_parser("show", help="one node: status, health, score explained, conditions")
    show.add_argument("node")
    show.add_argument("--cluster")
    summary = actions.add_parser("summary", help="per cluster: nodes by health, the worst score; fleet totals")
    summary.add_argument("--cluster")
    events = actions.add_parser("events", help="a node's event history, oldest first")
    events.add_argument("node")
    events.add_argument("--cluster")
    events.add_argument("--since", help="24h, 30m, 7d or an RFC 3339 time")
    events.add_argument("--type", action="append", default=[], **one_of(wire.EVENT_TYPES), metavar="TYPE",
                        help="only this type (repeatable)")
    events.add_argument("--latest", action="store_true", help="the newest page (no page token)")
    events.add_argument("--page-size", type=int, default=reads.DEFAULT_PAGE_SIZE)
    events.add_argument("--page-token")
    for sub in (listing, show, summary, events):
        sub.add_argument("-o", "--output", **one_of(["text", "json"]), default="text")
        connection_flags(sub)
    for sub in (listing, show, summary):
        federation_flag(sub)
    node_actions.add_arguments(actions)
    validate_cmd.add_validate(actions)


def federation_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--federation", action="store_true",
                        help="on a federation hub: every attached cluster's nodes (FED, docs/federation.md)")


def run(args: argparse.Namespace) -> int:
    if args.node_command == "validate":
        return validate_cmd.run_validate(args)
    if args.node_command not in ("list", "show", "summary", "events"):
        return node_actions.run(args)
    try:
        return asyncio.run(_run(args))
    except CommandFailed as exc:
        return fail(exc)


async def _run(args: argparse.Namespace) -> int:
    if getattr(args, "domain", None) and getattr(args, "federation", False):
        raise CommandFailed("--domain cannot be combined with --federation", EXIT_USAGE)
    _domain_selectors(args)  # a bad selector is a usage error before any connection
    async with nats_client(args) as nc:
        js = nc.jetstream()
        if getattr(args, "federation", False):
            return await _federated(nc, js, args)
        if args.node_command == "list":
            return await _list(nc, js, args)
        if args.node_command == "events":
            return await _events(nc, js, args)
        if args.node_command == "summary":
            listing = await reads.read_listing(nc, js, args.cluster)
            found = reads.summarize(listing.rows, datetime.now(UTC))
            _print(args, lambda: found, lambda: summary_text(found))
            return 0
        view = await find_node(nc, js, args.node, args.cluster)
        now = datetime.now(UTC)
        why = await reads.automation_status(js, view, now)
        _print(args, lambda: reads.shown(view, why), lambda: show_text(view, now, why))
        return 0


async def _federated(nc: NATS, js: JetStreamContext, args: argparse.Namespace) -> int:
    """``list | show | summary --federation`` on a hub (FED-1, FED-2): a reachable member's
    nodes as its own cluster shows them, an unreachable one's with no health at all."""
    threshold = federation.unreachable_after_s()
    if args.node_command == "show":
        members = await federation.members(nc)
        view = await find_node(nc, js, args.node, args.cluster, [m.stream for m in members])
        member = federation.member_named(members, view.cluster)
        now = datetime.now(UTC)
        if not member.reachable(now, threshold):
            row = views.ListRow(node_id=view.node_id, cluster=view.cluster, hostname=view.hostname,
                                status="UNKNOWN", health="UNKNOWN", score=None)
            _print(args, lambda: federation.unknown_row(row, member),
                   lambda: f"Node:      {view.node_id} ({view.hostname or 'hostname unknown'}, cluster {view.cluster})\n"
                           f"Health:    Unknown: {member.why_no_health()}")
            return 0
        place = member.to_builtins(now, threshold)
        _print(args, lambda: {**wire.to_builtins(view), "federation": place},
               lambda: show_text(view, now) + f"\nFederation: from cluster {member.name}, data "
                                              f"{member.data_age_s(now) or 0:.0f}s old")
        return 0
    found = await federation.read_federated(nc, js, args.cluster, threshold)
    if args.node_command == "summary":
        summary = federation.summary(found)
        _print(args, lambda: summary, lambda: summary_text(summary))
        return 0
    if args.output == "json":
        sys.stdout.flush()
        sys.stdout.buffer.write(found.json() + b"\n")
    else:
        sys.stdout.write(list_text(found.rows()) + "\n" + "".join(f"{note}\n" for note in found.notes()))
    sys.stdout.flush()
    return 0


def _print(args: argparse.Namespace, data: Callable[[], Any], text: Callable[[], str]) -> None:
    print(json.dumps(data(), indent=2) if args.output == "json" else text())


# ---------------------------------------------------------------------------- list


def _domain_selectors(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    try:
        return domains.parse_selectors(getattr(args, "domain", []))
    except domains.DomainError as exc:
        raise CommandFailed(f"--domain: {exc}", EXIT_USAGE) from None


async def _list(nc: NATS, js: JetStreamContext, args: argparse.Namespace) -> int:
    wanted = _domain_selectors(args)
    listing = await reads.read_listing(nc, js, args.cluster)
    order = views.list_order(listing.rows)
    if wanted:
        order = [i for i in order if domains.selected(listing.rows[i].domains, wanted)]
    if args.output == "json":
        # The stored views are already the JSON shape: no decode, no re-encode.
        sys.stdout.flush()
        sys.stdout.buffer.write(listing.json(order) + b"\n")
    elif wanted:  # the table's columns as wide as the nodes it shows
        sys.stdout.write(list_text([listing.rows[i] for i in order]) + "\n")
    else:
        sys.stdout.write(list_text(listing.rows, order) + "\n")
    sys.stdout.flush()
    return 0


def summary_text(summary: dict[str, Any]) -> str:
    """One line per cluster in the dashboard's words, then the fleet's healthy total."""
    rows = [(entry["cluster"], str(entry["nodes"]), entry["label"]) for entry in summary["clusters"]]
    width = [max(len(r[i]) for r in [("CLUSTER", "NODES", ""), *rows]) for i in range(2)]
    lines = [f"{'CLUSTER':<{width[0]}}   {'NODES':<{width[1]}}   HEALTH"]
    lines += [f"{c:<{width[0]}}   {n:<{width[1]}}   {label}" for c, n, label in rows]
    fleet = summary["fleet"]
    if fleet["nodes"]:
        lines.append(f"fleet: {fleet['healthy']} of {fleet['nodes']} nodes healthy ({fleet['healthyPercent']}%)")
    return "\n".join(lines)


def _status(status: str) -> str:
    return status.replace("_", " ").capitalize()


def list_text(views: list[views.ListRow], order: list[int] | None = None) -> str:
    """The reference's table: columns padded to their widest cell, three spaces apart; rows
    in ``order`` (positions in ``views``), else as given.

    100,000 rows make this a large part of what ``node list`` costs, so: each distinct status
    and health label is worked out once, and the lines are built in the order the views were
    decoded (next to each other in memory) and only then put in order."""
    status_labels: dict[str, str] = {}
    health_labels: dict[str, str] = {}
    columns = [
        [v.node_id for v in views],
        [v.cluster for v in views],
        [v.hostname or "-" for v in views],
        [status_labels.get(v.status) or status_labels.setdefault(v.status, _status(v.status)) for v in views],
        [health_labels.get(v.health) or health_labels.setdefault(v.health, v.health.capitalize()) for v in views],
        ["-" if v.score is None else str(v.score) for v in views],
        [str(v.jobs) for v in views],
    ]
    header = ("ID", "CLUSTER", "HOSTNAME", "STATUS", "HEALTH", "SCORE", "JOBS")
    widths = [max(len(title), max(map(len, column), default=0))
              for title, column in zip(header[:-1], columns, strict=False)]
    # The last column unpadded: no trailing spaces to strip (JOBS is a number, never blank).
    template = "".join(f"%-{width}s   " for width in widths) + "%s"
    lines = [template % row for row in zip(*columns, strict=True)]
    return "\n".join([template % header, *(lines if order is None else [lines[i] for i in order])])


# ---------------------------------------------------------------------------- show


def _time(value: datetime | None) -> str:
    """Text shows whole seconds, as the references print them; JSON keeps full precision."""
    return wire.rfc3339(value) if value else "-"


def show_text(view: wire.NodeView, now: datetime | None = None, automation: str | None = None) -> str:
    now = now or datetime.now(UTC)
    lines = [f"Node:      {view.node_id} ({view.hostname or 'hostname unknown'}, cluster {view.cluster})",
             f"Status:    {_status(view.status)}"]
    if view.needs_attention is not None:
        lines.append(f"Needs attention since {_time(view.needs_attention.since)}: {view.needs_attention.reason}")
    health = view.health.capitalize()
    lines.append(f"Health:    {health} (last reported {_time(view.last_reported_at)})" if view.last_reported_at
                 else f"Health:    {health}")
    stale = reads.staleness(view, now)
    if stale:
        lines.append(f"Stale:     {stale}")
    if view.domains:
        lines.append(f"Domains:   {domains.describe(view.domains)}")
    if view.score is None:
        lines.append("Score:     not yet scored")
    else:
        source = view.score_explanation.penalties if view.score_explanation else "cluster"
        lines.append(f"Score:     {view.score}/100 (penalties: {source})")
        for contribution in (view.score_explanation.contributions if view.score_explanation else []):
            lines.append(f"  {contribution.points!s:<4} {contribution.reason}")
    if automation:
        lines.append(f"Automation: {automation}")
    if view.conditions:
        lines.append("Conditions:")
        for c in view.conditions:
            lines.append(f"  {wire.condition_title(c.type)} [{c.severity.capitalize()}] {c.message}")
            if c.recommended_action:  # XID-3: what NVIDIA's Xid catalog says to do
                lines.append(f"    recommended action: {c.recommended_action} (healthplane xid N explains a code)")
            noun = "observation" if c.observations == 1 else "observations"
            lines.append(f"    first seen {_time(c.first_seen)}, {c.observations} {noun}")
    failures = view.attributed_failures
    if failures.count:
        lines.append(f"Attributed job failures: {failures.count} (last {_time(failures.last)})")
        for fault, count in sorted(failures.by_fault.items()):
            lines.append(f"  {wire.condition_title(fault)}: {count}")
    if view.holds:
        lines.append("Holds:")
        for hold in view.holds:
            lines.append(f"  {hold.id}  {hold.effect}  {hold.reason or '-'}  ({hold.actor}, {_time(hold.created_at)})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- events


async def _events(nc: NATS, js: JetStreamContext, args: argparse.Namespace) -> int:
    page = await reads.event_page(nc, js, args.node, args.cluster, types=args.type, since=args.since,
                                  latest=args.latest, page_size=args.page_size, token=args.page_token)
    if args.output == "json":
        print(json.dumps(page.to_builtins(), indent=2))
        return 0
    rows = [("TIME", "TYPE", "DETAIL")] + [(_time(e.occurred_at), e.type, detail(e)) for e in page.events]
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    for row in rows:
        print(f"{row[0]:<{width[0]}} | {row[1]:<{width[1]}} | {row[2]}")
    if page.next_page_token:
        print(f"\nmore: --page-token {page.next_page_token}", file=sys.stderr)
    return 0
