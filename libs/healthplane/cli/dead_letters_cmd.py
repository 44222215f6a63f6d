"""``healthplane dead-letters list | replay`` (issue 16.2): inputs a service set aside.

``list`` shows what is in ``HP_DEAD_LETTERS`` (newest last); ``replay ID`` sends the input
of dead letter ID again, byte for byte, on its original subject, once the bug or the
refusal behind it is fixed: the service folds it as a new input."""

from __future__ import annotations

import argparse
import asyncio
import json

from nats.js.errors import NotFoundError

from healthplane.cli.common import connection_flags, fail, nats_client, one_of, who
from healthplane.client.connection import acked_or_refused
from healthplane.client.errors import EXIT_USAGE, CommandFailed
from healthplane.contracts import wire
from healthplane.runtime import deadletters


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="dead_letters_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="inputs the services set aside, with why")
    listing.add_argument("--service", help="only this service's")
    listing.add_argument("-o", "--output", **one_of(["text", "json"]), default="text")
    again = actions.add_parser("replay", help="send the input of dead letter ID again (after a fix)")
    again.add_argument("id", type=int, help="the ID `dead-letters list` shows")
    for sub in (listing, again):
        connection_flags(sub)


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_list(args) if args.dead_letters_command == "list" else _replay(args))
    except CommandFailed as exc:
        return fail(exc)


async def _list(args: argparse.Namespace) -> int:
    async with nats_client(args) as nc:
        found = await deadletters.read(nc, nc.jetstream(), args.service)
    if args.output == "json":
        print(json.dumps([d.to_json() for d in found], indent=2))
        return 0
    if not found:
        print("no dead letters" + (f" of {args.service}" if args.service else ""))
        return 0
    rows = [("ID", "SERVICE", "INPUT", "REASON", "RECORDED", "ERROR")]
    rows += [(str(d.id), d.service, f"{d.input_stream}:{d.input_seq}", d.reason,
              wire.rfc3339(d.recorded_at) if d.recorded_at else "-",
              d.error) for d in found]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("   ".join(cell.ljust(width) for cell, width in zip(row[:5], widths, strict=True)) + "   " + row[5])
    return 0


async def _replay(args: argparse.Namespace) -> int:
    async with nats_client(args) as nc:
        js = nc.jetstream()
        try:
            raw = await js.get_msg(deadletters.STREAM, args.id)
        except NotFoundError as exc:
            raise CommandFailed(f"no dead letter {args.id}") from exc
        headers = raw.headers or {}
        if not (raw.subject or "").startswith("hp.dead.") or deadletters.INPUT_SUBJECT not in headers:
            raise CommandFailed(f"record {args.id} of {deadletters.STREAM} is not a dead letter", EXIT_USAGE)
        if deadletters.ENDPOINT in headers:  # the event is in the stream already: only its delivery failed
            raise CommandFailed(f"dead letter {args.id} is a webhook delivery to {headers[deadletters.ENDPOINT]}; "
                                f"`healthplane webhooks replay {headers[deadletters.ENDPOINT]}` sends it again",
                                EXIT_USAGE)
        if headers.get(deadletters.TRUNCATED) == "true":
            raise CommandFailed(f"dead letter {args.id} holds only the start of its input (it was larger than "
                                "a message can carry with its headers); it cannot be sent again")
        subject = headers[deadletters.INPUT_SUBJECT]
        ack = await acked_or_refused(nc, who(args), f"replay dead letters on {subject} (the maintainer's "
                                     "credentials do: stream administration, SEC-10)", js.publish(
                                         subject, raw.data or b"",
                                         headers={"Hp-Replayed-From": f"{deadletters.STREAM}:{args.id}"}))
    print(f"dead letter {args.id} sent again on {subject} ({ack.stream} seq {ack.seq})")
    return 0
