"""`healthplane service slurm-adapter` against a real Slurm 22.05 (slurmctld, four slurmd, munge:
tests/support/slurm.py) and a real nats-server (SLU-1..5, SLU-7). The test plays the rest of
the control plane: it writes the scorer's node views, eviction's directives and the config,
and reads what the adapter stored and what Slurm shows."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import parse_cluster_config
from healthplane.runtime.replay import read_all
from healthplane.stack.natsserver import NatsServer
from tests.support.secure import apply_config, env_for
from tests.support.service import spawn
from tests.support.slurm import SlurmCluster

pytestmark = [pytest.mark.nats, pytest.mark.slurm]
CLUSTER = "default"
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


class Adapter:
    """The service as a child process, as `up --scheduler slurm` runs it."""

    def __init__(self, server: NatsServer, slurm: SlurmCluster, tmp_path: Path, **settings: str) -> None:
        self.env = env_for(server, "slurm-adapter", None, SLURM_CONF=str(slurm.conf),
                           HEALTHPLANE_SLURM_INTERVAL_SECONDS="0.5", HEALTHPLANE_SLURM_CONFIRM_SECONDS="2",
                           **settings)
        self.log = tmp_path / "slurm-adapter.log"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Adapter:
        self.process, self.port = spawn("slurm-adapter", self.env, self.log, start_new_session=True)
        return self

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=20)

    def metrics(self) -> str:
        """The service's Prometheus text; empty while its endpoint is not up yet."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as answer:
                return str(answer.read().decode())
        except OSError:
            return ""

    def said(self) -> list[dict[str, object]]:
        lines = self.log.read_text(errors="replace").splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]


@pytest.fixture
def adapter(nats_server: NatsServer, slurm: SlurmCluster, tmp_path: Path) -> Iterator[Adapter]:
    running = Adapter(nats_server, slurm, tmp_path).start()
    try:
        yield running
    finally:
        running.stop()


def view(node: str, *holds: str, score: int | None = 90) -> wire.NodeView:
    return wire.NodeView(
        node_id=node, cluster=CLUSTER, hostname=node, status="CORDONED" if holds else "READY", health="HEALTHY",
        last_reported_at=T0, score=score, score_explanation=None, conditions=[],
        attributed_failures=wire.AttributedFailures(),
        holds=[wire.Hold(id=h, effect="cordon", reason="bad GPU", actor="policy", created_at=T0) for h in holds])


async def put(js: JetStreamContext, *records: wire.NodeView | wire.Directive) -> None:
    for record in records:
        if isinstance(record, wire.NodeView):
            await js.publish(subjects.node_view(record.cluster, record.node_id), wire.encode(record))
        else:
            await js.publish(subjects.directive(record.cluster, record.node_id), wire.encode(record))


def directive(node: str, action: wire.DirectiveAction, allocation: str | None, message: str) -> wire.Directive:
    return wire.Directive(id=f"d-{action}-{node}-{allocation}", node_id=node, cluster=CLUSTER, action=action,
                          message=message, issued_at=T0, allocation_id=allocation)


async def allocations(nc: NATS, js: JetStreamContext) -> list[wire.Allocation]:
    return [wire.decode(wire.Allocation, m.data) for m in await read_all(nc, js, "HP_ALLOCATIONS", "hp.alloc.>")]


async def until(check: Callable[[], bool] | Callable[[], Awaitable[bool]], timeout: float = 30.0,
                what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what or getattr(check, '__name__', check)}"
        await asyncio.sleep(0.2)


def drained(slurm: SlurmCluster, node: str) -> bool:
    return "DRAIN" in slurm.node(node)["state_flags"]


def reason(slurm: SlurmCluster, node: str) -> str:
    return str(slurm.node(node)["reason"])


# ---------------------------------------------------------------------------- drains (SLU-2)


