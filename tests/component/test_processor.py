"""The event-sourced runtime on a toy service: exactly-once emit after kill -9 (REL-1),
replay equals live state, malformed inputs never block (REL-3)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.runtime import converge
from healthplane.runtime.connect import connect
from healthplane.runtime.fold import Emit, Inbound
from healthplane.stack.natsserver import NatsServer
from tests.support import toy

# The runtime on streams of the test's own, outside the product's stream table: no product
# identity may touch those (SEC-1 gives each only its own subjects), so this module's servers
# run open. Every product stream and service is tested with auth on elsewhere.
pytestmark = [pytest.mark.nats, pytest.mark.insecure]
ROOT = Path(__file__).resolve().parents[2]


_outputs = toy.outputs


def _assert_exactly_once(outputs: list[dict[str, object]], inputs: list[bytes]) -> None:
    expected = toy.fold(inputs)
    by_key: dict[str, list[int]] = defaultdict(list)
    for out in outputs:
        by_key[str(out["key"])].append(int(out["count"]))  # type: ignore[call-overload]
    # Every valid input produced exactly one output, in order: counts are 1..n per key.
    assert {k: sorted(v) for k, v in by_key.items()} == {k: list(range(1, n + 1)) for k, n in expected.counts.items()}
    causes = [out["cause"] for out in outputs]
    assert len(causes) == len(set(causes))


def _inputs(count: int) -> list[bytes]:
    # Every 97th input is malformed: it is rejected and the ones behind it still count.
    return [b"{not json" if i % 97 == 0 else msgspec.json.encode({"key": f"k{i % 5}"}) for i in range(count)]


async def _toy_bus(nats_server: NatsServer, suffix: str, inputs: list[bytes], **options: Any,
                   ) -> tuple[NATS, JetStreamContext]:
    """A client, the product's streams and the toy's (``options``: ensure_toy_streams'), and
    ``inputs`` published to the toy's."""
    nc = await connect(nats_server.url, name="test", give_up_after=5)
    js = nc.jetstream()
    await converge.ensure(js)
    await toy.ensure_toy_streams(js, suffix, **options)
    await _publish(js, inputs, suffix)
    return nc, js


async def _publish(js: JetStreamContext, inputs: list[bytes], suffix: str = "") -> None:
    futures = [await js.publish_async(f"toy{suffix}.in.x", data) for data in inputs]
    await asyncio.gather(*futures)


async def test_exactly_once_after_kill_9_mid_batch(nats_server: NatsServer, tmp_path: Path) -> None:
    # REL-1: kill -9 in the middle of the work; on restart nothing is lost, nothing is
    # emitted twice, even with the de-duplication window too short to help.
    nc = await connect(nats_server.url, name="test", give_up_after=5)
    js = nc.jetstream()
    await converge.ensure(js)
    await toy.ensure_toy_streams(js, duplicate_window=0.1)
    inputs = _inputs(6000)
    await _publish(js, inputs)

    def start(log: Path) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "tests.support.toy", nats_server.url, "700"],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))

    first = start(tmp_path / "first.log")
    async with asyncio.timeout(30):
        while (await js.stream_info("TOY_OUT")).state.messages < 2500:
            await asyncio.sleep(0.01)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    killed_at = (await js.stream_info("TOY_OUT")).state.messages
    await asyncio.sleep(0.3)  # past the duplicate window

    second = start(tmp_path / "second.log")
    valid = sum(1 for i in range(6000) if i % 97)
    async with asyncio.timeout(30):
        while (await js.stream_info("TOY_OUT")).state.messages < valid:
            await asyncio.sleep(0.05)
    second.send_signal(signal.SIGTERM)
    assert second.wait(15) == 0
    outputs = await _outputs(js)
    await nc.close()

    assert killed_at < valid
    _assert_exactly_once(outputs, inputs)
    restart_log = (tmp_path / "second.log").read_text()
    [restored] = [json.loads(line) for line in restart_log.splitlines() if '"snapshot restored"' in line]
    # The restart skipped what the first life emitted after its last snapshot, when it had
    # emitted anything after it (a kill can land right after a snapshot).
    emitted_by_snapshot = sum(1 for i in range(restored["positions"]["TOY_IN"]) if i % 97)
    if killed_at > emitted_by_snapshot:
        assert "outputs already in the streams" in restart_log


