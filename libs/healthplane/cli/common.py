"""What every CLI command shares: its place in the command table, its flags, and saying why
it could not. Everything a command asks of the bus is ``healthplane.client``'s."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypedDict

from nats.aio.client import Client as NATS

from healthplane.client.connection import Identity, connected
from healthplane.client.errors import CommandFailed
from healthplane.runtime import tls
from healthplane.runtime.connect import DEFAULT_URL


@dataclass(frozen=True, slots=True)
class CommandGroup:
    """``healthplane NAME …``: ``arguments`` fills the group's parser, ``run`` takes the parsed
    arguments and returns the exit code. Both are "module:function", imported only for the
    group a command line names: a command pays for its own imports, not every group's (every
    CLI call and every service process starts through this table)."""

    name: str
    help: str
    arguments: str
    run: str


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


def output_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", **one_of(["text", "json"]), default="text")


def fail(exc: CommandFailed) -> int:
    print(f"healthplane: {exc}", file=sys.stderr)
    return exc.code


def who(args: argparse.Namespace) -> Identity:
    """Who this command acts as: its credentials' identity (``--creds``, ``HEALTHPLANE_NATS_CREDS``)."""
    return Identity.of_creds(getattr(args, "creds", None))


@asynccontextmanager
async def nats_client(args: argparse.Namespace) -> AsyncIterator[NATS]:
    """A connection for one command (``--nats-url``, ``--creds``)."""
    async with connected(args.nats_url, args.creds) as nc:
        yield nc
