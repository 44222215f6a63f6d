"""``healthplane federation attach | list | offer`` (FED): on the hub, who is attached and how
they are; on a member, the consumer the hub sources through.

``attach NAME`` is the hub operator's decision that cluster NAME may join: it issues the
member credentials NAME's nats-server connects its leaf with (``creds`` of role ``member``:
it can carry only NAME's sourced views and NAME's commands) and creates NAME's aggregate on
the running hub. It prints the ``up --attach`` line to run on the member.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

from healthplane.cli.common import connection_flags, fail, nats_client, output_flag
from healthplane.client import federation
from healthplane.client.errors import EXIT_RETRY, CommandFailed
from healthplane.contracts import permissions
from healthplane.runtime import converge
from healthplane.runtime.connect import connect
from healthplane.runtime.creds import CredsError
from healthplane.stack.keystore import Keystore

DEFAULT_DATA_DIR = ".healthplane"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="federation_command", required=True, metavar="ACTION")
    attach = actions.add_parser("attach", help="on the hub: let cluster NAME attach (its credentials, its aggregate)")
    attach.add_argument("name", metavar="NAME", help="the member cluster's name (its config's `cluster`)")
    attach.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                        help=f"the hub's `up --federation-hub` data dir (default {DEFAULT_DATA_DIR})")
    attach.add_argument("-o", "--out", help="member credentials to write (default ./NAME.member.creds), 0600")
    listing = actions.add_parser("list", help="on the hub: every attached cluster, reachable or since when not")
    connection_flags(listing)
    output_flag(listing)
    offer = actions.add_parser("offer", help="on a member (deployed without `up --attach`): make the consumer the "
                                             "hub sources this cluster's node views through")
    offer.add_argument("--cluster", required=True, help="this cluster's name, as the hub attached it")
    connection_flags(offer)


def run(args: argparse.Namespace) -> int:
    try:
        if args.federation_command == "attach":
            return _attach(args)
        if args.federation_command == "offer":
            return asyncio.run(_offer(args))
        return asyncio.run(_list(args))
    except CredsError as exc:
        return fail(CommandFailed(str(exc)))
    except CommandFailed as exc:
        return fail(exc)


def _hub_stack(data_dir: Path) -> dict[str, object]:
    try:
        stack = json.loads((data_dir / "stack.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CommandFailed(f"no running hub in {data_dir} (stack.json: {exc}); start it with "
                            "`healthplane up --federation-hub`") from exc
    if not isinstance(stack, dict) or not stack.get("leafUrl"):
        raise CommandFailed(f"{data_dir} is not a federation hub (no leafUrl in stack.json); start one with "
                            "`healthplane up --federation-hub`")
    return stack


def _attach(args: argparse.Namespace) -> int:
    name = federation.check_member_name(args.name)
    data_dir = Path(args.data_dir)
    stack = _hub_stack(data_dir)
    out = Path(args.out or f"{name}.member.creds").resolve()
    # The member's aggregate is a stream: made as the maintainer (stream administration, SEC-10).
    maintainer = stack.get("maintainerCreds")
    if not stack.get("insecure"):
        Keystore.open(data_dir / "creds").member(name, out)
    # On a hub of three servers the aggregate is R3, like every stream there (HA-1): the hub's
    # sourcing survives a lost server.
    servers = stack.get("servers")
    replicas = converge.replicas_for(len(servers) if isinstance(servers, list) else 1)
    asyncio.run(_create_aggregate(str(stack["natsUrl"]), str(maintainer) if maintainer else None, name, data_dir,
                                  replicas))
    creds_flag = "" if stack.get("insecure") else f" --attach-creds {out}"
    if not stack.get("insecure"):
        print(f"member credentials for {name}: {out}")
    print(f"on {name}'s control plane (config `cluster: {name}`):\n"
          f"  healthplane up --attach {stack['leafUrl']}{creds_flag} --config CONFIG")
    return 0


async def _create_aggregate(nats_url: str, maintainer: str | None, name: str, data_dir: Path,
                            replicas: int = 1) -> None:
    try:
        nc = await connect(nats_url, name="healthplane-federation", creds=maintainer, give_up_after=5.0)
    except ConnectionError as exc:
        raise CommandFailed(f"the hub in {data_dir} does not answer: {exc}", EXIT_RETRY) from exc
    try:
        await federation.attach(nc, name, replicas)
    finally:
        await nc.close()


async def _offer(args: argparse.Namespace) -> int:
    async with nats_client(args) as nc:
        await federation.offer_to_hub(nc, args.cluster)
    print(f"the hub can now source cluster {args.cluster}'s node views (consumer {permissions.HUB_CONSUMER} on "
          f"{permissions.SOURCED_STREAM})")
    return 0


async def _list(args: argparse.Namespace) -> int:
    threshold = federation.unreachable_after_s()
    async with nats_client(args) as nc:
        found = await federation.members(nc)
    now = datetime.now(UTC)
    if args.output == "json":
        print(json.dumps([m.to_builtins(now, threshold) for m in found], indent=2))
        return 0
    rows = [("CLUSTER", "REACHABLE", "DATA AGE", "LAG")]
    for member in found:
        age = member.data_age_s(now)
        rows.append((member.name, "yes" if member.reachable(now, threshold) else f"no: {member.why_no_health()}",
                     "-" if age is None else f"{age:.0f}s", str(member.lag)))
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        print(f"{row[0]:<{width[0]}}   {row[1]:<{width[1]}}   {row[2]:<{width[2]}}   {row[3]}")
    return 0
