"""The Slurm adapter (issue 19) beside a real Slurm 22.05, each figure beside Slurm's own floor
measured in the same run (docs/benchmarks.md, "Slurm adapter").

1. **Cordon → Slurm drain**, as an operator feels it. The whole stack (``healthplane up
   --scheduler slurm --no-sim``, a ``sim run`` fleet of sim-000..sim-003, as
   tests/e2e/test_slurm_scenarios.py runs it) beside a real slurmctld with four slurmd, the
   adapter's reconcile interval set to ``INTERVAL_S`` (``HEALTHPLANE_SLURM_INTERVAL_SECONDS``;
   the shipped default is 10 s). ``SAMPLES`` times, over the four nodes in turn, each after a
   random pause (otherwise every sample starts just after one of the adapter's passes and they
   all read one interval): the clock starts, ``healthplane node cordon NODE`` runs as the
   admin, and ``sinfo --json`` is polled (``POLL_S`` between calls) until the node shows DRAIN
   with our ``healthplane:`` reason; then ``node uncordon`` and the poll until DRAIN is gone. The floor, on the same node right
   after: ``scontrol update nodename=NODE state=drain reason=...`` issued directly and the same
   poll (then ``state=resume``). Where the time goes: from the stream timestamps of the
   command (the HOLD_CREATED event's ``occurredAt``) and of HOLD_CREATED in HP_NODE_EVENTS,
   and the adapter's "slurm command" log line for its drain.
2. **A reconcile pass at 1,000 nodes**, in process, without NATS: 4 real slurmd + 996 "ghost"
   nodes (configured, no daemon), one running job per real node, an :class:`AdapterState` of
   1,000 node views (5 % held, 1 % gated below drainBelow). After converging (passes run and
   their drains obeyed until none is asked): (a) a steady pass, ``nodes()`` + ``jobs()`` +
   ``core.reconcile`` with nothing to do; (b) ``core.reconcile`` alone, CPU; (c) a pass that
   drains 50 newly held nodes, its 50 ``scontrol update`` calls included (one at a time, as
   the Reconciler runs them). Floors: bare ``sinfo --json``, bare ``squeue --json --states
   all``, bare ``scontrol -o show nodes`` (22.05's scontrol has no ``--json``), and for (c)
   the bare reads plus 50 bare ``scontrol update`` drains. Medians of ``REPS``; the drains of
   (c) and of its floor are undone between repetitions, untimed.

Run: ``.venv/bin/python -m pytest -q -p no:cacheprovider tests/bench/test_slurm_adapter.py
-o addopts="" -o timeout=3600 -s``. HP_BENCH_SLURM_SAMPLES and HP_BENCH_SLURM_REPS change the
counts.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from healthplane.contracts import wire
from healthplane_slurm_adapter.fold import AdapterCore, Drain
from healthplane_slurm_adapter.reconcile import obey
from healthplane_slurm_adapter.rules import AdapterState, NodeWant, Observation
from healthplane_slurm_adapter.slurm import Slurm
from tests.bench import harness
from tests.e2e.test_eviction_scenarios import NODES, Stack, _stack
from tests.support.slurm import SlurmCluster, slurm_cluster

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

SAMPLES = int(os.environ.get("HP_BENCH_SLURM_SAMPLES", "20"))
REPS = int(os.environ.get("HP_BENCH_SLURM_REPS", "10"))
INTERVAL_S = 1  # the adapter's reconcile interval in the stack (the shipped default is 10)
POLL_S = 0.025  # between two sinfo --json calls (each takes ~10-20 ms itself at 4 nodes)
SEEN_TIMEOUT_S = 20.0
PREFIX = "healthplane:"
# No suppression after an operator's uncordon, no breaker counting the samples' cordons.
CONFIG = ("nodeHealth:\n  mode: cordon\n  maxUnavailablePercent: 50\n  cordonSuppressionMinutes: 0\n"
          "  circuitBreaker: {enabled: false}\n")

GHOSTS = 996  # + the 4 real nodes: 1,000
HELD_EVERY = 20  # 5 % of the nodes carry a hold ...
GATED_EVERY = 100  # ... and 1 % a score below drainBelow
NEW_DRAINS = 50
T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


def p99(samples: list[float]) -> float:
    """Interpolated; of 20 samples it lies between the two largest."""
    return statistics.quantiles(samples, n=100, method="inclusive")[98] if len(samples) > 1 else samples[0]


def ms(seconds: float) -> float:
    return seconds * 1000


# ---------------------------------------------------------------------------- 1. cordon → drain


async def sinfo_nodes(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    process = await asyncio.create_subprocess_exec("sinfo", "--json", env=env, stdin=subprocess.DEVNULL,
                                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    document = json.loads(out)
    assert not document.get("errors"), document["errors"]
    return {node["name"]: node for node in document["nodes"]}


async def seen(env: dict[str, str], node: str, test: Callable[[dict[str, Any]], bool], what: str) -> tuple[float, float]:
    """(perf_counter, wall clock) at the end of the first ``sinfo --json`` that shows ``test``."""
    deadline = time.perf_counter() + SEEN_TIMEOUT_S
    while True:
        entry = (await sinfo_nodes(env))[node]
        now, wall = time.perf_counter(), time.time()
        if test(entry):
            return now, wall
        assert now < deadline, f"{node}: {what} not seen in sinfo within {SEEN_TIMEOUT_S:g} s: {entry['state_flags']}"
        await asyncio.sleep(POLL_S)


def drained_by(reason: str) -> Callable[[dict[str, Any]], bool]:
    return lambda entry: "DRAIN" in entry["state_flags"] and str(entry["reason"]).startswith(reason)


def resumed(entry: dict[str, Any]) -> bool:
    return "DRAIN" not in entry["state_flags"]


async def scontrol(env: dict[str, str], *argv: str) -> None:
    process = await asyncio.create_subprocess_exec("scontrol", *argv, env=env, stdin=subprocess.DEVNULL,
                                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = await process.communicate()
    assert process.returncode == 0, err.decode()


@dataclass
class Latencies:
    cordon_to_drain: list[float] = field(default_factory=list)
    cordon_cli: list[float] = field(default_factory=list)  # the cordon command's own run, start to exit
    uncordon_to_resume: list[float] = field(default_factory=list)
    floor_drain: list[float] = field(default_factory=list)
    floor_resume: list[float] = field(default_factory=list)
    cordon_at: dict[str, float] = field(default_factory=dict)  # sample's reason -> wall clock at the cordon
    drained_at: dict[str, float] = field(default_factory=dict)  # ... -> wall clock when sinfo showed it


async def timed_cli(stack: Stack, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.perf_counter()
    done = await asyncio.to_thread(stack.cli, *args)
    return done, time.perf_counter() - started


async def drain_samples(stack: Stack, slurm: SlurmCluster) -> Latencies:
    env = slurm.env
    got = Latencies()
    phase = random.Random(19)
    for i in range(SAMPLES):
        node = NODES[i % len(NODES)]
        reason = f"bench sample {i}"
        # Each wait ends just after one of the adapter's passes: without a random pause every
        # sample would start at the same point of the interval, as no real fault does.
        await asyncio.sleep(phase.uniform(0, INTERVAL_S))
        got.cordon_at[reason] = time.time()
        started = time.perf_counter()
        cordon = asyncio.create_task(timed_cli(stack, "node", "cordon", node, "--reason", reason))
        drained, got.drained_at[reason] = await seen(env, node, drained_by(PREFIX), "our drain")
        done, took = await cordon
        assert done.returncode == 0, done.stderr
        got.cordon_cli.append(took)
        got.cordon_to_drain.append(drained - started)
        await asyncio.sleep(phase.uniform(0, INTERVAL_S))
        started = time.perf_counter()
        uncordon = asyncio.create_task(timed_cli(stack, "node", "uncordon", node))
        got.uncordon_to_resume.append((await seen(env, node, resumed, "the resume"))[0] - started)
        assert (await uncordon)[0].returncode == 0
        # Slurm's floor on the same node: someone else's reason, which the adapter leaves alone.
        started = time.perf_counter()
        await scontrol(env, "update", f"nodename={node}", "state=drain", f"reason=bench floor {i}")
        got.floor_drain.append((await seen(env, node, drained_by(f"bench floor {i}"), "the drain"))[0] - started)
        started = time.perf_counter()
        await scontrol(env, "update", f"nodename={node}", "state=resume")
        got.floor_resume.append((await seen(env, node, resumed, "the resume"))[0] - started)
    return got


def drain_commands(log: Path) -> dict[str, float]:
    """A sample's reason -> when the adapter's ``scontrol update ... state=drain`` returned (its
    "slurm command" log line, written right after)."""
    found = {}
    for line in log.read_text().splitlines():
        if '"slurm command"' not in line:
            continue
        entry = json.loads(line)
        if entry.get("command") == "drain" and (match := re.search(r"\(cordon: (bench sample \d+)\)", entry["action"])):
            found[match.group(1)] = datetime.fromisoformat(entry["timestamp"]).timestamp()
    return found


@pytest.mark.nats
def test_cordon_to_slurm_drain_latency(tmp_path: Path) -> None:
    with slurm_cluster(tmp_path / "slurm") as slurm:
        env = {**os.environ, "SLURM_CONF": str(slurm.conf),
               "HEALTHPLANE_SLURM_INTERVAL_SECONDS": str(INTERVAL_S)}
        with contextmanager(_stack)(tmp_path, CONFIG, "--scheduler", "slurm", env=env) as stack:
            got = asyncio.run(drain_samples(stack, slurm))
            holds = asyncio.run(stack.read("HP_NODE_EVENTS", "hp.event.*.*.HOLD_CREATED"))
    # Where the time goes, from the records' stream timestamps (one machine, one clock).
    stored: dict[str, float] = {}  # the sample's reason -> the cordon command's stream timestamp
    created: dict[str, float] = {}  # ... -> HOLD_CREATED's stream timestamp
    for msg in holds:
        event = wire.decode(wire.NodeEvent, msg.data)
        reason = event.hold.reason if event.hold else None
        if reason in got.cordon_at:
            stored[reason] = event.occurred_at.timestamp()  # the input's (the command's) timestamp
            created[reason] = msg.time.timestamp()
    assert sorted(created) == sorted(got.cordon_at), f"{len(created)} HOLD_CREATED events for {SAMPLES} cordons"
    commanded = drain_commands(tmp_path / "hp" / "logs" / "slurm-adapter.log")
    assert sorted(commanded) == sorted(got.cordon_at), "a drain missing from the adapter's log"
    reasons = list(got.cordon_at)
    parts = {"cordon → command stored": [stored[r] - got.cordon_at[r] for r in reasons],
             "command → HOLD_CREATED stored": [created[r] - stored[r] for r in reasons],
             "HOLD_CREATED → adapter's scontrol done": [commanded[r] - created[r] for r in reasons],
             "adapter's scontrol done → seen": [got.drained_at[r] - commanded[r] for r in reasons]}
    to_hold = [created[r] - got.cordon_at[r] for r in reasons]
    floor = got.floor_drain
    harness.record("slurm.cordon_to_drain_p50", ms(statistics.median(got.cordon_to_drain)), "ms",
                   baseline=ms(statistics.median(floor)))
    harness.record("slurm.cordon_to_drain_p99", ms(p99(got.cordon_to_drain)), "ms", baseline=ms(p99(floor)))
    harness.record("slurm.cordon_to_hold_created_p50", ms(statistics.median(to_hold)), "ms")
    harness.record("slurm.hold_created_to_drain_p50",
                   ms(statistics.median(got.drained_at[r] - created[r] for r in reasons)), "ms")
    harness.record("slurm.uncordon_to_resume_p50", ms(statistics.median(got.uncordon_to_resume)), "ms",
                   baseline=ms(statistics.median(got.floor_resume)))
    print(f"\n  {SAMPLES} samples, reconcile interval {INTERVAL_S} s, sinfo polled every {ms(POLL_S):.0f} ms + its run")
    print("  sample: cordon → drain = " + " + ".join(parts) + " (ms); cordon CLI run; floor")
    for i in range(len(reasons)):
        print(f"  {i:2d} {NODES[i % len(NODES)]}: {ms(got.cordon_to_drain[i]):5.0f} = "
              + " + ".join(f"{ms(values[i]):4.0f}" for values in parts.values())
              + f"; {ms(got.cordon_cli[i]):5.0f}; {ms(floor[i]):3.0f}")
    for name, values in (("cordon → drain", got.cordon_to_drain), ("floor: scontrol drain → seen", floor),
                         ("cordon CLI run", got.cordon_cli), *parts.items(),
                         ("uncordon → resume", got.uncordon_to_resume),
                         ("floor: scontrol resume → seen", got.floor_resume)):
        print(f"  {name:40s} min {ms(min(values)):6.0f}  p50 {ms(statistics.median(values)):6.0f}  "
              f"p99 {ms(p99(values)):6.0f}  max {ms(max(values)):6.0f} ms")


# ---------------------------------------------------------------------------- 2. a pass at 1,000 nodes


def copied(state: AdapterState) -> AdapterState:
    return msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=AdapterState)


def hold(name: str, reason: str) -> wire.Hold:
    return wire.Hold(id=f"hold-{name}", effect="cordon", reason=reason, actor="ops", created_at=T0)


def fleet(names: list[str]) -> AdapterState:
    nodes = {}
    for i, name in enumerate(names):
        nodes[name] = NodeWant(holds=[hold(name, "bench")] if i % HELD_EVERY == 7 else [],
                               score=30 if i % GATED_EVERY == 13 else 100)
    return AdapterState(nodes=nodes)


async def observe(slurm: Slurm) -> Observation:
    nodes = await slurm.nodes()
    jobs = await slurm.jobs()
    return Observation(nodes, jobs, {}, datetime.now(UTC))


def bare(cluster: SlurmCluster, *argv: str) -> float:
    started = time.perf_counter()
    cluster.run(*argv)
    return time.perf_counter() - started


def undrain(cluster: SlurmCluster, names: list[str]) -> None:
    """Untimed reset. On a ghost node (never registered, state unknown) Slurm 22.05 lifts the
    drain but still answers ``Invalid node state specified`` (exit 1): the check is sinfo's."""
    cluster.run("scontrol", "update", f"nodename={','.join(names)}", "state=resume", check=False)
    left = [n["name"] for n in cluster.nodes_json() if n["name"] in names and "DRAIN" in n["state_flags"]]
    assert not left, f"still drained after resume: {left}"


