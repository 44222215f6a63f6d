"""The node agent runs remediation steps from its own subject (REM-2), as a process on a
fixture root against a real nats-server with auth on: fake ``nvidia-smi`` and ``systemctl``
first on PATH record what they were asked; the outcome comes back in the node's resource
report; a reboot is proven by the boot id of the next start. The simulator answers for its
nodes the same way. The server, not the agent, keeps other identities off the subject (SEC-1)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.runtime.connect import connect
from healthplane.stack.natsserver import NatsServer
from tests.component.test_collector_live import collector_config, fixture_root
from tests.support.live import live
from tests.support.secure import creds_for, env_for

pytestmark = pytest.mark.nats

NODE, CLUSTER = "gpu-node-7", "lab"
BOOT_A = "0f0e0d0c-0b0a-0908-0706-050403020100"  # fixture_root's
BOOT_B = "b0b0b0b0-1111-2222-3333-444444444444"
RESET_FAILURE = "Unable to reset GPU 00000000:3B:00.0 because it's being used by some other process"
REFUSAL_WAIT_S = 1.0


def node_tree(tmp_path: Path) -> Path:
    """``fixture_root`` with two NVIDIA GPUs on the PCI bus, and fake tools that record their argv."""
    root = fixture_root(tmp_path / "root")
    for bus_id in ("0000:3b:00.0", "0000:5e:00.0"):
        device = root / "sys" / "bus" / "pci" / "devices" / bus_id
        device.mkdir(parents=True)
        (device / "vendor").write_text("0x10de\n")
        (device / "class").write_text("0x030200\n")
    calls, bin_dir = tmp_path / "calls", tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir / "nvidia-smi", f"""echo "nvidia-smi $*" >> {calls}
if [ "$1" = "-r" ]; then
  if [ -e {tmp_path / "fail-reset"} ]; then echo "resetting" ; echo "{RESET_FAILURE}" >&2; exit 255; fi
  echo "GPU 00000000:3B:00.0 was successfully reset."; exit 0
fi
echo "No devices were found"; exit 6
""")
    _tool(bin_dir / "systemctl", f'echo "systemctl $*" >> {calls}\nexit 0\n')
    return root


def _tool(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


def start_agent(server: NatsServer, tmp_path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "healthplane.cli", "collector", "--root", str(tmp_path / "root"),
         "--state-dir", str(tmp_path / "state"), "--gpu-source", "nvidia-smi",
         "--config", str(collector_config(tmp_path / "collector.json"))],
        env={**env_for(server, "collector", f"{CLUSTER}/{NODE}"), "PATH": str(tmp_path / "bin")},
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "collector.log", "ab"))


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    assert process.wait(20) == 0


def request(request_id: str, action: str = "gpu-reset", node: str = NODE, **fields: Any) -> bytes:
    return wire.encode(wire.RemediationRequest(id=request_id, node_id=node, cluster=CLUSTER, action=action,  # type: ignore[arg-type]
                                               attempt=1, requested_at=datetime.now(UTC), timeout_seconds=60,
                                               **fields))


async def eviction(server: NatsServer) -> NATS:
    """The one identity that may publish remediation requests."""
    return await connect(server.url, name="eviction", creds=creds_for(server, "eviction"), give_up_after=5)


async def send(nc: NATS, payload: bytes, node: str = NODE) -> None:
    await nc.jetstream().publish(subjects.remediate(CLUSTER, node), payload, timeout=5)


async def outcome_of(resources: Any, request_id: str, timeout_s: float = 10) -> wire.ResourceReport:
    """The first resource report that carries ``request_id``'s outcome."""
    deadline = time.monotonic() + timeout_s
    while True:
        report = wire.decode(wire.ResourceReport,
                             (await resources.next_msg(timeout=max(0.1, deadline - time.monotonic()))).data)
        if report.remediation is not None and report.remediation.request_id == request_id:
            return report


