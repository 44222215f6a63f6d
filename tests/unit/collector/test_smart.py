"""SMART via smartctl -j: parsers against the real JSON of FORMATS.md §5, and the adapter against
fake ``smartctl`` executables (COL-3, COL-4, COL-12)."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import time
from pathlib import Path

import msgspec
import pytest

from healthplane.contracts import wire
from healthplane_collector.probe import read_smart
from healthplane_collector.smart import (
    EXIT_STATUS_BITS,
    ScannedDevice,
    SmartParseError,
    decode_exit_status,
    device_argv,
    device_outcome,
    parse_smartctl,
    probe_failure,
    scan_devices,
    scan_outcome,
    smart_signal,
    unread,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "collector" / "smart"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def fixture_exit_status(name: str) -> int:
    status: int = json.loads(fixture(name))["smartctl"]["exit_status"]
    return status


# ---------------------------------------------------------------------------- exit status


@pytest.mark.parametrize(
    ("exit_status", "bits"),
    [
        (0, []),
        (2, ["device_open_failed"]),
        (4, ["smart_command_failed"]),
        (8, ["disk_failing"]),
        (24, ["disk_failing", "prefail_attributes_failing"]),
        (96, ["attributes_failed_in_past", "error_log_has_errors"]),
        (192, ["error_log_has_errors", "self_test_log_has_errors"]),
        (
            255,
            [
                "command_line_did_not_parse",
                "device_open_failed",
                "smart_command_failed",
                "disk_failing",
                "prefail_attributes_failing",
                "attributes_failed_in_past",
                "error_log_has_errors",
                "self_test_log_has_errors",
            ],
        ),
    ],
)
def test_exit_status_bits_decode_per_smartctl_man_page(exit_status: int, bits: list[str]) -> None:
    """COL-3: the exit status is a bitmask of eight findings (FORMATS §5.1), decoded by name."""
    assert decode_exit_status(exit_status) == bits


def test_exit_status_bit_table_covers_bits_0_to_7() -> None:
    assert sorted(EXIT_STATUS_BITS) == list(range(8))
    assert len(set(EXIT_STATUS_BITS.values())) == 8


# ---------------------------------------------------------------------------- parse_smartctl


@pytest.mark.parametrize(
    ("name", "protocol", "model", "serial", "passed", "bits", "critical_warning", "now", "past"),
    [
        (
            "ata_wdc_passing.json",
            "ATA",
            "WDC WD20EFRX-68EUZN0",
            None,
            True,
            [],
            None,
            [],
            [],
        ),
        (
            "ata_wdc_failing_now.json",
            "ATA",
            "WDC WD20EFRX-68EUZN0",
            None,
            False,
            ["disk_failing", "prefail_attributes_failing"],
            None,
            [5],
            [],
        ),
        (
            "ata_wdc_failed_in_past.json",
            "ATA",
            "WDC WD20EFRX-68EUZN0",
            None,
            True,
            ["attributes_failed_in_past", "error_log_has_errors"],
            None,
            [],
            [1],
        ),
        (
            "nvme_intel_passing.json",
            "NVMe",
            "INTEL SSDPE2KX080T8",
            "REDACTED",
            True,
            [],
            0,
            [],
            [],
        ),
        (
            "nvme_intel_critical_warning.json",
            "NVMe",
            "INTEL SSDPE2KX080T8",
            "REDACTED",
            False,
            ["disk_failing"],
            8,
            [],
            [],
        ),
    ],
)
def test_parse_smartctl_real_json(
    name: str,
    protocol: str,
    model: str,
    serial: str | None,
    passed: bool,
    bits: list[str],
    critical_warning: int | None,
    now: list[int],
    past: list[int],
) -> None:
    """COL-3: ATA and NVMe readings from the real smartctl JSON (FORMATS §5.3, §5.4)."""
    exit_status = fixture_exit_status(name)
    device = parse_smartctl("/dev/sdx", exit_status, fixture(name))
    assert device.name == "/dev/sdx"
    assert device.protocol == protocol
    assert device.model == model
    assert device.serial == serial
    assert device.passed is passed
    assert device.exit_status == exit_status
    assert device.exit_status_bits == bits
    assert device.critical_warning == critical_warning
    assert [a.id for a in device.failing_now] == now
    assert [a.id for a in device.failed_in_past] == past
    assert device.error is None
    assert probe_failure(device) is None  # a failing disk is a reading, not a probe failure


def test_failing_attribute_keeps_its_numbers() -> None:
    device = parse_smartctl("/dev/sdb", 24, fixture("ata_wdc_failing_now.json"))
    assert device.failing_now == [
        wire.SmartAttribute(
            id=5,
            name="Reallocated_Sector_Ct",
            value=120,
            worst=120,
            thresh=140,
            raw=2048,
            when_failed="now",
        )
    ]


def test_nvme_critical_warning_without_smart_status_still_fails() -> None:
    """NVMe passed is exactly !critical_warning (nvmeprint.cpp), also when -H was not run."""
    document = json.loads(fixture("nvme_intel_critical_warning.json"))
    del document["smart_status"]
    device = parse_smartctl("/dev/nvme0", 8, json.dumps(document).encode())
    assert device.passed is False
    assert device.critical_warning == 8


def test_no_smart_status_means_no_verdict_never_passing() -> None:
    """COL-4: absent health is null, never passing."""
    document = json.loads(fixture("ata_wdc_passing.json"))
    del document["smart_status"]
    device = parse_smartctl("/dev/sdb", 0, json.dumps(document).encode())
    assert device.passed is None


def test_process_exit_status_is_what_counts() -> None:
    device = parse_smartctl("/dev/nvme0", 8, fixture("nvme_intel_passing.json"))
    assert device.exit_status_bits == ["disk_failing"]


def test_open_failure_is_a_probe_failure_with_smartctl_message() -> None:
    """COL-12: a disk smartctl cannot open fails the signal, with smartctl's own words."""
    device = parse_smartctl("/dev/sdc", 2, fixture("ata_open_failed.json"))
    assert device.passed is None
    assert device.exit_status_bits == ["device_open_failed"]
    assert device.error == "Smartctl open device: /dev/sdc [SAT] failed: No such device"
    assert probe_failure(device) == (
        "smartctl could not open /dev/sdc: Smartctl open device: /dev/sdc [SAT] failed: "
        "No such device"
    )


