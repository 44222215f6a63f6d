"""Breakfix figures as Prometheus series (issue 41.5; SPEC RUL, "Breakfix figures"): node events
stored on a real nats-server, two api replicas as `healthplane service api` processes, and their
real /metrics endpoints. Each replica folds every stored node event (``live.Breakfix``, the one
fold of ``contracts.breakfix``), so both serve the same numbers."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from nats.js import JetStreamContext
from prometheus_client.parser import text_string_to_metric_families

from healthplane.contracts import subjects, wire
from healthplane.runtime import converge
from healthplane.stack.natsserver import NatsServer
from tests.support.secure import env_for
from tests.support.service import spawn

pytestmark = pytest.mark.nats

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
XID = wire.Condition(type="gpu_xid_errors", severity="critical", reason="GpuXid", message="Xid 79 on GPU 0",
                     first_seen=T0, recommended_action="RESTART_BM")


def _event(n: int, kind: str, node: str, seconds: float, actor: str = "eviction", **fields: object) -> wire.NodeEvent:
    return wire.NodeEvent(id=f"e{n}", node_id=node, cluster="default", type=kind,  # type: ignore[arg-type]
                          occurred_at=T0 + timedelta(seconds=seconds), message=kind.lower(), actor=actor, **fields)


def _hold(hold_id: str) -> wire.Hold:
    return wire.Hold(id=hold_id, effect="cordon", reason="GPU Xid Errors", actor="eviction", created_at=T0)


def incident(node: str, start: float, n: int) -> list[wire.NodeEvent]:
    """Fault at start; cordoned 30 s later; rebooted and remediated at 600 s; the fault clears and the
    hold is released at 900 s; a score change on the way, which the figures pass over."""
    return [
        _event(n, "CONDITION_RAISED", node, start, actor="health-ingest", condition=XID),
        _event(n + 1, "SCORE_CHANGED", node, start + 1, actor="scorer", score=55, previous_score=100),
        _event(n + 2, "HOLD_CREATED", node, start + 30, hold=_hold(f"h{n}")),
        _event(n + 3, "NODE_EVICTED", node, start + 30, fault_class="GPU_XID_ERRORS", moved=1, failed=0),
        _event(n + 4, "REMEDIATION_STARTED", node, start + 31, remediation=wire.RemediationRecord(
            action="reboot", attempt=1, reason="GPU_XID_ERRORS")),
        _event(n + 5, "REMEDIATION_SUCCEEDED", node, start + 600, remediation=wire.RemediationRecord(
            action="reboot", attempt=1, reason="the fault's condition cleared")),
        _event(n + 6, "CONDITION_CLEARED", node, start + 600, actor="health-ingest", condition=XID),
        _event(n + 7, "HOLD_RELEASED", node, start + 900, hold=_hold(f"h{n}")),
    ]


async def _put(js: JetStreamContext, events: list[wire.NodeEvent]) -> None:
    for event in events:
        await js.publish(subjects.event(event.cluster, event.node_id, event.type), wire.encode(event))


@contextmanager
def api(nats_server: NatsServer, tmp_path: Path, name: str) -> Iterator[str]:
    """One api replica as a process; yields its metrics URL."""
    env = env_for(nats_server, "api", HEALTHPLANE_API_PORT="0", HEALTHPLANE_INSTANCE=f"test-{name}")
    process, port = spawn("api", env, tmp_path / f"{name}.log")
    try:
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, (tmp_path / f"{name}.log").read_text()[-2000:]


def _breakfix(text: str) -> dict[tuple[str, ...], float]:
    found: dict[tuple[str, ...], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("healthplane_breakfix_"):
                labels = sample.labels
                found[(sample.name, labels["cluster"], labels["fault_class"], labels.get("stage", ""))] = sample.value
    return found


async def _scrape(url: str, until: object, timeout: float = 30.0) -> dict[tuple[str, ...], float]:
    last: dict[tuple[str, ...], float] = {}
    async with httpx.AsyncClient(timeout=5) as http:
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            try:
                last = _breakfix((await http.get(url)).text)
            except httpx.TransportError:
                last = {}
            if until(last):  # type: ignore[operator]
                return last
            await asyncio.sleep(0.2)
    raise AssertionError(f"{url}: the breakfix series never showed what was wanted; last {last}")


def _stage(series: dict[tuple[str, ...], float], stage: str) -> tuple[float, float]:
    key = ("default", "gpu_xid_errors", stage)
    return series[("healthplane_breakfix_seconds_count", *key)], series[("healthplane_breakfix_seconds_sum", *key)]


async def test_breakfix_series_on_metrics_equal_on_every_replica_and_follow_new_incidents(
        nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> None:
    """Issue 41.5 (SPEC RUL "Breakfix figures"): fault → drain → remediation → back, stored before
    the api starts (replayed) and after (followed): incidents, each stage's count and seconds,
    MTTR and the time between incidents on /metrics, the same on two replicas."""
    await converge.ensure(js)
    await _put(js, incident("n1", 0, 0))
    with api(nats_server, tmp_path, "api-a") as first, api(nats_server, tmp_path, "api-b") as second:
        def one(series: dict[tuple[str, ...], float]) -> bool:
            return series.get(("healthplane_breakfix_incidents_total", "default", "gpu_xid_errors", "")) == 1

        replayed = [await _scrape(url, one) for url in (first, second)]
        assert replayed[0] == replayed[1]
        series = replayed[0]
        assert _stage(series, "out_of_service") == (1, 30)
        assert _stage(series, "remediated") == (1, 600)
        assert _stage(series, "back_in_service") == (1, 900)  # MTTR
        assert _stage(series, "between_incidents") == (0, 0)
        # The node faults again an hour after the first fault: followed live.
        await _put(js, incident("n1", 3600, 100))
        await _put(js, [_event(200, "CONDITION_RAISED", "n2", 50, actor="health-ingest", condition=XID)])

        def three(series: dict[tuple[str, ...], float]) -> bool:
            return (series.get(("healthplane_breakfix_incidents_total", "default", "gpu_xid_errors", "")) == 3
                    and _stage(series, "back_in_service")[0] == 2)

        followed = [await _scrape(url, three) for url in (first, second)]
        assert followed[0] == followed[1]
        series = followed[0]
        assert _stage(series, "out_of_service") == (2, 60)
        assert _stage(series, "back_in_service") == (2, 1800)  # MTTR 900 s
        assert _stage(series, "between_incidents") == (1, 3600)
