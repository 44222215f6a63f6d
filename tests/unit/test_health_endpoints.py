"""Issue 25: what ``/healthz`` and ``/readyz`` answer, from the process's own state, served on
the metrics port (a real HTTP server on loopback)."""

from __future__ import annotations

import time

import httpx

from healthplane.runtime import metrics


def test_readyz_names_what_a_service_waits_for_and_healthz_a_stalled_loop() -> None:
    endpoint = metrics.serve(0)
    base = f"http://127.0.0.1:{endpoint.port}"
    metrics.readiness("scorer", lambda: (False, "replaying (partition 1of4)"))
    metrics.readiness("other", lambda: (True, "caught up"))
    try:
        answer = httpx.get(f"{base}/readyz", timeout=5)
        assert (answer.status_code, answer.text.strip()) == (503, "scorer: replaying (partition 1of4)")
        metrics.readiness("scorer", lambda: (True, "standby"))
        answer = httpx.get(f"{base}/readyz", timeout=5)
        assert (answer.status_code, answer.text.strip()) == (200, "other: caught up; scorer: standby")
        assert httpx.get(f"{base}/metrics", timeout=5).text.startswith("# HELP")

        metrics._loop_turned_at[0] = time.monotonic()
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        metrics._loop_turned_at[0] = time.monotonic() - 30  # the event loop has not turned for 30 s
        answer = httpx.get(f"{base}/healthz", timeout=5)
        assert answer.status_code == 503 and "event loop stalled for 30 s" in answer.text
    finally:
        metrics.readiness("scorer", None)
        metrics.readiness("other", None)
        metrics._loop_turned_at[0] = time.monotonic()
