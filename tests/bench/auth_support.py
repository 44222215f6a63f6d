"""What tests/bench/test_auth_candidates.py needs to run the two SEC-2 candidates side by side
(docs/security.md, "Candidates measured"):

* NATS JWTs, encoded by ``healthplane.stack.keystore`` (what the product ships): no maintained Python
  library writes the claims the candidates need (``nats-jwt`` 0.2.2 has neither scoped signing keys nor the authorization request/response
  claims of auth callout). A NATS JWT is ``b64url(header).b64url(claims).b64url(sig)``,
  header ``{"typ":"JWT","alg":"ed25519-nkey"}``, the signature ed25519 by the issuer's nkey
  over the first two parts; keys come from ``nkeys`` (nats-io's, what nats-py signs with);
* the trust chain of candidate A: an operator, the system account, the control plane's account
  with a *scoped* signing key for nodes whose template binds a node to its own subjects;
* nats-server processes from a config text, their RSS read from ``/proc``;
* candidate B's auth callout responder, run as its own process (``python -m
  tests.bench.auth_support callout CONFIG.json``) so that its memory can be read and its
  absence shown: it verifies the same offline-issued node JWTs (and the nonce signature) and
  answers with a user JWT carrying that node's concrete permissions.

Every wait is bounded; every socket is on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nacl.exceptions
import nacl.signing
import nkeys

from healthplane.contracts.streams import CHANNELS
from healthplane.runtime.creds import CredsError, decode_jwt, unb64url, verify_jwt, verify_key
from healthplane.stack.keystore import encode_jwt, new_pair, public
from healthplane.stack.natsserver import die_with_parent, find_binary, free_port, terminate

NO_LIMIT = -1
READY_TIMEOUT_S = 15.0
AUTH_ACCOUNT = "AUTH"  # candidate B: where the callout service lives
HP_ACCOUNT = "HP"  # the control plane's account
REVOKE_SUBJECT = "hp.auth.revoke"  # candidate B: the callout's control subject (AUTH account)
CALLOUT_LIVE_MAX = 200_000  # bound on the callout's table of live connections (for kicks)


# ---------------------------------------------------------------------------- nkeys and JWTs


def verify_sig(public_key: str, data: bytes, signature: bytes) -> None:
    try:
        verify_key(public_key).verify(data, signature)
    except nacl.exceptions.BadSignatureError as exc:
        raise ValueError("bad signature") from exc


def decode_sig(text: str) -> bytes:
    """nats-py sends the nonce signature in standard base64, Go clients in base64url."""
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except binascii.Error:
        return unb64url(text)


# ---------------------------------------------------------------------------- node permissions

# From the channel table: what a collector writes, with the address's parameters as the
# template functions of the node's JWT tags; plus what it reads (its own inbox and its own
# remediation subject, which has no stream in the table yet).
NODE_INBOX = "_INBOX.{cluster}.{node}"
NODE_READS = (f"{NODE_INBOX}.>", "hp.remediate.{cluster}.{node}")


def node_publish_addresses() -> tuple[str, ...]:
    return tuple(c.address for c in CHANNELS if c.writer == "collector")


def _as_template(address: str) -> str:
    return address.replace("{cluster}", "{{tag(cluster)}}").replace("{node}", "{{tag(node)}}")


def node_template() -> dict[str, Any]:
    """The scoped signing key's template: the server fills in each node's tags."""
    return {
        "pub": {"allow": [_as_template(a) for a in node_publish_addresses()]},
        "sub": {"allow": [_as_template(a) for a in NODE_READS]},
        "subs": 64, "data": NO_LIMIT, "payload": NO_LIMIT,
    }


def node_permissions(cluster: str, node: str) -> dict[str, Any]:
    """The same, concrete: what candidate B's callout puts in a node's user JWT."""
    return {
        "pub": {"allow": [a.format(cluster=cluster, node=node) for a in node_publish_addresses()]},
        "sub": {"allow": [a.format(cluster=cluster, node=node) for a in NODE_READS]},
        "subs": 64, "data": NO_LIMIT, "payload": NO_LIMIT,
    }


def node_inbox(cluster: str, node: str) -> str:
    return NODE_INBOX.format(cluster=cluster, node=node)


def tag_values(tags: list[str], name: str) -> list[str]:
    prefix = f"{name}:"
    return [t[len(prefix):] for t in tags if t.startswith(prefix)]


# ---------------------------------------------------------------------------- trust (candidate A)

_ACCOUNT_LIMITS = {
    "subs": NO_LIMIT, "data": NO_LIMIT, "payload": NO_LIMIT, "imports": NO_LIMIT,
    "exports": NO_LIMIT, "wildcards": True, "conn": NO_LIMIT, "leaf": NO_LIMIT,
}
_JETSTREAM_LIMITS = {
    "mem_storage": NO_LIMIT, "disk_storage": NO_LIMIT, "streams": NO_LIMIT, "consumer": NO_LIMIT,
}


@dataclass
class Creds:
    jwt: str
    seed: bytes

    @property
    def public_key(self) -> str:
        return str(decode_jwt(self.jwt)["sub"])

    def connect_options(self) -> dict[str, Any]:
        """nats-py's callbacks, so that no creds file is needed per node."""
        seed = self.seed
        token = self.jwt.encode()

        def sign(nonce: str) -> bytes:
            return base64.b64encode(nkeys.from_seed(bytearray(seed)).sign(nonce.encode()))

        return {"user_jwt_cb": lambda: bytearray(token), "signature_cb": sign}

    def callout_connect_options(self) -> dict[str, Any]:
        """Candidate B: nats-server (config mode) does not pass a client's ``jwt`` on to the
        callout, so the JWT also travels as the token; the nonce signature proves the key."""
        return {**self.connect_options(), "token": self.jwt}

    def file_text(self) -> str:
        """The ``.creds`` format nats-py, nats CLI and nsc read."""
        return (f"-----BEGIN NATS USER JWT-----\n{self.jwt}\n------END NATS USER JWT------\n\n"
                f"-----BEGIN USER NKEY SEED-----\n{self.seed.decode()}\n------END USER NKEY SEED------\n")


