"""``healthplane policy breaker reset``: close a TRIPPED circuit breaker (POL-6).

The reset is a record on ``hp.policy.{cluster}.breaker-reset`` that the policy service folds in
order with its other inputs, so it is never lost while the service is down and a replay
reaches the same breaker state."""

from __future__ import annotations

import argparse
import asyncio
import uuid
from datetime import UTC, datetime

from healthplane.cli.common import connection_flags, fail, nats_client, who
from healthplane.client.connection import publish_checked
from healthplane.client.errors import CommandFailed
from healthplane.contracts import subjects, wire


def add_arguments(parser: argparse.ArgumentParser) -> None:
    areas = parser.add_subparsers(dest="policy_area", required=True, metavar="AREA")
    breaker = areas.add_parser("breaker", help="the circuit breaker on automated cordons")
    actions = breaker.add_subparsers(dest="breaker_action", required=True, metavar="ACTION")
    reset = actions.add_parser("reset", help="close a TRIPPED breaker; automated cordons resume")
    reset.add_argument("--cluster", default="default", help="cluster whose breaker to reset (default: default)")
    reset.add_argument("--reason", help="why, recorded with the reset")
    connection_flags(reset)


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_reset(args))
    except CommandFailed as exc:
        return fail(exc)


async def _reset(args: argparse.Namespace) -> int:
    command = wire.PolicyCommand(id=str(uuid.uuid4()), cluster=args.cluster, action="breaker-reset",
                                 actor=who(args).actor, issued_at=datetime.now(UTC), reason=args.reason)
    async with nats_client(args) as nc:
        await publish_checked(nc, who(args), "reset the circuit breaker",
                              subjects.policy_command(args.cluster, "breaker-reset", command.actor),
                              wire.encode(command), {"Nats-Msg-Id": command.id})
    print(f"circuit breaker reset requested for cluster {args.cluster} (id {command.id}); "
          f"automated cordons resume once the policy service applies it")
    return 0
