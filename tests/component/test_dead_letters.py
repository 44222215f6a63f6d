"""Inputs a service cannot process are set aside, never retried forever and never lost
(issue 16.2, REL-3): each lands in HP_DEAD_LETTERS with why, the inputs behind it go on,
and the state equals a replay without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence

import msgspec
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.runtime import converge, deadletters, metrics
from healthplane.runtime.connect import connect
from healthplane.stack.natsserver import NatsServer
from tests.support import toy

# The runtime on streams of the test's own, outside the product's stream table: no product
# identity may touch those (SEC-1 gives each only its own subjects), so this module's servers
# run open. Every product stream and service is tested with auth on elsewhere.
pytestmark = [pytest.mark.nats, pytest.mark.insecure]


def _inputs(keys: Sequence[str]) -> list[bytes]:
    return [msgspec.json.encode({"key": key}) for key in keys]


async def _setup(js: JetStreamContext, inputs: list[bytes]) -> str:
    suffix = f"d{os.urandom(3).hex()}"
    await converge.ensure(js)
    await toy.ensure_toy_streams(js, suffix)
    for data in inputs:
        await js.publish(f"toy{suffix}.in.x", data)
    return suffix


async def _run_to_end(nc: NATS, js: JetStreamContext, suffix: str, count: int, core: toy.ToyCore,
                      snapshot_every: int = 10**9) -> toy.ToyState:
    proc = toy.processor(nc, js, suffix, snapshot_every=snapshot_every, batch=8, core=core)
    return await toy.run_until_folded(proc, suffix, count)


_outputs = toy.outputs


@pytest.mark.parametrize(("broken", "reason", "error"), [
    ("raises_on", "error", "RuntimeError: cannot fold bad"),
    ("oversized_on", "refused", "exceeds the server"),
    ("stray_on", "refused", "no stream stores this subject"),
])
async def test_one_input_the_service_cannot_process_is_set_aside(nc: NATS, broken: str, reason: str,
                                                                 error: str) -> None:
    # Issue 16.2: a core that raises halfway through a change, an output too large for any
    # server, an output on a subject no stream takes: the one input is dead-lettered and
    # acked, every input behind it is folded, the state is the replay that skips it.
    js = nc.jetstream()
    keys = [f"k{i % 3}" for i in range(40)]
    keys[17] = "bad"
    inputs = _inputs(keys)
    suffix = await _setup(js, inputs)
    before = metrics.DEAD_LETTERS.labels(f"toy{suffix}", reason)._value.get()
    core = toy.ToyCore(f"toy{suffix}.out", **{broken: "bad"})  # type: ignore[arg-type]

    state = await _run_to_end(nc, js, suffix, len(inputs), core)

    assert state == toy.fold(inputs, without=[18])
    [dead] = await deadletters.read(nc, js, f"toy{suffix}")
    assert (dead.input_stream, dead.input_seq, dead.reason) == (f"TOY_IN{suffix}", 18, reason)
    assert error in dead.error and dead.payload == inputs[17] and not dead.truncated
    assert metrics.DEAD_LETTERS.labels(f"toy{suffix}", reason)._value.get() == before + 1
    outputs = await _outputs(js, suffix)
    assert sorted(int(o["cause"]) for o in outputs) == [s for s in range(1, 41) if s != 18]  # once each
    info = await js.consumer_info(f"TOY_IN{suffix}", f"toy{suffix}.0-TOY_IN{suffix}".replace(".", "_"))
    assert info.num_ack_pending == 0 and info.num_pending == 0  # nothing left to redeliver


async def test_a_restart_passes_over_dead_letters(nc: NATS) -> None:
    # Issue 16.2: replayed from the start (no snapshot), the dead-lettered input is not folded
    # again, not dead-lettered twice, and nothing is emitted twice.
    js = nc.jetstream()
    inputs = _inputs(["a", "bad", "b", "a", "bad", "c"])
    suffix = await _setup(js, inputs)
    core = toy.ToyCore(f"toy{suffix}.out", raises_on="bad")
    await _run_to_end(nc, js, suffix, len(inputs), core)
    await js.purge_stream("HP_SNAPSHOTS", subject=f"hp.snapshot.toy{suffix}.>")

    again = await _run_to_end(nc, js, suffix, len(inputs), toy.ToyCore(f"toy{suffix}.out", raises_on="bad"))

    assert again == toy.fold(inputs, without=[2, 5])
    assert [d.input_seq for d in await deadletters.read(nc, js, f"toy{suffix}")] == [2, 5]
    assert sorted(int(o["cause"]) for o in await _outputs(js, suffix)) == [1, 3, 4, 6]


async def test_malformed_inputs_are_dead_letters_without_a_rebuild(nc: NATS) -> None:
    # REL-3: a malformed record is rejected before it changes anything: set aside, counted.
    js = nc.jetstream()
    inputs = [*_inputs(["a", "b"]), b"{not json", *_inputs(["a"])]
    suffix = await _setup(js, inputs)
    proc = toy.processor(nc, js, suffix, snapshot_every=10**9, batch=8)
    await toy.run_until_folded(proc, suffix, len(inputs))
    assert proc.rebuilds == 0 and proc.state == toy.fold(inputs)
    [dead] = await deadletters.read(nc, js, f"toy{suffix}")
    assert (dead.input_seq, dead.reason, dead.payload) == (3, "malformed", b"{not json")


async def test_an_input_as_large_as_the_server_takes_still_fits(nats_server: NatsServer) -> None:
    # A dead letter's headers cannot push it over the limit: its payload is cut and marked.
    record = deadletters.record(service="s", producer="s.0", input_stream="HP_REPORTS", input_seq=7,
                                input_subject="hp.report.c.n", payload=b"x" * (1024 * 1024), reason="error",
                                error="boom\nwith a second line", max_payload=1024 * 1024)
    subject, payload, headers = record
    assert subject == "hp.dead.s.HP_REPORTS" and headers[deadletters.TRUNCATED] == "true"
    assert len(payload) == 1024 * 1024 - deadletters.HEADROOM_BYTES and headers[deadletters.ERROR] == "boom with a second line"
    nc = await connect(nats_server.url, name="t", give_up_after=5)
    js = nc.jetstream()
    await converge.ensure(js)
    await js.publish(subject, payload, headers=headers)
    [dead] = await deadletters.read(nc, js, "s")
    assert dead.truncated and dead.input_seq == 7
    await nc.close()


def _cli(server: NatsServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "healthplane.cli", "dead-letters", *args, "--nats-url", server.url],
                          capture_output=True, text=True, timeout=60)


async def test_dead_letters_list_and_replay(nats_server: NatsServer, nc: NATS) -> None:
    # Issue 16.2: `dead-letters list` shows what was set aside; `replay ID` sends the input
    # again once fixed, and the fixed service folds it.
    js = nc.jetstream()
    inputs = _inputs(["a", "bad", "b"])
    suffix = await _setup(js, inputs)
    await _run_to_end(nc, js, suffix, 3, toy.ToyCore(f"toy{suffix}.out", raises_on="bad"))

    listed = _cli(nats_server, "list", "--service", f"toy{suffix}")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split()[:5] == ["ID", "SERVICE", "INPUT", "REASON", "RECORDED"]
    assert f"TOY_IN{suffix}:2" in row and "error" in row and "RuntimeError: cannot fold bad" in row
    [shown] = json.loads(_cli(nats_server, "list", "-o", "json", "--service", f"toy{suffix}").stdout)
    assert (shown["inputSeq"], shown["reason"], shown["bytes"]) == (2, "error", len(inputs[1]))

    replayed = _cli(nats_server, "replay", str(shown["id"]))
    assert replayed.returncode == 0, replayed.stderr
    assert f"sent again on toy{suffix}.in.x (TOY_IN{suffix} seq 4)" in replayed.stdout
    fixed = await _run_to_end(nc, js, suffix, 4, toy.ToyCore(f"toy{suffix}.out"))
    assert fixed.counts == {"a": 1, "b": 1, "bad": 1}

    missing = _cli(nats_server, "replay", "999")
    assert missing.returncode == 1 and "no dead letter 999" in missing.stderr


async def test_a_fold_notes_live_inputs_only(nc: NATS) -> None:
    # Issue 17: a fold never logs or counts itself; what it notes is told once, for live
    # inputs, and not again when a restart refolds them.
    js = nc.jetstream()
    inputs = _inputs(["a", "loud", "b", "loud"])
    suffix = await _setup(js, inputs)

    def seen() -> float:
        return metrics.FOLD_NOTES.labels(f"toy{suffix}", "seen")._value.get()  # type: ignore[no-any-return]

    await _run_to_end(nc, js, suffix, 4, toy.ToyCore(f"toy{suffix}.out", notes_on="loud"))
    assert seen() == 2
    await js.purge_stream("HP_SNAPSHOTS", subject=f"hp.snapshot.toy{suffix}.>")
    await _run_to_end(nc, js, suffix, 4, toy.ToyCore(f"toy{suffix}.out", notes_on="loud"))
    assert seen() == 2  # the replay's outputs were all there: nothing told twice