@pytest.mark.parametrize(
    ("exit_status", "passed", "smart_available", "fails"),
    [
        (4, None, None, True),  # SMART command failed, no verdict: a broken probe
        (4, None, True, True),
        (4, None, False, False),  # the device says it has no SMART: nothing to read
        (4, True, None, False),  # a verdict came back despite a failed optional command
        (1, True, None, True),  # our command line was rejected
        (8, False, None, False),  # DISK FAILING is a finding
    ],
)
def test_probe_failure_rules(
    exit_status: int, passed: bool | None, smart_available: bool | None, fails: bool
) -> None:
    device = wire.SmartDevice(name="/dev/sda", passed=passed, exit_status=exit_status)
    assert (probe_failure(device, smart_available) is not None) is fails


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"Segmentation fault",
        b"\xff\xfe\x00garbage",
        b"[1, 2, 3]",
        b'{"hello": "world"}',
        fixture("ata_wdc_passing.json")[:200],  # truncated mid-document
        b'{"json_format_version": [1, 0], "smart_status": {"passed": "yes"}}',
        b'{"json_format_version": [1, 0], "ata_smart_attributes": {"table": [{"name": "x"}]}}',
        b'{"json_format_version": [1, 0], "ata_smart_attributes": {"table": '
        b'[{"id": 5, "when_failed": "sometime"}]}}',
        b'{"json_format_version": [1, 0], "nvme_smart_health_information_log": '
        b'{"critical_warning": "8"}}',
    ],
)
def test_garbage_output_raises_naming_the_device(garbage: bytes) -> None:
    """COL-12: garbage smartctl output is an error naming the device, never a reading."""
    with pytest.raises(SmartParseError, match=r"^/dev/sdq: ") as caught:
        parse_smartctl("/dev/sdq", 0, garbage)
    assert caught.value.device == "/dev/sdq"