async def start_report(resources: Any, timeout_s: float = 30) -> wire.ResourceReport:
    """The next agent's first resource report (``ready: false``), past the last agent's others."""
    deadline = time.monotonic() + timeout_s
    while True:
        report = wire.decode(wire.ResourceReport,
                             (await resources.next_msg(timeout=max(0.1, deadline - time.monotonic()))).data)
        if not report.ready:
            return report


async def until(check: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {check.__name__}"
        await asyncio.sleep(0.05)


def log_lines(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "collector.log").read_text().splitlines() if line.startswith("{")]


def scrape(tmp_path: Path) -> str:
    [url] = [line["url"] for line in log_lines(tmp_path) if line.get("event") == "metrics endpoint"][-1:]
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


async def test_rem2_gpu_reset_runs_nvidia_smi_and_reports_the_outcome(nats_server: NatsServer, js: JetStreamContext,
                                                                      tmp_path: Path) -> None:
    node_tree(tmp_path)
    resources = await live(js, subjects.resource(CLUSTER, NODE))
    agent = start_agent(nats_server, tmp_path)
    sender = await eviction(nats_server)
    try:
        start = await start_report(resources)
        assert start.boot_id == BOOT_A and start.remediation is None
        assert [d.index for d in start.devices] == [0, 1]

        await send(sender, request("r1", gpus=[1]))
        done = (await outcome_of(resources, "r1")).remediation
        assert done is not None and (done.action, done.result, done.reason) == ("gpu-reset", "succeeded", "GPU 1 reset")
        assert [c for c in calls(tmp_path) if " -r " in c] == ["nvidia-smi -r -i 1"]

        (tmp_path / "fail-reset").touch()  # every GPU: the first fails, the step ends there
        await send(sender, request("r2"))
        report = await outcome_of(resources, "r2")
        failed = report.remediation
        assert failed is not None and failed.result == "failed"
        assert failed.reason == f"nvidia-smi -r -i 0 exited with 255: {RESET_FAILURE}"
        assert report.boot_id == BOOT_A
        resets = [c for c in calls(tmp_path) if " -r " in c]
        assert resets == ["nvidia-smi -r -i 1", "nvidia-smi -r -i 0"]

        # Forged or broken requests: refused or counted, nothing run.
        await send(sender, request("f1", node="gpu-node-8"))
        refused = (await outcome_of(resources, "f1")).remediation
        assert refused is not None and refused.result == "refused"
        assert refused.reason == "the request is for node 'gpu-node-8', not this node (gpu-node-7)"
        await send(sender, b'{"id": "f2", "nodeId": "gpu-node-7", "cluster": "lab", "action": "exec", '
                           b'"argv": ["/bin/sh", "-c", "reboot"]}')
        unknown = (await outcome_of(resources, "f2")).remediation
        assert unknown is not None and (unknown.action, unknown.result) == ("exec", "refused")
        assert unknown.reason == "unknown action 'exec': this agent runs only gpu-reset, reboot"
        await send(sender, b"\xde\xad\xbe\xef not json")
        await send(sender, request("r1", gpus=[0]))  # an id already handled: ignored
        await until(lambda: any(line.get("event") == "remediation request malformed; ignored"
                                for line in log_lines(tmp_path)))
        await until(lambda: any(line.get("event") == "remediation request already handled; ignored"
                                for line in log_lines(tmp_path)))
        assert [c for c in calls(tmp_path) if " -r " in c] == resets and not any("systemctl" in c for c in calls(tmp_path))

        metrics = scrape(tmp_path)
        for series in ('healthplane_agent_remediations_total{action="gpu-reset",result="succeeded"} 1.0',
                       'healthplane_agent_remediations_total{action="gpu-reset",result="failed"} 1.0',
                       'healthplane_agent_remediations_total{action="gpu-reset",result="refused"} 1.0',
                       'healthplane_agent_remediations_total{action="other",result="refused"} 1.0',
                       'healthplane_messages_rejected_total{reason="malformed",service="collector",'
                       'stream="HP_REMEDIATION"} 1.0'):
            assert series in metrics, series
    finally:
        await sender.close()
        stop(agent)
    assert "Traceback" not in (tmp_path / "collector.log").read_text()


