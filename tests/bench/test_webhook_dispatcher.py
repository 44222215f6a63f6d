"""webhook-dispatcher figures (issue #8): deliveries per second to a local receiver that answers
at once, against bare httpx (its default transport, httpcore) POSTing the same signed bodies in
the same run; and the dispatcher process's peak RSS through a 100,000-event burst, against its
own footprint before it.

One more figure says where the time goes: the dispatcher's own sender (``send.EndpointSender``,
requests straight into transport.StreamTransport, h11 on asyncio, with the attempt's
deadline and body bound) POSTing the same bodies with nothing else: what is left for reading
the stream, the envelope and signing.

There is no absolute target (a figure of this machine's load, not of the code): the ratio to
bare httpx in the same run is the figure, and below 1.0 the transport would have no reason
to exist."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from prometheus_client import REGISTRY

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import parse_cluster_config
from healthplane.contracts.webhooks import signature_headers
from healthplane.runtime import configstore, logs
from healthplane.runtime.lifecycle import ServiceContext
from healthplane.stack.natsserver import NatsServer, free_port
from healthplane_webhook_dispatcher.dispatch import Dispatcher
from healthplane_webhook_dispatcher.rules import CONTENT_TYPE, Settings, endpoint_label, envelope
from healthplane_webhook_dispatcher.send import EndpointSender
from tests.bench import harness
from tests.bench.bus import publish_all

# In-process services run as the test's own identity: on an open server, as the other
# component benches (what identities cost is tests/bench/test_auth_pipeline.py's).
pytestmark = pytest.mark.insecure

ROOT = Path(__file__).resolve().parents[2]
SECRET = "bench-secret"
RATE_EVENTS = 10_000
BURST_EVENTS = 100_000
CONCURRENCY = Settings().concurrency


@pytest.fixture(autouse=True)
def _endpoint_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoint's secretEnv, in this process's environment (the in-process dispatcher's)
    and so in the environment of the dispatcher process it starts."""
    monkeypatch.setenv("HP_BENCH_WEBHOOK_SECRET", SECRET)


@contextmanager
def receiver_process() -> Iterator[str]:
    """The receiver in its own process, so its CPU is not the dispatcher's."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "tests.support.webhook_receiver", str(port)], cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT), "HP_BENCH_WEBHOOK_SECRET": SECRET})
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "receiver did not start"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/hooks/healthplane"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(10)


def _event(i: int, event_type: str = "CONDITION_RAISED") -> wire.NodeEvent:
    return wire.NodeEvent(
        id=f"health-ingest:HP_REPORTS:{i}:0", node_id=f"cn-{i % 10_000:05d}", cluster="default", type=event_type,  # type: ignore[arg-type]
        occurred_at=datetime(2026, 11, 30, 8, 0, tzinfo=UTC), message="1 uncorrectable GPU ECC error(s) on GPU 0",
        actor="health-ingest", condition=wire.ConditionChange(type="gpu_ecc_errors", severity="critical",
                                                              reason="GpuEccUncorrectable", message="1 uncorrectable"))


def _signed(i: int, body: bytes) -> dict[str, str]:
    headers = signature_headers(SECRET, f"e{i}", int(time.time()), body)
    headers["Content-Type"] = CONTENT_TYPE
    return headers


async def _post_rate(clients: list[httpx.AsyncClient], url: str, count: int) -> float:
    """POSTs per second of the same signed envelopes the dispatcher sends, ``CONCURRENCY``
    at a time over ``clients`` (each worker takes one, round robin), nothing else."""
    bodies = [envelope(_event(i)) for i in range(count)]
    todo = list(range(count))

    async def work(client: httpx.AsyncClient) -> None:
        while todo:
            i = todo.pop()
            response = await client.post(url, content=bodies[i], headers=_signed(i, bodies[i]))
            assert response.status_code == 204

    started = time.perf_counter()
    await asyncio.gather(*(work(clients[w % len(clients)]) for w in range(CONCURRENCY)))
    elapsed = time.perf_counter() - started
    for client in clients:
        await client.aclose()
    return count / elapsed


async def _sender_rate(url: str, count: int) -> float:
    """The same POSTs through the dispatcher's own sender, ``CONCURRENCY`` at a time."""
    bodies = [envelope(_event(i)) for i in range(count)]
    todo = list(range(count))
    sender = EndpointSender(url, Settings(), environ={})

    async def work() -> None:
        while todo:
            i = todo.pop()
            assert (await sender.post(bodies[i], _signed(i, bodies[i])))[0] == 204

    started = time.perf_counter()
    await asyncio.gather(*(work() for _ in range(CONCURRENCY)))
    elapsed = time.perf_counter() - started
    await sender.aclose()
    return count / elapsed


def _bare_httpx_clients() -> list[httpx.AsyncClient]:
    """The baseline: httpx with its default transport (httpcore, h11, anyio), one client
    with one kept-alive connection per worker (its fastest shape here: a shared pool of 16
    costs 2x the CPU per request, docs/webhooks.md)."""
    return [httpx.AsyncClient(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1), timeout=10)
            for _ in range(CONCURRENCY)]