# ---------------------------------------------------------------------------- scan


def test_scan_lists_devices_with_types_and_labels_raid_members_apart() -> None:
    assert scan_devices(fixture("scan.json")) == [
        ScannedDevice(name="/dev/sda", type="sat", protocol="ATA", label="/dev/sda"),
        ScannedDevice(name="/dev/nvme0", type="nvme", protocol="NVMe", label="/dev/nvme0"),
        ScannedDevice(
            name="/dev/bus/0", type="megaraid,0", protocol="SCSI", label="/dev/bus/0 [megaraid,0]"
        ),
        ScannedDevice(
            name="/dev/bus/0", type="megaraid,1", protocol="SCSI", label="/dev/bus/0 [megaraid,1]"
        ),
    ]


def test_scan_open_keeps_open_errors() -> None:
    scanned = scan_devices(fixture("scan_open.json"))
    assert [(d.name, d.open_error) for d in scanned] == [
        ("/dev/sda", None),
        ("/dev/sdc", "No such device"),
    ]


def test_scan_without_devices_is_empty() -> None:
    assert scan_devices(b'{"json_format_version": [1, 0], "smartctl": {"exit_status": 0}}') == []


@pytest.mark.parametrize(
    "garbage",
    [b"/dev/sda -d sat # /dev/sda [SAT], ATA device", b'{"devices": {}}', b'{"devices": [{}]}'],
)
def test_scan_garbage_raises(garbage: bytes) -> None:
    with pytest.raises(SmartParseError, match="smartctl --scan"):
        scan_devices(garbage)


# ---------------------------------------------------------------------------- a run's outcome

SDA = ScannedDevice(name="/dev/sda", type="sat", protocol="ATA")


def test_device_argv_names_the_type_and_puts_the_device_last() -> None:
    assert device_argv("/usr/sbin/smartctl", SDA) == ["/usr/sbin/smartctl", "-j", "-a", "-d", "sat", "/dev/sda"]
    assert device_argv("smartctl", ScannedDevice(name="/dev/sdb")) == ["smartctl", "-j", "-a", "/dev/sdb"]


@pytest.mark.parametrize(
    ("returncode", "stdout", "stderr", "problem"),
    [
        (-9, b"", b"", "smartctl -a /dev/sda died of signal 9"),
        (0, b'{"json_format', b"Segmentation fault\n",
         "smartctl -a /dev/sda: smartctl output is not JSON"),
    ],
)
def test_a_run_that_went_wrong_leaves_the_disk_unread_naming_why_COL_12(
    returncode: int, stdout: bytes, stderr: bytes, problem: str
) -> None:
    reading, why = device_outcome(SDA, returncode, stdout, stderr)
    assert why is not None and why.startswith(problem)
    assert (reading.name, reading.passed, reading.error) == ("/dev/sda", None, why)


def test_a_disk_smartctl_could_not_open_keeps_smartctl_words_COL_12() -> None:
    name = "ata_open_failed.json"
    reading, why = device_outcome(SDA, fixture_exit_status(name), fixture(name), b"")
    assert why == "smartctl could not open /dev/sda: Smartctl open device: /dev/sdc [SAT] failed: No such device"
    assert (reading.passed, reading.error) == (None, "Smartctl open device: /dev/sdc [SAT] failed: No such device")


def test_garbage_names_the_first_stderr_line_COL_12() -> None:
    _, why = device_outcome(SDA, 0, b"garbage", b"\n  Segmentation fault  \nmore\n")
    assert why is not None and why.endswith("(stderr: Segmentation fault)")