@dataclass
class Trust:
    """Operator → system account and HP account; HP has a plain signing key (services, users)
    and a scoped one (nodes). What ``healthplane creds init`` would create."""

    operator: nkeys.KeyPair = field(default_factory=lambda: new_pair(nkeys.PREFIX_BYTE_OPERATOR))
    system: nkeys.KeyPair = field(default_factory=lambda: new_pair(nkeys.PREFIX_BYTE_ACCOUNT))
    account: nkeys.KeyPair = field(default_factory=lambda: new_pair(nkeys.PREFIX_BYTE_ACCOUNT))
    service_signer: nkeys.KeyPair = field(default_factory=lambda: new_pair(nkeys.PREFIX_BYTE_ACCOUNT))
    node_signer: nkeys.KeyPair = field(default_factory=lambda: new_pair(nkeys.PREFIX_BYTE_ACCOUNT))
    revocations: dict[str, int] = field(default_factory=dict)

    _operator_jwt: str = field(default="", init=False, repr=False)
    _system_jwt: str = field(default="", init=False, repr=False)

    def operator_jwt(self) -> str:
        """Signed once: a reload refuses an operator JWT that differs by as much as its iat."""
        if not self._operator_jwt:
            self._operator_jwt = encode_jwt({"sub": public(self.operator), "name": "healthplane", "nats": {
                "system_account": public(self.system), "type": "operator", "version": 2}}, self.operator)
        return self._operator_jwt

    def system_jwt(self) -> str:
        if not self._system_jwt:
            self._system_jwt = encode_jwt({"sub": public(self.system), "name": "SYS", "nats": {
                "limits": dict(_ACCOUNT_LIMITS), "type": "account", "version": 2}}, self.operator)
        return self._system_jwt

    def account_jwt(self) -> str:
        nats: dict[str, Any] = {
            "limits": {**_ACCOUNT_LIMITS, **_JETSTREAM_LIMITS},
            "signing_keys": [
                public(self.service_signer),
                {"kind": "user_scope", "key": public(self.node_signer), "role": "node",
                 "template": node_template(), "description": "one node: its own subjects"},
            ],
            "type": "account", "version": 2,
        }
        if self.revocations:
            nats["revocations"] = dict(self.revocations)
        return encode_jwt({"sub": public(self.account), "name": HP_ACCOUNT, "nats": nats}, self.operator)

    def revoke(self, user_public_key: str, at: int | None = None) -> str:
        """Every JWT of that user issued at or before ``at`` is refused; the new account JWT."""
        self.revocations[user_public_key] = int(time.time()) if at is None else at
        return self.account_jwt()

    def node(self, cluster: str, node: str) -> Creds:
        """A node's credentials, issued offline: the server is not told."""
        user = new_pair(nkeys.PREFIX_BYTE_USER)
        jwt = encode_jwt({"sub": public(user), "name": f"{cluster}.{node}", "nats": {
            "issuer_account": public(self.account), "tags": [f"cluster:{cluster}", f"node:{node}"],
            "type": "user", "version": 2}}, self.node_signer)
        return Creds(jwt, bytes(user.seed))

    def service(self, name: str, pub: list[str] | None = None, sub: list[str] | None = None) -> Creds:
        """A user with explicit permissions (none: everything), signed by the plain signing key."""
        user = new_pair(nkeys.PREFIX_BYTE_USER)
        nats: dict[str, Any] = {"issuer_account": public(self.account), "subs": NO_LIMIT,
                                "data": NO_LIMIT, "payload": NO_LIMIT, "type": "user", "version": 2,
                                "pub": {"allow": pub} if pub else {}, "sub": {"allow": sub} if sub else {}}
        return Creds(encode_jwt({"sub": public(user), "name": name, "nats": nats}, self.service_signer),
                     bytes(user.seed))

    def system_user(self) -> Creds:
        user = new_pair(nkeys.PREFIX_BYTE_USER)
        jwt = encode_jwt({"sub": public(user), "name": "sys", "nats": {
            "subs": NO_LIMIT, "data": NO_LIMIT, "payload": NO_LIMIT, "pub": {}, "sub": {},
            "type": "user", "version": 2}}, self.system)
        return Creds(jwt, bytes(user.seed))