async def test_rem2_reboot_is_proven_by_the_next_boot_s_id(nats_server: NatsServer, js: JetStreamContext,
                                                            tmp_path: Path) -> None:
    root = node_tree(tmp_path)
    boot_id_file = root / "proc" / "sys" / "kernel" / "random" / "boot_id"
    pending = tmp_path / "state" / "remediation.pending"
    resources = await live(js, subjects.resource(CLUSTER, NODE))
    sender = await eviction(nats_server)
    try:
        agent = start_agent(nats_server, tmp_path)
        try:
            await start_report(resources)
            await send(sender, request("boot-1", action="reboot"))
            # (The start's health report may still be asking nvidia-smi meanwhile: any order.)
            await until(lambda: "systemctl reboot" in calls(tmp_path))
            saved = json.loads(pending.read_text())
            assert (saved["request"]["id"], saved["bootIdBefore"]) == ("boot-1", BOOT_A)
        finally:
            stop(agent)

        # The machine came back on a new boot: the first resource report says so.
        boot_id_file.write_text(BOOT_B + "\n")
        agent = start_agent(nats_server, tmp_path)
        try:
            first = await start_report(resources)
            done = first.remediation
            assert first.ready is False and first.boot_id == BOOT_B
            assert done is not None and (done.request_id, done.action, done.result) == ("boot-1", "reboot", "succeeded")
            assert (done.boot_id_before, done.boot_id) == (BOOT_A, BOOT_B)
            assert done.reason == f"rebooted: boot id {BOOT_A} → {BOOT_B}"
            assert not pending.exists()

            await send(sender, request("boot-2", action="reboot"))
            await until(lambda: calls(tmp_path).count("systemctl reboot") == 2)
        finally:
            stop(agent)

        # systemctl said yes, but the machine never went down: same boot id at the next start.
        agent = start_agent(nats_server, tmp_path)
        try:
            first = await start_report(resources)
            done = first.remediation
            assert done is not None and (done.request_id, done.result) == ("boot-2", "failed")
            assert done.reason == "boot id unchanged: the reboot did not happen"
            assert (done.boot_id_before, done.boot_id) == (BOOT_B, BOOT_B)
            # A request already handled before the restart is not run again.
            await send(sender, request("boot-2", action="reboot"))
            await until(lambda: any(line.get("event") == "remediation request already handled; ignored"
                                    for line in log_lines(tmp_path)))
            assert calls(tmp_path).count("systemctl reboot") == 2
        finally:
            stop(agent)
    finally:
        await sender.close()


async def _subscription_refused(nc: NATS, subject: str, trigger: Callable[[], Any]) -> bool:
    heard: list[bytes] = []

    async def on_message(msg: Msg) -> None:
        heard.append(msg.data)

    await nc.subscribe(subject, cb=on_message)
    await nc.flush(timeout=5)
    await trigger()
    deadline = time.monotonic() + REFUSAL_WAIT_S
    while time.monotonic() < deadline:
        error = str(nc.last_error or "").lower()
        if f'permissions violation for subscription to "{subject.lower()}"' in error:
            return heard == []
        await asyncio.sleep(0.01)
    return False


async def _publish_refused(nc: NATS, subject: str) -> bool:
    await nc.publish(subject, request("forged"))
    await nc.flush(timeout=5)
    deadline = time.monotonic() + REFUSAL_WAIT_S
    while time.monotonic() < deadline:
        error = str(nc.last_error or "").lower()
        if f'permissions violation for publish to "{subject.lower()}"' in error:
            return True
        await asyncio.sleep(0.01)
    return False


