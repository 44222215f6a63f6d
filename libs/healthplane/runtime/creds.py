"""Reading an identity (SEC-1, SEC-2): what a ``.creds`` file or a bearer token says, and
whether this control plane signed it.

What every client needs to connect and to say who it is (``runtime.connect``, the CLI, the
api's token check): claims, tags, the inbox an identity may receive on. Issuing identities
is the keystore's (``healthplane.stack.keystore``), which only ``up`` and ``creds`` use.
Errors name files, never their content.
"""

from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path
from typing import Any

import nacl.exceptions
import nacl.signing
import nkeys

from healthplane.contracts import permissions
from healthplane.contracts.subjects import SubjectError, decode_token


class CredsError(RuntimeError):
    """One line naming what is wrong (a file, a name), never key material."""



def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))



def decode_jwt(token: str) -> dict[str, Any]:
    """The claims, unverified (a file we wrote, or before :func:`verify_jwt`)."""
    try:
        claims = json.loads(unb64url(token.split(".")[1]))
    except (IndexError, ValueError) as exc:
        raise CredsError("not a NATS JWT") from exc
    if not isinstance(claims, dict):
        raise CredsError("not a NATS JWT")
    return claims



def verify_key(public_key: str) -> nacl.signing.VerifyKey:
    try:
        raw = base64.b32decode(public_key + "=" * (-len(public_key) % 8))
    except ValueError as exc:
        raise CredsError("not a public nkey") from exc
    if len(raw) != 35 or nkeys.crc16(bytearray(raw[:-2])) != int.from_bytes(raw[-2:], "little"):
        raise CredsError("not a public nkey")
    return nacl.signing.VerifyKey(raw[1:33])



def verify_jwt(token: str, issuers: dict[str, str], now: float | None = None) -> dict[str, Any]:
    """The claims when ``token`` is signed by one of ``issuers`` (public key → role) and not
    expired; the role lands in ``claims["role"]``."""
    parts = token.split(".")
    if len(parts) != 3:
        raise CredsError("not a NATS JWT")
    claims = decode_jwt(token)
    issuer = claims.get("iss")
    if not isinstance(issuer, str) or issuer not in issuers:
        raise CredsError("token not signed by this control plane")
    try:
        verify_key(issuer).verify(f"{parts[0]}.{parts[1]}".encode(), unb64url(parts[2]))
    except (nacl.exceptions.BadSignatureError, ValueError) as exc:
        raise CredsError("token signature invalid") from exc
    if isinstance(claims.get("exp"), int) and claims["exp"] < (time.time() if now is None else now):
        raise CredsError("token expired")
    return {**claims, "role": issuers[issuer]}



def read_creds_jwt(path: str | Path) -> str:
    """The user JWT of a ``.creds`` file (its first line between the JWT markers)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CredsError(f"cannot read credentials {path}: {exc.strerror or exc}") from exc
    match = re.search(r"-----BEGIN NATS USER JWT-----\s*\n\s*(\S+)\s*\n", text)
    if match is None:
        raise CredsError(f"{path} is not a NATS credentials file")
    return match.group(1)



def tags(claims: dict[str, Any]) -> dict[str, str]:
    nats = claims.get("nats") or {}
    out: dict[str, str] = {}
    for tag in nats.get("tags") or []:
        name, sep, value = str(tag).partition(":")
        if sep:
            out[name] = value
    return out



def identity_of(path: str | Path) -> tuple[str, str]:
    """``(role, name)`` of a ``.creds`` file, from its JWT's tags (what the CLI acts as)."""
    claims = decode_jwt(read_creds_jwt(path))
    found = tags(claims)
    return found.get("role", ""), found.get("user") or str(claims.get("name", ""))



def expires_at(path: str | Path) -> int | None:
    """When a ``.creds`` file's identity ends (unix seconds), ``None`` if never (SEC-12)."""
    expiry = decode_jwt(read_creds_jwt(path)).get("exp")
    return expiry if isinstance(expiry, int) else None


def node_of(path: str | Path) -> tuple[str, str] | None:
    """``(cluster, node id)`` a collector's credentials speak for; ``None`` for any other identity."""
    found = tags(decode_jwt(read_creds_jwt(path)))
    if found.get("role") != permissions.NODE:
        return None
    try:
        return decode_token(found.get("cluster", "")), decode_token(found.get("node", ""))
    except SubjectError as exc:
        raise CredsError(f"{path}: node credentials with a damaged tag") from exc



def inbox_prefix(path: str | Path) -> str | None:
    """The inbox this identity may receive on (``permissions.inbox`` with its tags filled
    in); ``None`` for credentials we did not issue (the server's default then applies)."""
    return inbox_of(decode_jwt(read_creds_jwt(path)))



def inbox_of(claims: dict[str, Any]) -> str | None:
    """:func:`inbox_prefix` of a user JWT's claims (a bearer token's)."""
    found = tags(claims)
    role = found.get("role")
    if role not in permissions.ROLES:
        return None
    return (permissions.inbox(role).replace(permissions.CLUSTER, found.get("cluster", ""))
            .replace(permissions.NODE_ID, found.get("node", "")).replace(permissions.USER, found.get("user", "")))


TOKEN_SIGNERS_FILE = "token-signers.json"  # beside the credentials a keystore issues


def token_signers(path: str | Path) -> dict[str, str]:
    """The bearer-token signers a keystore published beside the credentials (public key ->
    role, ``token-signers.json``): what a token's signature is checked against."""
    try:
        loaded = json.loads(Path(path).read_text(encoding="utf-8"))
        signers = loaded["tokenSigners"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CredsError(f"cannot read the token signers {path}: {exc}") from exc
    if not isinstance(signers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in signers.items()):
        raise CredsError(f"{path}: tokenSigners must map public keys to roles")
    return dict(signers)
