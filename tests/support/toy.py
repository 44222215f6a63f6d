"""A toy event-sourced service for testing the runtime: counts inputs per key and emits one
output per input. Run as a process: ``python -m tests.support.toy NATS_URL [SNAPSHOT_EVERY]``."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Sequence

import msgspec
from nats.js import JetStreamContext

from healthplane.runtime import logs
from healthplane.runtime.connect import connect
from healthplane.runtime.fold import Emit, Inbound, Input, Reject, Step, note
from healthplane.runtime.processor import Processor


class ToyState(msgspec.Struct):
    counts: dict[str, int] = {}


class ToyInput(msgspec.Struct):
    key: str


_decode_input = msgspec.json.Decoder(ToyInput).decode


class ToyCore:
    """``pairs``: two outputs per input (an output and its echo), as a service that appends an
    event and an assessment for one report."""

    def __init__(self, out_prefix: str = "toy.out", pairs: bool = False, *, raises_on: str | None = None,
                 oversized_on: str | None = None, stray_on: str | None = None,
                 notes_on: str | None = None) -> None:
        self.out_prefix = out_prefix
        self.pairs = pairs
        # Keys that play a broken service: the core raises after changing the state in place,
        # emits an output larger than any server takes, or one on a subject no stream takes.
        self.raises_on, self.oversized_on, self.stray_on = raises_on, oversized_on, stray_on
        self.notes_on = notes_on  # a key the fold has something to say about

    def initial_state(self) -> ToyState:
        return ToyState()

    def step(self, state: ToyState, inbound: Inbound) -> Step[ToyState]:
        try:
            item = _decode_input(inbound.data)
        except msgspec.DecodeError as exc:
            raise Reject(str(exc)) from exc
        count = state.counts.get(item.key, 0) + 1
        notes = [note("warning", "toy key seen", counter="seen", key=item.key)] if item.key == self.notes_on else []
        if item.key == self.raises_on:
            state.counts[item.key] = 10**6  # half a change: only a rebuild undoes it
            raise RuntimeError(f"cannot fold {item.key}")
        new = ToyState(counts={**state.counts, item.key: count})
        payload = msgspec.json.encode({"key": item.key, "count": count, "cause": inbound.seq})
        if item.key == self.oversized_on:
            payload += b" " * (9 * 1024 * 1024)  # past the 8 MiB our servers take
        subject = f"nowhere.{item.key}" if item.key == self.stray_on else f"{self.out_prefix}.{item.key}"
        out = [Emit(subject, payload)]
        if self.pairs:
            out.append(Emit(f"{self.out_prefix}.{item.key}.echo", msgspec.json.encode(
                {"key": item.key, "count": count, "cause": inbound.seq, "echo": True})))
        return Step(new, out, notes)


def fold(inputs: Sequence[bytes], without: Sequence[int] = ()) -> ToyState:
    """The state a full replay must reach: the pure fold of every input (but the sequences
    in ``without``: dead-lettered)."""
    core, state = ToyCore(), ToyState()
    for seq, data in enumerate(inputs, 1):
        if seq in without:
            continue
        try:
            state, _, _ = core.step(state, Inbound("TOY_IN", seq, "", data, {}, None, True))  # type: ignore[arg-type]
        except Reject:
            pass
    return state


async def ensure_toy_streams(js: JetStreamContext, suffix: str = "", duplicate_window: float = 120.0,
                             latest_per_key: bool = False) -> None:
    """``latest_per_key``: the output stream keeps one record per subject (per key), as the
    assessments and node views do."""
    await js.add_stream(name=f"TOY_IN{suffix}", subjects=[f"toy{suffix}.in.>"], allow_direct=True)
    await js.add_stream(name=f"TOY_OUT{suffix}", subjects=[f"toy{suffix}.out.>"], duplicate_window=duplicate_window,
                        max_msgs_per_subject=1 if latest_per_key else -1, allow_direct=True)


def processor(nc, js, suffix: str = "", snapshot_every: int = 200, batch: int = 50, log=None,  # type: ignore[no-untyped-def]
              pairs: bool = False, core: ToyCore | None = None) -> Processor[ToyState]:
    return Processor(
        nc=nc, js=js, service=f"toy{suffix}", core=core or ToyCore(f"toy{suffix}.out", pairs), state_type=ToyState,
        inputs=[Input(f"TOY_IN{suffix}")], outputs=[f"TOY_OUT{suffix}"], batch=batch,
        snapshot_every_inputs=snapshot_every, snapshot_every_s=3600, log=log,
    )


async def run_until_folded(proc: Processor[ToyState], suffix: str, count: int, timeout_s: float = 30) -> ToyState:
    """One life in this process: start, fold until ``count`` inputs of TOY_IN are in, stop
    cleanly (snapshot included); the state it ended with."""
    await proc.start()
    task = asyncio.create_task(proc.run())
    async with asyncio.timeout(timeout_s):
        while proc.positions.get(f"TOY_IN{suffix}", 0) < count:
            await asyncio.sleep(0.01)
    proc.stop()
    await task
    return proc.state


async def outputs(js: JetStreamContext, suffix: str = "") -> list[dict[str, object]]:
    """Every output record, in stream order."""
    from healthplane.runtime.replay import replay

    return [msgspec.json.decode(m.data) async for m in replay(js, f"TOY_OUT{suffix}", f"toy{suffix}.out.>")]


async def _main(url: str, snapshot_every: int) -> None:
    log = logs.configure("toy", json=True)
    nc = await connect(url, name="toy", log=log)
    js = nc.jetstream()
    proc = processor(nc, js, snapshot_every=snapshot_every, log=log)
    await proc.start()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, proc.stop)
    log.info("toy running")
    await proc.run()
    await nc.drain()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 200))
