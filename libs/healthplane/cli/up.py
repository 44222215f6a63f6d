"""``healthplane up``: the embedded stack for development.

Starts a JetStream nats-server on loopback (unless ``--nats-url``), creates the streams,
applies the config, starts every built service as its own process, prints what runs where
and writes ``DATA_DIR/stack.json``. Ctrl-C (or SIGTERM) stops the services, then the server,
and leaves no process behind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from healthplane import configstore, registry, streams
from healthplane.config import ClusterConfig, ConfigError, load_cluster_config
from healthplane.natsserver import NatsServer, NatsServerError, free_port
from healthplane.runtime.connect import connect

STOP_GRACE_S = 10.0


class CannotStart(RuntimeError):
    """One line naming what could not start."""


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    metrics_url: str | None


def _fail(message: str) -> int:
    print(f"healthplane up: {message}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    try:
        config = load_cluster_config(args.config) if args.config else ClusterConfig()
    except ConfigError as exc:
        return _fail(str(exc).splitlines()[0])
    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)

    server: NatsServer | None = None
    children: list[Child] = []
    stop_requested = False

    def request_stop(signum: int, _frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        if args.nats_url:
            nats_url = args.nats_url
        else:
            server = NatsServer(data_dir / "nats", port=args.nats_port).start()
            nats_url = server.url
        try:
            asyncio.run(_prepare(nats_url, config))
        except (ConnectionError, streams.StreamConflict, configstore.ConfigConflict) as exc:
            raise CannotStart(str(exc)) from exc

        log_dir = data_dir / "logs"
        log_dir.mkdir(exist_ok=True)
        for name in registry.CONTROL_PLANE:
            children.append(_start_service(name, nats_url, log_dir))
        if not args.no_sim:
            fleet = ["sim", "run", "--nodes", str(args.nodes), "--provisioned", str(args.nodes // 2)]
            children.append(_start_child("sim", fleet, nats_url, log_dir))
        _check_alive(children, log_dir)

        stack = {
            "natsUrl": nats_url,
            "natsServerPid": server.process.pid if server and server.process else None,
            "services": [
                {"name": c.name, "pid": c.process.pid, "metricsUrl": c.metrics_url} for c in children
            ],
        }
        (data_dir / "stack.json").write_text(json.dumps(stack, indent=2) + "\n", encoding="utf-8")
        _print_table(nats_url, server, children, data_dir, simulated=0 if args.no_sim else args.nodes)

        while not stop_requested:
            time.sleep(0.2)
            for child in children:
                code = child.process.poll()
                if code is not None and not getattr(child, "reported", False):
                    child.reported = True  # type: ignore[attr-defined]
                    print(f"healthplane up: {child.name} exited with {code}; see {log_dir / child.name}.log",
                          file=sys.stderr)
        print("\nstopping…", file=sys.stderr)
        return 0
    except (CannotStart, NatsServerError) as exc:
        return _fail(str(exc))
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _stop_all(children)
        if server is not None:
            server.stop()


async def _prepare(nats_url: str, config: ClusterConfig) -> None:
    nc = await connect(nats_url, name="healthplane-up", give_up_after=10)
    try:
        js = nc.jetstream()
        await streams.ensure(js)
        await configstore.apply(js, config, actor="healthplane-up", on_skipped=lambda record: print(
            f"healthplane up: warning: {record.line()}", file=sys.stderr))
    finally:
        await nc.close()


def _start_service(name: str, nats_url: str, log_dir: Path) -> Child:
    return _start_child(name, ["service", name], nats_url, log_dir)


def _start_child(name: str, command: list[str], nats_url: str, log_dir: Path) -> Child:
    port = free_port()
    env = {**os.environ, "HEALTHPLANE_NATS_URL": nats_url, "HEALTHPLANE_LOG_FORMAT": "json"}
    with open(log_dir / f"{name}.log", "ab") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "healthplane.cli", *command, "--metrics-port", str(port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # Ctrl-C reaches us only; we stop children in order
        )
    return Child(name, process, f"http://127.0.0.1:{port}/metrics")


def _check_alive(children: list[Child], log_dir: Path, timeout_s: float = 60.0) -> None:
    """Wait until every child answers on its metrics endpoint: the table and stack.json
    describe a running stack, not one still starting."""
    deadline = time.monotonic() + timeout_s
    waiting = list(children)
    while waiting:
        for child in list(waiting):
            if child.process.poll() is not None:
                raise CannotStart(f"{child.name} exited at start; see {log_dir / child.name}.log")
            try:
                with urllib.request.urlopen(child.metrics_url or "", timeout=1) as answer:
                    if answer.status == 200:
                        waiting.remove(child)
            except OSError:
                pass
        if waiting and time.monotonic() > deadline:
            raise CannotStart(f"{waiting[0].name} did not answer within {timeout_s:g}s; see {log_dir / waiting[0].name}.log")
        time.sleep(0.1)


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


def _print_table(nats_url: str, server: NatsServer | None, children: list[Child], data_dir: Path,
                 simulated: int) -> None:
    rows = [("nats-server", str(server.process.pid) if server and server.process else "-", nats_url)]
    rows += [(c.name, str(c.process.pid), c.metrics_url or "-") for c in children]
    width = max(len(r[0]) for r in rows)
    print(f"{'SERVICE':<{width}}  {'PID':>7}  ENDPOINT")
    for name, pid, endpoint in rows:
        print(f"{name:<{width}}  {pid:>7}  {endpoint}")
    if simulated:
        print(f"simulated fleet: {simulated} nodes, the last {simulated // 2} provisioned by the control plane "
              f"(inject faults with `healthplane sim inject sim-000 --fault xid:79 --gpu 0`)")
    print(f"stack: {data_dir / 'stack.json'}   logs: {data_dir / 'logs'}   Ctrl-C stops everything")
    sys.stdout.flush()
