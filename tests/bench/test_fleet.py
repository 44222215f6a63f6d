"""HA-5 and issue 25, the fleet the whole pipeline sustains on this machine: `healthplane up
--no-sim` (every service: health-ingest, the scorer, policy, eviction, the scheduler, webhooks
and the bridge) with `healthplane sim load --nodes N --interval 30`, at each fleet size of
HEALTHPLANE_BENCH_FLEETS (default "60000,80000"; 100000 is the goal): the startup wave, then
a hold of HOLD_S seconds.

Every 30 s: each consumer's lag (pending + unacknowledged), report -> node view latency (a
core subscription on ``hp.node.>`` reads every 10th view as the scorer writes it: now minus
the report's ``sentAt``), CPU and RSS of each process, and each service's ``/metrics``
response time. The startup wave (every node's first cycle, spread over one interval) is
absorbed once every node has a scored view and the summed lag is back under one second of
reports; the hold is the windows that begin after that. A size *holds* when the wave is
absorbed within WAVE_LIMIT_S and, in every window of the hold, the summed lag stays under one
second of reports and the p99 latency under LATENCY_GOAL_S.

Baseline in the same run: nats-server alone with the same generator and a consumer that only
acks (the physical floor: what storing and delivering the flow costs the server here). RSS
per node, at a size that holds: each process's RSS at the end less its RSS before the fleet
started, over the nodes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from healthplane.contracts import wire
from healthplane.runtime import converge
from healthplane.runtime.pull import Delivery, PullLoop
from healthplane.stack.natsserver import NatsServer, terminate
from tests.bench import harness

pytestmark = pytest.mark.insecure
FLEETS = [int(n) for n in os.environ.get("HEALTHPLANE_BENCH_FLEETS", "60000,80000").split(",")]
INTERVAL_S = 30
WINDOW_S = 30.0
# The first cycles (3 records a node) and their backlog: an operator restarting a whole fleet
# expects it scored within minutes (the issue sets no figure; the wave's time is recorded).
WAVE_LIMIT_S = 300.0
BASELINE_WAVE_S = 120.0  # the server alone absorbs the wave well within this; then two windows
HOLD_S = float(os.environ.get("HEALTHPLANE_BENCH_HOLD_S", "300"))
LATENCY_GOAL_S = 1.0
TICK = os.sysconf("SC_CLK_TCK")
STREAMS = ("HP_REPORTS", "HP_RESOURCES", "HP_ASSESSMENTS", "HP_NODE_EVENTS", "HP_ALLOCATIONS", "HP_NODES")


def _processes() -> dict[str, tuple[int, int]]:
    """name -> (CPU ticks, RSS bytes) of every healthplane service, nats-server and generator."""
    found: dict[str, tuple[int, int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            continue
        line = " ".join(argv)
        if "healthplane.cli service " in line:
            name = argv[argv.index("service") + 1]
        elif argv and argv[0].endswith("nats-server"):
            name = "nats-server"
        elif "healthplane.cli sim load" in line:
            name = "sim load"
        else:
            continue
        ticks, size = found.get(name, (0, 0))
        found[name] = (ticks + int(stat[11]) + int(stat[12]), size + rss)
    return found


def _scrape_s(url: str) -> float | None:
    """Seconds to the last byte of a scrape, asking for gzip as Prometheus does."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept-Encoding": "gzip"}),
                                    timeout=10) as response:
            while response.read(1 << 20):
                pass
    except OSError:
        return None
    return time.monotonic() - started


@dataclass
class Window:
    from_s: float  # since the sampler started
    at_s: float
    lag: int
    latencies: list[float]
    cpu: dict[str, float]
    rss: dict[str, int]
    scrape_s: dict[str, float | None]

    @property
    def length_s(self) -> float:
        return self.at_s - self.from_s

    def p(self, q: float) -> float | None:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else None


