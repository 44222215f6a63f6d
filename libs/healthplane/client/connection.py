"""Who a client is, its connection, and reading records it may not trust.

A client acts as one identity: its credentials' (what nats-server binds its publishes to,
SEC-1), or, for the api, the caller's. ``Identity`` carries it to every command.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

from nats.aio.client import Client as NATS

from healthplane.client.errors import EXIT_RETRY, CommandFailed, PermissionDenied
from healthplane.contracts import permissions, wire
from healthplane.runtime import creds
from healthplane.runtime.connect import connect, default_creds
from healthplane.runtime.replay import StoredMsg

R = TypeVar("R", bound=wire.Record)
T = TypeVar("T")

CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Identity:
    """``role`` and ``name`` as the server knows them; ``role`` is ``None`` on an open bus
    (``up --insecure``), where ``name`` is only what the sender says."""

    role: str | None
    name: str

    @classmethod
    def of_creds(cls, path: str | None) -> Identity:
        """The credentials' identity (``path``, else ``HEALTHPLANE_NATS_CREDS``). Without any:
        ``HEALTHPLANE_ACTOR`` or the login name, unverified."""
        path = path or default_creds()
        if path:
            try:
                role, name = creds.identity_of(path)
            except creds.CredsError as exc:
                raise CommandFailed(str(exc)) from exc
            if role in permissions.ROLES and name:
                return cls(role, name)
        return cls(None, os.environ.get("HEALTHPLANE_ACTOR") or _login_name())

    @property
    def actor(self) -> str:
        """The name its commands carry."""
        return self.name

    def __str__(self) -> str:
        return f"{self.name} (role {self.role})" if self.role else "this identity"


def _login_name() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry, no LOGNAME: a container's arbitrary uid
        return "unknown"


@asynccontextmanager
async def connected(nats_url: str | None, creds_path: str | None) -> AsyncIterator[NATS]:
    """A connection for one request; unreachable is retryable (``EXIT_RETRY``), never a traceback."""
    try:
        nc = await connect(nats_url, name="healthplane-cli", creds=creds_path, give_up_after=CONNECT_TIMEOUT_S)
    except ConnectionError as exc:
        raise CommandFailed(str(exc), EXIT_RETRY) from exc
    try:
        yield nc
    finally:
        await nc.close()


async def acked_or_refused(nc: NATS, who: Identity, what: str, pending: Awaitable[T]) -> T:
    """``pending`` (a publish waiting for its ack), or ``PermissionDenied`` naming the
    permission as soon as the server refuses it: a refused publish never gets an ack, and
    waiting one out would only end in a timeout that does not say why."""
    before = nc.last_error
    task = asyncio.ensure_future(pending)
    try:
        while not task.done():
            error = nc.last_error
            if error is not None and error is not before and "permissions violation" in str(error).lower():
                raise PermissionDenied(f"permission denied: {who} may not {what} "
                                       f"({str(error).removeprefix('nats: ')})")
            await asyncio.wait({task}, timeout=0.02)
        return task.result()
    finally:
        task.cancel()


async def publish_checked(nc: NATS, who: Identity, what: str, subject: str, payload: bytes,
                          headers: dict[str, str] | None = None) -> None:
    try:
        await acked_or_refused(nc, who, what, nc.jetstream().publish(subject, payload, headers=headers,
                                                                      timeout=CONNECT_TIMEOUT_S))
    except TimeoutError as exc:
        raise CommandFailed(f"no answer from JetStream for {subject}; retry", EXIT_RETRY) from exc


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


def decoded(kind: type[R], messages: Iterable[StoredMsg]) -> list[tuple[StoredMsg, R]]:
    """Each message with its record; one that is not a ``kind`` is named and skipped."""
    out = []
    for msg in messages:
        record = decoded_or_skipped(kind, msg.data, lambda msg=msg: (  # type: ignore[misc]
            f"{msg.stream} record {msg.seq} ({msg.subject})"))
        if record is not None:
            out.append((msg, record))
    return out