async def test_a_hold_drains_with_our_reason_and_its_release_resumes(
        nc: NATS, js: JetStreamContext, slurm: SlurmCluster, adapter: Adapter) -> None:
    """SLU-2: any hold → State=DRAIN Reason="healthplane: hold …"; the last hold released →
    RESUME; POL-5 gating (score below drainBelow) drains too, naming the score."""
    await put(js, view("sim-000", "h-1"), view("sim-001", score=30), view("sim-002"))
    await until(lambda: drained(slurm, "sim-000") and drained(slurm, "sim-001"), what="the drains")
    assert reason(slurm, "sim-000") == "healthplane: hold h-1 (cordon: bad GPU)"
    assert reason(slurm, "sim-001") == "healthplane: score 30 below drainBelow 45"
    assert not drained(slurm, "sim-002")
    await put(js, view("sim-000", "h-1", "h-2"))
    await until(lambda: reason(slurm, "sim-000") == "healthplane: hold h-1 (cordon: bad GPU) (+1 more)",
                what="the reason to follow the holds")
    await put(js, view("sim-000"), view("sim-001", score=80))
    await until(lambda: not drained(slurm, "sim-000") and not drained(slurm, "sim-001"), what="the resumes")
    assert slurm.node("sim-000")["state"] == "idle"
    assert "healthplane_slurm_commands_total{command=\"drain\",result=\"ok\"}" in adapter.metrics()


async def test_a_drain_an_administrator_set_is_never_resumed_nor_overwritten(
        nc: NATS, js: JetStreamContext, slurm: SlurmCluster, adapter: Adapter) -> None:
    """SLU-2: a node drained by hand, then held and released in Healthplane, keeps the
    administrator's drain and reason."""
    slurm.drain("sim-002", "bad DIMM, ticket 4711")
    await put(js, view("sim-002", "h-9"), view("sim-003", "h-8"))
    await until(lambda: drained(slurm, "sim-003"), what="a control drain")  # the adapter has passed
    assert reason(slurm, "sim-002") == "bad DIMM, ticket 4711"
    await put(js, view("sim-002"), view("sim-003"))
    await until(lambda: not drained(slurm, "sim-003"), what="the control resume")
    await asyncio.sleep(1.5)  # three more passes
    assert drained(slurm, "sim-002") and reason(slurm, "sim-002") == "bad DIMM, ticket 4711"


async def test_an_administrators_resume_of_our_drain_releases_the_holds_as_slurm(
        nc: NATS, js: JetStreamContext, slurm: SlurmCluster, adapter: Adapter) -> None:
    """SLU-2: RESUME of our drain in Slurm is recorded (a hold-release command by actor slurm,
    which eviction turns into HOLD_RELEASED events) and the node is not drained again for
    those holds; a new hold drains it again."""
    await put(js, view("sim-001", "h-5"))
    await until(lambda: drained(slurm, "sim-001"), what="our drain")
    await asyncio.sleep(4)  # well past HEALTHPLANE_SLURM_CONFIRM_SECONDS (2), as last seen: in Slurm's saved state
    slurm.resume("sim-001")

    async def released() -> bool:
        found = await read_all(nc, js, "HP_COMMANDS", "hp.cmd.>")
        return any(m.subject == subjects.command(CLUSTER, "sim-001", "hold-release", "slurm") for m in found)

    await until(released, what="the hold-release command")
    [command] = [wire.decode(wire.Command, m.data) for m in await read_all(nc, js, "HP_COMMANDS", "hp.cmd.>")]
    assert (command.actor, command.hold_ids, command.verb) == ("slurm", ["h-5"], "hold-release")
    await asyncio.sleep(2)
    assert not drained(slurm, "sim-001"), "the adapter drained again what an administrator resumed"
    await put(js, view("sim-001", "h-5", "h-6"))
    await until(lambda: drained(slurm, "sim-001"), what="a new hold to drain again")
    assert reason(slurm, "sim-001") == "healthplane: hold h-6 (cordon: bad GPU)"


# ---------------------------------------------------------------------------- allocations (SLU-3)