@dataclass
class Sampler:
    nc: Any
    metrics_urls: dict[str, str] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    seen: int = 0
    idle_rss: dict[str, int] = field(default_factory=dict)  # each process before the fleet
    scored: set[str] = field(default_factory=set)  # nodes with a scored view: the startup wave
    all_scored_s: float | None = None  # since the generator started
    started: float = field(default_factory=time.monotonic)

    async def start(self, nodes: int = 0) -> None:
        async def on_view(msg: Any) -> None:
            self.seen += 1
            if self.all_scored_s is None and nodes:
                node_id = msg.subject.rpartition(".")[2]
                if node_id not in self.scored and b'"score":null' not in msg.data:
                    self.scored.add(node_id)
                    if len(self.scored) == nodes:
                        self.all_scored_s = time.monotonic() - self.started
            if self.seen % 10:
                return
            try:
                view = wire.decode(wire.NodeView, msg.data)
            except wire.WireError:
                return
            if view.last_reported_at is not None:
                self.latencies.append((datetime.now(UTC) - view.last_reported_at).total_seconds())

        await self.nc.subscribe("hp.node.>", cb=on_view)

    async def windows(self, seconds: float, after: asyncio.Task[float] | None = None) -> list[Window]:
        """Windows for ``seconds``; with ``after``, until ``seconds`` of windows have begun after
        it finished (it returns when, since the sampler started), or WAVE_LIMIT_S passed without."""
        js = self.nc.jetstream()
        started = self.started
        before, then = _processes(), time.monotonic()
        out: list[Window] = []

        def done() -> bool:
            elapsed = time.monotonic() - started
            if after is None:
                return elapsed >= seconds
            if not after.done():
                return elapsed >= WAVE_LIMIT_S
            return sum(w.length_s for w in _steady(out, after.result())) >= seconds

        while not done():
            await asyncio.sleep(WINDOW_S)
            lag = await _lag(js)
            now, at = _processes(), time.monotonic()
            cpu = {name: 100 * (ticks - before.get(name, (ticks, 0))[0]) / TICK / (at - then)
                   for name, (ticks, _) in now.items()}
            # Scraped from a thread: a scrape blocking this loop would hold back the views it
            # reads and count the wait as pipeline latency.
            scrapes = await asyncio.to_thread(lambda: {name: _scrape_s(url) for name, url in self.metrics_urls.items()})
            latencies, self.latencies = self.latencies, []
            out.append(Window(then - started, at - started, lag, latencies, cpu, {n: r for n, (_, r) in now.items()},
                              scrapes))
            before, then = now, at
        return out


async def _lag(js: Any) -> int:
    """Every consumer's pending and unacknowledged records, summed."""
    lag = 0
    for stream in STREAMS:
        try:
            lag += sum(c.num_pending + c.num_ack_pending for c in await js.consumers_info(stream))
        except Exception:  # a stream not there (the baseline has two)
            pass
    return lag


async def _wave_settled(sampler: Sampler, nodes: int) -> float:
    """Seconds from the generator's start until every node is scored and the lag is back
    under one second of reports (the startup wave absorbed); polled every 2 s."""
    js = sampler.nc.jetstream()
    while sampler.all_scored_s is None or await _lag(js) > nodes / INTERVAL_S:
        await asyncio.sleep(2)
    return time.monotonic() - sampler.started


def _snapshots(urls: dict[str, str]) -> dict[str, tuple[float, float]]:
    """Each fold's last snapshot: (seconds, compressed bytes), from the head of its /metrics
    (the registry's series come before the scorer's node series)."""
    found: dict[str, tuple[float, float]] = {}
    for name, url in urls.items():
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                head = response.read(1 << 20).decode(errors="replace")
        except OSError:
            continue
        took = re.search(r'^healthplane_snapshot_duration_seconds\{[^}]*\} (\S+)$', head, re.M)
        size = re.search(r'^healthplane_snapshot_bytes\{[^}]*\} (\S+)$', head, re.M)
        if took and size:
            found[name] = (float(took.group(1)), float(size.group(1)))
    return found