async def pass_figures(cluster: SlurmCluster) -> dict[str, list[float]]:
    slurm = Slurm(environ=cluster.env)
    core = AdapterCore()
    names = sorted(n["name"] for n in cluster.nodes_json())
    assert len(names) == GHOSTS + len(cluster.nodes)
    state = fleet(names)
    for node in cluster.nodes:  # one running job per real node: jobs() has something to say
        cluster.sbatch("sleep 600", node=node)
    cluster.wait_for(lambda: sum(1 for n in cluster.nodes_json() if n["state"] == "allocated") == len(cluster.nodes),
                     30, "one job running on each real node")
    for _ in range(5):  # converge: obey each pass's drains until a pass asks for nothing
        state, decided = core.reconcile(state, await observe(slurm), datetime.now(UTC))
        for action in decided.actions:
            await obey(slurm, action)
        if not decided.actions:
            break
    else:
        raise AssertionError(f"no steady state after 5 passes: {decided.actions[:5]}")
    ours = [n for n in await slurm.nodes() if n.drained and n.reason.startswith(PREFIX)]
    assert len(ours) == len(names) // HELD_EVERY + len(names) // GATED_EVERY
    assert len(state.open) == len(cluster.nodes)
    new = [name for i, name in enumerate(names) if i % HELD_EVERY == 11][:NEW_DRAINS]
    assert len(new) == NEW_DRAINS and not set(new) & set(cluster.nodes)
    found: dict[str, list[float]] = {k: [] for k in (
        "steady", "nodes", "jobs", "core_cpu", "core_wall", "drains", "sinfo", "squeue", "scontrol_show",
        "floor_drains")}
    last = await observe(slurm)
    for _ in range(REPS):
        started = time.perf_counter()
        seen_now = await observe(slurm)
        state, decided = core.reconcile(state, seen_now, datetime.now(UTC))
        found["steady"].append(time.perf_counter() - started)
        assert not decided.actions and not decided.emits, decided
        started = time.perf_counter()
        await slurm.nodes()
        found["nodes"].append(time.perf_counter() - started)
        started = time.perf_counter()
        await slurm.jobs()
        found["jobs"].append(time.perf_counter() - started)
        found["sinfo"].append(bare(cluster, "sinfo", "--json"))
        found["squeue"].append(bare(cluster, "squeue", "--json", "--states", "all"))
        found["scontrol_show"].append(bare(cluster, "scontrol", "-o", "show", "nodes"))
        last = seen_now
    for _ in range(REPS * 5):  # cheap: more of them
        now = datetime.now(UTC)
        cpu, wall = time.process_time(), time.perf_counter()
        state, decided = core.reconcile(state, last, now)
        found["core_cpu"].append(time.process_time() - cpu)
        found["core_wall"].append(time.perf_counter() - wall)
        assert not decided.actions
    steady = state
    for rep in range(REPS):
        state = copied(steady)
        for name in new:
            state.nodes[name] = NodeWant(holds=[hold(name, f"bench rep {rep}")], score=100)
        started = time.perf_counter()
        state, decided = core.reconcile(state, await observe(slurm), datetime.now(UTC))
        for action in decided.actions:
            await obey(slurm, action)
        found["drains"].append(time.perf_counter() - started)
        assert sorted(a.node for a in decided.actions if isinstance(a, Drain)) == new == sorted(
            n["name"] for n in cluster.nodes_json() if n["name"] in new and drained_by(PREFIX)(n))
        undrain(cluster, new)
        # The floor: the reads and 50 drains, bare, one call each.
        started = time.perf_counter()
        cluster.run("sinfo", "--json")
        cluster.run("squeue", "--json", "--states", "all")
        for name in new:
            cluster.run("scontrol", "update", f"nodename={name}", "state=drain", f"reason=bench floor {rep}")
        found["floor_drains"].append(time.perf_counter() - started)
        undrain(cluster, new)
    return found


