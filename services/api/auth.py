"""Who is asking (API-2): bearer tokens of ``healthplane creds token``, the UI's session
cookie, CSRF, and a connection on the bus as the caller.

A token is a NATS user JWT that is its own proof (``bearer_token``, from the scope of the
viewer's or the admin's token signing key), so the API holds no keys at all: it connects to
nats-server *with the caller's token*, the server checks it (signature, expiry, revocation)
as it checks every identity, and every command the API sends for the caller goes out on that
connection, the server binding its actor to the caller and refusing a viewer's (SEC-1).
A token the server refused is remembered for ``REFUSED_FOR_S`` so that garbage cannot make
the API hammer the server. The UI keeps the token in an ``HttpOnly; SameSite=Strict``
cookie; a form a cookie authenticates must also carry the page's CSRF value (an HMAC of the
token under this process's secret) and come from this origin. Tokens never reach a log:
errors name the reason only.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from nats.aio.client import Client as NATS

from healthplane.contracts import permissions
from healthplane.runtime import creds as credentials
from healthplane.runtime.connect import connect

COOKIE: Final = "hp_session"
SESSION_IDLE_S: Final = 600.0
REFUSED_FOR_S: Final = 30.0
CONNECT_WITHIN_S: Final = 3.0
MAX_SESSIONS: Final = 10_000


class Unauthorized(Exception):
    """No usable token (401): ``str()`` says why, never the token."""


@dataclass(frozen=True, slots=True)
class Caller:
    name: str
    role: str
    token: str  # kept for the CSRF value and the connection; never logged or rendered
    client: NATS | None  # the bus as this caller; None on an open bus

    @property
    def is_admin(self) -> bool:
        return self.role == permissions.ADMIN


@dataclass
class _Session:
    caller: Caller
    used_at: float


class Callers:
    """Tokens to callers, each with its own connection, made on first use and closed after
    ``SESSION_IDLE_S`` unused. ``open``: the stack runs without identities (``--insecure``);
    anyone may read, and nobody may command through the API (no anonymous writes)."""

    def __init__(self, nats_url: str | None, *, open_bus: bool, signers: dict[str, str] | None = None) -> None:
        self.open = open_bus
        self._url = nats_url
        self._secret = secrets.token_bytes(32)
        self._sessions: dict[str, _Session] = {}
        self._refused: dict[str, tuple[float, str]] = {}
        # Public key -> role of the bearer-token signers: a token is checked here, in
        # microseconds, before any connection; None: only the server checks (older key dirs).
        self._signers = signers
        self._lock = asyncio.Lock()  # the session table's, held for no I/O
        self._connecting: dict[str, asyncio.Lock] = {}  # one per token being connected
        self._closing: set[asyncio.Future[None]] = set()

    async def caller(self, token: str | None) -> Caller | None:
        """The caller a token names, connected as them; ``None`` on an open bus."""
        if self.open:
            return None
        if not token:
            raise Unauthorized("no token: send Authorization: Bearer TOKEN (healthplane creds token NAME --role ROLE)")
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        refused = self._refused.get(key)
        if refused is not None and now - refused[0] < REFUSED_FOR_S:
            raise Unauthorized(refused[1])
        found = self._sessions.get(key)
        if found is not None and found.caller.client is not None and not found.caller.client.is_closed:
            found.used_at = now
            return found.caller
        if self._signers is not None:
            try:  # SEC-12: a token this control plane did not sign never costs a connection
                credentials.verify_jwt(token, self._signers)
            except credentials.CredsError as exc:
                raise Unauthorized(f"not a token of this control plane: {exc}") from None
        # One connection per token however many of its requests arrive at once, and only its
        # own requests wait for it: a token the server refuses (seconds) holds up no other login.
        connecting = self._connecting.setdefault(key, asyncio.Lock())
        try:
            async with connecting:
                found = self._sessions.get(key)
                if found is not None and found.caller.client is not None and not found.caller.client.is_closed:
                    return found.caller
                try:
                    caller = await self._connect(token)
                except Unauthorized as exc:
                    if len(self._refused) >= MAX_SESSIONS:
                        self._refused.clear()
                    self._refused[key] = (now, str(exc))
                    raise
                async with self._lock:
                    if len(self._sessions) >= MAX_SESSIONS:
                        await self._close_idle(0.0)
                    self._sessions[key] = _Session(caller, now)
                return caller
        finally:
            if not connecting.locked():
                self._connecting.pop(key, None)

    async def _connect(self, token: str) -> Caller:
        try:
            claims = credentials.decode_jwt(token)
        except credentials.CredsError as exc:
            raise Unauthorized(f"not a token: {exc}") from None
        found = credentials.tags(claims)
        role, name = found.get("role", ""), found.get("user", "")
        if role not in permissions.TOKEN_ROLES or not name:
            raise Unauthorized("not a person's token (healthplane creds token NAME --role viewer|admin)")
        expires = claims.get("exp")
        if isinstance(expires, int) and expires < time.time():
            raise Unauthorized("token expired")
        try:
            client = await connect(self._url, name=f"healthplane-api-{name}", bearer=token,
                                   give_up_after=CONNECT_WITHIN_S)
        except ConnectionError as exc:
            reason = str(exc).rsplit(": ", 1)[-1].strip("'")
            raise Unauthorized(f"the control plane refused this token ({reason})") from None
        return Caller(name, role, token, client)

    def csrf(self, caller: Caller | None) -> str:
        subject = caller.token if caller else "anonymous"
        return hmac.new(self._secret, subject.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, caller: Caller | None, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(self.csrf(caller), given or "")

    async def sweep(self) -> None:
        async with self._lock:
            await self._close_idle(SESSION_IDLE_S)
            now = time.monotonic()
            self._refused = {k: v for k, v in self._refused.items() if now - v[0] < REFUSED_FOR_S}

    async def _close_idle(self, idle_s: float) -> None:
        """Drop the sessions idle for ``idle_s``; their connections close in the background, so
        the table's lock is never held across a close (a dead server makes each take 2 s)."""
        now = time.monotonic()
        idle = [key for key, session in self._sessions.items() if now - session.used_at >= idle_s]
        for key in idle:
            session = self._sessions.pop(key)
            self._closing.add(closing := asyncio.ensure_future(_close(session.caller.client)))
            closing.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        async with self._lock:
            await self._close_idle(0.0)
        await asyncio.gather(*self._closing, return_exceptions=True)


async def _close(client: NATS | None) -> None:
    if client is None:
        return
    try:
        await asyncio.wait_for(client.close(), 2.0)
    except Exception:  # closing a connection the server dropped: nothing left to do
        pass


def bearer(header: str | None) -> str | None:
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    return None


def token_signers_beside(creds_path: str | None) -> dict[str, str] | None:
    """The token signers published beside the api's own credentials (``up`` and the compose
    volume keep them together), or ``None`` when there are none to read (missing or damaged:
    the server alone then checks tokens, and the api says so at start)."""
    if not creds_path:
        return None
    path = Path(creds_path).parent / credentials.TOKEN_SIGNERS_FILE
    if not path.exists():
        return None
    try:
        return credentials.token_signers(path)
    except credentials.CredsError:
        return None