@pytest.mark.timeout(300)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    count=st.integers(min_value=1, max_value=400),
    stops=st.lists(st.tuples(st.integers(min_value=1, max_value=400), st.booleans()), max_size=3),
    snapshot_every=st.integers(min_value=1, max_value=150),
)
def test_replay_equals_live_state(nats_server: NatsServer, count: int, stops: list[tuple[int, bool]],
                                  snapshot_every: int) -> None:
    # Whatever the crashes (connection cut, no snapshot) and clean stops along the way, the
    # state after the last restart equals the pure fold of every input, and every output
    # exists exactly once.
    suffix = f"x{os.urandom(4).hex()}"
    inputs = _inputs(count)

    async def scenario() -> None:
        admin = await connect(nats_server.url, name="admin", give_up_after=5)
        js = admin.jetstream()
        await converge.ensure(js)
        await toy.ensure_toy_streams(js, suffix, duplicate_window=0.1)
        await _publish(js, inputs, suffix)
        for stop_after, clean in sorted(stops):
            nc = await connect(nats_server.url, name="life", give_up_after=5)
            proc = toy.processor(nc, nc.jetstream(), suffix, snapshot_every=snapshot_every, batch=16)
            await proc.start()
            task = asyncio.create_task(proc.run())
            async with asyncio.timeout(20):
                while proc.positions.get(f"TOY_IN{suffix}", 0) < min(stop_after, count):
                    await asyncio.sleep(0.002)
            if clean:
                proc.stop()
                await task
            else:
                await nc.close()
                await asyncio.gather(task, return_exceptions=True)
            await nc.close()
            await asyncio.sleep(0.12)
        nc = await connect(nats_server.url, name="last", give_up_after=5)
        assert await _restart_to(nc, nc.jetstream(), suffix, count, snapshot_every) == toy.fold(inputs)
        _assert_exactly_once(await _outputs(js, suffix), inputs)
        await nc.close()
        await admin.close()

    asyncio.run(scenario())


async def _fold_then_crash(url: str, suffix: str, count: int, snapshot_every: int, pairs: bool = False,
                           written: int = 0) -> None:
    """A life of the toy service that folds ``count`` inputs (and, with ``written``, has
    stored that many outputs: a fold's position moves before its batch's write) and then
    dies: its connection cut, no snapshot at the end."""
    life = await connect(url, name="life", give_up_after=5)
    js = life.jetstream()
    proc = toy.processor(life, js, suffix, snapshot_every=snapshot_every, batch=16, pairs=pairs)
    await proc.start()
    task = asyncio.create_task(proc.run())
    async with asyncio.timeout(20):
        while proc.positions.get(f"TOY_IN{suffix}", 0) < count or (
                written and (await js.stream_info(f"TOY_OUT{suffix}")).state.messages < written):
            await asyncio.sleep(0.01)
    await life.close()
    await asyncio.gather(task, return_exceptions=True)


async def _restart_to(nc, js: JetStreamContext, suffix: str, count: int, snapshot_every: int,  # type: ignore[no-untyped-def]
                      pairs: bool = False) -> toy.ToyState:
    """The next life: start, fold up to ``count`` inputs, stop cleanly; its state."""
    again = toy.processor(nc, js, suffix, snapshot_every=snapshot_every, batch=16, pairs=pairs)
    return await toy.run_until_folded(again, suffix, count, timeout_s=20)


@pytest.mark.parametrize("snapshot_every", [10**9, 100])
async def test_restart_does_not_put_replaced_outputs_back(nats_server: NatsServer, snapshot_every: int) -> None:
    """REL-1 with an output stream that keeps the latest record per subject (assessments,
    node views): after a crash, refolding inputs whose outputs later ones replaced emits
    nothing, so the latest record of every subject stays the newest one. Found by the
    1,000,000-report restart benchmark: every replaced assessment came back, stale, on top."""
    suffix = f"latest{snapshot_every}"
    inputs = [msgspec.json.encode({"key": f"k{i % 5}"}) for i in range(250)]
    nc, js = await _toy_bus(nats_server, suffix, inputs, duplicate_window=0.1, latest_per_key=True)

    await _fold_then_crash(nats_server.url, suffix, len(inputs), snapshot_every=snapshot_every)
    stored = (await js.stream_info(f"TOY_OUT{suffix}")).state.last_seq
    await asyncio.sleep(0.3)  # past the duplicate window: only the scan can stop a re-emit

    assert await _restart_to(nc, js, suffix, len(inputs), snapshot_every=snapshot_every) == toy.fold(inputs)
    assert (await js.stream_info(f"TOY_OUT{suffix}")).state.last_seq == stored  # nothing emitted again
    latest = {str(out["key"]): out["count"] for out in await _outputs(js, suffix)}
    assert latest == {f"k{k}": 50 for k in range(5)}  # the newest count of each key, not an older one
    await nc.close()


