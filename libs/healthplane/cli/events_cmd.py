"""``healthplane events watch`` (INT-1): a live, filtered tail of node events, as text or JSON
lines, resumable from the position it prints.

The reading is ``healthplane.client.events``'s; this module parses and prints. Where it
starts and where to resume go to stderr, the events to stdout, so that ``-o json`` pipes as
JSON lines and nothing else."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import IO, Any, NoReturn

import msgspec
from nats.errors import Error as NatsError

from healthplane.cli.common import connection_flags, fail, nats_client, one_of, output_flag, who
from healthplane.client import events
from healthplane.client.connection import acked_or_refused, warn
from healthplane.client.errors import EXIT_RETRY, EXIT_USAGE, CommandFailed
from healthplane.client.reads import detail, parse_since
from healthplane.contracts import wire

ERRORS_EVERY_S = 30.0  # a bus that stays away is said again this often, not at every try


class _OneLine(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit 2 (the usage is ``--help``'s)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        # A subcommand's leftovers would be reported by the top-level parser, with its usage.
        parsed, rest = super().parse_known_args(args, namespace)
        if rest:
            self.error(f"unrecognized arguments: {' '.join(rest)}")
        return parsed, rest


def _position(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a position (a stream sequence, 1 or more, as printed "
                                         "by a watch that stopped)")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="events_command", required=True, metavar="ACTION", parser_class=_OneLine)
    watch = actions.add_parser("watch", help="a live, filtered tail of node events; resumable from a position")
    watch.add_argument("--cluster", help="only this cluster's events")
    watch.add_argument("--node", help="only this node's events")
    watch.add_argument("--type", action="append", default=[], **one_of(wire.EVENT_TYPES), metavar="TYPE",
                       help="only events of this type (any case; repeatable)")
    where = watch.add_mutually_exclusive_group()
    where.add_argument("--since", help="start with the events stored since: 24h, 30m, 7d or an RFC 3339 time "
                                       "(default: only events stored from now on)")
    where.add_argument("--from-position", type=_position, metavar="P",
                       help="start exactly at position P, as printed by a watch that stopped (no gap, no duplicate)")
    output_flag(watch)
    connection_flags(watch)


def run(args: argparse.Namespace) -> int:
    try:
        selection = events.select(args.cluster, args.node, args.type)
        since = parse_since(args.since, datetime.now(UTC)) if args.since else None
        return asyncio.run(_watch(args, selection, since))
    except CommandFailed as exc:
        return fail(exc)
    except (NatsError, TimeoutError) as exc:
        return fail(CommandFailed(f"reading {events.STREAM}: {exc or type(exc).__name__}; retry", EXIT_RETRY))


async def _watch(args: argparse.Namespace, selection: events.Selection, since: datetime | None) -> int:
    async with nats_client(args) as nc:
        js = nc.jetstream()
        begun = await acked_or_refused(nc, who(args), f"read {events.STREAM}",
                                       events.start(nc, js, selection, since=since, from_position=args.from_position))
        if begun.note:
            warn(begun.note)
        print(f"watching {events.STREAM} from position {begun.position}", file=sys.stderr, flush=True)
        said = _Errors()
        tail = events.Tail(nc, selection, begun.position, on_skip=lambda _seq, why: warn(why), on_error=said.error)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, tail.stop)
        try:
            async for watched in tail:
                _print(watched, args.output, sys.stdout)
        finally:
            await tail.aclose()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
        print(f"stopped; resume with --from-position {tail.position}", file=sys.stderr, flush=True)
    return 0


def _print(watched: events.Watched, output: str, out: IO[str]) -> None:
    if output == "json":
        out.write(msgspec.json.encode(watched.to_builtins()).decode() + "\n")
    else:
        event = watched.event
        out.write(f"{wire.rfc3339(event.occurred_at)}  {watched.position:>8}  {event.cluster}/{event.node_id}  "
                  f"{event.type}  {detail(event)}\n")
    out.flush()


class _Errors:
    """A failing read is retried by the tail; say so once in a while, not at every try."""

    def __init__(self) -> None:
        self._last = -ERRORS_EVERY_S

    def error(self, exc: Any) -> None:
        now = time.monotonic()
        if now - self._last >= ERRORS_EVERY_S:
            self._last = now
            warn(f"reading {events.STREAM} failed ({exc or type(exc).__name__}); trying again")
