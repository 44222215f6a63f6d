"""Collector figures (issue: collector): one collection cycle's CPU and memory on this machine
against node_exporter's own scrape durations, the out-of-band latency from a kmsg record to
the JetStream-acked report, and how many reports one simulator process sustains."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.stack.natsserver import NatsServer, free_port
from healthplane_collector.sim import Fleet
from tests.bench import harness
from tests.component.test_collector_live import collector_config, fixture_root

CYCLE_SCRIPT = """
import asyncio, json, sys, time
from pathlib import Path
from healthplane_collector.agent import Collector, HostSources, KmsgWatcher, Settings

# In-process services run as the test's own identity: on an open server, as the other
# component benches (what identities cost is tests/bench/test_auth_pipeline.py's).
pytestmark = pytest.mark.insecure
settings = Settings(node_id="bench", state_dir=Path(sys.argv[1]), gpu_source="auto")
async def main():
    kmsg = KmsgWatcher(Path("/dev/kmsg"), settings.state_dir, None)
    kmsg.read_once()
    collector = Collector(settings, HostSources(settings), kmsg)
    collector.refresh_inventory()
    await collector.collect("start")          # warm: imports, first reads
    cpu = []
    for _ in range(20):
        before = time.process_time()
        await collector.collect("scheduled")
        cpu.append(time.process_time() - before)
    cpu.sort()
    # VmHWM, not ru_maxrss: the latter carries the forking parent's size across exec.
    hwm_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(json.dumps({"cpu_ms": cpu[len(cpu) // 2] * 1000, "rss_mb": hwm_kb / 1024}))
asyncio.run(main())
"""


def _node_exporter_seconds() -> float | None:
    """node_exporter's own scrape time for the collectors that read what ours reads."""
    binary = shutil.which("prometheus-node-exporter")
    if binary is None:
        install = subprocess.run(["apt-get", "install", "-y", "-q", "prometheus-node-exporter"],
                                 capture_output=True, timeout=300)
        binary = shutil.which("prometheus-node-exporter")
        if install.returncode != 0 or binary is None:
            return None
    port = free_port()
    process = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
                                "--collector.edac", "--collector.hwmon", "--collector.filesystem"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        samples = []
        for _ in range(30):
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except httpx.HTTPError:
                time.sleep(0.2)
                continue
            total = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                        if line.startswith("node_scrape_collector_duration_seconds{"))
            samples.append(total)
        return statistics.median(samples) if samples else None
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(10)


def test_collection_cycle_cost(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", CYCLE_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                         timeout=300, check=True)
    import json

    figures = json.loads(out.stdout)
    theirs = _node_exporter_seconds()
    harness.record("collector.cycle_cpu", figures["cpu_ms"], "ms CPU", target="value <= 20",
                   baseline=theirs * 1000 if theirs else None)
    harness.record("collector.peak_rss", figures["rss_mb"], "MiB", target="value <= 60")


async def test_out_of_band_latency(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> None:
    # COL-2: from the record reaching the kmsg FIFO to the report acked by JetStream.
    fixture_root(tmp_path / "root")
    (tmp_path / "bin").mkdir()
    reports = await js.subscribe(subjects.report("lab", "gpu-node-7"))
    process = subprocess.Popen(
        [sys.executable, "-m", "healthplane.cli", "collector", "--root", str(tmp_path / "root"), "--state-dir",
         str(tmp_path / "state"), "--gpu-source", "nvidia-smi", "--config", str(collector_config(tmp_path / "c.yaml"))],
        env={**os.environ, "HEALTHPLANE_NATS_URL": nats_server.url, "PATH": str(tmp_path / "bin")},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await reports.next_msg(timeout=30)  # the start report
        writer = os.open(tmp_path / "root" / "dev" / "kmsg", os.O_WRONLY)
        latencies = []
        for seq in range(200):
            record = f"4,{9000 + seq},1000,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception\n".encode()
            sent = time.perf_counter()
            os.write(writer, record)
            msg = await reports.next_msg(timeout=10)
            # JetStream has stored the report when the subscriber sees it (stream capture precedes delivery).
            latencies.append((time.perf_counter() - sent) * 1000)
            assert wire.decode(wire.HealthReport, msg.data).trigger == "kmsg"
            await asyncio.sleep(0.12)  # past the 100 ms coalescing window: one report per record
        os.close(writer)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(20)
    latencies.sort()
    harness.record("collector.oob_latency_p50", latencies[len(latencies) // 2], "ms")
    harness.record("collector.oob_latency_p99", latencies[int(len(latencies) * 0.99) - 1], "ms", target="value <= 250")


async def test_simulator_throughput(nats_server: NatsServer, js: JetStreamContext) -> None:
    # One simulator process with 10,000 nodes reporting every 5 s: reports/s it sustains.
    nodes, interval = 10_000, 5
    fleet = Fleet(nodes, "bench", interval_s=interval, gpus=8)
    stopping = asyncio.Event()
    from healthplane.runtime import logs
    from healthplane.runtime.connect import connect

    nc = await connect(nats_server.url, name="sim-bench", give_up_after=5)
    task = asyncio.create_task(fleet.run(nc, stopping, logs.configure("sim", json=True, level="warning")))
    await asyncio.sleep(interval + 2)  # first round spread over min(interval, 5 s)
    before = (await js.stream_info("HP_REPORTS")).state.messages
    started = time.perf_counter()
    await asyncio.sleep(3 * interval)
    after = (await js.stream_info("HP_REPORTS")).state.messages
    rate = (after - before) / (time.perf_counter() - started)
    stopping.set()
    await asyncio.wait_for(task, 60)
    await nc.close()
    harness.record("sim.reports_per_s_10k_nodes", rate, "reports/s", target=f"value >= {0.9 * nodes / interval:.0f}")