async def test_slurm_jobs_become_allocations_with_their_end_states(
        nc: NATS, js: JetStreamContext, slurm: SlurmCluster, adapter: Adapter) -> None:
    """SLU-3: a running job is a started allocation on its node with user, partition, nodes and
    its requeue flag as retry declaration; COMPLETED → finished, FAILED → failed with the exit
    code; a two-node job is one allocation per node."""
    runs = slurm.sbatch("sleep 600", node="sim-000", requeue=True)
    fails = slurm.sbatch("sleep 1; exit 3", node="sim-001", requeue=False)
    done = slurm.sbatch("sleep 1", node="sim-002")
    wide = slurm.sbatch("sleep 600", nodes=2, requeue=False)

    def latest(records: list[wire.Allocation]) -> dict[tuple[str, str], wire.Allocation]:
        return {(a.job_id, a.node_id): a for a in records}

    async def settled() -> bool:
        found = latest(await allocations(nc, js))
        return (found.get((fails, "sim-001")) is not None and found[(fails, "sim-001")].state == "failed"
                and found.get((done, "sim-002")) is not None and found[(done, "sim-002")].state == "finished"
                and (runs, "sim-000") in found and sum(1 for job, _ in found if job == wide) == 2)

    await until(settled, what="the allocation records")
    found = latest(await allocations(nc, js))
    running = found[(runs, "sim-000")]
    assert (running.state, running.user, running.partition, running.nodes) == ("started", "root", "batch", ["sim-000"])
    assert (running.requeueable, running.retry_on, running.restart) == (True, ["node"], "on-node-fault")
    assert found[(fails, "sim-001")].reason == "FAILED: exit code 3"
    assert found[(fails, "sim-001")].retry_on == [] and found[(fails, "sim-001")].requeueable is False
    spread = [a for (job, _), a in found.items() if job == wide]
    assert len({a.node_id for a in spread}) == 2 and all(sorted(a.nodes or []) == sorted(a.node_id for a in spread)
                                                          for a in spread)
    counts = Counter((a.id, a.state) for a in await allocations(nc, js))
    assert max(counts.values()) == 1, f"a record written twice: {counts}"


# ---------------------------------------------------------------------------- directives (SLU-4)


async def test_directives_requeue_cancel_and_power_down(
        nc: NATS, js: JetStreamContext, slurm: SlurmCluster, adapter: Adapter) -> None:
    """SLU-4: requeue → `scontrol requeue` (Slurm runs it again: restart count 1; the old
    allocation requeued); fail → cancelled, the directive's reason on the failed record;
    requeue of a --no-requeue job → cancelled, saying so; terminate of a node that is not a
    cloud node → Slurm's refusal is the provisioner's answer."""
    movable = slurm.sbatch("sleep 600", node="sim-000", requeue=True)
    doomed = slurm.sbatch("sleep 600", node="sim-001", requeue=True)
    stuck = slurm.sbatch("sleep 600", node="sim-002", requeue=False)

    async def started() -> dict[str, wire.Allocation]:
        return {a.job_id: a for a in await allocations(nc, js) if a.state == "started"}

    await until(lambda: _has(started(), {movable, doomed, stuck}), what="three started allocations")
    running = await started()
    await put(js, directive("sim-000", "requeue", running[movable].id, "node sim-000 was drained"),
              directive("sim-001", "fail", running[doomed].id, "node sim-001 was held: bad GPU; job failed"),
              directive("sim-002", "requeue", running[stuck].id, "node sim-002 was drained"),
              directive("sim-003", "terminate", None, "replace by policy"))
    await until(lambda: (slurm.job(movable) or {}).get("restart_cnt") == 1, what="the requeue in Slurm")

    async def ended() -> bool:
        states = {(a.job_id, a.state) for a in await allocations(nc, js)}
        return {(movable, "requeued"), (doomed, "failed"), (stuck, "failed")} <= states

    await until(ended, what="the ended allocations")
    records = {(a.job_id, a.state): a for a in await allocations(nc, js)}
    assert records[(doomed, "failed")].reason == "node sim-001 was held: bad GPU; job failed"
    assert records[(stuck, "failed")].reason == (
        f"node sim-002 was drained; job {stuck} is not requeueable in Slurm, so it was cancelled")
    assert records[(movable, "requeued")].reason == "node sim-000 was drained"
    assert (slurm.job(doomed) or {})["job_state"] == "CANCELLED"

    async def answered() -> list[wire.TerminationResult]:
        return [wire.decode(wire.TerminationResult, m.data) for m in await read_all(nc, js, "HP_COMMANDS", "hp.provision.>")]

    await until(lambda: _nonempty(answered()), what="the termination answer")
    [answer] = await answered()
    assert not answer.accepted and "Slurm refused to power down sim-003" in answer.message


async def _has(found: Awaitable[dict[str, wire.Allocation]], jobs: set[str]) -> bool:
    return jobs <= set(await found)


async def _nonempty(found: Awaitable[list[wire.TerminationResult]]) -> bool:
    return bool(await found)


# ---------------------------------------------------------------------------- level-based (SLU-5)


