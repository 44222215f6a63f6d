"""The agent's side of remediation (REM-2): what a request means, what it runs, what the
outcome says; the executor against commands that fail, hang and flood; the simulator's
hardware under a reset and a reboot."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthplane.contracts import wire
from healthplane_collector import probe
from healthplane_collector.agent import Collector, Settings
from healthplane_collector.remediation import (
    HANDLED_FILE,
    PENDING_FILE,
    HostActions,
    Malformed,
    NodeFacts,
    PendingReboot,
    Refusal,
    Remediator,
    command_failure,
    gpu_reset_argv,
    read_request,
    reboot_argv,
    refusal,
    remember,
    reset_targets,
    run_command,
    save_pending,
    settle,
    take_pending,
)
from healthplane_collector.sim import SimNode
from tests.support.log import Log

NOW = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
BOOT_A = "0f0e0d0c-0b0a-0908-0706-050403020100"
BOOT_B = "11111111-2222-3333-4444-555555555555"
GPUS = (0, 1, 2, 3)


def request(**fields: Any) -> wire.RemediationRequest:
    base: dict[str, Any] = {"id": "r1", "node_id": "n1", "cluster": "c1", "action": "gpu-reset", "attempt": 1,
                            "requested_at": NOW, "timeout_seconds": 120}
    return wire.RemediationRequest(**{**base, **fields})


def payload(**fields: Any) -> bytes:
    return wire.encode(request(**fields))


# ---------------------------------------------------------------------------- what a payload is


def test_rem2_a_request_decodes() -> None:
    assert read_request(payload(gpus=[2])) == request(gpus=[2])


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"\x00\xff garbage", Malformed),
        (b"[1, 2]", Malformed),
        (b'{"action": "gpu-reset"}', Malformed),  # no id: nothing to answer
        (b'{"id": "", "action": "reboot"}', Malformed),
        (b'{"id": "r9", "action": "rm -rf /", "nodeId": "n1"}', Refusal),
        (b'{"id": "r9", "nodeId": "n1"}', Refusal),  # no action at all
        (b'{"id": "r9", "action": "reboot", "nodeId": "n1", "cluster": "c1", "attempt": "one"}', Refusal),
    ],
)
def test_rem2_what_does_not_decode_is_malformed_or_refused(raw: bytes, expected: type) -> None:
    assert isinstance(read_request(raw), expected)


def test_rem2_an_unknown_action_is_refused_naming_the_vocabulary() -> None:
    read = read_request(b'{"id": "r9", "action": "flash-firmware", "nodeId": "n1"}')
    assert read == Refusal("r9", "flash-firmware",
                           "unknown action 'flash-firmware': this agent runs only gpu-reset, reboot")


def test_rem2_a_known_action_with_a_bad_field_is_refused_with_the_decoder_s_words() -> None:
    read = read_request(b'{"id": "r9", "action": "reboot", "nodeId": "n1", "cluster": "c1", "attempt": "one"}')
    assert isinstance(read, Refusal) and read.action == "reboot"
    assert "attempt" in read.reason and "\n" not in read.reason


# ---------------------------------------------------------------------------- whether it is for us


@pytest.mark.parametrize(
    ("fields", "facts", "why"),
    [
        ({"node_id": "n2"}, (GPUS, BOOT_A), "the request is for node 'n2', not this node (n1)"),
        ({"cluster": "c2"}, (GPUS, BOOT_A), "the request is for cluster 'c2', not this node's (c1)"),
        ({"timeout_seconds": 0}, (GPUS, BOOT_A), "timeoutSeconds must be positive, not 0"),
        ({"requested_at": NOW - timedelta(seconds=121)}, (GPUS, BOOT_A),
         "expired: requested at 2026-12-03T09:57:59Z with 120 s to run, received at 2026-12-03T10:00:00Z"),
        ({"gpus": []}, (GPUS, BOOT_A), "gpus is empty: name the GPUs to reset, or leave it out for every GPU"),
        ({"gpus": [1, 7, 9]}, (GPUS, BOOT_A), "no GPU 7, 9 on this node (its NVIDIA GPUs: 0, 1, 2, 3)"),
        ({}, ((), BOOT_A), "no NVIDIA GPU on this node to reset"),
        ({"action": "reboot"}, (GPUS, None),
         "this node has no boot id (/proc/sys/kernel/random/boot_id): a reboot could not be proven"),
    ],
)
def test_rem2_what_is_refused(fields: dict[str, Any], facts: tuple[tuple[int, ...], str | None], why: str) -> None:
    assert refusal(request(**fields), "n1", "c1", NOW, facts[0], facts[1]) == why


def test_rem2_a_request_without_a_time_zone_is_read_as_utc() -> None:
    assert refusal(request(requested_at=NOW.replace(tzinfo=None)), "n1", "c1", NOW, GPUS, BOOT_A) is None


@given(delay=st.integers(min_value=-3600, max_value=7200), timeout=st.integers(min_value=1, max_value=3600),
       action=st.sampled_from(wire.AGENT_ACTIONS),
       gpus=st.none() | st.lists(st.sampled_from(GPUS), min_size=1, max_size=6))
def test_rem2_a_request_for_this_node_runs_until_its_time_is_up(delay: int, timeout: int, action: str,
                                                                gpus: list[int] | None) -> None:
    asked = request(action=action, gpus=gpus, timeout_seconds=timeout, requested_at=NOW - timedelta(seconds=delay))
    why = refusal(asked, "n1", "c1", NOW, GPUS, BOOT_A)
    assert (why is None) == (delay <= timeout)
    assert why is None or why.startswith("expired: ")


@given(requested_at=st.datetimes(timezones=st.just(UTC)), timeout=st.integers(min_value=1, max_value=2**63 - 1))
def test_rem2_judging_a_request_never_raises(requested_at: datetime, timeout: int) -> None:
    raw = payload(requested_at=requested_at, timeout_seconds=timeout)
    read = read_request(raw)
    assert isinstance(read, wire.RemediationRequest)
    refusal(read, "n1", "c1", NOW, GPUS, BOOT_A)


@given(node=st.text(min_size=1, max_size=12).filter(lambda n: n != "n1"),
       action=st.sampled_from(wire.AGENT_ACTIONS))
def test_rem2_another_node_s_request_is_always_refused(node: str, action: str) -> None:
    why = refusal(request(node_id=node, action=action), "n1", "c1", NOW, GPUS, BOOT_A)
    assert why is not None and why.startswith("the request is for node ")


@given(gpus=st.none() | st.lists(st.sampled_from(GPUS), min_size=1, max_size=8))
def test_rem2_a_reset_runs_each_gpu_once_and_only_the_node_s(gpus: list[int] | None) -> None:
    targets = reset_targets(request(gpus=gpus), GPUS)
    assert len(targets) == len(set(targets)) and set(targets) <= set(GPUS)
    assert targets == (sorted(GPUS) if gpus is None else list(dict.fromkeys(gpus)))


def test_rem2_the_commands() -> None:
    assert gpu_reset_argv(3) == ["nvidia-smi", "-r", "-i", "3"]
    assert reboot_argv() == ["systemctl", "reboot"]


@pytest.mark.parametrize(
    ("returncode", "stdout", "stderr", "reason"),
    [
        (255, b"", b"first\nUnable to reset GPU 00000000:3B:00.0: In use by another client\n\n",
         "nvidia-smi -r -i 0 exited with 255: Unable to reset GPU 00000000:3B:00.0: In use by another client"),
        (3, b"GPU 00000000:3B:00.0: Not Supported\n", b"  \n", "nvidia-smi -r -i 0 exited with 3: GPU 00000000:3B:00.0: Not Supported"),
        (1, b"", b"", "nvidia-smi -r -i 0 exited with 1"),
        (-9, b"", b"", "nvidia-smi -r -i 0 was killed by signal 9"),
    ],
)
def test_rem2_a_failed_command_is_one_line(returncode: int, stdout: bytes, stderr: bytes, reason: str) -> None:
    assert command_failure(gpu_reset_argv(0), returncode, stdout, stderr) == reason


def test_rem2_a_long_line_is_cut() -> None:
    reason = command_failure(reboot_argv(), 1, b"", b"x" * 5000)
    assert len(reason) <= 300 and reason.endswith("…")


# ---------------------------------------------------------------------------- the boot-id proof


def pending(boot_id_before: str = BOOT_A) -> PendingReboot:
    return PendingReboot(request=request(id="boot-1", action="reboot"), boot_id_before=boot_id_before)


def test_rem2_a_new_boot_id_proves_the_reboot() -> None:
    done = settle(pending(), BOOT_B, NOW)
    assert (done.request_id, done.action, done.result) == ("boot-1", "reboot", "succeeded")
    assert done.reason == f"rebooted: boot id {BOOT_A} → {BOOT_B}"
    assert (done.boot_id_before, done.boot_id, done.finished_at) == (BOOT_A, BOOT_B, NOW)


def test_rem2_the_same_boot_id_means_the_reboot_did_not_happen() -> None:
    done = settle(pending(), BOOT_A, NOW)
    assert (done.result, done.reason) == ("failed", "boot id unchanged: the reboot did not happen")
    assert (done.boot_id_before, done.boot_id) == (BOOT_A, BOOT_A)


def test_rem2_no_boot_id_now_cannot_prove_it() -> None:
    done = settle(pending(), None, NOW)
    assert done.result == "failed" and "could not be proven" in done.reason


def test_rem2_the_pending_reboot_is_settled_once(tmp_path: Path) -> None:
    save_pending(tmp_path, pending())
    assert take_pending(tmp_path) == pending()
    assert not (tmp_path / PENDING_FILE).exists() and take_pending(tmp_path) is None
    assert not (tmp_path / (PENDING_FILE + ".tmp")).exists()


def test_rem2_a_garbled_pending_reboot_says_so_and_is_removed(tmp_path: Path) -> None:
    (tmp_path / PENDING_FILE).write_bytes(b'{"request": ')
    why = take_pending(tmp_path)
    assert isinstance(why, str) and "is not a pending reboot" in why
    assert not (tmp_path / PENDING_FILE).exists()


@given(handled=st.lists(st.text(min_size=1, max_size=4), max_size=80), new=st.text(min_size=1, max_size=4))
def test_rem2_handled_ids_are_bounded_newest_last(handled: list[str], new: str) -> None:
    kept = remember(handled, new, kept=16)
    assert kept[-1] == new and len(kept) <= 16 and len(set(kept)) == len(set(kept[:-1])) + 1


# ---------------------------------------------------------------------------- running commands


def fake(bin_dir: Path, name: str, script: str) -> Path:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path


async def test_rem2_a_command_not_on_path_fails_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert await run_command(gpu_reset_argv(0), 5) == "nvidia-smi not found on PATH"


async def test_rem2_a_hanging_command_is_killed_at_its_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake(tmp_path, "nvidia-smi", "exec /bin/sleep 30\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    started = asyncio.get_running_loop().time()
    assert await run_command(gpu_reset_argv(0), 0.3) == "nvidia-smi -r -i 0 timed out after 0.3 s and was killed"
    assert asyncio.get_running_loop().time() - started < 5


async def test_rem2_a_flooding_command_costs_a_bounded_read(tmp_path: Path) -> None:
    # 4 MiB of output, then a last line: kept is the tail, at most the bound.
    flood = fake(tmp_path, "flood", "/usr/bin/head -c 4194304 /dev/zero | /usr/bin/tr '\\0' x; echo; "
                                    "echo 'the last line' >&2; exit 7\n")
    done = await probe.run_probe([str(flood)], 10, keep_bytes=4096)
    assert done.returncode == 7 and len(done.stdout) <= 4096 and done.stderr == b"the last line\n"
    assert command_failure(["flood"], done.returncode, done.stdout, done.stderr) == "flood exited with 7: the last line"


class Calls:
    """A ``run_command`` that records argv and answers from a table."""

    def __init__(self, answers: dict[str, str | None] | None = None, state_dir: Path | None = None) -> None:
        self.argv: list[list[str]] = []
        self.answers = answers or {}
        self.state_dir = state_dir
        self.pending_when_run: bool | None = None

    async def __call__(self, argv: Sequence[str], timeout_s: float) -> str | None:
        self.argv.append(list(argv))
        if self.state_dir is not None:
            self.pending_when_run = (self.state_dir / PENDING_FILE).exists()
        return self.answers.get(" ".join(argv))


async def test_rem2_a_reset_stops_at_the_first_gpu_that_fails(tmp_path: Path) -> None:
    calls = Calls({"nvidia-smi -r -i 2": "nvidia-smi -r -i 2 exited with 255: In use by another client"})
    failure = await HostActions(tmp_path, calls).gpu_reset([0, 2, 3], 60)
    assert calls.argv == [gpu_reset_argv(0), gpu_reset_argv(2)]
    assert failure == "nvidia-smi -r -i 2 exited with 255: In use by another client (GPU 0 reset before it)"


async def test_rem2_a_reboot_is_persisted_before_systemctl_runs(tmp_path: Path) -> None:
    calls = Calls(state_dir=tmp_path)
    assert await HostActions(tmp_path, calls).reboot(pending(), 60) is None
    assert calls.argv == [reboot_argv()] and calls.pending_when_run is True
    saved = json.loads((tmp_path / PENDING_FILE).read_text())
    assert saved["bootIdBefore"] == BOOT_A and saved["request"]["id"] == "boot-1"


async def test_rem2_a_reboot_systemctl_refuses_leaves_nothing_pending(tmp_path: Path) -> None:
    calls = Calls({"systemctl reboot": "systemctl reboot exited with 1: Access denied"}, tmp_path)
    assert await HostActions(tmp_path, calls).reboot(pending(), 60) == "systemctl reboot exited with 1: Access denied"
    assert not (tmp_path / PENDING_FILE).exists()


# ---------------------------------------------------------------------------- the remediator


class FakeActions:
    def __init__(self, gate: asyncio.Event | None = None, failure: str | None = None) -> None:
        self.resets: list[list[int]] = []
        self.reboots: list[PendingReboot] = []
        self.gate, self.failure = gate, failure

    async def gpu_reset(self, gpus: Sequence[int], within_s: float) -> str | None:
        self.resets.append(list(gpus))
        if self.gate is not None:
            await self.gate.wait()
        return self.failure

    async def reboot(self, pending: PendingReboot, within_s: float) -> str | None:
        self.reboots.append(pending)
        return self.failure


class Node:
    def __init__(self, actions: FakeActions, state_dir: Path | None = None) -> None:
        self.outcomes: list[wire.RemediationOutcome] = []
        self.counted: list[tuple[str, str]] = []
        self.rejected = 0
        self.log = Log()
        self.remediator = Remediator("n1", "c1", actions, lambda: NodeFacts(GPUS, BOOT_A), self.outcomes.append,
                                     self.log, lambda a, r: self.counted.append((a, r)), self._reject, state_dir)

    def _reject(self) -> None:
        self.rejected += 1

    async def take(self, raw: bytes) -> None:
        self.remediator.take(raw, NOW)
        await asyncio.sleep(0.01)  # the step's task runs


async def test_rem2_a_reset_runs_and_its_outcome_is_reported(tmp_path: Path) -> None:
    actions = FakeActions()
    node = Node(actions, tmp_path)
    await node.take(payload(gpus=[3, 1, 3]))
    assert actions.resets == [[3, 1]]
    [done] = node.outcomes
    assert (done.request_id, done.action, done.result, done.reason) == ("r1", "gpu-reset", "succeeded", "GPUs 3, 1 reset")
    assert node.counted == [("gpu-reset", "succeeded")]


async def test_rem2_forged_and_garbage_requests_run_nothing(tmp_path: Path) -> None:
    actions = FakeActions()
    node = Node(actions, tmp_path)
    await node.take(payload(id="f1", node_id="n2"))
    await node.take(b'{"id": "f2", "action": "exec", "nodeId": "n1", "argv": ["/bin/sh"]}')
    await node.take(b"\x89PNG\r\n\x1a\n")
    assert actions.resets == [] and actions.reboots == []
    assert [(o.request_id, o.result) for o in node.outcomes] == [("f1", "refused"), ("f2", "refused")]
    assert node.counted == [("gpu-reset", "refused"), ("other", "refused")]
    assert node.rejected == 1
    [(level, _, fields)] = [line for line in node.log.lines if "malformed" in line[1]]
    assert level == "warning" and "\n" not in fields["reason"]


async def test_rem2_one_request_at_a_time_and_an_id_once(tmp_path: Path) -> None:
    gate = asyncio.Event()
    actions = FakeActions(gate)
    node = Node(actions, tmp_path)
    await node.take(payload(id="a"))
    await node.take(payload(id="b", action="reboot"))
    await node.take(payload(id="a"))  # the same request again: ignored, not "busy"
    gate.set()
    await asyncio.sleep(0.01)
    assert [(o.request_id, o.result) for o in node.outcomes] == [("b", "refused"), ("a", "succeeded")]
    assert node.outcomes[0].reason == "busy: remediation a (gpu-reset) is running"
    assert actions.resets == [list(GPUS)] and actions.reboots == []
    # Handled ids outlive the agent: a restarted one ignores "a" too.
    assert json.loads((tmp_path / HANDLED_FILE).read_text()) == ["a", "b"]
    again = Node(FakeActions(), tmp_path)
    await again.take(payload(id="a"))
    assert again.outcomes == []


async def test_rem2_a_reboot_under_way_reports_nothing_until_the_next_boot(tmp_path: Path) -> None:
    actions = FakeActions()
    node = Node(actions, tmp_path)
    await node.take(payload(id="boot-1", action="reboot"))
    assert [p.boot_id_before for p in actions.reboots] == [BOOT_A] and node.outcomes == []
    save_pending(tmp_path, actions.reboots[0])  # what HostActions wrote
    after = Node(FakeActions(), tmp_path)
    after.remediator.settle_pending(BOOT_B, NOW)
    [done] = after.outcomes
    assert (done.request_id, done.result, done.boot_id_before, done.boot_id) == ("boot-1", "succeeded", BOOT_A, BOOT_B)
    assert not (tmp_path / PENDING_FILE).exists()


async def test_rem2_a_reboot_that_cannot_start_is_failed_with_the_boot_id(tmp_path: Path) -> None:
    node = Node(FakeActions(failure="systemctl not found on PATH"), tmp_path)
    await node.take(payload(id="boot-2", action="reboot"))
    [done] = node.outcomes
    assert (done.result, done.reason, done.boot_id_before) == ("failed", "systemctl not found on PATH", BOOT_A)


async def test_rem2_an_action_that_raises_is_a_failed_outcome(tmp_path: Path) -> None:
    class Broken(FakeActions):
        async def gpu_reset(self, gpus: Sequence[int], within_s: float) -> str | None:
            raise OSError(5, "Input/output error")

    node = Node(Broken(), tmp_path)
    await node.take(payload())
    [done] = node.outcomes
    assert (done.result, done.reason) == ("failed", "OSError: [Errno 5] Input/output error")


# ---------------------------------------------------------------------------- the resource report


def test_rem2_the_resource_report_carries_the_boot_id_and_the_latest_outcome() -> None:
    node = SimNode("sim-000")
    collector = Collector(Settings(node_id="sim-000", cluster="c1"), node, node.kmsg)
    collector.refresh_inventory()
    before = collector.resource_report(True, NOW)
    assert before is not None and before.boot_id == node.boot_id and before.remediation is None
    done = settle(pending(), BOOT_B, NOW)
    collector.report_outcome(done)
    after = collector.resource_report(True, NOW)
    assert collector.remediated.is_set() and after is not None and after.remediation == done
    assert collector.nvidia_gpus() == tuple(range(8))
    assert msgspec.json.decode(wire.encode(after))["remediation"]["bootIdBefore"] == BOOT_A


# ---------------------------------------------------------------------------- the simulator


def test_rem2_sim_a_reset_clears_what_a_reset_clears() -> None:
    node = SimNode("sim-001")
    for fault in ("ecc-correctable", "ecc-uncorrectable", "throttle-thermal", "row-remap-failure", "xid:13",
                  "silent-gpu"):
        node.inject(fault, 2, NOW)
    assert node.reset_gpus([2]) is None
    gpu = node.hardware.gpus[2]
    assert (gpu.ecc_volatile, gpu.throttle) == ([0, 0], [])
    assert gpu.ecc_aggregate == [1, 1] and gpu.remap_failed and gpu.silently_bad  # kept by the card
    assert [x.xid for x in node.kmsg.signal({gpu.pci_bus_id: 2}).xid] == [13]  # the kernel log keeps it


def test_rem2_sim_a_gpu_off_the_bus_cannot_be_reset() -> None:
    node = SimNode("sim-002")
    node.inject("xid:79", 1, NOW)
    failure = node.reset_gpus([0, 1])
    assert failure is not None and failure.startswith("nvidia-smi -r -i 1 exited with 15: ")
    assert "GPU is lost" in failure and node.hardware.gpus[1].lost


def test_rem2_sim_a_reboot_is_a_new_boot() -> None:
    node = SimNode("sim-003")
    boot_before = node.boot_id
    for fault, gpu in (("xid:79", 1), ("ecc-uncorrectable", 0), ("edac-ue", None), ("readonly-mount", None),
                       ("smart-failing", None), ("silent-gpu", 3)):
        node.inject(fault, gpu, NOW)
    node.boot()
    hw = node.hardware
    assert node.boot_id != boot_before and node.inventory().boot_id == node.boot_id
    assert node.kmsg.signal({}).xid == [] and not hw.gpus[1].lost and hw.gpus[0].ecc_volatile == [0, 0]
    assert (hw.edac_ue, hw.readonly_mount) == (0, False)
    assert hw.gpus[0].ecc_aggregate == [0, 1] and hw.smart_failing and hw.gpus[3].silently_bad