def test_reconcile_pass_at_1000_nodes(tmp_path: Path) -> None:
    with slurm_cluster(tmp_path / "slurm", ghost_nodes=GHOSTS) as cluster:
        release = cluster.run("sinfo", "--json").stdout
        found = asyncio.run(pass_figures(cluster))
    med = {k: statistics.median(v) for k, v in found.items()}
    reads = med["sinfo"] + med["squeue"]
    harness.record("slurm.pass_steady_1k_nodes", ms(med["steady"]), "ms", baseline=ms(reads))
    harness.record("slurm.reconcile_core_cpu_1k_nodes", ms(med["core_cpu"]), "ms CPU")
    harness.record("slurm.pass_50_drains_1k_nodes", ms(med["drains"]), "ms", baseline=ms(med["floor_drains"]))
    harness.record("slurm.nodes_read_1k_nodes", ms(med["nodes"]), "ms", baseline=ms(med["sinfo"]))
    harness.record("slurm.sinfo_json_1k_nodes", ms(med["sinfo"]), "ms", baseline=ms(med["scontrol_show"]))
    harness.record("slurm.squeue_json", ms(med["squeue"]), "ms")
    version = json.loads(release)["meta"]["Slurm"]["release"]
    print(f"\n  Slurm {version}, {GHOSTS + 4} nodes, medians of {REPS} (the core alone: of {REPS * 5})")
    for key, label in (("steady", "steady pass (nodes + jobs + reconcile)"), ("nodes", "  nodes(): sinfo --json, decoded"),
                       ("jobs", "  jobs(): squeue --json, decoded"), ("core_wall", "  core.reconcile (wall)"),
                       ("core_cpu", "  core.reconcile (CPU)"), ("drains", "pass draining 50 nodes"),
                       ("floor_drains", "floor: bare reads + 50 scontrol"), ("sinfo", "bare sinfo --json"),
                       ("squeue", "bare squeue --json --states all"), ("scontrol_show", "bare scontrol -o show nodes")):
        print(f"  {label:40s} p50 {ms(med[key]):7.1f}  min {ms(min(found[key])):7.1f}  "
              f"max {ms(max(found[key])):7.1f} ms")