async def test_a_write_cut_short_by_a_crash_is_completed_on_restart(nats_server: NatsServer) -> None:
    """REL-1: a crash in the middle of writing a batch leaves the server a prefix of it, so the
    last input found may have only some of its outputs stored (an event and not its
    assessment). The restart emits the rest of that input's outputs, and nothing twice."""
    suffix = "cut"
    inputs = [msgspec.json.encode({"key": f"k{i % 3}"}) for i in range(10)]
    nc, js = await _toy_bus(nats_server, suffix, inputs, duplicate_window=0.1)

    await _fold_then_crash(nats_server.url, suffix, len(inputs), snapshot_every=10**9, pairs=True,
                           written=2 * len(inputs))
    # The cut: the server kept the last input's output and not its echo.
    last = (await js.stream_info(f"TOY_OUT{suffix}")).state.last_seq
    assert last == 2 * len(inputs)
    await js.delete_msg(f"TOY_OUT{suffix}", last)
    await asyncio.sleep(0.3)  # past the duplicate window

    assert await _restart_to(nc, js, suffix, len(inputs), snapshot_every=10**9, pairs=True) == toy.fold(inputs)
    outputs = [(out["cause"], bool(out.get("echo"))) for out in await _outputs(js, suffix)]
    assert sorted(outputs) == sorted((seq, echo) for seq in range(1, len(inputs) + 1) for echo in (False, True))
    await nc.close()


class _Watching(toy.ToyCore):
    """The toy core, noting whether each input reached it as caught up."""

    def __init__(self, suffix: str) -> None:
        super().__init__(f"toy{suffix}.out")
        self.seen: list[bool] = []

    def step(self, state: toy.ToyState, inbound: Inbound) -> tuple[toy.ToyState, Sequence[Emit]]:
        self.seen.append(inbound.caught_up)
        return super().step(state, inbound)


async def test_issue25_a_live_burst_is_caught_up_though_records_are_pending(nats_server: NatsServer) -> None:
    # Issue 25: under a fleet's steady flow something is always pending; a fold of records
    # stored a moment ago is caught up (its /readyz says so, its ticks run), not "replaying".
    nc = await connect(nats_server.url, name="test", give_up_after=5)
    js = nc.jetstream()
    await converge.ensure(js)
    await toy.ensure_toy_streams(js, suffix="burst")
    core = _Watching("burst")
    proc = toy.processor(nc, js, "burst", snapshot_every=10**9, batch=20, core=core)
    await proc.start()
    task = asyncio.create_task(proc.run())
    try:
        await _publish(js, [msgspec.json.encode({"key": f"k{i % 5}"}) for i in range(2000)], "burst")
        async with asyncio.timeout(30):
            while len(core.seen) < 2000:
                await asyncio.sleep(0.01)
        assert proc.caught_up
        assert all(core.seen), f"{core.seen.count(False)} of 2000 live inputs folded as if replaying"
    finally:
        proc.stop()
        await task
        await nc.close()


async def test_rel1_a_snapshot_of_another_versions_state_is_replayed_over_not_a_crash(nats_server: NatsServer) -> None:
    # REL-1 across an upgrade: a snapshot whose state this version cannot read is set aside
    # with a warning naming why, and the state is rebuilt from the streams, every input once.
    from healthplane.runtime import snapshots

    suffix = "oldstate"
    inputs = [msgspec.json.encode({"key": f"k{i % 3}"}) for i in range(30)]
    nc, js = await _toy_bus(nats_server, suffix, inputs)
    await snapshots.save(js, service=f"toy{suffix}", partition=0, taken_at=datetime.now(UTC),
                         positions={f"TOY_IN{suffix}": 20}, outputs={}, previous_slot=None,
                         state_json=msgspec.json.encode({"counts": [["k0", "seven"]]}))
    warnings: list[tuple[str, dict[str, object]]] = []

    class Log:
        def warning(self, event: str, **fields: object) -> None:
            warnings.append((event, fields))

        def __getattr__(self, name: str) -> object:
            return lambda *args, **kwargs: None

    proc = toy.processor(nc, js, suffix, snapshot_every=10**9, log=Log())
    assert await toy.run_until_folded(proc, suffix, len(inputs)) == toy.fold(inputs)
    assert [event for event, _ in warnings] == ["snapshot unusable, replaying from the start"]
    assert "does not decode" in str(warnings[0][1]["reason"])
    await nc.close()