async def test_rem2_sec1_only_the_node_reads_its_subject_and_only_eviction_writes_it(
        nats_server: NatsServer, js: JetStreamContext) -> None:
    mine, theirs = subjects.remediate(CLUSTER, NODE), subjects.remediate(CLUSTER, "gpu-node-8")
    sender = await eviction(nats_server)
    node_a = await connect(nats_server.url, name="a", creds=creds_for(nats_server, "collector", f"{CLUSTER}/{NODE}"),
                           give_up_after=5)
    node_b = await connect(nats_server.url, name="b", creds=creds_for(nats_server, "collector",
                                                                      f"{CLUSTER}/gpu-node-8"), give_up_after=5)
    try:
        # Node B cannot read node A's requests, nor every node's.
        assert await _subscription_refused(node_b, mine, lambda: send(sender, request("s1")))
        assert await _subscription_refused(node_b, f"hp.remediate.{CLUSTER}.*", lambda: send(sender, request("s2")))
        # Node A reads its own.
        heard: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_request(msg: Msg) -> None:
            await heard.put(msg.data)

        await node_a.subscribe(mine, cb=on_request)
        await node_a.flush(timeout=5)
        # Live delivery is at most once: a request published while the node's connection is
        # re-established (a loaded CI machine starving the test's loop past its pings, once) is
        # not delivered, and eviction's ladder tries the rung again after its timeout. So does the test:
        # what it checks is that the node may read its own subject, not the bus's luck.
        sent = 0
        for _ in range(3):
            await send(sender, request("s3"))
            sent += 1
            with contextlib.suppress(TimeoutError):
                assert wire.decode(wire.RemediationRequest, await asyncio.wait_for(heard.get(), 10)).id == "s3"
                break
        else:
            raise AssertionError("node A never heard its own remediation request, sent 3 times")
        # No node may publish a request: not to itself, not to another.
        for nc, subject in ((node_a, mine), (node_a, theirs), (node_b, mine), (node_b, theirs)):
            assert await _publish_refused(nc, subject), f"a node published {subject}"
        stored = (await js.stream_info("HP_REMEDIATION")).state.messages
        assert stored == 2 + sent  # eviction's, nothing forged
    finally:
        for nc in (sender, node_a, node_b):
            await nc.close()


async def test_rem2_the_simulator_answers_for_its_nodes(nats_server: NatsServer, js: JetStreamContext,
                                                        tmp_path: Path) -> None:
    node = "sim-001"
    resources = await live(js, subjects.resource(CLUSTER, node))
    fleet = subprocess.Popen(
        [sys.executable, "-m", "healthplane.cli", "sim", "run", "--nodes", "2", "--gpus", "2", "--cluster", CLUSTER,
         "--interval", "3600"],
        env=env_for(nats_server, "sim", CLUSTER), stdout=subprocess.DEVNULL, stderr=open(tmp_path / "sim.log", "ab"))
    sender = await eviction(nats_server)
    admin = await connect(nats_server.url, name="admin", give_up_after=5)
    try:
        start = await start_report(resources)
        boot_before = start.boot_id
        assert boot_before is not None
        injected = await admin.request(f"hp.sim.{CLUSTER}.inject",
                                       json.dumps({"nodeId": node, "fault": "xid:79", "gpu": 1}).encode(), timeout=5)
        assert json.loads(injected.data)["ok"]

        await send(sender, request("sim-r1", node=node, gpus=[1]), node=node)
        lost = (await outcome_of(resources, "sim-r1")).remediation
        assert lost is not None and lost.result == "failed" and "GPU is lost" in lost.reason

        await send(sender, request("sim-r2", action="reboot", node=node), node=node)
        back = await outcome_of(resources, "sim-r2")
        done = back.remediation
        assert done is not None and done.result == "succeeded" and back.ready is False  # the new boot's agent
        assert done.boot_id_before == boot_before and done.boot_id == back.boot_id != boot_before

        await send(sender, request("sim-r3", node=node, gpus=[1]), node=node)  # back on the bus after the reboot
        reset = (await outcome_of(resources, "sim-r3")).remediation
        assert reset is not None and (reset.result, reset.reason) == ("succeeded", "GPU 1 reset")
    finally:
        await sender.close()
        await admin.close()
        fleet.send_signal(signal.SIGTERM)
        fleet.wait(20)
    assert "Traceback" not in (tmp_path / "sim.log").read_text()
