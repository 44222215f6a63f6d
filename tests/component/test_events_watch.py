"""INT-1: ``healthplane events watch`` against a real, secure nats-server, as a viewer: a live,
filtered tail of node events as JSON lines, resumed from the position it printed with no gap
and no duplicate; bad input is one line and exit 2."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.client import events
from healthplane.contracts import subjects, wire
from healthplane.runtime import converge
from healthplane.runtime.connect import connect
from healthplane.stack.natsserver import NatsServer
from tests.support.secure import creds_for, env_for

pytestmark = pytest.mark.nats

STARTED = re.compile(r"^watching HP_NODE_EVENTS from position (\d+)$")
STOPPED = re.compile(r"^stopped; resume with --from-position (\d+)$")


class Watch:
    """``healthplane events watch`` as a child process, its lines collected as they come."""

    def __init__(self, server: NatsServer, *args: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "healthplane.cli", "events", "watch", *args],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env=env_for(server, "viewer", "alice"))
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, lines in ((self.process.stdout, self.out), (self.process.stderr, self.err)):
            threading.Thread(target=lambda s=stream, into=lines: into.extend(line.rstrip("\n") for line in s),
                             daemon=True).start()

    async def line(self, pattern: re.Pattern[str], timeout: float = 20) -> re.Match[str]:
        for _ in range(int(timeout / 0.05)):
            for text in list(self.err):
                if found := pattern.match(text):
                    return found
            await asyncio.sleep(0.05)
        raise AssertionError(f"no {pattern.pattern!r} on stderr: {self.err}")

    async def events(self, count: int, timeout: float = 20) -> list[dict[str, Any]]:
        for _ in range(int(timeout / 0.05)):
            if len(self.out) >= count:
                return [json.loads(line) for line in self.out]
            await asyncio.sleep(0.05)
        raise AssertionError(f"{len(self.out)} of {count} events printed: {self.out}; stderr {self.err}")

    async def stop(self) -> int:
        """Ctrl-C; the position it says to resume from."""
        self.process.send_signal(signal.SIGINT)
        assert self.process.wait(timeout=20) == 0, self.err
        await asyncio.sleep(0.2)  # the reader threads drain the pipes
        return int((await self.line(STOPPED)).group(1))


def event(node_id: str, kind: str, n: int) -> wire.NodeEvent:
    return wire.NodeEvent(id=f"{node_id}-{kind}-{n}", node_id=node_id, cluster="lab", type=kind,  # type: ignore[arg-type]
                          occurred_at=datetime(2026, 8, 5, 13, 0, n, tzinfo=UTC), message=f"event {n}", actor="test")


async def put(js: JetStreamContext, *records: wire.NodeEvent) -> list[int]:
    """The records as the services write them (the test's own connection is the maintainer's)."""
    return [(await js.publish(subjects.event(r.cluster, r.node_id, r.type), wire.encode(r))).seq for r in records]


def noise(n: int) -> list[wire.NodeEvent]:
    """Events the filter must leave out: another type of the node, the type on another node."""
    return [event("gpu/07", "SCORE_CHANGED", n), event("gpu-08", "NODE_CORDONED", n)]


async def test_int1_watch_filters_prints_json_lines_and_resumes_without_gap_or_duplicate(
        nats_server: NatsServer, js: JetStreamContext) -> None:
    before = await put(js, event("gpu/07", "NODE_CORDONED", 0))  # stored before the watch: not shown
    first = Watch(nats_server, "-o", "json", "--cluster", "lab", "--node", "gpu/07", "--type", "node_cordoned")
    started = int((await first.line(STARTED)).group(1))
    assert started == before[-1] + 1  # a live tail: only what is stored from now on

    wanted: list[tuple[int, str]] = []
    for n in range(1, 4):
        seqs = await put(js, *noise(n), event("gpu/07", "NODE_CORDONED", n))
        wanted.append((seqs[-1], f"gpu/07-NODE_CORDONED-{n}"))
    shown = await first.events(3)
    assert [(e["position"], e["id"]) for e in shown] == wanted
    assert shown[0] == {**wire.to_builtins(event("gpu/07", "NODE_CORDONED", 1)), "position": wanted[0][0]}

    # Stored while the first watch stops, and after: each shown by exactly one of the two runs.
    for n in range(4, 7):
        seqs = await put(js, event("gpu/07", "NODE_CORDONED", n), *noise(n))
        wanted.append((seqs[0], f"gpu/07-NODE_CORDONED-{n}"))
    resume = await first.stop()
    for n in range(7, 9):
        seqs = await put(js, *noise(n), event("gpu/07", "NODE_CORDONED", n))
        wanted.append((seqs[-1], f"gpu/07-NODE_CORDONED-{n}"))
    seen_first = [(e["position"], e["id"]) for e in json.loads("[" + ",".join(first.out) + "]")]
    assert seen_first == wanted[:len(seen_first)] and len(seen_first) >= 3

    second = Watch(nats_server, "-o", "json", "--node", "gpu/07", "--type", "Node_Cordoned",
                   "--from-position", str(resume))
    assert int((await second.line(STARTED)).group(1)) == resume
    rest = await second.events(len(wanted) - len(seen_first))
    await asyncio.sleep(0.5)  # nothing more comes
    await second.stop()
    assert seen_first + [(e["position"], e["id"]) for e in json.loads("[" + ",".join(second.out) + "]")] == wanted
    assert len(rest) == len(second.out)


async def test_int1_since_starts_at_the_first_event_stored_since_and_text_lines_read_well(
        nats_server: NatsServer, js: JetStreamContext) -> None:
    seqs = await put(js, event("n1", "CONDITION_RAISED", 1), event("n2", "SCORE_CHANGED", 2))
    watch = Watch(nats_server, "--since", "1h", "--cluster", "lab")
    assert int((await watch.line(STARTED)).group(1)) == seqs[0]
    for _ in range(200):
        if len(watch.out) >= 2:
            break
        await asyncio.sleep(0.05)
    await watch.stop()
    assert watch.out == [f"2026-08-05T13:00:01Z  {seqs[0]:>8}  lab/n1  CONDITION_RAISED  event 1",
                         f"2026-08-05T13:00:02Z  {seqs[1]:>8}  lab/n2  SCORE_CHANGED  event 2"]


@pytest.mark.parametrize("args", [
    ["--type", "bogus"], ["--since", "3 days"], ["--from-position", "x"], ["--from-position", "0"], ["--colour"],
    ["--since", "1h", "--from-position", "4"], ["-o", "yaml"], ["--node", ""],
])
def test_int1_bad_input_is_one_line_and_exit_2(nats_server: NatsServer, args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "healthplane.cli", "events", "watch", *args], capture_output=True,
                          text=True, timeout=60, env=env_for(nats_server, "viewer", "alice"))
    assert done.returncode == 2, done
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == ""


async def test_int1_a_tail_reads_a_partitioned_install_in_order_and_holds_back_for_a_slow_taker(
        nats_server: NatsServer, nc: NATS) -> None:
    """One filter takes the stored form with the slot too (HA-4), and a taker that falls behind
    holds at most ``buffer`` events read ahead (the api's bound for a slow client)."""
    js = nc.jetstream()
    await converge.ensure(js, slotted=True)
    seqs = await put(js, *[event("a", "NODE_CORDONED" if n % 3 else "SCORE_CHANGED", n) for n in range(30)])
    assert (await js.get_msg("HP_NODE_EVENTS", seqs[0])).subject.count(".") == 5  # hp.event.lab.a.TYPE.<slot>
    wanted = [seq for n, seq in enumerate(seqs) if n % 3]
    viewer = await connect(nats_server.url, name="test-viewer", creds=creds_for(nats_server, "viewer", "alice"),
                           give_up_after=5)
    try:
        selection = events.select("lab", "a", ["node_cordoned"])
        tail = events.Tail(viewer, selection, seqs[0], buffer=4, every_s=0.05)
        taken = []
        for _ in range(7):
            found = await tail.next(10)
            assert found is not None and found.event.type == "NODE_CORDONED"
            taken.append(found.position)
            await asyncio.sleep(0.1)  # slower than the reads: the tail fills up and waits
            assert len(tail._pending) <= 4
        await tail.aclose()
        assert taken == wanted[:7] and tail.position == wanted[7]  # read ahead, not taken: still to come
        rest = events.Tail(viewer, selection, tail.position)
        taken += [(await rest.next(10)).position for _ in wanted[7:]]  # type: ignore[union-attr]
        assert await rest.next(0.5) is None
        await rest.aclose()
        assert taken == wanted
    finally:
        await viewer.close()