def test_a_failing_disk_is_a_reading_not_a_problem_COL_3() -> None:
    name = "ata_wdc_failing_now.json"
    reading, why = device_outcome(SDA, fixture_exit_status(name), fixture(name), b"")
    assert why is None
    assert (reading.passed, reading.exit_status_bits) == (False, ["disk_failing", "prefail_attributes_failing"])


@pytest.mark.parametrize(
    ("returncode", "stdout", "expected"),
    [
        (0, b'{"json_format_version": [1, 0]}',
         wire.SmartSignal(status="unavailable", reason="smartctl --scan found no SMART-capable devices")),
        (1, b'{"json_format_version": [1, 0], "devices": []}',
         wire.SmartSignal(status="failed", reason="smartctl --scan exited 1 listing no devices")),
        (0, b'{"json_format_version": [1, 0], "devices": [{"name": "/dev/sda", "type": "sat"}]}',
         [ScannedDevice(name="/dev/sda", type="sat")]),
    ],
)
def test_scan_outcome(returncode: int, stdout: bytes, expected: object) -> None:
    assert scan_outcome(returncode, stdout) == expected


def test_scan_outcome_of_garbage_fails() -> None:
    outcome = scan_outcome(0, b"Segmentation fault")
    assert isinstance(outcome, wire.SmartSignal) and outcome.status == "failed"
    assert (outcome.reason or "").startswith("smartctl --scan: smartctl output is not JSON")


def test_one_unread_disk_fails_the_signal_and_every_disk_is_listed_COL_12() -> None:
    passing = wire.SmartDevice(name="/dev/nvme0", passed=True)
    signal = smart_signal([unread(SDA, "smartctl -a /dev/sda timed out after 1s and was killed"), (passing, None)])
    assert signal.status == "failed"
    assert signal.reason == "smartctl -a /dev/sda timed out after 1s and was killed"
    assert [d.name for d in signal.devices] == ["/dev/sda", "/dev/nvme0"]
    assert smart_signal([(passing, None)]) == wire.SmartSignal(status="ok", devices=[passing])


# ---------------------------------------------------------------------------- adapter


def fake_smartctl(tmp_path: Path, scan: str, devices: dict[str, str]) -> Path:
    """A ``smartctl`` stand-in: ``scan`` and each device's shell body; logs its argv."""
    log = tmp_path / "argv.log"
    cases = "\n".join(f"  {shlex.quote(name)}) {body} ;;" for name, body in devices.items())
    script = tmp_path / "smartctl"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {shlex.quote(str(log))}\n'
        "for last; do :; done\n"
        f'case "$*" in *--scan*) {scan} ;; esac\n'
        'case "$last" in\n'
        f"{cases}\n"
        '  *) echo "unexpected device $last" >&2; exit 1 ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    return script


def cat(name: str, exit_status: int | None = None) -> str:
    status = fixture_exit_status(name) if exit_status is None else exit_status
    return f"cat {shlex.quote(str(FIXTURES / name))}; exit {status}"


SCAN_SDA_NVME = (
    'echo \'{"json_format_version": [1, 0], "devices": ['
    '{"name": "/dev/sda", "type": "sat", "protocol": "ATA"}, '
    '{"name": "/dev/nvme0", "type": "nvme", "protocol": "NVMe"}]}\'; exit 0'
)


async def test_reads_every_scanned_disk_with_its_type(tmp_path: Path) -> None:
    """COL-3: scan, then smartctl -j -a -d TYPE DEV per disk; the device name goes last."""
    smartctl = fake_smartctl(
        tmp_path,
        SCAN_SDA_NVME,
        {"/dev/sda": cat("ata_wdc_passing.json"), "/dev/nvme0": cat("nvme_intel_passing.json")},
    )
    signal = await read_smart(str(smartctl), timeout_s=5)
    assert signal.status == "ok", signal.reason
    assert signal.reason is None
    assert [(d.name, d.protocol, d.passed) for d in signal.devices] == [
        ("/dev/sda", "ATA", True),
        ("/dev/nvme0", "NVMe", True),
    ]
    argv = sorted((tmp_path / "argv.log").read_text().splitlines())
    assert argv == ["-j --scan", "-j -a -d nvme /dev/nvme0", "-j -a -d sat /dev/sda"]