# ---------------------------------------------------------------------------- server configs


def jetstream_block(store: Path) -> str:
    return f'jetstream {{ store_dir: "{store / "js"}", max_mem: 64MB, max_file: 1GB }}\n'


def config_none(port: int, store: Path) -> str:
    return f'listen: "127.0.0.1:{port}"\nserver_name: hp_none\nmax_payload: 8MB\n' + jetstream_block(store)


def config_jwt(port: int, store: Path, trust: Trust, resolver: str) -> str:
    """Candidate A: ``resolver`` "full" (nats-based, kept in a directory) or "memory"."""
    preload = (f'  {public(trust.system)}: "{trust.system_jwt()}"\n'
               f'  {public(trust.account)}: "{trust.account_jwt()}"\n')
    resolver_block = (f'resolver {{ type: full, dir: "{store / "jwt"}", allow_delete: false, '
                      f'interval: "2m", timeout: "1.9s" }}\n' if resolver == "full" else "resolver: MEMORY\n")
    return (f'listen: "127.0.0.1:{port}"\nserver_name: hp_jwt_{resolver}\nmax_payload: 8MB\n'
            + jetstream_block(store)
            + f'operator: "{trust.operator_jwt()}"\nsystem_account: {public(trust.system)}\n'
            + resolver_block + f"resolver_preload {{\n{preload}}}\n")


@dataclass(frozen=True)
class CalloutSecrets:
    """The callout's own identity and the system user's (nkey users: their presence also makes
    the server put a nonce in INFO, which a node signs with its nkey and the callout checks),
    and the account key that signs the callout's responses."""

    auth_user: nkeys.KeyPair = field(default_factory=lambda: new_pair(nkeys.PREFIX_BYTE_USER))
    sys_user: nkeys.KeyPair = field(default_factory=lambda: new_pair(nkeys.PREFIX_BYTE_USER))
    issuer: nkeys.KeyPair = field(default_factory=lambda: new_pair(nkeys.PREFIX_BYTE_ACCOUNT))


def config_callout(port: int, store: Path, secrets: CalloutSecrets) -> str:
    """Candidate B: accounts in the config, every connection but the callout's own (and the
    system user's) sent to the callout, which places it in HP."""
    auth, system = public(secrets.auth_user), public(secrets.sys_user)
    return (f'listen: "127.0.0.1:{port}"\nserver_name: hp_callout\nmax_payload: 8MB\n'
            + jetstream_block(store)
            + "accounts {\n"
            + f"  {AUTH_ACCOUNT} {{ users: [ {{ nkey: {auth} }} ] }}\n"
            + f"  {HP_ACCOUNT} {{ jetstream: enabled }}\n"
            + f"  SYS {{ users: [ {{ nkey: {system} }} ] }}\n"
            + "}\nsystem_account: SYS\n"
            + f"authorization {{ auth_callout {{ issuer: {public(secrets.issuer)}, "
            + f"auth_users: [ {auth}, {system} ], account: {AUTH_ACCOUNT} }} }}\n")


def callout_config(url: str, secrets: CalloutSecrets, trust: Trust) -> dict[str, Any]:
    """What the callout process reads (a 0600 file): its keys and the signers it trusts."""
    return {"url": url, "auth_seed": bytes(secrets.auth_user.seed).decode(),
            "sys_seed": bytes(secrets.sys_user.seed).decode(), "issuer_seed": bytes(secrets.issuer.seed).decode(),
            "node_signers": [public(trust.node_signer)], "service_signers": [public(trust.service_signer)],
            "target_account": HP_ACCOUNT}


