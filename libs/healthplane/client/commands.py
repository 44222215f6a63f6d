"""Commands for nodes: build one, check its flags, send it and wait for eviction's outcome.

A command is appended to ``HP_COMMANDS`` on the subject of its node, verb and actor (the
server lets an identity publish only commands that carry its own name, SEC-1), and eviction
answers each on ``hp.outcome.*``. Past ``wait_s`` the command is still in the stream and
eviction acts on it when it runs: the caller gets no outcome for it, and says "pending".
"""

from __future__ import annotations

import asyncio
import typing
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from nats.aio.client import Client as NATS

from healthplane.client.connection import Identity, acked_or_refused
from healthplane.client.errors import EXIT_RETRY, EXIT_USAGE, CommandFailed
from healthplane.contracts import subjects, wire
from healthplane.runtime.publish import Publisher, PublishError

NODE_VERBS: tuple[wire.CommandVerb, ...] = ("cordon", "uncordon", "drain", "evict", "deprovision", "service",
                                            "remediate")
ALL_FORMS = ("drain", "evict", "deprovision")  # the verbs that take --all instead of a node


def verb_of(text: str) -> wire.CommandVerb:
    """``text`` as a command verb, or a usage error listing them."""
    for verb in typing.get_args(wire.CommandVerb):
        if verb == text:
            return verb  # type: ignore[no-any-return]
    raise CommandFailed(f"no command {text!r}: one of {', '.join(typing.get_args(wire.CommandVerb))}", EXIT_USAGE)


def command(verb: wire.CommandVerb, node_id: str, cluster: str, who: Identity, *, reason: str | None = None,
            active: bool = False, evict: bool = False, force: bool = False, batch_id: str | None = None,
            hold_ids: Sequence[str] = (), effect: wire.HoldEffect | None = None, suite: str | None = None,
            job_id: str | None = None) -> wire.Command:
    """One command, from ``who``, with a fresh id (the outcome names it)."""
    return wire.Command(
        id=str(uuid.uuid4()), node_id=node_id, cluster=cluster, verb=verb, actor=who.actor,
        issued_at=datetime.now(UTC), reason=reason, active=active, evict=evict, force=force,
        batch_id=batch_id, hold_ids=list(hold_ids), effect=effect, suite=suite, job_id=job_id)


def check(verb: str, *, node: str | None, all_nodes: bool = False, reason: str | None = None,
          evict: bool = False, force: bool = False, federation: bool = False,
          hold_ids: Sequence[str] = ()) -> None:
    """Flag combinations refused before anything is sent (``EXIT_USAGE``)."""
    if verb == "hold-release":
        if hold_ids and all_nodes:
            raise CommandFailed("name hold ids or use --all, not both", EXIT_USAGE)
        if not hold_ids and not all_nodes:
            raise CommandFailed("name the hold id(s) to release, or use --all (with --node, --effect)", EXIT_USAGE)
        return
    if verb in ALL_FORMS:
        if all_nodes and node:
            raise CommandFailed(f"{verb}: name a node or use --all, not both", EXIT_USAGE)
        if not all_nodes and not node:
            raise CommandFailed(f"{verb}: name a node, or use --all", EXIT_USAGE)
    if verb == "deprovision" and force and (all_nodes or evict):
        raise CommandFailed("--force cannot be combined with --all or --evict", EXIT_USAGE)
    if verb == "service" and not reason:
        raise CommandFailed("service: say what was done with --reason", EXIT_USAGE)
    if federation and all_nodes:
        raise CommandFailed(f"{verb} --federation: name one node; --all belongs to the node's own cluster",
                            EXIT_USAGE)


async def send_and_wait(nc: NATS, who: Identity, commands: Sequence[wire.Command],
                        wait_s: float) -> dict[str, wire.CommandOutcome]:
    """Append every command and collect the outcomes that arrive within ``wait_s`` seconds,
    by command id. Nothing stored (no stream answered) is retryable; a publish the server
    refuses this identity is ``PermissionDenied``."""
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
        for sent in commands:
            await publisher.publish(subjects.command(sent.cluster, sent.node_id, sent.verb, sent.actor),
                                    wire.encode(sent), {"Nats-Msg-Id": sent.id})
        try:
            await acked_or_refused(nc, who, f"send {commands[0].verb} commands (publish hp.cmd)", publisher.flush())
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
