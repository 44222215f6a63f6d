"""The HTTP API and the web UI over a large fleet (issue "HTTP API and web UI", figures):
``GET /api/v1/nodes`` (the whole list and the first page) against ``node list`` in the same
run, the nodes page's time to first render in Chromium, and a change's time from its view
being written to an open node page showing it.

The fleet is HEALTHPLANE_BENCH_API_NODES (default 100,000) node views written straight to
``HP_NODES``, as the scorer writes them; the api service is the real one, on a secure bus,
asked with a real bearer token."""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from playwright.async_api import async_playwright, expect

from healthplane.contracts import subjects, wire
from healthplane.stack.keystore import Keystore
from healthplane.stack.natsserver import NatsServer, free_port
from tests.bench import harness
from tests.support.browser import CHROMIUM, FLAGS
from tests.support.secure import creds_for, env_for

NODES = int(os.environ.get("HEALTHPLANE_BENCH_API_NODES", "100000"))
REPEATS = 5


def _view(i: int, score: int) -> wire.NodeView:
    degraded = score < 95
    return wire.NodeView(
        node_id=f"n-{i:06d}", cluster=f"c{i % 4}", hostname=f"gpu{i:06d}.example", status="READY",
        health="DEGRADED" if degraded else "HEALTHY", last_reported_at=datetime.now(UTC), score=score,
        score_explanation=wire.ScoreExplanation(penalties="cluster", contributions=[
            wire.Contribution(reason="GpuXidHardware", condition="gpu_xid_errors", points=score - 100)]
            if degraded else []),
        conditions=[], attributed_failures=wire.AttributedFailures(), holds=[], jobs=i % 3,
        definition="gpu-pool", report_interval_seconds=30)


async def _write_fleet(js: JetStreamContext) -> None:
    window = []
    for i in range(NODES):
        view = _view(i, 55 if i % 1000 == 7 else 100)
        window.append(await js.publish_async(subjects.node_view(view.cluster, view.node_id), wire.encode(view)))
        if len(window) >= 4000:
            await asyncio.gather(*window)
            window = []
    await asyncio.gather(*window)


def _median_s(action: object, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def test_api_figures_over_a_large_fleet(nats_server: NatsServer, keystore: Keystore, nc: NATS,
                                              js: JetStreamContext, tmp_path: Path) -> None:
    await _write_fleet(js)
    port = free_port()
    log = open(tmp_path / "api.log", "wb")
    api = subprocess.Popen([sys.executable, "-m", "healthplane.cli", "service", "api", "--metrics-port", "0"],
                           env=env_for(nats_server, "api", HEALTHPLANE_API_PORT=str(port)), stdout=log,
                           stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    token = keystore.token("bench", "viewer")
    headers = {"Authorization": f"Bearer {token}"}
    try:
        started = time.perf_counter()
        async with httpx.AsyncClient(timeout=120, headers=headers) as client:
            while True:
                try:
                    summary = (await client.get(url + "/api/v1/summary")).json()
                    if summary["fleet"]["nodes"] == NODES:
                        break
                except (httpx.HTTPError, KeyError, TypeError, ValueError):
                    pass
                await asyncio.sleep(0.2)
        harness.record(f"api index loaded ({NODES:,} views)", time.perf_counter() - started, "s")
        cli_env = {**os.environ, "HEALTHPLANE_NATS_URL": nats_server.url,
                   "HEALTHPLANE_NATS_CREDS": str(creds_for(nats_server, "viewer"))}

        def node_list() -> None:
            done = subprocess.run([sys.executable, "-m", "healthplane.cli", "node", "list", "-o", "json"],
                                  env=cli_env, capture_output=True, timeout=300)
            assert done.returncode == 0, done.stderr[-500:]

        def get(path: str) -> None:
            answer = httpx.get(url + path, headers=headers, timeout=300)
            assert answer.status_code == 200, answer.text[:300]

        cli_s = await asyncio.to_thread(_median_s, node_list)
        whole_s = await asyncio.to_thread(_median_s, lambda: get("/api/v1/nodes"))
        page_s = await asyncio.to_thread(_median_s, lambda: get("/api/v1/nodes?pageSize=100&sort=score"))
        table_s = await asyncio.to_thread(_median_s, lambda: get("/nodes"))
        harness.record(f"node list -o json, {NODES:,} nodes (baseline: none)", cli_s, "s")
        harness.record(f"GET /api/v1/nodes, all {NODES:,}", whole_s, "s", baseline=cli_s)
        harness.record(f"GET /api/v1/nodes, first page of 100 by score of {NODES:,}", page_s, "s", baseline=cli_s,
                       target="value <= 0.5")
        harness.record(f"GET /nodes (the table's first page), {NODES:,} nodes", table_s, "s", baseline=cli_s,
                       target="value <= 0.5")

        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=list(FLAGS))
            page = await browser.new_page()
            await page.goto(url + "/login")
            await page.fill("textarea[name=token]", token)
            await page.click("form.login button[type=submit]")
            paints = []
            for _ in range(REPEATS):
                await page.goto(url + "/nodes")
                # Headless Chromium records no paint entries: the page is rendered once its DOM is loaded.
                loaded = await page.evaluate("performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd")
                paints.append(float(loaded) / 1000)
            harness.record(f"nodes page rendered (DOMContentLoaded), {NODES:,} nodes", statistics.median(paints), "s",
                           baseline=cli_s, target="value <= 1")

            target = _view(42, 100)
            await page.goto(url + f"/nodes/{target.node_id}?cluster={target.cluster}")
            await page.wait_for_selector("body[data-live=open]")
            delays = []
            for score in (40, 60, 45, 70, 50):
                changed = _view(42, score)
                written = time.perf_counter()
                await js.publish(subjects.node_view(changed.cluster, changed.node_id), wire.encode(changed))
                # A polling locator, not wait_for_function: the page's CSP forbids evaluating strings.
                await expect(page.locator("#score")).to_have_text(f"{score}/100", timeout=30_000)
                delays.append(time.perf_counter() - written)
                await asyncio.sleep(1.2)  # a page re-reads at most once a second: measure each change alone
            harness.record("view written -> open node page shows it (median of 5)", statistics.median(delays), "s",
                           target="value <= 2")
            await browser.close()
    finally:
        api.terminate()
        api.wait(timeout=30)
        log.close()
