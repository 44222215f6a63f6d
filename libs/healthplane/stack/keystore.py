"""Identities on the bus (SEC-1, SEC-2): NATS decentralized JWT auth with scoped signing keys.

Chosen by measurement (docs/security.md): a connect needs only nats-server, issuing an
identity never touches the server, and a revocation reaches it in milliseconds.

The trust chain, all kept in one directory (``DATA_DIR/creds``, 0700; every file 0600):
an *operator* signs the *system account* and the control plane's account ``HP``. ``HP``
holds one *scoped signing key per role* (``healthplane.contracts.permissions``: collector, sim,
viewer, admin, each service) whose template holds the role's permissions; nats-server
fills in the user's tags (a node's ``cluster``/``node``, a person's ``user``). A user JWT
carries no permissions of its own, only its name, tags and expiry, so 100,000 node
identities are 100,000 files and nothing in the server until they connect.

No maintained Python library writes these claims (docs/security.md): a NATS JWT is
``b64url(header).b64url(claims).b64url(ed25519 signature by the issuer's nkey)``, the keys
are nats-io's ``nkeys``. Key material never reaches a log: :class:`Keystore` has no repr of
it and errors name files, never their content.

What reads an identity (a client connecting, the api checking a token) is
``healthplane.runtime.creds``; this module issues them and only ``up`` and ``creds`` use it.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import nkeys

from healthplane.contracts import permissions
from healthplane.contracts.subjects import SubjectError, encode_token
from healthplane.runtime.creds import TOKEN_SIGNERS_FILE, CredsError, verify_jwt

ACCOUNT: Final = "HP"


SYSTEM_ACCOUNT: Final = "SYS"


DAY_S: Final = 24 * 3600
NODE_LIFETIME_S: Final = 365 * DAY_S  # a node JWT expires; revocations of expired ones are dropped
# SEC-12: every identity ends. A person's credentials and tokens: a quarter; what runs
# unattended (services, the simulator, a federation member's link): a year, like a node's.
# `up` issues again what would end within RENEW_WITHIN_S; `creds rotate` does it by hand.
PERSON_LIFETIME_S: Final = 90 * DAY_S
MACHINE_LIFETIME_S: Final = 365 * DAY_S
RENEW_WITHIN_S: Final = 14 * DAY_S


TOKEN_LIFETIME_S: Final = 90 * 24 * 3600  # = PERSON_LIFETIME_S


_HEADER: Final = {"typ": "JWT", "alg": "ed25519-nkey"}


_NAME_RE: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


_NO_LIMIT: Final = -1


_ACCOUNT_LIMITS: Final = {
    "subs": _NO_LIMIT, "data": _NO_LIMIT, "payload": _NO_LIMIT, "imports": _NO_LIMIT,
    "exports": _NO_LIMIT, "wildcards": True, "conn": _NO_LIMIT, "leaf": _NO_LIMIT,
}


# SEC-8: consumers are the services' durables (about 60 at 24 partitions) and their KV
# watches (a few per replica); readers make none (direct gets). A bound far above that keeps
# an identity gone wrong from filling the server with consumers.
CONSUMER_LIMIT: Final = 4096
_JETSTREAM_LIMITS: Final = {"mem_storage": _NO_LIMIT, "disk_storage": _NO_LIMIT, "streams": _NO_LIMIT,
                            "consumer": CONSUMER_LIMIT}




def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()



def _jti(claims: dict[str, Any]) -> str:
    """What nats-io/jwt puts in ``jti``: base32 of SHA-512/256 of the claims without it."""
    body = json.dumps({**claims, "jti": ""}, separators=(",", ":"), sort_keys=True).encode()
    return base64.b32encode(hashlib.new("sha512_256", body).digest()).rstrip(b"=").decode()



def encode_jwt(claims: dict[str, Any], signer: nkeys.KeyPair, now: float | None = None) -> str:
    claims = {"iat": int(time.time() if now is None else now), **claims, "iss": public(signer)}
    claims["jti"] = _jti(claims)
    head = _b64(json.dumps(_HEADER, separators=(",", ":")).encode())
    body = _b64(json.dumps(claims, separators=(",", ":")).encode())
    return f"{head}.{body}.{_b64(signer.sign(f'{head}.{body}'.encode()))}"



def public(pair: nkeys.KeyPair) -> str:
    return bytes(pair.public_key).decode()



def new_pair(prefix: int) -> nkeys.KeyPair:
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))



def creds_text(jwt: str, seed: bytes) -> str:
    """The standard ``.creds`` file (what nats-py's ``user_credentials=`` reads)."""
    return (f"-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n"
            "************************* IMPORTANT *************************\n"
            "NKEY Seed printed below can be used to sign and prove identity.\n"
            "NKEYs are sensitive and should be treated as secrets.\n\n"
            f"-----BEGIN USER NKEY SEED-----\n{seed.decode()}\n------END USER NKEY SEED------\n")



def _token_signer(role: str) -> str:
    return f"signers/{role}-token.nk"



def _check_name(kind: str, value: str) -> str:
    if not _NAME_RE.fullmatch(value):
        raise CredsError(f"{kind} {value!r} must be 1-64 letters, digits, '-' or '_'")
    return value



def _check_person(name: str) -> None:
    """A person is never named like automation: the actor token of a command would pass for it."""
    if name in permissions.reserved_names():
        raise CredsError(f"user name {name!r} is an automation actor's (reserved: "
                         f"{', '.join(sorted(permissions.reserved_names()))}); choose another")


def _token(kind: str, value: str) -> str:
    try:
        return encode_token(value)
    except SubjectError as exc:
        raise CredsError(f"{kind} {value!r}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Issued:
    """One line of ``issued.jsonl``: who got credentials, never the credentials."""

    name: str
    role: str
    public_key: str
    issued_at: int
    expires_at: int | None
    path: str | None
    cluster: str | None = None  # a node's or the simulator's

    def line(self) -> str:
        return json.dumps({"name": self.name, "role": self.role, "publicKey": self.public_key,
                           "issuedAt": self.issued_at, "expiresAt": self.expires_at, "path": self.path,
                           "cluster": self.cluster})



def write_secret(path: Path, text: str) -> None:
    """Created 0600 before a byte is written, then moved into place whole (SEC-12). The staged
    file is a new one with an unguessable name, opened ``O_EXCL|O_NOFOLLOW``: a symlink or file
    someone planted beside it (the old fixed ``FILE.new``) is never followed or written."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    staged = path.with_name(f".{path.name}.{secrets.token_hex(8)}.new")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(staged, path)  # replaces a symlink at ``path`` itself, never its target
    except BaseException:
        staged.unlink(missing_ok=True)
        raise


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    with open(directory / ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)



class Keystore:
    """The operator's keys and the account JWTs in one directory (``creds init`` makes it)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __repr__(self) -> str:
        return f"Keystore({str(self.directory)!r})"

    # -- files

    def _path(self, name: str) -> Path:
        return self.directory / name

    def _seed(self, name: str) -> nkeys.KeyPair:
        path = self._path(name)
        try:
            return nkeys.from_seed(bytearray(path.read_bytes().strip()))
        except OSError as exc:
            raise CredsError(f"missing key {path}; run `healthplane creds init` first") from exc
        except Exception as exc:  # nkeys raises its own errors for a damaged seed
            raise CredsError(f"{path} is not an nkey seed") from exc

    def _ensure_seed(self, name: str, prefix: int) -> nkeys.KeyPair:
        path = self._path(name)
        if not path.exists():
            write_secret(path, new_pair(prefix).seed.decode() + "\n")
        return self._seed(name)

    @classmethod
    def init(cls, directory: str | Path) -> Keystore:
        """Create what is missing; keys that exist are kept (running ``init`` twice is safe,
        and every credential issued before stays valid)."""
        store = cls(Path(directory))
        store.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(store.directory, 0o700)
        with _locked(store.directory):
            operator = store._ensure_seed("operator.nk", nkeys.PREFIX_BYTE_OPERATOR)
            system = store._ensure_seed("sys.nk", nkeys.PREFIX_BYTE_ACCOUNT)
            store._ensure_seed("hp.nk", nkeys.PREFIX_BYTE_ACCOUNT)
            for role in permissions.ROLES:
                store._ensure_seed(f"signers/{role}.nk", nkeys.PREFIX_BYTE_ACCOUNT)
            for role in permissions.TOKEN_ROLES:
                store._ensure_seed(_token_signer(role), nkeys.PREFIX_BYTE_ACCOUNT)
            if not store._path("operator.jwt").exists():  # signed once: a reload refuses a new one
                write_secret(store._path("operator.jwt"), encode_jwt({"sub": public(operator), "name": "healthplane",
                              "nats": {"system_account": public(system), "type": "operator", "version": 2}},
                              operator))
            if not store._path("sys.jwt").exists():
                write_secret(store._path("sys.jwt"), encode_jwt({"sub": public(system), "name": SYSTEM_ACCOUNT,
                              "nats": {"limits": dict(_ACCOUNT_LIMITS), "type": "account", "version": 2}}, operator))
            if not store._path("sys-user.creds").exists():
                user = new_pair(nkeys.PREFIX_BYTE_USER)
                jwt = encode_jwt({"sub": public(user), "name": "sys", "nats": {
                    "subs": _NO_LIMIT, "data": _NO_LIMIT, "payload": _NO_LIMIT, "pub": {}, "sub": {},
                    "type": "user", "version": 2}}, system)
                write_secret(store._path("sys-user.creds"), creds_text(jwt, bytes(user.seed)))
            store._sign_account()
        return store

    @classmethod
    def open(cls, directory: str | Path) -> Keystore:
        store = cls(Path(directory))
        if not (store.directory / "operator.nk").is_file():
            raise CredsError(f"no keys in {store.directory}; run `healthplane creds init --data-dir DIR` "
                             f"or `healthplane up` first")
        return store

    # -- the account

    def revocations(self) -> dict[str, int]:
        path = self._path("revocations.json")
        if not path.exists():
            return {}
        loaded = json.loads(path.read_text(encoding="utf-8"))
        return {str(k): int(v) for k, v in loaded.items()}

    def signer_roles(self) -> dict[str, str]:
        """Public key of each role's signing key → role."""
        return {public(self._seed(f"signers/{role}.nk")): role for role in permissions.ROLES}

    def token_signer_roles(self) -> dict[str, str]:
        """Public key of each bearer-token signing key → the people's role it grants."""
        return {public(self._seed(_token_signer(role))): role for role in permissions.TOKEN_ROLES}

    def _sign_account(self, revocations: dict[str, int] | None = None) -> str:
        """(Re-)sign ``hp.jwt`` with today's templates and the revocation list."""
        operator, account = self._seed("operator.nk"), self._seed("hp.nk")
        keys: list[Any] = []
        for role in permissions.ROLES:
            # A role this build added has no key in a key directory an older one made: made here.
            signer = self._ensure_seed(f"signers/{role}.nk", nkeys.PREFIX_BYTE_ACCOUNT)
            keys.append({"kind": "user_scope", "key": public(signer), "role": role,
                         "template": permissions.of(role).template(), "description": f"role {role}"})
        for role in permissions.TOKEN_ROLES:  # the same permissions, for a JWT that is its own proof
            keys.append({"kind": "user_scope", "key": public(self._seed(_token_signer(role))), "role": f"{role}-token",
                         "template": {**permissions.of(role).template(), "bearer_token": True},
                         "description": f"bearer tokens of role {role}"})
        nats: dict[str, Any] = {"limits": {**_ACCOUNT_LIMITS, **_JETSTREAM_LIMITS}, "signing_keys": keys,
                                "type": "account", "version": 2}
        revoked = self.revocations() if revocations is None else revocations
        if revoked:
            nats["revocations"] = revoked
        jwt = encode_jwt({"sub": public(account), "name": ACCOUNT, "nats": nats}, operator)
        write_secret(self._path("hp.jwt"), jwt + "\n")
        # Public keys only: what the api verifies a bearer token's signature with, locally,
        # before it connects anyone (SEC-12). Beside the credentials every service is given.
        write_secret(self._path(TOKEN_SIGNERS_FILE), json.dumps({"tokenSigners": self.token_signer_roles()},
                                                                indent=1) + "\n")
        return jwt

    def refresh(self) -> str:
        """Re-sign the account with the templates this build generates (``up`` at each start)."""
        with _locked(self.directory):
            return self._sign_account()

    def account_public(self) -> str:
        """The control plane's account: what a federation member's leaf connection binds to."""
        return public(self._seed("hp.nk"))

    def account_jwt(self) -> str:
        return self._path("hp.jwt").read_text(encoding="utf-8").strip()

    def system_jwt(self) -> str:
        return self._path("sys.jwt").read_text(encoding="utf-8").strip()

    @property
    def system_user_creds(self) -> Path:
        return self._path("sys-user.creds")

    def server_config(self, resolver_dir: Path) -> str:
        """The operator-mode part of nats-server's config: the trust and a ``full`` resolver
        whose directory keeps pushed account JWTs (revocations) across restarts."""
        system, account = public(self._seed("sys.nk")), public(self._seed("hp.nk"))
        return (f'operator: "{self._path("operator.jwt")}"\n'
                f"system_account: {system}\n"
                f'resolver {{ type: full, dir: "{resolver_dir}", allow_delete: false, interval: "2m", '
                f'timeout: "1.9s" }}\n'
                f'resolver_preload {{\n  {system}: "{self.system_jwt()}"\n  {account}: "{self.account_jwt()}"\n}}\n')

    # -- identities

    def _issue(self, role: str, name: str, tag_values: dict[str, str], lifetime_s: int | None,
               out: Path | None, cluster: str | None = None, now: float | None = None) -> tuple[str, bytes]:
        moment = int(time.time() if now is None else now)
        user = new_pair(nkeys.PREFIX_BYTE_USER)
        claims: dict[str, Any] = {"sub": public(user), "name": f"{cluster}/{name}" if cluster else name, "nats": {
            "issuer_account": public(self._seed("hp.nk")),
            "tags": [f"role:{role}", *(f"{k}:{v}" for k, v in tag_values.items())],
            "type": "user", "version": 2}}
        if lifetime_s is not None:
            claims["exp"] = moment + lifetime_s
        jwt = encode_jwt(claims, self._seed(f"signers/{role}.nk"), now=moment)
        seed = bytes(user.seed)
        if out is not None:
            write_secret(out, creds_text(jwt, seed))
        self._record(Issued(name, role, public(user), moment, claims.get("exp"), str(out) if out else None, cluster))
        return jwt, seed

    def _record(self, issued: Issued) -> None:
        with _locked(self.directory):
            fd = os.open(self._path("issued.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as log:
                log.write(issued.line() + "\n")

    def node(self, node_id: str, cluster: str, out: Path, lifetime_s: int = NODE_LIFETIME_S) -> Path:
        """A collector's credentials: it may publish only its own report and resource."""
        cluster_token, node_token = _token("cluster", cluster), _token("node", node_id)
        self._issue(permissions.NODE, node_id, {"cluster": cluster_token, "node": node_token}, lifetime_s, out,
                    cluster)
        return out

    def sim(self, cluster: str, out: Path) -> Path:
        """The simulated fleet's: every node of ``cluster``, and nothing else."""
        cluster_token = _token("cluster", cluster)
        self._issue(permissions.SIM, "sim", {"cluster": cluster_token}, MACHINE_LIFETIME_S, out, cluster)
        return out

    def member(self, cluster: str, out: Path) -> Path:
        """A federation member's leaf link to this hub (FED): it may carry only what the hub
        sources from ``cluster`` and the commands forwarded to it."""
        self._issue(permissions.MEMBER, "member", {"cluster": _token("cluster", cluster)}, MACHINE_LIFETIME_S, out,
                    cluster)
        return out

    def user(self, name: str, role: str, out: Path) -> Path:
        if role not in permissions.USER_ROLES:
            raise CredsError(f"role {role!r}: one of {', '.join(permissions.USER_ROLES)}")
        _check_person(name)
        self._issue(role, _check_name("user name", name), {"user": name}, PERSON_LIFETIME_S, out)
        return out

    def service(self, name: str, out: Path) -> Path:
        if name not in permissions.SERVICE_ROLES:
            raise CredsError(f"service {name!r}: one of {', '.join(permissions.SERVICE_ROLES)}")
        self._issue(name, name, {}, MACHINE_LIFETIME_S, out)
        return out

    def token(self, name: str, role: str, lifetime_s: int = TOKEN_LIFETIME_S) -> str:
        """A bearer token for the HTTP API: a NATS user JWT marked ``bearer_token`` by the scope
        of its signing key, so the JWT alone connects as ``name`` with ``role``'s permissions
        (no seed, no nonce to sign). The API connects with it and nats-server checks it:
        signature, expiry and revocation, like every identity's."""
        if role not in permissions.TOKEN_ROLES:
            raise CredsError(f"role {role!r}: a token is one of {', '.join(permissions.TOKEN_ROLES)} (stream "
                             "administration never goes through the HTTP API: use the maintainer's credentials, SEC-10)")
        _check_name("user name", name)
        _check_person(name)
        moment = int(time.time())
        user = new_pair(nkeys.PREFIX_BYTE_USER)
        claims: dict[str, Any] = {"sub": public(user), "name": name, "exp": moment + lifetime_s, "nats": {
            "issuer_account": public(self._seed("hp.nk")), "tags": [f"role:{role}", f"user:{name}"],
            "type": "user", "version": 2}}
        jwt = encode_jwt(claims, self._seed(_token_signer(role)), now=moment)
        self._record(Issued(name, role, public(user), moment, claims["exp"], None, None))
        return jwt

    def verify_token(self, token: str, now: float | None = None) -> dict[str, Any]:
        claims = verify_jwt(token, self.token_signer_roles(), now)
        revoked_at = self.revocations().get(str(claims.get("sub")))
        if revoked_at is not None and int(claims.get("iat", 0)) <= revoked_at:
            raise CredsError("token revoked")
        return claims

    def issued(self) -> list[Issued]:
        path = self._path("issued.jsonl")
        if not path.exists():
            return []
        out = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                raw = json.loads(line)
                out.append(Issued(raw["name"], raw["role"], raw["publicKey"], raw["issuedAt"], raw.get("expiresAt"),
                                  raw.get("path"), raw.get("cluster")))
        return out

    def rotate(self, name: str, cluster: str | None = None, now: float | None = None) -> tuple[list[Issued], str]:
        """SEC-12: a fresh key for every credentials file issued to ``name`` (in ``cluster``) that
        is neither revoked nor expired, written over the same file with its role's lifetime, and
        the old keys revoked: the new ones and the new account JWT (push it: :func:`push_account`).
        The server then drops a connection made with an old key; a service exits on that, and
        its supervisor (systemd, ``up``) starts it again on the rotated file."""
        moment = int(time.time() if now is None else now)
        revoked = self.revocations()
        latest: dict[str, Issued] = {}  # by file: only its last issue is in it
        for issued in self.issued():
            if issued.path is not None:
                latest[issued.path] = issued
        current = [i for i in latest.values() if i.name == name and (cluster is None or i.cluster == cluster)
                   and not (i.public_key in revoked and i.issued_at <= revoked[i.public_key])
                   and not (i.expires_at is not None and i.expires_at < moment)]
        if not current:
            where = f" in cluster {cluster!r}" if cluster else ""
            raise CredsError(f"no credentials file issued to {name!r}{where} to rotate (tokens are issued again "
                             "with `healthplane creds token`; see `healthplane creds list`)")
        for old in current:
            self._reissue(old, Path(old.path or ""))
        fresh = self.issued()[-len(current):]  # each re-issue appended its own line
        with _locked(self.directory):
            revocations = self.revocations()
            for old in current:
                revocations[old.public_key] = moment
            write_secret(self._path("revocations.json"), json.dumps(revocations, indent=1) + "\n")
            return fresh, self._sign_account(revocations)

    def _reissue(self, old: Issued, out: Path) -> None:
        if old.role == permissions.NODE:
            self.node(old.name, old.cluster or "default", out)
        elif old.role == permissions.SIM:
            self.sim(old.cluster or "default", out)
        elif old.role == permissions.MEMBER:
            self.member(old.cluster or "default", out)
        elif old.role in permissions.USER_ROLES:
            self.user(old.name, old.role, out)
        else:
            self.service(old.name, out)

    def revoke(self, name: str, cluster: str | None = None, now: float | None = None) -> tuple[list[Issued], str]:
        """Revoke every credential issued under ``name`` (in ``cluster``, for a node): the
        revoked ones and the new account JWT (push it to a running server: :func:`push_account`)."""
        moment = int(time.time() if now is None else now)
        issued = self.issued()  # one pass: at a million identities a second read costs seconds
        matching = [i for i in issued if i.name == name and (cluster is None or i.cluster == cluster)]
        if not matching:
            where = f" in cluster {cluster!r}" if cluster else ""
            raise CredsError(f"no credentials issued to {name!r}{where} (see `healthplane creds list`)")
        with _locked(self.directory):
            expired = {i.public_key for i in issued if i.expires_at is not None and i.expires_at < moment}
            revoked = {k: v for k, v in self.revocations().items() if k not in expired}
            for credential in matching:
                revoked[credential.public_key] = moment
            write_secret(self._path("revocations.json"), json.dumps(revoked, indent=1) + "\n")
            return matching, self._sign_account(revoked)



async def push_account(nats_url: str, keystore: Keystore) -> None:
    """Send the current account JWT to a running server (``$SYS.REQ.CLAIMS.UPDATE``, as the
    system account's user): the server applies it at once and its resolver keeps it. The
    connection is ``runtime.connect``'s (TLS from the environment like every client)."""
    from healthplane.runtime.connect import connect  # it imports this module

    client = await connect(nats_url, name="healthplane-creds", creds=str(keystore.system_user_creds), give_up_after=5)
    try:
        answer = await client.request("$SYS.REQ.CLAIMS.UPDATE", keystore.account_jwt().encode(), timeout=5)
        body = json.loads(answer.data or b"{}")
        if body.get("error"):
            raise CredsError(f"the server refused the account update: {body['error'].get('description', body['error'])}")
    finally:
        await client.close()
