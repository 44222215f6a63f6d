"""The reference scheduler on a real nats-server (EVI-8, POL-5, REL-1): node views, jobs and
directives in, allocation records and provisioner answers out; `sim submit` end to end."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import parse_cluster_config
from healthplane.runtime import logs, snapshots
from healthplane.runtime.connect import connect
from healthplane.runtime.fold import Inbound
from healthplane.runtime.processor import FENCE_MARKS, Processor
from healthplane.runtime.replay import read_all
from healthplane.stack.natsserver import NatsServer
from healthplane_collector.sim import Fleet
from healthplane_scheduler.fold import INPUTS, OUTPUTS, SERVICE, SchedulerCore
from healthplane_scheduler.rules import SchedulerState
from tests.support.secure import apply_config, creds_for, env_for

pytestmark = pytest.mark.nats
CLUSTER = "default"
T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def view(node: str, *, status: wire.NodeStatus = "READY", held: bool = False, score: int | None = None,
         definition: str | None = "gpu-pool") -> wire.NodeView:
    holds = [wire.Hold(id=f"hold-{node}", effect="cordon", reason="test", actor="operator", created_at=T0)] if held else []
    return wire.NodeView(node_id=node, cluster=CLUSTER, hostname=node, status=status, health="UNKNOWN",
                         last_reported_at=None, score=score, score_explanation=None, conditions=[],
                         attributed_failures=wire.AttributedFailures(), holds=holds, definition=definition)


def job(job_id: str, *, steps: int = 1, duration: float = 0.3, definition: str | None = None,
        retry: bool = False) -> wire.Job:
    return wire.Job(id=job_id, cluster=CLUSTER, steps=steps, duration_seconds=duration, submitted_at=T0,
                    submitted_by="test", retry_on=["node"] if retry else [], retry_attempts=3 if retry else 0,
                    restart="on-node-fault" if retry else "never", definition=definition)


async def put(js: JetStreamContext, *records: wire.Record) -> None:
    for record in records:
        match record:
            case wire.NodeView():
                subject = subjects.node_view(record.cluster, record.node_id)
            case wire.Job():
                subject = subjects.job(record.cluster, record.id)
            case wire.Directive():
                subject = subjects.directive(record.cluster, record.node_id)
            case wire.ProviderSetting():
                subject = subjects.provider(record.cluster, record.node_id)
            case _:
                raise AssertionError(record)
        await js.publish(subject, wire.encode(record))


async def allocations(nc: NATS, js: JetStreamContext) -> list[wire.Allocation]:
    return [wire.decode(wire.Allocation, m.data) for m in await read_all(nc, js, "HP_ALLOCATIONS", "hp.alloc.>")]


async def answers(nc: NATS, js: JetStreamContext) -> list[wire.TerminationResult]:
    return [wire.decode(wire.TerminationResult, m.data)
            for m in await read_all(nc, js, "HP_COMMANDS", "hp.provision.>")]


async def until(predicate: Callable[[], Awaitable[bool]], timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.05)


def latest(records: list[wire.Allocation]) -> dict[str, wire.Allocation]:
    out: dict[str, wire.Allocation] = {}
    for record in records:
        out[record.id] = record
    return out


@asynccontextmanager
async def scheduler(server: NatsServer, slots: int = 1) -> AsyncIterator[Processor[SchedulerState]]:
    """The scheduler's Processor in this process, as the scheduler's own identity: its
    durables are its alone (SEC-8)."""
    nc = await connect(server.url, name=SERVICE, creds=creds_for(server, SERVICE), give_up_after=5)
    js = nc.jetstream()
    proc = Processor(nc=nc, js=js, service=SERVICE, core=SchedulerCore(slots), state_type=SchedulerState,
                     inputs=INPUTS, outputs=OUTPUTS, batch=64)
    proc.tick_every_s = 0.05
    await proc.start()
    task = asyncio.create_task(proc.run())
    try:
        yield proc
    finally:
        proc.stop()
        await task
        await nc.close()


async def replayed(nc: NATS, js: JetStreamContext) -> SchedulerState:
    """The state a scheduler reaches from the streams alone, every stream folded in its order."""
    core = SchedulerCore()
    state = core.initial_state()
    for spec in INPUTS:
        filters = list(spec.filter_subjects) or list((await js.stream_info(spec.stream)).config.subjects or [])
        for msg in await read_all(nc, js, spec.stream, filters):
            if msg.subject.startswith(FENCE_MARKS):
                continue  # a lease holder's mark, not a record: the Processor passes over it too
            state, _, _ = core.step(state, Inbound(spec.stream, msg.seq, msg.subject, msg.data, {}, msg.time, True))
    return state


def settled(state: SchedulerState, core: SchedulerCore, now: datetime) -> SchedulerState:
    """After a tick every directive is obeyed or dropped; a quiet fleet emits nothing more."""
    state, emits, _ = core.tick(state, now)
    assert list(emits) == []
    return state


# ---------------------------------------------------------------------------- placement


async def test_placement_honours_status_holds_pol5_and_definitions(nats_server: NatsServer, nc: NATS, js: JetStreamContext) -> None:
    """EVI-8 and POL-5 on the bus: only READY nodes without holds, never below the definition's
    drainBelow, a node that never reported is placed on; steps finish after their duration."""
    config = parse_cluster_config({"nodeHealth": {"drainBelow": 45},
                                   "provisionerDefinitions": {"tolerant": {"nodeHealth": {"drainBelow": 20}}}})
    await apply_config(js, config)
    await put(js, view("cordoned", status="CORDONED", held=True), view("not-ready", status="NOT_READY"),
              view("offline", status="OFFLINE"), view("gated", score=40), view("never-reported", score=None),
              view("tolerant-40", score=40, definition="tolerant"), view("cpu", definition="cpu-pool"))
    async with scheduler(nats_server) as proc:
        await put(js, job("gpu-work", steps=3, duration=0.5, definition="gpu-pool"), job("any", steps=3, duration=0.5))

        async def all_finished() -> bool:
            found = latest(await allocations(nc, js))
            return len(found) == 6 and all(a.state == "finished" for a in found.values())

        await until(all_finished)
        assert proc.state.done == {f"{CLUSTER}\x00gpu-work": "finished", f"{CLUSTER}\x00any": "finished"}
    records = await allocations(nc, js)
    nodes = {a.node_id for a in records}
    assert nodes <= {"never-reported", "tolerant-40", "cpu"}
    assert {a.node_id for a in records if a.job_id == "gpu-work"} == {"never-reported"}  # one gpu-pool node open
    for alloc_id in latest(records):
        lifecycle = [(a.state, a.at) for a in records if a.id == alloc_id]
        assert [s for s, _ in lifecycle] == ["placed", "started", "finished"]
        assert lifecycle[2][1] - lifecycle[1][1] >= timedelta(seconds=0.5)


# ---------------------------------------------------------------------------- directives


async def test_requeue_and_fail_directives_are_obeyed(nats_server: NatsServer, nc: NATS, js: JetStreamContext) -> None:
    """EVI-8: requeue -> `requeued` with the message and the step placed elsewhere with
    node_fault_restarts + 1; fail -> `failed` with the message, the job failed, no retry."""
    await put(js, view("n1"), view("n2"), view("n3"))
    async with scheduler(nats_server) as proc:
        await put(js, job("j1", steps=2, duration=60, retry=True))

        async def both_started() -> bool:
            return sum(a.state == "started" for a in await allocations(nc, js)) == 2

        await until(both_started)
        running = {a.id: a for a in await allocations(nc, js) if a.state == "started"}
        first, second = running["j1.0.0"], running["j1.1.0"]
        await put(js, wire.Directive(id="d1", node_id=first.node_id, cluster=CLUSTER, action="requeue",
                                     message=f"node {first.node_id} was held: failing disk; requeued", issued_at=T0,
                                     allocation_id=first.id),
                  wire.Directive(id="d2", node_id=second.node_id, cluster=CLUSTER, action="fail",
                                 message=f"node {second.node_id} was held: failing disk; job failed", issued_at=T0,
                                 allocation_id=second.id))

        async def moved() -> bool:
            return any(a.id == "j1.0.1" and a.state == "started" for a in await allocations(nc, js))

        await until(moved)
        state = proc.state
    found = latest(await allocations(nc, js))
    assert found["j1.0.0"].state == "requeued" and found["j1.0.0"].reason == f"node {first.node_id} was held: failing disk; requeued"
    assert found["j1.1.0"].state == "failed" and found["j1.1.0"].reason == f"node {second.node_id} was held: failing disk; job failed"
    again = found["j1.0.1"]
    assert again.node_id not in (first.node_id,) and again.node_fault_restarts == 1
    assert (again.retry_on, again.retry_attempts, again.restart) == (["node"], 3, "on-node-fault")
    assert "j1.1.1" not in found  # a failed step is not retried
    assert state.jobs[f"{CLUSTER}\x00j1"].failed


async def test_terminate_is_answered_rejected_on_request_and_the_node_is_never_used_again(nats_server: NatsServer,
        nc: NATS, js: JetStreamContext) -> None:
    """EVI-8: the scheduler plays the provisioner of the simulated fleet."""
    await put(js, view("n1"), view("n2"))
    async with scheduler(nats_server):
        refusal = "RequestLimitExceeded: Request limit exceeded."
        await put(js, wire.ProviderSetting(node_id="n1", cluster=CLUSTER, reject_terminations=True, message=refusal,
                                           set_at=T0, actor="test"),
                  wire.Directive(id="t1", node_id="n1", cluster=CLUSTER, action="terminate", message="replace",
                                 issued_at=T0))

        def answered(count: int) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                return len(await answers(nc, js)) >= count
            return check

        await until(answered(1))
        await put(js, wire.ProviderSetting(node_id="n1", cluster=CLUSTER, reject_terminations=False,
                                           set_at=T0, actor="test"),
                  wire.Directive(id="t2", node_id="n1", cluster=CLUSTER, action="terminate", message="replace",
                                 issued_at=T0))
        await until(answered(2))
        await put(js, job("after", steps=2, duration=60))

        async def placed() -> bool:
            return len(await allocations(nc, js)) >= 1

        await until(placed)
        await asyncio.sleep(0.3)  # several ticks: the second step must still be waiting
    found = await answers(nc, js)
    assert [(a.directive_id, a.accepted, a.message) for a in found] == [
        ("t1", False, refusal), ("t2", True, "instance n1 terminated")]
    assert {a.node_id for a in await allocations(nc, js)} == {"n2"}


# ---------------------------------------------------------------------------- restart safety


async def test_stopped_mid_run_and_restarted_nothing_is_emitted_twice(nats_server: NatsServer, nc: NATS, js: JetStreamContext) -> None:
    """REL-1: a scheduler stopped in the middle of a run and a new one started from its snapshot
    emit every allocation record once, and end in the state a full replay reaches."""
    await put(js, *[view(f"n{i}") for i in range(6)])
    await put(js, *[job(f"j{i:02d}", steps=2, duration=0.2) for i in range(30)])
    async with scheduler(nats_server):
        async def some() -> bool:
            return len(await allocations(nc, js)) >= 25

        await until(some)
    at_stop = latest(await allocations(nc, js))
    assert sum(a.state == "finished" for a in at_stop.values()) < 60  # stopped in the middle
    # A directive while it is down: obeyed once, by the next one.
    running = [a for a in at_stop.values() if a.state in ("placed", "started")]
    assert running
    await put(js, wire.Directive(id="while-down", node_id=running[0].node_id, cluster=CLUSTER, action="requeue",
                                 message="requeued while the scheduler was down", issued_at=T0,
                                 allocation_id=running[0].id))
    async with scheduler(nats_server) as proc:
        async def done() -> bool:
            return len(proc.state.done) == 30 and not proc.state.jobs

        await until(done, timeout=30)
    records = await allocations(nc, js)
    repeats = [k for k, n in Counter((a.id, a.state) for a in records).items() if n > 1]
    assert repeats == []
    assert len([a for a in records if a.state == "finished"]) == 60
    assert [a.reason for a in records if a.state == "requeued"] == ["requeued while the scheduler was down"]
    core = SchedulerCore()
    far = datetime.now(UTC) + timedelta(hours=1)
    assert settled(await replayed(nc, js), core, far) == settled(proc.state, SchedulerCore(), far)


def start_scheduler(server: NatsServer, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "healthplane.cli", "service", "scheduler"],
                            env={**env_for(server, "scheduler"),
                                 "HEALTHPLANE_SCHEDULER_TICK_SECONDS": "0.05"},
                            stdout=subprocess.DEVNULL, stderr=open(log, "ab"))


async def test_kill_9_mid_run_and_restart(nats_server: NatsServer, nc: NATS, js: JetStreamContext,
                                          tmp_path: Path) -> None:
    """REL-1: kill -9 while allocations are being written; the next process emits nothing twice,
    finishes the work, and its snapshot equals a full replay of the streams."""
    await put(js, *[view(f"n{i}") for i in range(5)])
    await put(js, *[job(f"k{i:02d}", steps=2, duration=0.2) for i in range(25)])
    first = start_scheduler(nats_server, tmp_path / "first.log")
    try:
        async def some() -> bool:
            return len(await allocations(nc, js)) >= 30

        await until(some, timeout=90)  # a process's start on a loaded 2-core machine: seconds, not a deadline
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert sum(a.state == "finished" for a in await allocations(nc, js)) < 50  # killed in the middle
    second = start_scheduler(nats_server, tmp_path / "second.log")
    try:
        async def all_finished() -> bool:
            return sum(a.state == "finished" for a in await allocations(nc, js)) >= 50

        await until(all_finished, timeout=90)
        await asyncio.sleep(0.3)
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(20) == 0
    records = await allocations(nc, js)
    assert [k for k, n in Counter((a.id, a.state) for a in records).items() if n > 1] == []
    assert sum(a.state == "finished" for a in records) == 50
    found = await snapshots.load(js, SERVICE, 0)
    assert found is not None
    restored = msgspec.json.decode(found[1], type=SchedulerState)
    far = datetime.now(UTC) + timedelta(hours=1)
    assert settled(await replayed(nc, js), SchedulerCore(), far) == settled(restored, SchedulerCore(), far)


# ---------------------------------------------------------------------------- the CLI


def cli(server: NatsServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "healthplane.cli", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "HEALTHPLANE_NATS_URL": server.url})


async def test_sim_submit_end_to_end(nats_server: NatsServer, nc: NATS, js: JetStreamContext,
                                     tmp_path: Path) -> None:
    """EVI-8: `sim submit` appends jobs a running scheduler places and runs; `sim jobs` shows them."""
    await put(js, view("sim-000"), view("sim-001"))
    process = start_scheduler(nats_server, tmp_path / "scheduler.log")
    try:
        submitted = await asyncio.to_thread(cli, nats_server, "sim", "submit", "--steps", "2", "--duration", "0.5",
                                            "--retry-on", "node", "--retry-attempts", "2", "--restart",
                                            "on-node-fault", "--count", "2", "-o", "json")
        assert submitted.returncode == 0, submitted.stderr
        jobs = json.loads(submitted.stdout)
        assert [(j["steps"], j["retryOn"], j["retryAttempts"], j["restart"]) for j in jobs] == [
            (2, ["node"], 2, "on-node-fault")] * 2

        async def finished() -> bool:
            shown = await asyncio.to_thread(cli, nats_server, "sim", "jobs", "-o", "json")
            return [j["state"] for j in json.loads(shown.stdout)] == ["finished", "finished"]

        await until(finished, timeout=30)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(20)
    listed = json.loads((await asyncio.to_thread(cli, nats_server, "sim", "jobs", "-o", "json")).stdout)
    assert sorted(j["id"] for j in listed) == sorted(j["id"] for j in jobs)
    assert all(len(j["allocations"]) == 2 and {a["state"] for a in j["allocations"]} == {"finished"} for j in listed)
    text = (await asyncio.to_thread(cli, nats_server, "sim", "jobs")).stdout.splitlines()
    assert text[0].split() == ["JOB", "STEP", "STATE", "NODE", "ALLOCATION", "RESTARTS", "REASON"]
    assert len(text) == 5 and all(" finished " in line for line in text[1:])
    plain = await asyncio.to_thread(cli, nats_server, "sim", "submit")
    assert plain.returncode == 0 and plain.stdout.strip().startswith("job-")
    bad = await asyncio.to_thread(cli, nats_server, "sim", "submit", "--steps", "0")
    assert bad.returncode == 2 and "--steps must be at least 1" in bad.stderr


async def test_sim_provider_reject_is_what_the_scheduler_answers(nats_server: NatsServer, nc: NATS,
                                                                 js: JetStreamContext) -> None:
    """`sim provider reject NODE --message` is the simulated provider's answer to a terminate."""
    said = await asyncio.to_thread(cli, nats_server, "sim", "provider", "reject", "sim-003", "--message",
                                   "InsufficientInstanceCapacity: try again later")
    assert said.returncode == 0 and "reject terminations of sim-003" in said.stdout
    async with scheduler(nats_server):
        await put(js, wire.Directive(id="t1", node_id="sim-003", cluster=CLUSTER, action="terminate",
                                     message="deprovision --force by operator", issued_at=T0))

        async def answered() -> bool:
            return len(await answers(nc, js)) == 1

        await until(answered)
    (answer,) = await answers(nc, js)
    assert (answer.accepted, answer.message) == (False, "InsufficientInstanceCapacity: try again later")


async def test_an_accepted_termination_silences_the_simulated_node(nats_server: NatsServer, nc: NATS,
                                                                    js: JetStreamContext) -> None:
    """The provisioner's accepted termination means the instance is gone: its simulated node
    stops reporting. The fleet runs as the simulator's identity, as under `up`."""
    fleet = Fleet(2, CLUSTER, interval_s=1)
    stopping = asyncio.Event()
    sim = await connect(nats_server.url, name="sim", creds=creds_for(nats_server, "sim", CLUSTER), give_up_after=5)
    running = asyncio.create_task(fleet.run(sim, stopping, logs.get(service="sim")))
    try:
        result = wire.TerminationResult(directive_id="t1", node_id="sim-001", cluster=CLUSTER, accepted=True,
                                        message="instance sim-001 terminated", at=T0)
        # Said again until heard: on a loaded machine the fleet may subscribe after the first.
        async with asyncio.timeout(30):
            while not fleet.nodes["sim-001"].silent:
                await js.publish(subjects.provision(CLUSTER, "sim-001"), wire.encode(result))
                await asyncio.sleep(0.3)
        assert not fleet.nodes["sim-000"].silent
    finally:
        stopping.set()
        await asyncio.wait_for(running, 10)
        await sim.close()