async def test_failing_disk_exit_status_is_data_not_an_error(tmp_path: Path) -> None:
    """COL-3/COL-4: smartctl exits 24 for a failing disk; the signal is ok, the disk is not."""
    smartctl = fake_smartctl(
        tmp_path,
        SCAN_SDA_NVME,
        {
            "/dev/sda": cat("ata_wdc_failing_now.json"),
            "/dev/nvme0": cat("nvme_intel_critical_warning.json"),
        },
    )
    signal = await read_smart(str(smartctl), timeout_s=5)
    assert signal.status == "ok"
    sda, nvme0 = signal.devices
    assert (sda.passed, sda.exit_status, sda.exit_status_bits) == (
        False,
        24,
        ["disk_failing", "prefail_attributes_failing"],
    )
    assert (nvme0.passed, nvme0.critical_warning) == (False, 8)


async def test_missing_smartctl_is_unavailable_with_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """COL-4: no smartctl → unavailable, saying why; never passing."""
    monkeypatch.setenv("PATH", str(tmp_path))
    signal = await read_smart()
    assert signal == wire.SmartSignal(
        status="unavailable", reason="smartctl not found on PATH (smartmontools not installed)"
    )
    missing = await read_smart(str(tmp_path / "nope" / "smartctl"))
    assert missing.status == "unavailable"
    assert str(tmp_path / "nope" / "smartctl") in (missing.reason or "")


async def test_no_devices_is_unavailable(tmp_path: Path) -> None:
    smartctl = fake_smartctl(tmp_path, "echo '{\"json_format_version\": [1, 0]}'; exit 0", {})
    signal = await read_smart(str(smartctl), timeout_s=5)
    assert signal.status == "unavailable"
    assert "no SMART-capable devices" in (signal.reason or "")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:  # a zombie waiting for its reaper is dead too
        return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


async def test_hung_smartctl_is_killed_at_its_timeout_and_fails_naming_the_disk(
    tmp_path: Path,
) -> None:
    """COL-12: a hung smartctl (``sleep 60``) is killed at its timeout → failed, disk named;
    the disk that answered is still reported."""
    pid_file = tmp_path / "sleep.pid"
    smartctl = fake_smartctl(
        tmp_path,
        SCAN_SDA_NVME,
        {
            "/dev/sda": f"sleep 60 & echo $! > {shlex.quote(str(pid_file))}; wait",
            "/dev/nvme0": cat("nvme_intel_passing.json"),
        },
    )
    started = time.monotonic()
    signal = await read_smart(str(smartctl), timeout_s=0.5)
    elapsed = time.monotonic() - started
    assert elapsed < 5
    assert signal.status == "failed"
    assert signal.reason == "smartctl -a /dev/sda timed out after 0.5s and was killed"
    sda, nvme0 = signal.devices
    assert (sda.name, sda.passed, sda.error) == ("/dev/sda", None, signal.reason)
    assert (nvme0.name, nvme0.passed) == ("/dev/nvme0", True)
    sleeper = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not _gone(sleeper) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _gone(sleeper), "the hung smartctl's child outlived the timeout"


async def test_child_holding_the_pipe_after_smartctl_exits_is_killed_too(
    tmp_path: Path,
) -> None:
    """COL-12: output never ends while a leftover child holds stdout; it dies at the timeout."""
    pid_file = tmp_path / "sleep.pid"
    smartctl = fake_smartctl(
        tmp_path,
        SCAN_SDA_NVME,
        {
            "/dev/sda": f"sleep 60 & echo $! > {shlex.quote(str(pid_file))}; exit 0",
            "/dev/nvme0": cat("nvme_intel_passing.json"),
        },
    )
    signal = await read_smart(str(smartctl), timeout_s=0.5)
    assert signal.status == "failed"
    assert signal.reason == "smartctl -a /dev/sda timed out after 0.5s and was killed"
    sleeper = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not _gone(sleeper) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _gone(sleeper)


