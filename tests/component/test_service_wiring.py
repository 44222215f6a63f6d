"""Issue 39.3: one way to wire a service. Every service reads its settings before anything
starts (a bad variable is one line naming it and exit 2, never a traceback), and the services
that replay report ready on ``/readyz`` only once caught up — the scheduler and the Slurm
adapter included, now on the same ``run_processor_service`` as the other folds."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from nats.js import JetStreamContext

from healthplane.runtime import converge
from healthplane.stack.natsserver import NatsServer, free_port
from tests.support.secure import env_for
from tests.support.service import spawn

pytestmark = pytest.mark.nats

BAD_SETTINGS = (
    ("scheduler", "HEALTHPLANE_SCHEDULER_TICK_SECONDS", "often"),
    ("slurm-adapter", "HEALTHPLANE_SLURM_INTERVAL_SECONDS", "-1"),
    ("webhook-dispatcher", "HEALTHPLANE_WEBHOOK_QUEUE_SIZE", "lots"),
    ("substrate-bridge", "HEALTHPLANE_BUCKET_SAMPLE_SECONDS", "soon"),
    ("api", "HEALTHPLANE_API_PORT", "http"),
)


@pytest.mark.parametrize(("service", "variable", "value"), BAD_SETTINGS)
def test_a_bad_setting_is_one_line_naming_it_and_exit_2(nats_server: NatsServer, tmp_path: Path, service: str,
                                                        variable: str, value: str) -> None:
    """Bad input gets one clear line naming what was wrong: for every service, through the one
    settings reader of ``run_service`` (the webhook dispatcher's used to end in a traceback)."""
    done = subprocess.run([sys.executable, "-m", "healthplane.cli", "service", service, "--metrics-port", "0"],
                          env=env_for(nats_server, service, **{variable: value}), capture_output=True, text=True,
                          timeout=60)
    said = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(said) == 1 and said[0].startswith(f"healthplane service {service}: {variable}"), said
    assert value in said[0] and "Traceback" not in done.stderr


@pytest.mark.parametrize(("service", "extra"), [
    ("scheduler", {}),
    # No Slurm behind it: its reconciler says so and backs off; the fold is caught up all the same.
    ("slurm-adapter", {"HEALTHPLANE_SLURM_BIN_DIR": "/nonexistent", "HEALTHPLANE_SLURM_OUTPUT_DIR": "/tmp/hp-val"}),
])
async def test_the_schedulers_say_ready_only_once_caught_up(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path,
                                                            service: str, extra: dict[str, str]) -> None:
    await converge.ensure(js)  # as `up` does: a service's identity may not create streams
    process, port = spawn(service, env_for(nats_server, service, **extra), tmp_path / f"{service}.log")
    try:
        answers: list[tuple[int, str]] = []
        async with httpx.AsyncClient(timeout=5) as http, asyncio.timeout(60):
            while not answers or answers[-1] != (200, f"{service}: caught up"):
                try:
                    answer = await http.get(f"http://127.0.0.1:{port}/readyz")
                    answers.append((answer.status_code, answer.text.strip()))
                except httpx.TransportError:
                    pass  # not listening yet
                await asyncio.sleep(0.05)
        # Its own probe from the first answer on (never a bare "ok" before it registers): starting,
        # standby until it takes the lease, replaying, then caught up.
        assert all(text.startswith(f"{service}: ") for _, text in answers), answers
        assert all(status == 503 for status, text in answers if text.endswith(("starting", "replaying"))), answers
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, (tmp_path / f"{service}.log").read_text()[-2000:]


# ---------------------------------------------------------------------------- a port taken


@pytest.mark.parametrize(("service", "which"), [("scheduler", "metrics"), ("api", "api")])
async def test_a_port_taken_is_one_line_and_the_port_in_use_status(nats_server: NatsServer, js: JetStreamContext,
                                                                    tmp_path: Path, service: str, which: str) -> None:
    """`healthplane up` (API): a service told to listen on a port another process holds says so
    in one line and exits EXIT_PORT_IN_USE, no traceback, so that its supervisor can tell a
    taken port from a crash."""
    from healthplane.runtime.lifecycle import EXIT_PORT_IN_USE

    await converge.ensure(js)  # as `up` does: a service's identity may not create streams
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        metrics_port = taken if which == "metrics" else free_port()
        extra = {"HEALTHPLANE_API_PORT": str(taken)} if which == "api" else {}
        done = subprocess.run([sys.executable, "-m", "healthplane.cli", "service", service,
                               "--metrics-port", str(metrics_port)], env=env_for(nats_server, service, **extra),
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_PORT_IN_USE, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    said = [line for line in done.stdout.splitlines() + done.stderr.splitlines() if "cannot listen" in line]
    assert len(said) == 1 and str(taken) in said[0], (done.stdout, done.stderr)
    assert "Traceback" not in done.stdout + done.stderr


async def test_up_starts_a_child_again_on_new_ports_when_the_one_it_picked_was_taken(nats_server: NatsServer,
                                                                                     js: JetStreamContext,
                                                                                     tmp_path: Path) -> None:
    """`healthplane up` (API): a port up picked was free when picked; another process on the
    host may take it before the child listens. The child exits saying so, and up starts it again
    on ports it picks anew, the api's own included (a port named with --api-port stays)."""
    from healthplane.cli import up
    from tests.support.secure import creds_for

    await converge.ensure(js)  # as `up` does: a service's identity may not create streams
    creds = creds_for(nats_server, "api")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        env = {"HEALTHPLANE_API_PORT": str(taken), "HEALTHPLANE_INSTANCE": "test-api"}
        child = up.Child("api", ["service", "api"], free_port(),
                         up._spawn("api", ["service", "api"], free_port(), nats_server.url, tmp_path,
                                   Path(creds) if creds else None, env),
                         Path(creds) if creds else None, env=env, http_port=taken, http_port_picked=True)
        try:
            up._check_alive([child], tmp_path, nats_server.url)
            assert child.process.poll() is None and child.http_port not in (None, taken)
            assert child.env["HEALTHPLANE_API_PORT"] == str(child.http_port)
            log = (tmp_path / "api.log").read_text(encoding="utf-8")
            assert "api cannot listen" in log  # the first start's, on the port taken
        finally:
            child.process.terminate()
            child.process.wait(10)




async def test_a_service_a_test_starts_serves_on_the_port_it_logged(nats_server: NatsServer, js: JetStreamContext,
                                                                    tmp_path: Path) -> None:
    """The tests' own starts (tests.support.service) take the port the kernel bound and the
    service logged; a restart on the same log gets its own: a full run had a metrics port picked
    free taken by another worker's process before the service listened."""
    from tests.support.service import spawn

    await converge.ensure(js)
    ports: list[int] = []
    for _ in range(2):
        process, port = spawn("scheduler", env_for(nats_server, "scheduler"), tmp_path / "scheduler.log")
        try:
            async with httpx.AsyncClient(timeout=5) as http:
                assert (await http.get(f"http://127.0.0.1:{port}/readyz")).text.startswith("scheduler: ")
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0
        ports.append(port)
