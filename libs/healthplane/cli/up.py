"""``healthplane up``: the embedded stack for development.

Starts a JetStream nats-server on loopback (``--servers 3``: a three-server cluster, every
stream and bucket R3, a federation hub's or member's too; none with ``--nats-url``), creates the streams,
applies the config, starts every built service as its own process, prints what runs where
and writes ``DATA_DIR/stack.json``. A service that dies is restarted like systemd's
``Restart=on-failure`` (``healthplane.stack.supervise``): with a growing delay, on the same metrics
port, its restart count in ``stack.json``; after repeated fast failures ``up`` gives up on it
with one line and keeps the rest running. Ctrl-C (or SIGTERM) stops the services, then the
server, and leaves no process behind.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from healthplane.cli import registry
from healthplane.client import federation
from healthplane.contracts.config import (
    LEASE_TTL_ENV,
    NODES_BUCKET_ENV,
    ClusterConfig,
    ConfigError,
    lease_ttl,
    load_cluster_config,
    nodes_bucket_cap,
)
from healthplane.runtime import configstore, converge
from healthplane.runtime import creds as credentials
from healthplane.runtime import tls as client_tls
from healthplane.runtime.connect import connect
from healthplane.runtime.creds import CredsError
from healthplane.runtime.lease import INSTANCE_ENV
from healthplane.runtime.lifecycle import EXIT_PORT_IN_USE
from healthplane.stack import tls
from healthplane.stack.keystore import RENEW_WITHIN_S, Keystore, write_secret
from healthplane.stack.natsserver import (
    PORT_PICKS,
    Federation,
    NatsCluster,
    NatsServer,
    NatsServerError,
    free_port,
)
from healthplane.stack.supervise import (
    GiveUp,
    LeaveStopped,
    Restart,
    RestartPolicy,
    after_exit,
    exit_reason,
)

STOP_GRACE_S = 10.0
# The simulated fleet's sim-000..003, sim-004..007, … each share an NVLink domain their GPUs'
# fabric info tells (DOM-1), so `node show` and `node list --domain` have domains to show.
UP_NVLINK_DOMAIN_SIZE = 4


class CannotStart(RuntimeError):
    """One line naming what could not start."""


@dataclass
class Child:
    name: str
    command: list[str]
    port: int
    process: subprocess.Popen[bytes]
    creds: Path | None = None
    restarts: int = 0
    state: str = "running"  # running | restarting | failed | stopped
    failures_at: list[float] = field(default_factory=list)
    restart_at: float | None = None
    replica: int = 1  # --replicas: the second scorer is replica 2
    env: dict[str, str] = field(default_factory=dict)  # the child's own settings (the api's port, keys)
    http_port: int | None = None  # the api's pages and API (its metrics stay on ``port``)
    http_port_picked: bool = False  # up chose it (no --api-port): another may be chosen
    port_taken: bool = False  # it last exited saying a port of its was taken (EXIT_PORT_IN_USE)

    @property
    def url(self) -> str | None:
        return f"http://127.0.0.1:{self.http_port}/" if self.http_port else None

    @property
    def label(self) -> str:
        return _label(self.name, self.replica)

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"


def _label(name: str, replica: int) -> str:
    """Unique among the children: the log file's name and what ``up`` prints."""
    return name if replica == 1 else f"{name}-{replica}"