class _StopAt(toy.ToyCore):
    """The toy core, stopping its processor once it folds input ``at``."""

    def __init__(self, suffix: str, at: int) -> None:
        super().__init__(f"toy{suffix}.out")
        self.at = at
        self.processor: Any = None

    def step(self, state: toy.ToyState, inbound: Inbound) -> tuple[toy.ToyState, Sequence[Emit]]:
        if inbound.seq == self.at:
            self.processor.stop()
        return super().step(state, inbound)


async def test_rel1_a_snapshot_taken_mid_refold_sends_the_next_restart_where_this_one_looked(
        nats_server: NatsServer) -> None:
    # REL-1: a restart refolds inputs whose outputs the streams hold already. A snapshot taken
    # before that refold passed them all (a stop, or a periodic one and then a crash) must
    # send the next restart looking for those outputs where this one did: past the streams'
    # ends it finds none, and emits them all again.
    suffix = "midrefold"
    inputs = [msgspec.json.encode({"key": f"k{i % 4}"}) for i in range(600)]
    nc, js = await _toy_bus(nats_server, suffix, inputs, duplicate_window=0.1)
    await _fold_then_crash(nats_server.url, suffix, len(inputs), snapshot_every=10**9)  # no snapshot
    await asyncio.sleep(0.3)  # past the duplicate window

    core = _StopAt(suffix, 100)
    refold = core.processor = toy.processor(nc, js, suffix, snapshot_every=10**9, batch=16, core=core)
    await refold.start()
    await refold.run()  # stops at input 100 of 600, and snapshots there
    assert refold.positions[f"TOY_IN{suffix}"] < len(inputs)

    assert await _restart_to(nc, js, suffix, len(inputs), snapshot_every=10**9) == toy.fold(inputs)
    _assert_exactly_once(await _outputs(js, suffix), inputs)
    await nc.close()


async def test_rel1_a_clean_stop_with_the_bus_gone_is_prompt_and_the_restart_refolds(nats_server: NatsServer) -> None:
    """REL-1: a service told to stop while its server is down stops at once, without the
    snapshot it cannot store (it used to wait out the stream-info request and the ack, 7 s
    and more, until its supervisor killed it); back up, the restart refolds from the last
    snapshot stored and ends with the same state, every output once."""
    suffix = "busgone"
    inputs = _inputs(300)
    nc, js = await _toy_bus(nats_server, suffix, inputs, duplicate_window=0.1)
    life = await connect(nats_server.url, name="life", give_up_after=5)
    proc = toy.processor(life, life.jetstream(), suffix, snapshot_every=100, batch=16)
    await proc.start()
    running = asyncio.create_task(proc.run())
    async with asyncio.timeout(20):
        while proc.positions.get(f"TOY_IN{suffix}", 0) < len(inputs):
            await asyncio.sleep(0.01)
    await asyncio.to_thread(nats_server.stop)
    async with asyncio.timeout(5):
        while life.is_connected:
            await asyncio.sleep(0.02)
    stop_at = asyncio.get_running_loop().time()
    proc.stop()
    await asyncio.wait_for(running, 10)
    assert asyncio.get_running_loop().time() - stop_at < 1.5
    await life.close()

    await asyncio.to_thread(nats_server.start)
    async with asyncio.timeout(15):
        while not nc.is_connected:
            await asyncio.sleep(0.05)
    again = await connect(nats_server.url, name="again", give_up_after=5)
    assert await _restart_to(again, again.jetstream(), suffix, len(inputs), 100) == toy.fold(inputs)
    _assert_exactly_once(await _outputs(js, suffix), inputs)
    await again.close()
    await nc.close()
