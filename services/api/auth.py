"""Who is asking (API-2): bearer tokens of ``healthplane creds token``, the UI's session
cookie, CSRF, and a connection on the bus as the caller.

A token is a user JWT signed by the viewer's or the admin's key (``Keystore.verify_token``:
that signer, not expired, not revoked), checked on every request. The UI keeps it in an
``HttpOnly; SameSite=Strict`` cookie; a form a cookie authenticates must also carry the
page's CSRF value (an HMAC of the token under this process's secret) and come from this
origin. The API never commands with an identity of its own: it mints the caller short-lived
credentials (``Keystore.session``) and publishes as them, so nats-server binds the command's
actor to the caller and refuses a viewer's command, exactly as it does the CLI's (SEC-1).
Tokens never reach a log: errors name the reason only.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from nats.aio.client import Client as NATS

from healthplane import creds as credentials
from healthplane.runtime.connect import connect

COOKIE: Final = "hp_session"
SESSION_IDLE_S: Final = 600.0
SESSION_RENEW_BEFORE_S: Final = 300.0  # credentials are replaced this long before they expire


class Unauthorized(Exception):
    """No usable token (401): ``str()`` says why, never the token."""


@dataclass(frozen=True, slots=True)
class Caller:
    name: str
    role: str
    token: str  # kept only to derive the CSRF value; never logged or rendered

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


class Verifier:
    """Checks tokens against the control plane's keys; ``None`` keys: an ``--insecure`` stack,
    where anyone may read and nobody may command through the API (no anonymous writes)."""

    def __init__(self, keys: Path | None) -> None:
        self.keystore = credentials.Keystore.open(keys) if keys is not None else None
        self._secret = secrets.token_bytes(32)

    @property
    def open(self) -> bool:
        return self.keystore is None

    def caller(self, token: str | None) -> Caller | None:
        """The caller a token names; ``None`` on an open stack without one."""
        if self.keystore is None:
            return None
        if not token:
            raise Unauthorized("no token: send Authorization: Bearer TOKEN (healthplane creds token NAME --role ROLE)")
        try:
            claims = self.keystore.verify_token(token)
        except credentials.CredsError as exc:
            raise Unauthorized(str(exc)) from None
        tags = dict(tag.split(":", 1) for tag in claims.get("nats", {}).get("tags", []) if ":" in tag)
        return Caller(tags.get("user", str(claims.get("name", "?"))), tags.get("role", "viewer"), token)

    def csrf(self, caller: Caller | None) -> str:
        subject = caller.token if caller else "anonymous"
        return hmac.new(self._secret, subject.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, caller: Caller | None, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(self.csrf(caller), given or "")


@dataclass
class _Session:
    client: NATS
    creds: Path
    expires_at: float
    used_at: float


class Sessions:
    """One connection per caller, made on first use with freshly minted credentials, closed
    after ``SESSION_IDLE_S`` unused or before its credentials expire."""

    def __init__(self, keystore: credentials.Keystore, nats_url: str | None) -> None:
        self._keystore = keystore
        self._url = nats_url
        self._dir = Path(tempfile.mkdtemp(prefix="healthplane-api-"))  # 0700: mkdtemp's mode
        self._sessions: dict[tuple[str, str], _Session] = {}
        self._lock = asyncio.Lock()

    async def connection(self, caller: Caller) -> tuple[NATS, Path]:
        """The caller's connection and the credentials file it uses (what names them in errors)."""
        async with self._lock:
            now = time.time()
            key = (caller.role, caller.name)
            found = self._sessions.get(key)
            if found is not None and found.expires_at - now > SESSION_RENEW_BEFORE_S and not found.client.is_closed:
                found.used_at = now
                return found.client, found.creds
            if found is not None:
                await self._close(key)
            path = self._dir / f"{caller.role}-{caller.name}-{secrets.token_hex(4)}.creds"
            self._keystore.session(caller.name, caller.role, path)
            client = await connect(self._url, name=f"healthplane-api-{caller.name}", creds=str(path),
                                   give_up_after=5.0)
            self._sessions[key] = _Session(client, path, now + credentials.SESSION_LIFETIME_S, now)
            return client, path

    async def sweep(self) -> None:
        async with self._lock:
            now = time.time()
            for key, session in list(self._sessions.items()):
                if now - session.used_at > SESSION_IDLE_S or session.expires_at - now < SESSION_RENEW_BEFORE_S:
                    await self._close(key)

    async def _close(self, key: tuple[str, str]) -> None:
        session = self._sessions.pop(key)
        try:
            await asyncio.wait_for(session.client.close(), 2.0)
        except Exception:  # closing a connection the server dropped: nothing left to do
            pass
        session.creds.unlink(missing_ok=True)

    async def close(self) -> None:
        async with self._lock:
            for key in list(self._sessions):
                await self._close(key)
        shutil.rmtree(self._dir, ignore_errors=True)


def bearer(header: str | None) -> str | None:
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    return None


def token_file_hint(path: str | os.PathLike[str] | None) -> str:
    return f" (e.g. the one in {path})" if path else ""