def _fail(message: str) -> int:
    print(f"healthplane up: {message}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    try:
        config = load_cluster_config(args.config) if args.config else ClusterConfig()
    except ConfigError as exc:
        return _fail(str(exc).splitlines()[0])
    if args.replicas < 1:
        return _fail(f"--replicas {args.replicas}: at least 1")
    if args.nats_url and args.servers > 1:
        return _fail("--servers starts nats-servers and --nats-url uses running ones: give one of them")
    try:
        fed = _federation(args, config)
    except federation.FederationError as exc:
        return _fail(str(exc))
    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    # The Slurm adapter's validation output (VAL-1) stays with the stack, like everything `up` keeps.
    os.environ.setdefault("HEALTHPLANE_SLURM_OUTPUT_DIR", str(data_dir / "slurm-validation"))

    nats: NatsServer | NatsCluster | None = None
    children: list[Child] = []
    stop_requested = False

    def request_stop(signum: int, _frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        identities = None if args.insecure else _identities(data_dir, config.cluster)
        if args.insecure:
            print(INSECURE_WARNING, file=sys.stderr)
        server_tls = tls.make_throwaway(data_dir / "tls") if args.tls else None
        if server_tls is not None:  # every client of this stack, and what it starts, verifies it
            os.environ[client_tls.ENV_CA] = str(server_tls.ca)
        keystore = identities.keystore if identities else None
        replicas: int | None = None  # a server we did not start: its streams stay as they are
        if args.nats_url:
            nats_url = args.nats_url
        elif args.servers > 1:
            ports = [args.nats_port + i for i in range(args.servers)] if args.nats_port else None
            # A hub's servers each listen for leaf connections, from --leaf-port up (0: free ones).
            leaf_ports = ([args.leaf_port + i for i in range(args.servers)]
                          if fed is not None and fed.leaf_port is not None and args.leaf_port else None)
            nats = NatsCluster(data_dir / "nats-cluster", args.servers, ports=ports, keystore=keystore,
                               tls=server_tls, federation=fed, leaf_ports=leaf_ports).start()
            nats_url, replicas = nats.url, converge.replicas_for(args.servers)
        else:
            # In a federation each server says which control plane it is (the hub's logs name the members').
            nats = NatsServer(data_dir / "nats", port=args.nats_port, keystore=keystore, tls=server_tls,
                              federation=fed, name=f"healthplane-{fed.domain}" if fed else "healthplane").start()
            nats_url, replicas = nats.url, 1
        try:
            asyncio.run(_prepare(nats_url, config, identities, replicas,
                                 slotted=True if args.partitions > 1 else None,
                                 offer_to_hub=fed is not None and fed.hub_url is not None))
        except (ConnectionError, converge.StreamConflict, configstore.ConfigConflict,
                federation.FederationError) as exc:
            raise CannotStart(str(exc)) from exc

        log_dir = data_dir / "logs"
        log_dir.mkdir(exist_ok=True)
        # A hub has no fleet of its own: only the API and its pages, over the members' views.
        services = ("api",) if args.federation_hub else registry.control_plane(args.scheduler)
        for replica in range(1, args.replicas + 1):  # HA-3: each replica stands by behind its lease
            for name in services:
                children.append(_start_service(name, nats_url, log_dir, identities, replica,
                                               partitions=args.partitions if name in registry.PARTITIONED else 1,
                                               api_port=args.api_port if replica == 1 else 0,
                                               hub=args.federation_hub))
        if not args.no_sim and not args.federation_hub:
            fleet = ["sim", "run", "--nodes", str(args.nodes), "--provisioned", str(args.nodes // 2),
                     "--cluster", config.cluster, "--nvlink-domain-size", str(UP_NVLINK_DOMAIN_SIZE)]
            children.append(_start_child("sim", fleet, nats_url, log_dir, identities))
        _check_alive(children, log_dir, nats_url)

        def write_stack() -> None:
            _write_stack(data_dir, nats_url, _members(nats), children, identities, server_tls, fed)

        write_stack()
        _print_table(nats_url, _members(nats), children, data_dir,
                     simulated=0 if args.no_sim or args.federation_hub else args.nodes)
        _print_federation(fed, _members(nats), data_dir)
        _print_access(nats_url, identities, server_tls, args, children)

        while not stop_requested:
            time.sleep(0.2)
            if any([_supervise(child, nats_url, log_dir, time.monotonic()) for child in children]):
                write_stack()
        print("\nstopping…", file=sys.stderr)
        return 0
    except CredsError as exc:
        return _fail(str(exc))
    except (CannotStart, NatsServerError) as exc:
        return _fail(str(exc))
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _stop_all(children)
        if nats is not None:
            nats.stop()


def _federation(args: argparse.Namespace, config: ClusterConfig) -> Federation | None:
    """The embedded servers' part in a federation (FED-1), or ``None``: the hub listens for
    leaf connections in domain ``hub``; a member runs its cluster's domain and connects to it
    (``--attach``: one URL or the hub's several, comma-separated). With ``--servers 3`` every
    server has the part (``NatsCluster``)."""
    if args.attach_creds and not args.attach:
        raise federation.FederationError("--attach-creds goes with --attach URL")
    if not (args.federation_hub or args.attach):
        return None
    if args.nats_url:
        raise federation.FederationError("--federation-hub and --attach configure the server up starts; for your "
                                         "own servers set their domain and leaf nodes (docs/federation.md)")
    if args.federation_hub:
        return Federation(federation.HUB_DOMAIN, leaf_port=args.leaf_port or free_port())
    if not args.insecure and not args.attach_creds:
        raise federation.FederationError("--attach needs --attach-creds FILE: the member credentials "
                                         "`healthplane federation attach NAME` printed on the hub")
    creds_file = Path(args.attach_creds).resolve() if args.attach_creds else None
    if creds_file is not None and not creds_file.is_file():
        raise federation.FederationError(f"--attach-creds {args.attach_creds}: no such file")
    hub_urls = [url.strip() for url in args.attach.split(",") if url.strip()]
    if not hub_urls or not all(url.startswith(("nats-leaf://", "tls://", "nats://", "ws://", "wss://"))
                               for url in hub_urls):
        raise federation.FederationError(f"--attach {args.attach}: the hub's leaf URL(s), comma-separated "
                                         "nats-leaf://HOST:PORT (the hub's `up` prints them)")
    return Federation(federation.check_member_name(config.cluster), hub_url=",".join(hub_urls),
                      hub_creds=creds_file)


def _leaf_urls(servers: list[NatsServer]) -> list[str]:
    """A hub's leaf URLs, one per server: a member's servers may use any of them."""
    return [s.leaf_url for s in servers if s.leaf_url is not None]


def _print_federation(fed: Federation | None, servers: list[NatsServer], data_dir: Path) -> None:
    if fed is None:
        return
    if fed.leaf_port is not None:
        urls = ",".join(_leaf_urls(servers))
        print(f"federation hub: members connect to {urls}; let a cluster in with "
              f"`healthplane federation attach NAME --data-dir {data_dir}`")
    else:
        servers_note = f" from each of its {len(servers)} servers" if len(servers) > 1 else ""
        print(f"attached to the federation hub at {fed.hub_url} as cluster {fed.domain}{servers_note}")


def _members(nats: NatsServer | NatsCluster | None) -> list[NatsServer]:
    if nats is None:
        return []
    return nats.servers if isinstance(nats, NatsCluster) else [nats]


INSECURE_WARNING = ("healthplane up: --insecure: nats-server runs WITHOUT authentication; anyone who can reach it "
                    "can publish reports, commands and config")


@dataclass(frozen=True)
class Identities:
    """The stack's credentials (SEC-3): every file 0600 under DATA_DIR/creds."""

    keystore: Keystore
    admin: Path
    viewer: Path
    maintainer: Path  # stream administration (SEC-10): converge, replay, purge
    admin_token: Path
    viewer_token: Path
    by_child: dict[str, Path]


def _token_expiry(path: Path) -> int | None:
    expiry = credentials.decode_jwt(path.read_text(encoding="utf-8").strip()).get("exp")
    return expiry if isinstance(expiry, int) else None


def _identities(data_dir: Path, cluster: str) -> Identities:
    """Keys made once (``creds init``); credentials issued once and kept across starts."""
    keystore = Keystore.init(data_dir / "creds")
    directory = keystore.directory

    def kept(path: Path, issue: Callable[[Path], object],
             expires_at: Callable[[Path], int | None] = credentials.expires_at) -> Path:
        """Issued once and kept across starts, and issued again when it would end within two
        weeks, never ends (an older build's), or cannot be read (SEC-12: every identity ends)."""
        try:
            expiry = expires_at(path) if path.exists() else 0
        except CredsError:
            expiry = 0
        if expiry is None or expiry < time.time() + RENEW_WITHIN_S:
            issue(path)
        return path.resolve()

    by_child = {name: kept(directory / f"{name}.creds", partial(keystore.service, name))
                for name in registry.CONTROL_PLANE}
    by_child["sim"] = kept(directory / "sim.creds", partial(keystore.sim, cluster))
    admin = kept(directory / "admin.creds", partial(keystore.user, "admin", "admin"))
    viewer = kept(directory / "viewer.creds", partial(keystore.user, "viewer", "viewer"))
    maintainer = kept(directory / "maintainer.creds", partial(keystore.user, "maintainer", "maintainer"))

    def token_file(role: str, path: Path) -> None:
        write_secret(path, keystore.token(role, role) + "\n")

    tokens = {}
    for role in ("admin", "viewer"):
        path = directory / f"{role}.token"
        if path.exists():
            try:
                keystore.verify_token(path.read_text(encoding="utf-8").strip())
            except CredsError:  # expired, revoked or of an older format: a new one
                path.unlink()
        tokens[role] = kept(path, partial(token_file, role), expires_at=_token_expiry)
    return Identities(keystore, admin, viewer, maintainer, tokens["admin"], tokens["viewer"], by_child)


async def _prepare(nats_url: str, config: ClusterConfig, identities: Identities | None, replicas: int | None, *,
                   slotted: bool | None = None, offer_to_hub: bool = False) -> None:
    """The streams as the maintainer (stream administration, SEC-10), then the config as the
    admin: each identity does its own part."""
    maintainer = str(identities.maintainer) if identities else None
    nc = await connect(nats_url, name="healthplane-up", creds=maintainer, give_up_after=10)
    try:
        js = nc.jetstream()
        await converge.ensure(js, replicas, servers=len(nc.servers), slotted=slotted,
                              nodes_bucket_cap=nodes_bucket_cap(config, os.environ.get(NODES_BUCKET_ENV)),
                              lease_ttl_s=lease_ttl(config, os.environ.get(LEASE_TTL_ENV)))
        if offer_to_hub:  # a federation member: the consumer the hub sources through (FED-1)
            await federation.offer_to_hub(nc, config.cluster)
    finally:
        await nc.close()
    admin = str(identities.admin) if identities else None
    nc = await connect(nats_url, name="healthplane-up", creds=admin, give_up_after=10)
    try:
        await configstore.apply(nc.jetstream(), config, actor="healthplane-up", on_skipped=lambda record: print(
            f"healthplane up: warning: {record.line()}", file=sys.stderr))
    finally:
        await nc.close()


RESTART_POLICY = RestartPolicy()


def _supervise(child: Child, nats_url: str, log_dir: Path, now: float) -> bool:
    """One look at ``child``: restart it when it died and its delay has passed; True when
    what ``stack.json`` says of it changed."""
    log = log_dir / f"{child.label}.log"
    if child.state == "restarting" and child.restart_at is not None and now >= child.restart_at:
        if child.port_taken:  # another process took its port while it was down: a restart there fails again
            _repick_ports(child)
            child.port_taken = False
        child.process = _spawn(child.label, child.command, child.port, nats_url, log_dir, child.creds, child.env)
        child.restarts += 1
        child.state, child.restart_at = "running", None
        print(f"healthplane up: {child.label} restarted (pid {child.process.pid}, restart {child.restarts})",
              file=sys.stderr)
        return True
    code = child.process.poll() if child.state == "running" else None
    if code is None:
        return False
    decision = after_exit(RESTART_POLICY, code, child.failures_at, now)
    # Otherwise a restart keeps its ports: a scraper's target and an open page stay where they were.
    child.port_taken = code == EXIT_PORT_IN_USE and (child.name != "api" or child.http_port_picked)
    if code != 0:  # only the start limit's window is kept: a service that fails once a day stays small
        child.failures_at = [t for t in child.failures_at if now - t < RESTART_POLICY.window_s] + [now]
    match decision:
        case Restart(delay_s):
            child.state, child.restart_at = "restarting", now + delay_s
            print(f"healthplane up: {child.label} {exit_reason(code)}; restarting in {delay_s:g}s; see {log}",
                  file=sys.stderr)
        case GiveUp(reason):
            child.state = "failed"
            print(f"healthplane up: {child.label} {exit_reason(code)} and {reason}; not restarting it; see {log}",
                  file=sys.stderr)
        case LeaveStopped(reason):
            child.state = "stopped"
            print(f"healthplane up: {child.label} {reason}; not restarted; see {log}", file=sys.stderr)
    return True


def _write_stack(data_dir: Path, nats_url: str, servers: list[NatsServer], children: list[Child],
                 identities: Identities | None, server_tls: tls.ServerTls | None, fed: Federation | None) -> None:
    # Paths only, never key material (SEC-6).
    stack: dict[str, object] = {
        "natsUrl": nats_url,
        "natsServerPid": _pid(servers[0]) if servers else None,
        "servers": [{"name": s.name, "pid": _pid(s), "url": s.url, "storeDir": str(s.store_dir),
                     **({"monitorUrl": s.monitor_url} if s.monitor_url else {})} for s in servers],
        "insecure": identities is None,
    }
    if identities is not None:
        stack |= {"adminCreds": str(identities.admin), "viewerCreds": str(identities.viewer),
                  "maintainerCreds": str(identities.maintainer),
                  "adminToken": str(identities.admin_token), "viewerToken": str(identities.viewer_token)}
    if server_tls is not None:
        stack["tlsCa"] = str(server_tls.ca)
    if fed is not None and fed.leaf_port is not None:
        # leafUrl: what `up --attach` takes (several comma-joined); leafUrls: the same, one by one.
        stack |= {"leafUrl": ",".join(_leaf_urls(servers)), "leafUrls": _leaf_urls(servers)}
    elif fed is not None:
        stack |= {"attachedTo": fed.hub_url, "cluster": fed.domain}
    stack["services"] = [
        {"name": c.name, "replica": c.replica, "pid": c.process.pid, "metricsUrl": c.metrics_url, "state": c.state,
         "restarts": c.restarts, **({"url": c.url} if c.url else {})} for c in children
    ]
    # Replaced whole, never half-written: a reader polling it sees the old or the new one.
    staged = data_dir / "stack.json.new"
    staged.write_text(json.dumps(stack, indent=2) + "\n", encoding="utf-8")
    staged.replace(data_dir / "stack.json")


def _pid(server: NatsServer) -> int | None:
    return server.process.pid if server.process else None


def _start_service(name: str, nats_url: str, log_dir: Path, identities: Identities | None, replica: int = 1, *,
                   partitions: int = 1, api_port: int = 0, hub: bool = False) -> Child:
    command = ["service", name, *(["--partitions", str(partitions)] if partitions > 1 else [])]
    env: dict[str, str] = {}
    http_port = None
    if name == "api":  # its port is kept across restarts: an open page reconnects by itself
        http_port = api_port or free_port()
        env["HEALTHPLANE_API_PORT"] = str(http_port)
        if hub:
            env["HEALTHPLANE_FEDERATION_HUB"] = "1"
    child = _start_child(name, command, nats_url, log_dir, identities, replica, env=env, http_port=http_port)
    child.http_port_picked = http_port is not None and not api_port
    return child


def _start_child(name: str, command: list[str], nats_url: str, log_dir: Path, identities: Identities | None,
                 replica: int = 1, *, env: dict[str, str] | None = None, http_port: int | None = None) -> Child:
    port = free_port()
    creds = identities.by_child[name] if identities else None  # replicas share their service's identity
    process = _spawn(_label(name, replica), command, port, nats_url, log_dir, creds, env or {})
    return Child(name, command, port, process, creds, replica=replica, env=env or {}, http_port=http_port)


def _spawn(name: str, command: list[str], port: int, nats_url: str, log_dir: Path,
           creds: Path | None, own_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    # A replica restarted after a crash takes its own lease back at once (runtime.lease).
    env = {**os.environ, "HEALTHPLANE_NATS_URL": nats_url, "HEALTHPLANE_LOG_FORMAT": "json",
           INSTANCE_ENV: f"{socket.gethostname()}/{name}", **(own_env or {})}
    env.pop("HEALTHPLANE_NATS_CREDS", None)  # each child its own identity, never the caller's
    if creds is not None:
        env["HEALTHPLANE_NATS_CREDS"] = str(creds)
    with open(log_dir / f"{name}.log", "ab") as log_file:
        return subprocess.Popen(
            [sys.executable, "-m", "healthplane.cli", *command, "--metrics-port", str(port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # Ctrl-C reaches us only; we stop children in order
        )


def _check_alive(children: list[Child], log_dir: Path, nats_url: str, timeout_s: float = 60.0) -> None:
    """Wait until every child answers on its metrics endpoint: the table and stack.json
    describe a running stack, not one still starting. A port up picked is free when picked,
    not when the child listens (another process on the host may take it meanwhile): a child
    that exits saying its port was taken (EXIT_PORT_IN_USE) is started again on new ones, up
    to PORT_PICKS times; a port the operator named (--api-port) is theirs to free."""
    deadline = time.monotonic() + timeout_s
    waiting = list(children)
    picks = dict.fromkeys((id(child) for child in children), 0)
    while waiting:
        for child in list(waiting):
            status = child.process.poll()
            if (status == EXIT_PORT_IN_USE and picks[id(child)] < PORT_PICKS
                    and (child.name != "api" or child.http_port_picked)):
                picks[id(child)] += 1
                _repick_ports(child)
                child.process = _spawn(child.label, child.command, child.port, nats_url, log_dir, child.creds,
                                       child.env)
                continue
            if status is not None:
                raise CannotStart(f"{child.label} exited at start; see {log_dir / child.label}.log")
            try:
                with urllib.request.urlopen(child.metrics_url, timeout=1) as answer:
                    if answer.status == 200:
                        waiting.remove(child)
            except (OSError, http.client.HTTPException):  # not up yet, or another server on its port
                pass
        if waiting and time.monotonic() > deadline:
            raise CannotStart(f"{waiting[0].label} did not answer within {timeout_s:g}s; "
                              f"see {log_dir / waiting[0].label}.log")
        time.sleep(0.1)


def _repick_ports(child: Child) -> None:
    """New ports for a child whose port was taken (its metrics', and the api's own if up chose it)."""
    child.port = free_port()
    if child.name == "api" and child.http_port_picked:
        child.http_port = free_port()
        child.env["HEALTHPLANE_API_PORT"] = str(child.http_port)


def _stop_all(children: list[Child]) -> None:
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for child in children:
        try:
            child.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()


def _print_access(nats_url: str, identities: Identities | None, server_tls: tls.ServerTls | None,
                  args: argparse.Namespace, children: list[Child]) -> None:
    """The lines an operator pastes to point the CLI at this stack (SEC-3)."""
    exports = []
    if args.nats_url or args.nats_port != 4222 or args.servers > 1:
        exports.append(f"HEALTHPLANE_NATS_URL={nats_url}")
    if identities is not None:
        exports.append(f"HEALTHPLANE_NATS_CREDS={identities.admin}")
    if server_tls is not None:
        exports.append(f"{client_tls.ENV_CA}={server_tls.ca}")
    if exports:
        print(f"export {' '.join(exports)}")
    if identities is not None:
        print(f"(admin; a read-only viewer: {identities.viewer}; stream administration, dead-letter replay: "
              f"{identities.maintainer}; more: `healthplane creds --data-dir {args.data_dir} user NAME "
              "--role admin|viewer|maintainer`)")
    else:
        print("no authentication (--insecure): the CLI needs no credentials")
    for url in (c.url for c in children if c.url):
        # The token's path, not the token: nothing up prints is a secret (SEC-6).
        login = (f"; log in with the admin token: cat {identities.admin_token}" if identities is not None
                 else " (read-only: --insecure)")
        print(f"web UI and API: {url}{login}")
    sys.stdout.flush()


def _print_table(nats_url: str, servers: list[NatsServer], children: list[Child], data_dir: Path,
                 simulated: int) -> None:
    rows = [(f"nats-server {s.name}" if len(servers) > 1 else "nats-server", str(_pid(s) or "-"), "-", s.url)
            for s in servers] or [("nats-server", "-", "-", nats_url)]
    rows += [(c.label, str(c.process.pid), str(c.restarts), c.metrics_url) for c in children]
    width = max(len(r[0]) for r in rows)
    print(f"{'SERVICE':<{width}}  {'PID':>7}  RESTARTS  ENDPOINT")
    for name, pid, restarts, endpoint in rows:
        print(f"{name:<{width}}  {pid:>7}  {restarts:>8}  {endpoint}")
    print("a service that dies is restarted (its restarts are counted in stack.json)")
    if simulated:
        print(f"simulated fleet: {simulated} nodes, the last {simulated // 2} provisioned by the control plane "
              f"(inject faults with `healthplane sim inject sim-000 --fault xid:79 --gpu 0`)")
    print(f"stack: {data_dir / 'stack.json'}   logs: {data_dir / 'logs'}   Ctrl-C stops everything")
    sys.stdout.flush()
