"""``healthplane creds init | node | user | service | token | revoke | list | server-config``
(SEC-2): identities issued offline from the keys of ``DATA_DIR/creds`` (``--data-dir``) or
any key directory (``--keys``). Issuing needs no server; revoking pushes the re-signed
account to the running one, which refuses the identity at once."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from nats.errors import Error as NatsError

from healthplane.cli.common import fail, one_of, output_flag
from healthplane.client.errors import EXIT_RETRY, CommandFailed
from healthplane.contracts import permissions
from healthplane.runtime.creds import CredsError, inbox_prefix
from healthplane.stack import keystore
from healthplane.stack.keystore import Keystore

DEFAULT_DATA_DIR = ".healthplane"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="creds_command", required=True, metavar="ACTION")

    def keys_flags(sub: argparse.ArgumentParser) -> None:
        where = sub.add_mutually_exclusive_group()
        where.add_argument("--data-dir", help=f"the keys of `healthplane up` in DIR/creds (default {DEFAULT_DATA_DIR})")
        where.add_argument("--keys", help="a key directory (`creds init --keys DIR`)")

    def issue_flags(sub: argparse.ArgumentParser, default: str) -> None:
        sub.add_argument("-o", "--out", help=f"file to write (default ./{default}.creds), 0600")
        keys_flags(sub)

    keys_flags(actions.add_parser("init", help="create the operator, the account and the signing keys"))
    node = actions.add_parser("node", help="a collector's credentials: its own report and resource only")
    node.add_argument("node_id", metavar="NODE")
    node.add_argument("--cluster", default="default")
    issue_flags(node, "NODE")
    user = actions.add_parser("user", help="an operator's credentials")
    user.add_argument("name", metavar="NAME")
    user.add_argument("--role", required=True, **one_of(permissions.USER_ROLES))
    issue_flags(user, "NAME")
    service = actions.add_parser("service", help="a service's credentials: its row of the stream table")
    service.add_argument("name", metavar="NAME", **one_of(permissions.SERVICE_ROLES))
    issue_flags(service, "NAME")
    sim = actions.add_parser("sim", help="the simulated fleet's credentials: every node of one cluster")
    sim.add_argument("--cluster", default="default")
    issue_flags(sim, "sim")
    token = actions.add_parser("token", help="print a bearer token for the HTTP API")
    token.add_argument("name", metavar="NAME")
    token.add_argument("--role", required=True, **one_of(permissions.TOKEN_ROLES))
    keys_flags(token)
    rotate = actions.add_parser("rotate", help="a fresh key in every credentials file of NAME; the old keys revoked")
    rotate.add_argument("name", metavar="NAME")
    rotate.add_argument("--cluster", help="a node's cluster (the same node id may be in several)")
    rotate.add_argument("--nats-url", help="the running server (default: DATA_DIR/stack.json's)")
    keys_flags(rotate)
    revoke = actions.add_parser("revoke", help="revoke every credential issued to NAME")
    revoke.add_argument("name", metavar="NAME")
    revoke.add_argument("--cluster", help="only the node NAME of this cluster")
    revoke.add_argument("--nats-url", help="the running server (default: DATA_DIR/stack.json's)")
    keys_flags(revoke)
    listing = actions.add_parser("list", help="every credential issued, and which are revoked")
    keys_flags(listing)
    output_flag(listing)
    server = actions.add_parser("server-config", help="the operator-mode part of nats-server's config")
    server.add_argument("--resolver-dir", required=True, help="where the server keeps account JWTs")
    server.add_argument("-o", "--out", help="file to write (default stdout)")
    keys_flags(server)


def _keys_dir(args: argparse.Namespace) -> Path:
    return Path(args.keys) if args.keys else Path(args.data_dir or DEFAULT_DATA_DIR) / "creds"


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except CredsError as exc:
        return fail(CommandFailed(str(exc)))
    except CommandFailed as exc:
        return fail(exc)


def _run(args: argparse.Namespace) -> int:
    directory = _keys_dir(args)
    if args.creds_command == "init":
        Keystore.init(directory)
        print(f"keys in {directory} (0600); issue identities with `healthplane creds node|user|service`")
        return 0
    store = Keystore.open(directory)
    match args.creds_command:
        case "node":
            out = store.node(args.node_id, args.cluster, Path(args.out or f"{args.node_id}.creds"))
            print(f"credentials for node {args.node_id} (cluster {args.cluster}) in {out}")
        case "user":
            out = store.user(args.name, args.role, Path(args.out or f"{args.name}.creds"))
            # Replies reach this identity only under its own inbox prefix (docs/subscribing.md).
            print(f"credentials for {args.name} (role {args.role}) in {out}, inbox prefix {inbox_prefix(out)}")
        case "service":
            out = store.service(args.name, Path(args.out or f"{args.name}.creds"))
            print(f"credentials for service {args.name} in {out}")
        case "sim":
            out = store.sim(args.cluster, Path(args.out or "sim.creds"))
            print(f"credentials for the simulated fleet of cluster {args.cluster} in {out}")
        case "token":
            print(store.token(args.name, args.role))
        case "revoke":
            return _revoke(args, store)
        case "rotate":
            fresh, _account = store.rotate(args.name, args.cluster)
            for issued in fresh:
                print(f"rotated {issued.path} ({issued.role} {issued.name}); the old key is revoked")
            return _tell_server(args, store, "rotated")
        case "list":
            _list(args, store)
        case "server-config":
            text = store.server_config(Path(args.resolver_dir).resolve())
            if args.out:
                keystore.write_secret(Path(args.out), text)
            else:
                sys.stdout.write(text)
    return 0


def _revoke(args: argparse.Namespace, store: Keystore) -> int:
    revoked, _account = store.revoke(args.name, args.cluster)
    print(f"revoked {len(revoked)} credential(s) of {args.name}")
    return _tell_server(args, store, "revoked")


def _tell_server(args: argparse.Namespace, store: Keystore, done: str) -> int:
    """The new account JWT to the running server, so that it refuses the revoked keys now."""
    url = args.nats_url or _stack_url(args)
    if url is None:
        print("no running server known (no --nats-url, no stack.json): the revocation applies when the "
              "server starts with this account", file=sys.stderr)
        return 0
    try:
        asyncio.run(keystore.push_account(url, store))
    except (ConnectionError, TimeoutError, CredsError, NatsError) as exc:  # NatsError: no responders, …
        raise CommandFailed(f"{done} in {store.directory}, but the server at {url} was not told "
                            f"({exc or type(exc).__name__}); run {args.creds_command} again", EXIT_RETRY) from exc
    print(f"the server at {url} refuses the old keys now")
    return 0


def _stack_url(args: argparse.Namespace) -> str | None:
    if args.keys:
        return None
    try:
        stack = json.loads((Path(args.data_dir or DEFAULT_DATA_DIR) / "stack.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    url = stack.get("natsUrl")
    return url if isinstance(url, str) else None


def _list(args: argparse.Namespace, store: Keystore) -> None:
    revoked = store.revocations()
    rows = [{"name": i.name, "role": i.role, "cluster": i.cluster, "publicKey": i.public_key,
             "issuedAt": datetime.fromtimestamp(i.issued_at, UTC).isoformat(),
             "expiresAt": datetime.fromtimestamp(i.expires_at, UTC).isoformat() if i.expires_at else None,
             "revoked": i.public_key in revoked and i.issued_at <= revoked[i.public_key], "path": i.path}
            for i in store.issued()]
    if args.output == "json":
        print(json.dumps(rows, indent=2))
        return
    print(f"{'NAME':<24} {'ROLE':<18} {'CLUSTER':<12} {'ISSUED':<26} STATE")
    for row in rows:
        print(f"{row['name']:<24} {row['role']:<18} {row['cluster'] or '-':<12} {row['issuedAt']:<26} "
              f"{'revoked' if row['revoked'] else 'valid'}")
