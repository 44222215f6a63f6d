"""``healthplane node list | show | events`` (EVT-1, the reference's layouts, SPEC.md shapes).

Reads only: ``list`` takes the latest view per node from ``HP_NODES`` (one record per node,
never the history); ``show`` one view; ``events`` replays the node's own subjects in
``HP_NODE_EVENTS`` (never a scan of every node's events), oldest first, in pages.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane import subjects, wire
from healthplane.cli import node_actions
from healthplane.cli.common import (
    EXIT_USAGE,
    CommandFailed,
    connection_flags,
    decoded,
    fail,
    nats_client,
    one_of,
)
from healthplane.cli.lookup import find_node, is_view
from healthplane.runtime.replay import read_all, read_payloads, start_of_last

DEFAULT_PAGE_SIZE = 50


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="node_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="every node: status, health, score, jobs")
    listing.add_argument("--cluster")
    show = actions.add_parser("show", help="one node: status, health, score explained, conditions")
    show.add_argument("node")
    show.add_argument("--cluster")
    events = actions.add_parser("events", help="a node's event history, oldest first")
    events.add_argument("node")
    events.add_argument("--cluster")
    events.add_argument("--since", help="24h, 30m, 7d or an RFC 3339 time")
    events.add_argument("--type", action="append", default=[], **one_of(wire.EVENT_TYPES), metavar="TYPE",
                        help="only this type (repeatable)")
    events.add_argument("--latest", action="store_true", help="the newest page (no page token)")
    events.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE)
    events.add_argument("--page-token")
    for sub in (listing, show, events):
        sub.add_argument("-o", "--output", **one_of(["text", "json"]), default="text")
        connection_flags(sub)
    node_actions.add_arguments(actions)


def run(args: argparse.Namespace) -> int:
    if args.node_command not in ("list", "show", "events"):
        return node_actions.run(args)
    try:
        return asyncio.run(_run(args))
    except CommandFailed as exc:
        return fail(exc)


async def _run(args: argparse.Namespace) -> int:
    async with nats_client(args) as nc:
        js = nc.jetstream()
        if args.node_command == "list":
            return await _list(nc, js, args)
        if args.node_command == "events":
            return await _events(nc, js, args)
        view = await find_node(nc, js, args.node, args.cluster)
        _print(args, lambda: wire.to_builtins(view), lambda: show_text(view))
        return 0


def _print(args: argparse.Namespace, data: Callable[[], Any], text: Callable[[], str]) -> None:
    print(json.dumps(data(), indent=2) if args.output == "json" else text())


# ---------------------------------------------------------------------------- list


class ListRow(msgspec.Struct, rename="camel"):
    """The columns of ``node list``: decoding only these keeps 100,000 nodes fast."""

    node_id: str
    cluster: str
    hostname: str | None
    status: str
    health: str
    score: int | None
    jobs: int = 0


_decode_row = msgspec.json.Decoder(ListRow).decode


async def _list(nc: NATS, js: JetStreamContext, args: argparse.Namespace) -> int:
    # Payloads only, no per-message Msg: at 100,000 nodes the read is most of the command.
    payloads = await read_payloads(nc, js, "HP_NODES", subjects.node_views(args.cluster), last_per_subject=True)
    try:
        rows = list(map(_decode_row, payloads))
    except msgspec.DecodeError:  # rare: only then pay for knowing which records are bad
        payloads = [p for p in payloads if is_view(p)]
        rows = list(map(_decode_row, payloads))
    order = list_order(rows)
    if args.output == "json":
        # The stored views are already the JSON shape: no decode, no re-encode.
        sys.stdout.flush()
        sys.stdout.buffer.write(b"[" + b",".join([payloads[i] for i in order]) + b"]\n")
    else:
        sys.stdout.write(list_text(rows, order) + "\n")
    sys.stdout.flush()
    return 0


def list_order(rows: list[ListRow]) -> list[int]:
    """Positions of ``rows`` by cluster, then node id.

    The server sends the views in the order they were last written, which for a live fleet
    is no order at all; one string per row ("cluster NUL node", NUL sorting below every
    character a name can hold) sorts three to four times faster than (cluster, node) tuples."""
    keys = [f"{row.cluster}\0{row.node_id}" for row in rows]
    return sorted(range(len(keys)), key=keys.__getitem__)


def _status(status: str) -> str:
    return status.replace("_", " ").capitalize()


def list_text(views: list[ListRow], order: list[int] | None = None) -> str:
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
    return value.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z") if value else "-"


def _span(seconds: float) -> str:
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours < 48 else f"{hours // 24}d {hours % 24}h"


# A view older than this many of the node's intervals, on a node not OFFLINE, means nothing
# has folded its reports (health-ingest's own heartbeat rule would otherwise have made it so).
STALE_AFTER_INTERVALS = 3


def staleness(view: wire.NodeView, now: datetime) -> str | None:
    """Why this view may no longer be true, or ``None``: a stale view must not look healthy."""
    if view.last_reported_at is None or view.status == "OFFLINE":
        return None
    age = (now - view.last_reported_at).total_seconds()
    interval = view.report_interval_seconds or 30
    if age <= max(15, STALE_AFTER_INTERVALS * interval):
        return None
    return (f"this view is {_span(age)} old ({interval}s report interval): health-ingest or the scorer "
            "is not folding reports; check that they run and their consumer lag")


def show_text(view: wire.NodeView, now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    lines = [f"Node:      {view.node_id} ({view.hostname or 'hostname unknown'}, cluster {view.cluster})",
             f"Status:    {_status(view.status)}"]
    health = view.health.capitalize()
    lines.append(f"Health:    {health} (last reported {_time(view.last_reported_at)})" if view.last_reported_at
                 else f"Health:    {health}")
    stale = staleness(view, now)
    if stale:
        lines.append(f"Stale:     {stale}")
    if view.score is None:
        lines.append("Score:     not yet scored")
    else:
        source = view.score_explanation.penalties if view.score_explanation else "cluster"
        lines.append(f"Score:     {view.score}/100 (penalties: {source})")
        for contribution in (view.score_explanation.contributions if view.score_explanation else []):
            lines.append(f"  {contribution.points!s:<4} {contribution.reason}")
    if view.conditions:
        lines.append("Conditions:")
        for c in view.conditions:
            lines.append(f"  {wire.condition_title(c.type)} [{c.severity.capitalize()}] {c.message}")
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


_DURATION = re.compile(r"^(\d+)([smhd])$")


def parse_since(text: str, now: datetime) -> datetime:
    match = _DURATION.match(text)
    if match:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[match.group(2)]
        return now - timedelta(**{unit: int(match.group(1))})
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise CommandFailed(f"--since {text!r} is neither a duration (24h, 30m, 7d) nor an RFC 3339 time",
                            EXIT_USAGE) from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _token(seq: int) -> str:
    return base64.urlsafe_b64encode(f"seq:{seq}".encode()).decode().rstrip("=")


def _from_token(token: str) -> int:
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        kind, _, seq = text.partition(":")
        if kind != "seq" or not seq.isdigit():
            raise ValueError(text)
        return int(seq)
    except ValueError as exc:
        raise CommandFailed(f"--page-token {token!r} is not a token this command gave", EXIT_USAGE) from exc


def detail(event: wire.NodeEvent) -> str:
    """The DETAIL column, worded as the reference's example: a raised condition by what was
    found ("1 uncorrectable GPU ECC error(s) on GPU 0"), everything else by its message."""
    change = event.condition
    if event.type == "CONDITION_RAISED" and change is not None:
        return change.message + (f" (was {change.previous_severity})" if change.previous_severity else "")
    return event.message


async def _history_cluster(nc: NATS, js: JetStreamContext, node_id: str, cluster: str | None) -> str | None:
    """The node's cluster from its view; a node decommissioned since (its view removed) still
    has its history: read it in the named cluster, or in any."""
    try:
        return (await find_node(nc, js, node_id, cluster)).cluster
    except CommandFailed as exc:
        if exc.code == EXIT_USAGE:
            raise
        if await read_all(nc, js, "HP_NODE_EVENTS", subjects.node_events(cluster, node_id), limit=1,
                          headers_only=True):
            return cluster
        raise


async def _events(nc: NATS, js: JetStreamContext, args: argparse.Namespace) -> int:
    if args.page_size < 1:
        raise CommandFailed("--page-size must be at least 1", EXIT_USAGE)
    if args.latest and args.page_token:
        raise CommandFailed("--latest and --page-token cannot be combined", EXIT_USAGE)
    cluster = await _history_cluster(nc, js, args.node, args.cluster)
    filters = ([subjects.node_events(cluster, args.node, t) for t in dict.fromkeys(args.type)]
               or [subjects.node_events(cluster, args.node)])
    since = parse_since(args.since, datetime.now(UTC)) if args.since else None
    start_seq = _from_token(args.page_token) if args.page_token else None
    if args.latest:
        start_seq = await start_of_last(js, "HP_NODE_EVENTS", filters, args.page_size)
    # The stream time narrows the read; the event's own time decides (they differ only for
    # records appended late, e.g. a replayed import).
    messages = await read_all(nc, js, "HP_NODE_EVENTS", filters, start_seq=start_seq,
                              start_time=since if start_seq is None else None,
                              limit=None if since is not None else args.page_size + 1)
    found = decoded(wire.NodeEvent, messages)
    if since is not None:
        found = [(m, e) for m, e in found if e.occurred_at >= since]
    page, rest = found[:args.page_size], found[args.page_size:]
    next_token = None if args.latest or not rest else _token(rest[0][0].metadata.sequence.stream)
    events = [e for _, e in page]
    if args.output == "json":
        print(json.dumps({"events": [wire.to_builtins(e) for e in events], "nextPageToken": next_token}, indent=2))
        return 0
    rows = [("TIME", "TYPE", "DETAIL")] + [(_time(e.occurred_at), e.type, detail(e)) for e in events]
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    for row in rows:
        print(f"{row[0]:<{width[0]}} | {row[1]:<{width[1]}} | {row[2]}")
    if next_token:
        print(f"\nmore: --page-token {next_token}", file=sys.stderr)
    return 0