async def _apply(js: JetStreamContext, url: str) -> int:
    return await configstore.apply(js, parse_cluster_config(
        {"nodeEventWebhooks": [{"url": url, "secretEnv": "HP_BENCH_WEBHOOK_SECRET"}]}), actor="bench")


async def test_delivery_rate(nc: NATS, js: JetStreamContext) -> None:
    with receiver_process() as url:
        raw = await _post_rate(_bare_httpx_clients(), url, RATE_EVENTS)
        own_sender = await _sender_rate(url, RATE_EVENTS)
        await _apply(js, url)
        # Acks after delivery (INT-2), the default bound on what an endpoint holds.
        settings = Settings()
        ctx = ServiceContext("webhook-dispatcher", nc, js, logs.configure("bench", json=True, level="error"), "",
                             asyncio.Event())
        dispatcher = Dispatcher(ctx, settings)
        await dispatcher.start()
        await publish_all(nc, [(subjects.event("default", e.node_id, e.type), wire.encode(e))
                               for e in map(_event, range(RATE_EVENTS))])
        [worker] = dispatcher.workers.values()
        started = time.perf_counter()
        task = asyncio.create_task(dispatcher.run())
        while worker.delivered < RATE_EVENTS:
            assert not task.done(), task
            await asyncio.sleep(0.01)
        rate = RATE_EVENTS / (time.perf_counter() - started)
        dispatcher.stop()
        await task
        label = endpoint_label(url)
        assert not REGISTRY.get_sample_value("healthplane_webhook_dead_letters_total",
                                             {"endpoint": label, "reason": "max_attempts"})
    figure = harness.record("webhook.deliveries_per_s", rate, "deliveries/s", baseline=raw, target="ratio >= 1.5")
    harness.record("webhook.raw_httpx_posts_per_s", raw, "posts/s")
    harness.record("webhook.sender_posts_per_s", own_sender, "posts/s", baseline=raw)
    assert figure.ratio is not None and figure.ratio > 1.0, f"slower than bare httpx: {figure.ratio}x"


def _vm_hwm_mib(pid: int) -> float:
    # VmHWM, not ru_maxrss: the latter carries the forking parent's size across exec.
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def _scrape(port: int, name: str) -> float:
    total = 0.0
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_peak_rss_through_a_100k_burst(nats_server: NatsServer, nc: NATS, js: JetStreamContext,
                                            tmp_path: Path) -> None:
    with receiver_process() as url:
        await _apply(js, url)
        metrics_port = free_port()
        log_path = tmp_path / "dispatcher.log"
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-m", "healthplane.cli", "service", "webhook-dispatcher",
                 "--metrics-port", str(metrics_port)],
                env={**os.environ, "HEALTHPLANE_NATS_URL": nats_server.url, "HEALTHPLANE_LOG_FORMAT": "json"},
                stdout=subprocess.DEVNULL, stderr=log_file)
        try:
            deadline = time.monotonic() + 30
            while "webhook endpoints in force" not in log_path.read_text():
                assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
                await asyncio.sleep(0.05)
            # Warm: one delivery through every layer before the footprint is taken.
            first = _event(0)
            await js.publish(subjects.event("default", first.node_id, first.type), wire.encode(first))
            while _scrape(metrics_port, "healthplane_webhook_deliveries_total") < 1:
                await asyncio.sleep(0.05)
            idle_mib = _vm_hwm_mib(process.pid)

            await publish_all(nc, [(subjects.event("default", e.node_id, e.type), wire.encode(e))
                                   for e in map(_event, range(1, BURST_EVENTS + 1))])
            deadline = time.monotonic() + 300
            while True:
                info = await js.consumer_info("HP_NODE_EVENTS", "webhook-dispatcher_0-HP_NODE_EVENTS")
                settled = (_scrape(metrics_port, "healthplane_webhook_deliveries_total")
                           + _scrape(metrics_port, "healthplane_webhook_dead_letters_total"))
                if info.num_pending == 0 and info.num_ack_pending == 0 and settled >= BURST_EVENTS + 1:
                    break
                assert time.monotonic() < deadline, "the burst never settled"
                await asyncio.sleep(0.2)
            peak_mib = _vm_hwm_mib(process.pid)
            delivered = _scrape(metrics_port, "healthplane_webhook_deliveries_total") - 1
            dropped = _scrape(metrics_port, "healthplane_webhook_dead_letters_total")
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(30)
    harness.record("webhook.peak_rss_100k_burst", peak_mib, "MiB", baseline=idle_mib, target="ratio <= 1.5")
    harness.record("webhook.burst_100k_delivered", delivered, "events")
    harness.record("webhook.burst_100k_dead_lettered", dropped, "events")  # INT-2: none dropped, ever