async def test_hung_scan_fails(tmp_path: Path) -> None:
    smartctl = fake_smartctl(tmp_path, "exec sleep 60", {})
    signal = await read_smart(str(smartctl), timeout_s=0.3)
    assert signal == wire.SmartSignal(
        status="failed", reason="smartctl --scan timed out after 0.3s and was killed"
    )


async def test_garbage_from_one_disk_fails_the_signal_naming_it(tmp_path: Path) -> None:
    """COL-12: garbage output → failed with a clear reason; the other disk is still read."""
    smartctl = fake_smartctl(
        tmp_path,
        SCAN_SDA_NVME,
        {
            "/dev/sda": "echo 'Segmentation fault' >&2; printf '{\"json_format'; exit 0",
            "/dev/nvme0": cat("nvme_intel_passing.json"),
        },
    )
    signal = await read_smart(str(smartctl), timeout_s=5)
    assert signal.status == "failed"
    assert signal.reason is not None
    assert signal.reason.startswith("smartctl -a /dev/sda: smartctl output is not JSON")
    assert signal.reason.endswith("(stderr: Segmentation fault)")
    assert [d.passed for d in signal.devices] == [None, True]


async def test_garbage_scan_fails(tmp_path: Path) -> None:
    smartctl = fake_smartctl(tmp_path, "echo '/dev/sda -d sat # /dev/sda'; exit 0", {})
    signal = await read_smart(str(smartctl), timeout_s=5)
    assert signal.status == "failed"
    assert (signal.reason or "").startswith("smartctl --scan: smartctl output is not JSON")


async def test_disk_that_cannot_be_opened_fails_the_signal(tmp_path: Path) -> None:
    """COL-4/COL-12: smartctl ran but could not open the disk → failed, with its message."""
    smartctl = fake_smartctl(
        tmp_path,
        SCAN_SDA_NVME,
        {"/dev/sda": cat("ata_open_failed.json"), "/dev/nvme0": cat("nvme_intel_passing.json")},
    )
    signal = await read_smart(str(smartctl), timeout_s=5)
    assert signal.status == "failed"
    assert signal.reason == (
        "smartctl could not open /dev/sda: Smartctl open device: /dev/sdc [SAT] failed: "
        "No such device"
    )
    assert signal.devices[0].exit_status_bits == ["device_open_failed"]


async def test_scan_open_error_fails_without_running_smartctl_on_it(tmp_path: Path) -> None:
    scan = f"cat {shlex.quote(str(FIXTURES / 'scan_open.json'))}; exit 0"
    smartctl = fake_smartctl(tmp_path, scan, {"/dev/sda": cat("ata_wdc_passing.json")})
    signal = await read_smart(str(smartctl), timeout_s=5)
    assert signal.status == "failed"
    assert signal.reason == "smartctl could not open /dev/sdc: No such device"
    assert "/dev/sdc" not in (tmp_path / "argv.log").read_text()


async def test_signal_encodes_to_the_report_shape(tmp_path: Path) -> None:
    """The wire shape other programs rely on: smart.devices[].{name, passed}."""
    smartctl = fake_smartctl(
        tmp_path,
        SCAN_SDA_NVME,
        {
            "/dev/sda": cat("ata_wdc_failed_in_past.json"),
            "/dev/nvme0": cat("nvme_intel_passing.json"),
        },
    )
    encoded = msgspec.json.decode(wire.encode(await read_smart(str(smartctl), timeout_s=5)))
    assert encoded["status"] == "ok"
    sda = encoded["devices"][0]
    assert sda["name"] == "/dev/sda"
    assert sda["passed"] is True
    assert sda["exitStatusBits"] == ["attributes_failed_in_past", "error_log_has_errors"]
    assert sda["failedInPast"][0]["whenFailed"] == "past"