# ---------------------------------------------------------------------------- processes


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_listening(port: int, process: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited at start: {log.read_text(errors='replace')[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {READY_TIMEOUT_S:g}s")


class Server:
    """One nats-server from a config text (``make_config(port, store)``), stopped by pid."""

    def __init__(self, name: str, store: Path, make_config: Callable[[int, Path], str]) -> None:
        self.name = name
        self.store = store
        self.make_config = make_config
        self.port = free_port()
        self.conf = store / "nats-server.conf"
        self.log = store / "nats-server.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def write_config(self) -> None:
        self.store.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(self.make_config(self.port, self.store), encoding="utf-8")

    def start(self, write_config: bool = True) -> Server:
        """``write_config=False``: a restart with the config file as it is (preloads included)."""
        if write_config:
            self.write_config()
        with open(self.log, "ab") as log_file:
            self.process = subprocess.Popen(
                [find_binary(), "-c", str(self.conf)], stdout=log_file, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent)
        _wait_listening(self.port, self.process, self.log, f"nats-server {self.name}")
        return self

    def reload(self) -> None:
        """A config reload (SIGHUP): what the MEMORY resolver needs for a lasting change."""
        self.write_config()
        os.kill(self.pid, signal.SIGHUP)

    def rss_kib(self) -> int:
        return rss_kib(self.pid)

    def cpu_s(self) -> float:
        return cpu_s(self.pid)

    def stop(self, timeout_s: float = 10.0) -> None:
        terminate(self.process, timeout_s)


class CalloutProcess:
    """Candidate B's responder in its own interpreter."""

    def __init__(self, store: Path, config: dict[str, Any]) -> None:
        self.store = store
        self.config_path = store / "callout.json"
        self.log = store / "callout.log"
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> CalloutProcess:
        self.store.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(json.dumps(self.config), encoding="utf-8")
        self.config_path.chmod(0o600)
        root = Path(__file__).resolve().parents[2]
        offset = self.log.stat().st_size if self.log.exists() else 0  # a restart appends
        with open(self.log, "ab") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.bench.auth_support", "callout", str(self.config_path)],
                cwd=root, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=die_with_parent)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"callout exited: {self.log.read_text(errors='replace')[-2000:]}")
            if b"callout ready" in self.log.read_bytes()[offset:]:
                return self
            time.sleep(0.05)
        raise RuntimeError(f"callout not ready within {timeout_s:g}s: {self.log.read_text()[-2000:]}")

    def rss_kib(self) -> int:
        assert self.process is not None
        return rss_kib(self.process.pid)

    def cpu_s(self) -> float:
        assert self.process is not None
        return cpu_s(self.process.pid)

    def stop(self, timeout_s: float = 10.0) -> None:
        terminate(self.process, timeout_s)


# ---------------------------------------------------------------------------- the callout (B)


@dataclass
class CalloutState:
    """All the callout holds: the keys it trusts, the revocations, and the live connections it
    let in (to kick them on revocation), bounded."""

    issuer: nkeys.KeyPair
    node_signers: frozenset[str]
    service_signers: frozenset[str]
    target_account: str
    revoked: dict[str, int] = field(default_factory=dict)
    live: OrderedDict[str, list[tuple[str, int]]] = field(default_factory=OrderedDict)
    answered: int = 0
    refused: int = 0

    def decide(self, request_jwt: str) -> tuple[str, str, str]:
        """(response JWT, the user's public key or "", error or "") for one authorization request."""
        request = decode_jwt(request_jwt)  # signed by the server's own nkey, on the AUTH account
        claims = request["nats"]
        user_nkey, server_id = claims["user_nkey"], claims["server_id"]["id"]
        options, client = claims.get("connect_opts", {}), claims.get("client_info", {})
        user_jwt, error, who = "", "", ""
        try:
            presented = options.get("jwt") or options.get("auth_token") or ""
            if not presented:
                raise ValueError("no credentials")
            user = verify_jwt(presented, dict.fromkeys(self.node_signers | self.service_signers, "user"))
            who = user["sub"]
            nonce = client.get("nonce") or request.get("nats", {}).get("request_nonce", "")
            if not nonce or not options.get("sig"):
                raise ValueError("no nonce signature")
            verify_sig(who, nonce.encode(), decode_sig(options["sig"]))
            if self.revoked.get(who, -1) >= int(user.get("iat", 0)):
                raise ValueError("revoked")
            if user["iss"] in self.node_signers:
                tags = user["nats"].get("tags", [])
                clusters, nodes = tag_values(tags, "cluster"), tag_values(tags, "node")
                if len(clusters) != 1 or len(nodes) != 1:
                    raise ValueError("a node JWT names one cluster and one node")
                permissions = node_permissions(clusters[0], nodes[0])
            else:
                permissions = {k: user["nats"].get(k, {}) for k in ("pub", "sub")}
                permissions.update(subs=NO_LIMIT, data=NO_LIMIT, payload=NO_LIMIT)
            user_jwt = encode_jwt({"sub": user_nkey, "aud": self.target_account, "name": user.get("name", ""),
                                   "nats": {**permissions, "type": "user", "version": 2}}, self.issuer)
            self._remember(who, server_id, int(client.get("id", 0)))
            self.answered += 1
        except (ValueError, KeyError, CredsError) as exc:
            error = str(exc)
            self.refused += 1
        response = encode_jwt({"sub": user_nkey, "aud": server_id, "nats": {
            "jwt": user_jwt, "error": error, "type": "authorization_response", "version": 2}}, self.issuer)
        return response, who, error

    def _remember(self, who: str, server_id: str, cid: int) -> None:
        self.live.setdefault(who, []).append((server_id, cid))
        self.live.move_to_end(who)
        while len(self.live) > CALLOUT_LIVE_MAX:
            self.live.popitem(last=False)


async def run_callout(config: dict[str, Any], stop: asyncio.Event) -> None:
    import nats

    state = CalloutState(
        issuer=nkeys.from_seed(bytearray(config["issuer_seed"].encode())),
        node_signers=frozenset(config["node_signers"]), service_signers=frozenset(config["service_signers"]),
        target_account=config["target_account"])
    nc = await nats.connect(config["url"], nkeys_seed_str=config["auth_seed"], name="hp-auth-callout",
                            max_reconnect_attempts=-1, connect_timeout=5)
    sysnc = await nats.connect(config["url"], nkeys_seed_str=config["sys_seed"], name="hp-auth-callout-sys",
                               max_reconnect_attempts=-1, connect_timeout=5)

    async def on_request(msg: Any) -> None:
        response, who, error = state.decide(msg.data.decode())
        if error and state.refused <= 3:  # the first few refusals, for whoever reads the log
            print(f"refused {who or '?'}: {error}", flush=True)
        await msg.respond(response.encode())

    async def on_revoke(msg: Any) -> None:
        """Payload: a user public key. Refuse its next connect, kick its live ones."""
        who = msg.data.decode().strip()
        state.revoked[who] = int(time.time())
        kicked = 0
        for server_id, cid in state.live.pop(who, []):
            try:
                reply = await sysnc.request(f"$SYS.REQ.SERVER.{server_id}.KICK",
                                            json.dumps({"cid": cid}).encode(), timeout=2)
                kicked += "error" not in json.loads(reply.data)
            except Exception:  # a cid gone already, or a server away: the next connect is refused anyway
                pass
        await msg.respond(json.dumps({"revoked": who, "kicked": kicked}).encode())

    async def on_stats(msg: Any) -> None:
        await msg.respond(json.dumps({"answered": state.answered, "refused": state.refused,
                                      "live": len(state.live), "revoked": len(state.revoked)}).encode())

    await nc.subscribe("$SYS.REQ.USER.AUTH", cb=on_request)
    await nc.subscribe(REVOKE_SUBJECT, cb=on_revoke)
    await nc.subscribe("hp.auth.stats", cb=on_stats)
    await nc.flush(timeout=5)
    print("callout ready", flush=True)
    await stop.wait()
    await nc.drain()
    await sysnc.drain()


def _main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "callout":
        print("usage: python -m tests.bench.auth_support callout CONFIG.json", file=sys.stderr)
        return 2
    config = json.loads(Path(argv[1]).read_text())

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await run_callout(config, stop)

    asyncio.run(main())
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))


def versions() -> str:
    """What an auth figure was measured on: the server, the key libraries, the machine."""
    import platform
    from importlib import metadata

    server = subprocess.run([find_binary(), "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    packages = ", ".join(f"{p} {metadata.version(p)}" for p in ("nats-py", "nkeys", "PyNaCl"))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{server}; Python {platform.python_version()}; {packages}; {os.cpu_count()} CPUs; load {load}"


def print_summary(title: str, results: dict[str, object]) -> None:
    if not results:
        return
    print(f"\n\n{title}\n  " + versions())
    width = max(len(k) for k in results)
    for key, value in results.items():
        print(f"  {key.ljust(width)}  {value}")