async def test_a_drain_asked_while_slurmctld_is_down_lands_once_it_is_back(
        nc: NATS, js: JetStreamContext, slurm: SlurmCluster, adapter: Adapter) -> None:
    """SLU-5: slurmctld stopped, a hold arrives: the failed passes are retried with backoff and
    counted; once the controller is back the drain is applied."""
    await until(lambda: "healthplane_slurm_reconcile_passes_total{result=\"ok\"}" in adapter.metrics(),
                what="a first pass")
    slurm.stop_controller()
    await put(js, view("sim-003", "h-7"))
    await until(lambda: "healthplane_slurm_up 0.0" in adapter.metrics(), what="the adapter to see Slurm down")
    await asyncio.sleep(3)
    slurm.start_controller()
    await until(lambda: drained(slurm, "sim-003"), timeout=60, what="the drain after the controller returned")
    assert reason(slurm, "sim-003") == "healthplane: hold h-7 (cordon: bad GPU)"
    assert 'healthplane_slurm_reconcile_passes_total{result="failed"}' in adapter.metrics()


async def test_an_adapter_killed_mid_pass_converges_and_writes_nothing_twice(
        nc: NATS, js: JetStreamContext, slurm: SlurmCluster, nats_server: NatsServer, tmp_path: Path) -> None:
    """SLU-5, REL-1: kill -9 the adapter while it works, again and again; restarted, Slurm
    converges on what the holds require and every allocation record exists once."""
    jobs = [slurm.sbatch("sleep 600", node=node, requeue=True) for node in ("sim-000", "sim-001")]
    slurm.wait_for(lambda: all((slurm.job(j) or {}).get("job_state") == "RUNNING" for j in jobs), 30, "jobs running")
    await put(js, view("sim-000", "h-1"), view("sim-002", "h-2"))
    adapter = Adapter(nats_server, slurm, tmp_path)
    for delay in (0.8, 1.1, 1.4):
        adapter.start()
        await asyncio.sleep(delay)
        adapter.kill()
    adapter.start()
    try:
        await until(lambda: drained(slurm, "sim-000") and drained(slurm, "sim-002"), what="the drains")

        async def both_started() -> bool:
            return {a.job_id for a in await allocations(nc, js) if a.state == "started"} >= set(jobs)

        await until(both_started, what="the allocations")
        await put(js, view("sim-000"))
        await until(lambda: not drained(slurm, "sim-000"), what="the resume")
        await asyncio.sleep(1.5)
        counts = Counter((a.id, a.state) for a in await allocations(nc, js))
        assert max(counts.values()) == 1, f"a record written twice: {counts}"
        assert drained(slurm, "sim-002") and not drained(slurm, "sim-001")
    finally:
        adapter.stop()


# ---------------------------------------------------------------------------- settings (SLU-1)


def test_a_bad_node_mapping_is_one_clear_line(tmp_path: Path) -> None:
    """SLU-1: a node id template without {name} is refused at start, naming the variable."""
    done = subprocess.run([sys.executable, "-m", "healthplane.cli", "service", "slurm-adapter"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HEALTHPLANE_SLURM_NODE_ID": "node-{id}"})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "healthplane service slurm-adapter: HEALTHPLANE_SLURM_NODE_ID: value error, node id template must hold "
        "{name} exactly once (got 'node-{id}') (got 'node-{id}')"]


async def test_node_names_map_through_the_template(
        nc: NATS, js: JetStreamContext, slurm: SlurmCluster, nats_server: NatsServer, tmp_path: Path) -> None:
    """SLU-1: HEALTHPLANE_SLURM_NODE_ID={name}.cluster.example: the node id sim-000.cluster.example
    is Slurm's sim-000, both ways (drain and allocations)."""
    adapter = Adapter(nats_server, slurm, tmp_path, HEALTHPLANE_SLURM_NODE_ID="{name}.cluster.example").start()
    try:
        job = slurm.sbatch("sleep 600", node="sim-001")
        await put(js, view("sim-000.cluster.example", "h-1"))
        await until(lambda: drained(slurm, "sim-000"), what="the mapped drain")

        async def mapped() -> bool:
            return any(a.job_id == job and a.node_id == "sim-001.cluster.example" for a in await allocations(nc, js))

        await until(mapped, what="the mapped allocation")
    finally:
        adapter.stop()


async def test_config_sets_the_gate(nc: NATS, js: JetStreamContext, slurm: SlurmCluster, adapter: Adapter) -> None:
    """SLU-2, POL-5: the gate follows the applied config's drainBelow."""
    await apply_config(js, parse_cluster_config({"nodeHealth": {"cordonBelow": 80, "drainBelow": 70}}))
    await put(js, view("sim-002", score=60))
    await until(lambda: drained(slurm, "sim-002"), what="the gated drain")
    assert reason(slurm, "sim-002") == "healthplane: score 60 below drainBelow 70"