def _metrics_urls(data: Path) -> dict[str, str]:
    urls: dict[str, str] = {}
    for log in (data / "logs").glob("*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if '"metrics endpoint"' in line and (found := re.search(r'"url": "([^"]+)"', line)):
                urls[log.stem] = found.group(1)
    return urls


def _generator(url: str, nodes: int, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "healthplane.cli", "sim", "load", "--nodes", str(nodes),
                             "--interval", str(INTERVAL_S)], env={**os.environ, "HEALTHPLANE_NATS_URL": url},
                            stdout=subprocess.DEVNULL, stderr=log.open("ab"))


@dataclass
class Wave:
    scored_s: float | None  # every node has a scored view
    settled_s: float | None  # and the lag is back under one second of reports


async def _pipeline(tmp: Path, nodes: int) -> tuple[list[Window], dict[str, int], Wave]:
    data = tmp / f"up-{nodes}"
    config = tmp / "fleet.yaml"  # the bucket sized for the fleet (BRG-1: 64 MiB holds ~45,000 nodes)
    config.write_text("cluster: default\nsubstrate:\n  nodesBucketMaxBytes: 1073741824\n")
    up = subprocess.Popen([sys.executable, "-m", "healthplane.cli", "up", "--no-sim", "--insecure", "--nats-port", "0",
                           "--data-dir", str(data), "--config", str(config)],
                          stdout=subprocess.DEVNULL, stderr=(tmp / f"up-{nodes}.log").open("ab"))
    try:
        for _ in range(240):
            if (data / "stack.json").exists() and len(_metrics_urls(data)) >= 7:
                break
            await asyncio.sleep(0.5)
        url = json.loads((data / "stack.json").read_text())["natsUrl"]
        nc = await nats.connect(url)
        sampler = Sampler(nc, _metrics_urls(data))
        await sampler.start(nodes)
        sampler.idle_rss = {name: rss for name, (_, rss) in _processes().items()}
        generator = _generator(url, nodes, tmp / f"load-{nodes}.log")
        sampler.started = time.monotonic()
        settling = asyncio.create_task(_wave_settled(sampler, nodes))
        try:
            windows = await sampler.windows(HOLD_S, after=settling)
            settled = settling.result() if settling.done() else None
            for name, (took_s, size) in sorted(_snapshots(sampler.metrics_urls).items()):
                harness.record(f"fleet.{nodes}.snapshot_s.{name}", took_s, "s")
                harness.record(f"fleet.{nodes}.snapshot_bytes_per_node.{name}", size / nodes, "B")
            return windows, sampler.idle_rss, Wave(sampler.all_scored_s, settled)
        finally:
            settling.cancel()
            terminate(generator, 10)
            await nc.close()
    finally:
        terminate(up, 60)


async def _server_alone(tmp: Path, nodes: int) -> list[Window]:
    """The same generator into the same streams, one consumer per stream that only acks."""
    server = NatsServer(tmp / f"alone-{nodes}").start()
    nc = await nats.connect(server.url)
    js = nc.jetstream()
    await converge.ensure(js)
    loops = []
    for stream in ("HP_REPORTS", "HP_RESOURCES"):
        await js.add_consumer(stream, ConsumerConfig(durable_name=f"ack-{stream}", ack_policy=AckPolicy.EXPLICIT,
                                                     max_ack_pending=20_000))

        async def ack(deliveries: list[Delivery]) -> None:
            pass  # the loop acks what the handler returns from

        loops.append(PullLoop(nc, stream, f"ack-{stream}", ack, batch=512))
    tasks = [asyncio.create_task(loop.run()) for loop in loops]
    generator = _generator(server.url, nodes, tmp / f"alone-{nodes}.log")
    try:
        return await Sampler(nc).windows(BASELINE_WAVE_S + 60.0)
    finally:
        terminate(generator, 10)
        for loop in loops:
            loop.stop()
        await asyncio.gather(*tasks)
        await nc.close()
        server.stop()


def _steady(windows: list[Window], settled_s: float | None) -> list[Window]:
    """The hold: the windows that began after the wave was absorbed."""
    return [w for w in windows if settled_s is not None and w.from_s >= settled_s]


def _held(windows: list[Window], nodes: int, settled_s: float | None) -> bool:
    steady = _steady(windows, settled_s)
    per_second = nodes / INTERVAL_S
    return (settled_s is not None and settled_s <= WAVE_LIMIT_S and sum(w.length_s for w in steady) >= HOLD_S
            and all(w.lag <= per_second and (w.p(0.99) or 0) < LATENCY_GOAL_S for w in steady))


async def test_the_fleet_the_pipeline_sustains(tmp_path: Path) -> None:
    held = 0
    for nodes in FLEETS:
        windows, idle_rss, wave = await _pipeline(tmp_path, nodes)
        steady = _steady(windows, wave.settled_s) or windows[-1:]
        for w in windows:
            print(f"{nodes} t={w.at_s:.0f}s lag={w.lag} p50={w.p(0.5)} p99={w.p(0.99)} "
                  f"cpu={ {k: round(v) for k, v in w.cpu.items()} } scrape={w.scrape_s}", flush=True)
        latencies = [latency for w in steady for latency in w.latencies]
        summary = Window(0, 0, max(w.lag for w in steady), latencies, {}, {}, {})
        holds = _held(windows, nodes, wave.settled_s)
        held = max(held, nodes if holds else 0)
        harness.record(f"fleet.{nodes}.held", 1.0 if holds else 0.0, "bool")
        harness.record(f"fleet.{nodes}.max_lag_steady", summary.lag, "records", target=f"value <= {nodes // INTERVAL_S}")
        harness.record(f"fleet.{nodes}.view_latency_p50", summary.p(0.5) or -1, "s")
        harness.record(f"fleet.{nodes}.view_latency_p99", summary.p(0.99) or -1, "s", target=f"value <= {LATENCY_GOAL_S}")
        cpu = {name: sum(w.cpu.get(name, 0) for w in steady) / len(steady) for name in steady[-1].cpu}
        alone = await _server_alone(tmp_path, nodes)
        alone_steady = [w for w in alone if w.from_s >= BASELINE_WAVE_S] or alone[-1:]
        server_alone = sum(w.cpu.get("nats-server", 0) for w in alone_steady) / len(alone_steady)
        harness.record(f"fleet.{nodes}.cpu_percent_all", sum(cpu.values()), "% of one core",
                       baseline=server_alone + sum(w.cpu.get("sim load", 0) for w in alone_steady) / len(alone_steady))
        for name, percent in sorted(cpu.items()):
            harness.record(f"fleet.{nodes}.cpu_percent.{name}", percent, "% of one core")
        scrapes = sorted(s for w in steady for name, s in w.scrape_s.items() if s is not None)
        failed = sum(s is None for w in steady for s in w.scrape_s.values())
        harness.record(f"fleet.{nodes}.metrics_scrape_p99", scrapes[int(len(scrapes) * 0.99)] if scrapes else -1, "s",
                       target="value <= 1")
        harness.record(f"fleet.{nodes}.metrics_scrapes_failed", failed, "scrapes", target="value <= 0")
        harness.record(f"fleet.{nodes}.startup_wave_scored_s", wave.scored_s or -1, "s",
                       target=f"value <= {WAVE_LIMIT_S:g}")
        harness.record(f"fleet.{nodes}.startup_wave_settled_s", wave.settled_s or -1, "s",
                       target=f"value <= {WAVE_LIMIT_S:g}")
        for name in sorted(idle_rss):  # the high-water mark, startup wave included: bounded memory
            peak = max(w.rss.get(name, 0) for w in windows)
            harness.record(f"fleet.{nodes}.rss_peak_bytes_per_node.{name}", (peak - idle_rss[name]) / nodes, "B")
        if holds:  # a backlog's high-water mark is not what a node costs
            for name, size in sorted(steady[-1].rss.items()):
                if name in idle_rss:
                    harness.record(f"fleet.{nodes}.rss_bytes_per_node.{name}", (size - idle_rss[name]) / nodes, "B",
                                   target="value <= 2048")
    harness.record("fleet.largest_held", held, "nodes", baseline=1100, target="value >= 100000")
