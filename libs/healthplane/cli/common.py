"""What every CLI command shares: its place in the command table, connecting, and saying
why it could not."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypedDict, TypeVar

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from healthplane.contracts import permissions, wire
from healthplane.runtime import creds, tls
from healthplane.runtime.connect import DEFAULT_URL, connect, default_creds

R = TypeVar("R", bound=wire.Record)
T = TypeVar("T")

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_RETRY = 0, 1, 2, 3
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class CommandGroup:
    """``healthplane NAME …``: ``add_arguments`` fills the group's parser, ``run`` takes the
    parsed arguments and returns the exit code. A ``run`` whose code is slow to import
    imports it when called, so that building the parser stays cheap."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


class CommandFailed(Exception):
    """A command that cannot go on; ``str()`` is the one line to print, ``code`` the exit code."""

    def __init__(self, message: str, code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.code = code


class PermissionDenied(CommandFailed):
    """The server refused what this identity tried (SEC-1): the API's 403."""


class Choices(TypedDict):
    type: Callable[[str], str]
    choices: list[str]


def one_of(choices: Sequence[str]) -> Choices:
    """``add_argument`` keywords for an enumerated value accepted in any case and held in its
    canonical form (EVT-1: ``--type score_changed`` is ``SCORE_CHANGED``, ``--effect CORDON``
    is ``cordon``); anything else is argparse's usage error listing the choices."""
    canonical = {choice.casefold(): choice for choice in choices}

    def convert(text: str) -> str:
        return canonical.get(text.casefold(), text)

    convert.__name__ = "value"  # argparse names the converter in its error messages
    return {"type": convert, "choices": list(choices)}


def connection_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nats-url", help=f"NATS server (env HEALTHPLANE_NATS_URL, default {DEFAULT_URL})")
    parser.add_argument("--creds", help="NATS credentials file (env HEALTHPLANE_NATS_CREDS)")
    parser.add_argument("--tls-ca", help=f"CA that verifies the server (env {tls.ENV_CA})")
    parser.add_argument("--tls-cert", help=f"client certificate (env {tls.ENV_CERT})")
    parser.add_argument("--tls-key", help=f"client key (env {tls.ENV_KEY})")


def export_tls_flags(args: argparse.Namespace) -> None:
    """``--tls-*`` given: this process and what it starts (``up``'s services) use them, through
    the same variables ``runtime.connect`` reads."""
    for flag, variable in (("tls_ca", tls.ENV_CA), ("tls_cert", tls.ENV_CERT), ("tls_key", tls.ENV_KEY)):
        value = getattr(args, flag, None)
        if value:
            os.environ[variable] = os.path.abspath(value)


def identity(args: argparse.Namespace) -> tuple[str, str] | None:
    """``(role, name)`` this command acts as: the HTTP API's caller (``args.identity``), or
    the credentials' (``--creds``, ``HEALTHPLANE_NATS_CREDS``); ``None`` without any."""
    given: tuple[str, str] | None = getattr(args, "identity", None)
    if given is not None:
        return given
    path = getattr(args, "creds", None) or default_creds()
    if not path:
        return None
    try:
        return creds.identity_of(path)
    except creds.CredsError as exc:
        raise CommandFailed(str(exc)) from exc


def actor(args: argparse.Namespace) -> str:
    """Who a command is from. With credentials, their identity: nats-server lets it publish
    only commands that carry that name (SEC-1). Without (``--insecure``), the login name or
    ``HEALTHPLANE_ACTOR``, unverified."""
    found = identity(args)
    if found is not None and found[0] in permissions.ROLES and found[1]:
        return found[1]
    if os.environ.get("HEALTHPLANE_ACTOR"):
        return os.environ["HEALTHPLANE_ACTOR"]
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


async def acked_or_refused(nc: NATS, args: argparse.Namespace, what: str, pending: Awaitable[T]) -> T:
    """``pending`` (a publish waiting for its ack), or ``CommandFailed`` naming the permission
    as soon as the server refuses it: a refused publish never gets an ack, and waiting one out
    would only end in a timeout that does not say why."""
    before = nc.last_error
    task = asyncio.ensure_future(pending)
    try:
        while not task.done():
            error = nc.last_error
            if error is not None and error is not before and "permissions violation" in str(error).lower():
                raise PermissionDenied(f"permission denied: {_identity(args)} may not {what} "
                                    f"({str(error).removeprefix('nats: ')})")
            await asyncio.wait({task}, timeout=0.02)
        return task.result()
    finally:
        task.cancel()


def _identity(args: argparse.Namespace) -> str:
    try:
        found = identity(args)
    except CommandFailed:
        found = None
    return f"{found[1]} (role {found[0]})" if found is not None else "this identity"


async def publish_checked(nc: NATS, args: argparse.Namespace, what: str, subject: str, payload: bytes,
                          headers: dict[str, str] | None = None) -> None:
    try:
        await acked_or_refused(nc, args, what, nc.jetstream().publish(subject, payload, headers=headers,
                                                                       timeout=CONNECT_TIMEOUT_S))
    except TimeoutError as exc:
        raise CommandFailed(f"no answer from JetStream for {subject}; retry", EXIT_RETRY) from exc


def output_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", **one_of(["text", "json"]), default="text")


def warn(message: str) -> None:
    print(f"healthplane: warning: {message}", file=sys.stderr)


def decoded_or_skipped(kind: type[R], data: bytes, where: Callable[[], str]) -> R | None:
    """``data`` as a ``kind``, or ``None`` with one stderr line naming ``where()`` and why:
    any client that may publish on a subject could have appended a record that is not one,
    and it must never hide the others or end a read in a traceback (REL-3)."""
    try:
        return wire.decode(kind, data)
    except wire.WireError as exc:
        warn(f"{where()} skipped: {exc}")
        return None


def decoded(kind: type[R], messages: Iterable[Msg]) -> list[tuple[Msg, R]]:
    """Each message with its record; one that is not a ``kind`` is named and skipped."""
    out = []
    for msg in messages:
        record = decoded_or_skipped(kind, msg.data, lambda msg=msg: (  # type: ignore[misc]
            f"{msg.metadata.stream} record {msg.metadata.sequence.stream} ({msg.subject})"))
        if record is not None:
            out.append((msg, record))
    return out


def fail(exc: CommandFailed) -> int:
    print(f"healthplane: {exc}", file=sys.stderr)
    return exc.code


@asynccontextmanager
async def nats_client(args: argparse.Namespace) -> AsyncIterator[NATS]:
    """A connection for one command; unreachable is retryable (exit 3), never a traceback."""
    try:
        nc = await connect(args.nats_url, name="healthplane-cli", creds=args.creds, give_up_after=CONNECT_TIMEOUT_S)
    except ConnectionError as exc:
        raise CommandFailed(str(exc), EXIT_RETRY) from exc
    try:
        yield nc
    finally:
        await nc.close()
