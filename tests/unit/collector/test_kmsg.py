"""The kernel ring buffer parsed (COL-3, COL-5, COL-7, COL-12), against the real lines in
``reference/FORMATS.md`` §1 and §2.1-2.9.

Lines are copied verbatim, with the syslog or dmesg rendering still on them; ``_kmsg_text``
takes that rendering off, because ``/dev/kmsg`` hands the agent the kernel's text alone.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from healthplane.contracts import wire
from healthplane_collector.kmsg import (
    EdacFinding,
    Finding,
    GpuOffBusFinding,
    HardwareErrorFinding,
    KmsgRecord,
    KmsgTally,
    MachineCheckFinding,
    MalformedRecord,
    RemountReadOnlyFinding,
    SxidFinding,
    SxidSeverity,
    XidFinding,
    classify,
    is_out_of_band,
    parse_record,
)

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)

# "Sep 16 19:51:15 host kernel: " (syslog), then "[    0.064265] " or "[Mon Jan 27 19:27:15 2020] " (dmesg).
_RENDERING = re.compile(
    r"^(?:.*?\bkernel: +)?"
    r"(?:\[(?:\s*\d+\.\d+|\w{2,3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\] +)?"
)


def _kmsg_text(line: str) -> str:
    return _RENDERING.sub("", line, count=1)


def _record(message: str, seq: int = 1, facility: int = 0) -> KmsgRecord:
    return KmsgRecord(seq=seq, usec=seq * 1000, level=4, facility=facility, message=message)


def _tally(lines: str, tally: KmsgTally | None = None, at: datetime = T0) -> KmsgTally:
    tally = tally if tally is not None else KmsgTally()
    for seq, line in enumerate(lines.strip("\n").splitlines(), start=1):
        tally.add(_record(_kmsg_text(line), seq), at)
    return tally


# ---------------------------------------------------------------------------- records (§1)


@pytest.mark.parametrize(
    ("raw", "seq", "usec", "level", "facility", "message", "continuation"),
    [
        pytest.param(
            b"7,160,424069,-;pci_root PNP0A03:00: host bridge window [io  0x0000-0x0cf7] (ignored)\n"
            b" SUBSYSTEM=acpi\n DEVICE=+acpi:PNP0A03:00\n",
            160, 424069, 7, 0,
            "pci_root PNP0A03:00: host bridge window [io  0x0000-0x0cf7] (ignored)",
            {"SUBSYSTEM": "acpi", "DEVICE": "+acpi:PNP0A03:00"},
            id="abi-example-with-continuation-lines",
        ),
        pytest.param(
            b"6,339,5140900,-;NET: Registered protocol family 10\n",
            339, 5140900, 6, 0, "NET: Registered protocol family 10", {}, id="abi-kernel",
        ),
        pytest.param(
            b"30,340,5690716,-;udevd[80]: starting version 181\n",
            340, 5690716, 6, 3, "udevd[80]: starting version 181", {}, id="abi-daemon-facility",
        ),
        pytest.param(
            b"6,3964,206764307,-;nvidia-nvswitch2: open (major=510)\n",
            3964, 206764307, 6, 0, "nvidia-nvswitch2: open (major=510)", {}, id="gpud-capture",
        ),
        pytest.param(
            b"6,3973,227996662,-;test", 3973, 227996662, 6, 0, "test", {},
            id="gpud-truncated-last-line",
        ),
        pytest.param(
            b"0,1234,5000000,-;Critical kernel message\n",
            1234, 5000000, 0, 0, "Critical kernel message", {}, id="emerg",
        ),
        pytest.param(
            b"3,2147483647,50000,-;Message with max int32 sequence\n",
            2147483647, 50000, 3, 0, "Message with max int32 sequence", {}, id="int32-seq",
        ),
        pytest.param(
            b"4,100,0,-;Message at boot time\n", 100, 0, 4, 0, "Message at boot time", {},
            id="boot-time",
        ),
        pytest.param(
            b"1,100,9223372036854,-;Large timestamp message\n",
            100, 9223372036854, 1, 0, "Large timestamp message", {}, id="large-timestamp",
        ),
        pytest.param(b"1,100,5000,-;\n", 100, 5000, 1, 0, "", {}, id="empty-text"),
        pytest.param(b"1,100,5000,-;", 100, 5000, 1, 0, "", {}, id="empty-text-no-newline"),
        pytest.param(
            b"3,123,5000,-;Message with; semicolons; in it\n",
            123, 5000, 3, 0, "Message with; semicolons; in it", {}, id="semicolons-in-text",
        ),
        pytest.param(
            b"12,7,9,-;foo\n", 7, 9, 4, 1, "foo", {}, id="userspace-echo-facility-user",
        ),
        pytest.param(
            b"4,7,9,-;a\\x5cb\\x09c \\xe2\\x9c\\x93\n", 7, 9, 4, 0, "a\\b\tc \u2713", {},
            id="escapes-backslash-tab-utf8",
        ),
        pytest.param(
            b"4,7,9,-;\\x5cx41 stays literal\n", 7, 9, 4, 0, "\\x41 stays literal", {},
            id="escaped-backslash-before-x",
        ),
        pytest.param(
            b"3,8,9,-;blk\n DEVICE=b8:0\n SUBSYSTEM=block\\x0a\n", 8, 9, 3, 0, "blk",
            {"DEVICE": "b8:0", "SUBSYSTEM": "block\n"}, id="escaped-continuation-value",
        ),
        pytest.param(
            b"6,18446744073709551615,1,-;last\n", (1 << 64) - 1, 1, 6, 0, "last", {},
            id="u64-max-seq",
        ),
    ],
)
def test_parse_record(
    raw: bytes, seq: int, usec: int, level: int, facility: int, message: str,
    continuation: dict[str, str],
) -> None:
    """COL-3: header fields, facility/level from pri, \\xNN decoded, continuation lines kept."""
    record = parse_record(raw)
    assert (record.seq, record.usec, record.level, record.facility) == (seq, usec, level, facility)
    assert record.message == message
    assert dict(record.continuation) == continuation


def test_parse_record_multi_line_message_is_one_record() -> None:
    """COL-7: an embedded newline arrives escaped as \\x0a; the record stays one message."""
    raw = (
        b"3,2001,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5)"
        b" installed in this system has\\x0aNVRM: fallen off the bus and is not responding to"
        b" commands.\n"
    )
    record = parse_record(raw)
    assert record.message.count("\n") == 2
    assert classify(record.message) == GpuOffBusFinding("0000:b3:00.0", record.message)


@pytest.mark.parametrize(
    ("raw", "fragment", "caller"),
    [
        pytest.param(b"6,5,100,-;hello\n", False, None, id="plain"),
        pytest.param(b"6,5,100,c;hello\n", True, None, id="fragment"),
        pytest.param(b"6,5,100,-,caller=T123;hello\n", False, "T123", id="caller-thread"),
        pytest.param(b"6,5,100,-,caller=C4;hello\n", False, "C4", id="caller-cpu"),
        pytest.param(b"6,5,100,-,caller=T1:C2,future=x,y;hello\n", False, "T1:C2",
                     id="unknown-extra-fields-ignored"),
    ],
)
def test_parse_record_flags_and_extra_header_fields(
    raw: bytes, fragment: bool, caller: str | None
) -> None:
    record = parse_record(raw)
    assert (record.message, record.fragment, record.caller) == ("hello", fragment, caller)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        pytest.param(b"", "no ';'", id="empty"),
        pytest.param(b"no header here\n", "no ';'", id="no-header"),
        pytest.param(b"6,3973;msg\n", "needs 4", id="too-few-fields"),
        pytest.param(b"x,1,2,-;msg\n", "priority", id="priority-not-number"),
        pytest.param(b" 6,1,2,-;msg\n", "priority", id="leading-space"),
        pytest.param(b"6,-1,2,-;msg\n", "sequence", id="negative-seq"),
        pytest.param(b"6,1,2.5,-;msg\n", "timestamp", id="fractional-timestamp"),
        pytest.param(b"6,18446744073709551616,2,-;msg\n", "64 bits", id="seq-over-u64"),
        pytest.param(b"6,1,2,;msg\n", "flags", id="empty-flags"),
        pytest.param(b"6,1,2,- ;msg\n", "flags", id="space-in-flags"),
        pytest.param(b"garbage\n6,1,2,-;msg\n", "priority", id="two-records-glued"),
        pytest.param(b"6,1,2,-;msg\nnot a continuation\n", "continuation", id="bare-second-line"),
        pytest.param(b"6,1,2,-;msg\n SUBSYSTEM\n", "KEY=value", id="continuation-without-equals"),
        pytest.param(b"6,1,2,-;msg\n\n", "continuation", id="blank-second-line"),
    ],
)
def test_parse_record_refuses_malformed(raw: bytes, reason: str) -> None:
    """COL-12: anything that is not a record is refused with a reason, never guessed at."""
    with pytest.raises(MalformedRecord, match=reason) as refused:
        parse_record(raw)
    assert isinstance(refused.value, ValueError)
    assert reason in refused.value.reason


# ---------------------------------------------------------------------------- machine checks


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # mcelog#70: logged at boot, UC and PCC set: the fatal error that ended the last boot.
        ("Sep 16 19:51:15 kernel: [    0.064265] mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 4: a600000000020408",
         MachineCheckFinding(True, 0, 4, 0xA600000000020408)),
        ("Dec 13 13:46:08 homeassistant kernel: mce: [Hardware Error]: CPU 2: Machine Check: 0 Bank 6: cc59dec000041152",
         MachineCheckFinding(False, 2, 6, 0xCC59DEC000041152)),
        ("Dec 13 13:46:08 homeassistant kernel: mce: [Hardware Error]: CPU 3: Machine Check: 0 Bank 6: cc400b0000041136",
         MachineCheckFinding(False, 3, 6, 0xCC400B0000041136)),
        # bazzite#5546: the reporter cut the status; it came through #MC, so uncorrected.
        ("mce: [Hardware Error]: CPU 7: Machine Check Exception: 5 Bank 0",
         MachineCheckFinding(True, 7, 0, None)),
        # sbridge prints the bank record itself when it decodes it (the core then stays quiet).
        ("[Mon Jan 27 19:27:15 2020] EDAC sbridge MC0: CPU 0: Machine Check Event: 0 Bank 5: 8c00004000010092",
         MachineCheckFinding(False, 0, 5, 0x8C00004000010092)),
        ("Feb 23 03:28:16 kernel: EDAC sbridge MC1: CPU 1: Machine Check Event: 0 Bank 11: 8c00004f000800c2",
         MachineCheckFinding(False, 1, 11, 0x8C00004F000800C2)),
        # OpenVZ wiki, 2.6-era: the bank line is the record.
        ("Jul  9 12:19:41 vz01 kernel: Bank 4: b604a00100000813 at 000000007e4f2f68",
         MachineCheckFinding(True, None, 4, 0xB604A00100000813)),
    ],
)
def test_classify_machine_check_bank_record(line: str, expected: MachineCheckFinding) -> None:
    """COL-3: one MCE bank record; fatal = MCi_STATUS.UC set (or #MC without a status)."""
    assert classify(_kmsg_text(line)) == expected


@pytest.mark.parametrize(
    "line",
    [
        "Sep 16 19:51:15 kernel: [    0.043437] mce: CPU supports 7 MCE banks",
        "Sep 16 19:51:15 kernel: [    0.064261] mce: [Hardware Error]: Machine check events logged",
        "Sep 16 19:51:15 kernel: [    0.064270] mce: [Hardware Error]: TSC 0 ADDR fef4c9e0 ",
        "Sep 16 19:51:15 kernel: [    0.064277] mce: [Hardware Error]: PROCESSOR 0:706a1 TIME 1537152664 SOCKET 0 APIC 0 microcode 28",
        "Dec 13 13:46:08 homeassistant kernel: mce: [Hardware Error]: TSC 0 ADDR 1422ff800 MISC 13020004086 ",
        "mce: [Hardware Error]: RIP !INEXACT! 33:<00007f181dce2d3c>",
        "mce: [Hardware Error]: PROCESSOR 0:906ed ... microcode 104",
        "mce: [Hardware Error]: Machine check: Processor context corrupt",
        "Kernel panic - not syncing: Fatal machine check",
        "Kernel panic - not syncing: Fatal Machine check",
        "Kernel panic - not syncing: Uncorrected machine check",
        "Kernel panic - not syncing: Fatal machine check on current CPU",
        "kernel: Machine check events logged",
        "Aug 20 17:59:28 hostname kernel: Machine check events logged",
        "Jul  9 12:19:41 vz01 kernel: CPU 0: Machine Check Exception: 0000000000000004",
        "Jul  9 12:19:41 vz01 kernel: Kernel panic: CPU context corrupt",
        "CMCI storm detected: switching to poll mode",
        "CMCI storm subsided: switching to interrupt mode",
        "mce_notify_irq: 14 callbacks suppressed",
        "[Mon Jan 27 19:27:15 2020] EDAC sbridge MC0: HANDLING MCE MEMORY ERROR",
        "[Mon Jan 27 19:27:15 2020] EDAC sbridge MC0: TSC 0",
        "[Mon Jan 27 19:27:15 2020] EDAC sbridge MC0: ADDR 849923380",
        "[Mon Jan 27 19:27:15 2020] EDAC sbridge MC0: MISC 42525286",
        "[Mon Jan 27 19:27:15 2020] EDAC sbridge MC0: PROCESSOR 0:206d7 TIME 1580149818 SOCKET 0 APIC 0",
    ],
)
def test_classify_machine_check_lines_that_are_not_a_record(line: str) -> None:
    """COL-3: the notice, detail and panic lines around a bank record never count again."""
    assert classify(_kmsg_text(line)) is None


# The kernel's trailing spaces (pr_cont pieces) are kept, written \x20.
MCELOG_70 = """
Sep 16 19:51:15 kernel: [    0.043437] mce: CPU supports 7 MCE banks
Sep 16 19:51:15 kernel: [    0.064261] mce: [Hardware Error]: Machine check events logged
Sep 16 19:51:15 kernel: [    0.064265] mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 4: a600000000020408
Sep 16 19:51:15 kernel: [    0.064270] mce: [Hardware Error]: TSC 0 ADDR fef4c9e0\x20
Sep 16 19:51:15 kernel: [    0.064277] mce: [Hardware Error]: PROCESSOR 0:706a1 TIME 1537152664 SOCKET 0 APIC 0 microcode 28
"""
HOME_ASSISTANT_2989 = """
Dec 13 13:46:08 homeassistant kernel: mce: [Hardware Error]: CPU 2: Machine Check: 0 Bank 6: cc59dec000041152
Dec 13 13:46:08 homeassistant kernel: mce: [Hardware Error]: TSC 0 ADDR 1422ff800 MISC 13020004086\x20
Dec 13 13:46:08 homeassistant kernel: mce: [Hardware Error]: PROCESSOR 0:406e3 TIME 1702475168 SOCKET 0 APIC 1 microcode d6
Dec 13 13:46:08 homeassistant kernel: mce: [Hardware Error]: CPU 3: Machine Check: 0 Bank 6: cc400b0000041136
"""
BAZZITE_5546 = """
mce: [Hardware Error]: CPU 7: Machine Check Exception: 5 Bank 0
mce: [Hardware Error]: RIP !INEXACT! 33:<00007f181dce2d3c>
mce: [Hardware Error]: PROCESSOR 0:906ed ... microcode 104
mce: [Hardware Error]: Machine check: Processor context corrupt
Kernel panic - not syncing: Fatal machine check
"""
OPENVZ = """
Jul  9 12:19:41 vz01 kernel: CPU 0: Machine Check Exception: 0000000000000004
Jul  9 12:19:41 vz01 kernel: Bank 4: b604a00100000813 at 000000007e4f2f68
Jul  9 12:19:41 vz01 kernel: Kernel panic: CPU context corrupt
"""
GRONDO_EDAC_10 = """
[Mon Jan 27 19:27:15 2020] mce: [Hardware Error]: Machine check events logged
[Mon Jan 27 19:27:15 2020] EDAC sbridge MC0: HANDLING MCE MEMORY ERROR
[Mon Jan 27 19:27:15 2020] EDAC sbridge MC0: CPU 0: Machine Check Event: 0 Bank 5: 8c00004000010092
[Mon Jan 27 19:27:15 2020] EDAC sbridge MC0: TSC 0
[Mon Jan 27 19:27:15 2020] EDAC sbridge MC0: ADDR 849923380
[Mon Jan 27 19:27:15 2020] EDAC sbridge MC0: MISC 42525286
[Mon Jan 27 19:27:15 2020] EDAC sbridge MC0: PROCESSOR 0:206d7 TIME 1580149818 SOCKET 0 APIC 0
[Mon Jan 27 19:27:15 2020] EDAC MC0: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#2_DIMM#0 (channel:2 slot:0 page:0x849923 offset:0x380 grain:32 syndrome:0x0 -  area:DRAM err_code:0001:0092 socket:0 ha:0 channel_mask:4 rank:0)
"""


@pytest.mark.parametrize(
    ("block", "corrected", "fatal", "edac_ce"),
    [
        pytest.param(MCELOG_70, 0, 1, 0, id="mcelog-70-previous-boot-fatal"),
        pytest.param(HOME_ASSISTANT_2989, 2, 0, 0, id="home-assistant-2989-two-corrected"),
        pytest.param(BAZZITE_5546, 0, 1, 0, id="bazzite-5546-fatal-with-panic"),
        pytest.param(OPENVZ, 0, 1, 0, id="openvz-2.6-era-fatal"),
        pytest.param(GRONDO_EDAC_10, 1, 0, 1, id="sbridge-decoded-corrected-plus-edac-ce"),
    ],
)
def test_machine_check_counts_once_per_bank_record(
    block: str, corrected: int, fatal: int, edac_ce: int
) -> None:
    """COL-3: a multi-line MCE record counts once, corrected or fatal."""
    signal = _tally(block).signal({}, backlog_skipped=False)
    assert signal.machine_checks == wire.MachineChecks(corrected=corrected, fatal=fatal)
    assert signal.edac == wire.KernelEdacCounts(ce=edac_ce, ue=0)
    assert signal.malformed_records == 0


# ---------------------------------------------------------------------------- GHES / APEI


JSK_ROBOT_1776 = """
Feb 28 21:34:47 pr1012 kernel: [107385.111954] {20}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 1
Feb 28 21:34:47 pr1012 kernel: [107385.111957] {20}[Hardware Error]: It has been corrected by h/w and requires no further action
Feb 28 21:34:47 pr1012 kernel: [107385.111959] {20}[Hardware Error]: event severity: corrected
Feb 28 21:34:47 pr1012 kernel: [107385.111961] {20}[Hardware Error]:  Error 0, type: corrected
Feb 28 21:34:47 pr1012 kernel: [107385.111962] {20}[Hardware Error]:  fru_text: CorrectedErr
Feb 28 21:34:47 pr1012 kernel: [107385.111964] {20}[Hardware Error]:   section_type: memory error
Feb 28 21:34:47 pr1012 kernel: [107385.111965] {20}[Hardware Error]:   node: 1 device: 0\x20
Feb 28 21:34:47 pr1012 kernel: [107385.111966] {20}[Hardware Error]:   error_type: 2, single-bit ECC
"""
NODE_EXPORTER_3511 = """
Dec 29 05:24:23 proxmox kernel: {35}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 4
Dec 29 05:24:23 proxmox kernel: {35}[Hardware Error]: It has been corrected by h/w and requires no further action
Dec 29 05:24:23 proxmox kernel: {35}[Hardware Error]: event severity: corrected
Dec 29 05:24:23 proxmox kernel: {35}[Hardware Error]:  Error 0, type: corrected
Dec 29 05:24:23 proxmox kernel: {35}[Hardware Error]:  fru_text: D2
Dec 29 05:24:23 proxmox kernel: {35}[Hardware Error]:   section_type: memory error
Dec 29 05:24:23 proxmox kernel: {35}[Hardware Error]:    error_status: Storage error in DRAM memory (0x0000000000000400)
Dec 29 05:24:23 proxmox kernel: {35}[Hardware Error]:   physical_address: 0x0000006a47d1f540
Dec 29 05:24:23 proxmox kernel: {35}[Hardware Error]:   node:6 card:1 module:0 rank:1 bank:2 device:11 row:40948 column:560
Dec 29 05:24:23 proxmox kernel: {35}[Hardware Error]:   error_type: 2, single-bit ECC
"""
# node-problem-detector#846 pasted several records on one line; quoted as given.
NPD_846 = """
kernel: {3}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 4 kernel: {3}[Hardware Error]: event severity: recoverable kernel: {3}[Hardware Error]:  Error 0, type: recoverable kernel: {3}[Hardware Error]:  fru_text: B1
kernel: {3}[Hardware Error]:   section_type: memory error
"""
BERT_PREVIOUS_BOOT = """
[    2.345569] BERT: Error records from previous boot:
[    2.345575] [Hardware Error]: event severity: fatal
[    2.345577] [Hardware Error]:  Error 0, type: fatal
[    2.345580] [Hardware Error]:   section_type: Firmware Error Record Reference
"""


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        pytest.param(JSK_ROBOT_1776, wire.HardwareErrorRecords(corrected=1), id="ghes-corrected"),
        pytest.param(NODE_EXPORTER_3511, wire.HardwareErrorRecords(corrected=1),
                     id="ghes-corrected-newer-format"),
        pytest.param(NPD_846, wire.HardwareErrorRecords(recoverable=1), id="ghes-recoverable"),
        pytest.param(BERT_PREVIOUS_BOOT, wire.HardwareErrorRecords(fatal=1), id="bert-fatal"),
        pytest.param(JSK_ROBOT_1776 + NODE_EXPORTER_3511 + BERT_PREVIOUS_BOOT,
                     wire.HardwareErrorRecords(corrected=2, fatal=1), id="three-records"),
    ],
)
def test_hardware_error_record_counts_once_by_severity(
    block: str, expected: wire.HardwareErrorRecords
) -> None:
    """COL-3: one GHES/APEI record = its one `event severity:` line."""
    signal = _tally(block).signal({}, backlog_skipped=False)
    assert signal.hardware_errors == expected
    assert signal.machine_checks == wire.MachineChecks()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("{20}[Hardware Error]: event severity: corrected", HardwareErrorFinding("corrected")),
        ("{3}[Hardware Error]: event severity: recoverable", HardwareErrorFinding("recoverable")),
        ("[Hardware Error]: event severity: fatal", HardwareErrorFinding("fatal")),
        ("{20}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 1", None),
        ("{20}[Hardware Error]:  Error 0, type: corrected", None),
        ("{35}[Hardware Error]:   error_type: 2, single-bit ECC", None),
        ("Kernel panic - not syncing: Fatal hardware error!", None),
        # cper.c severity strings that are not errors (format strings, FORMATS.md §2.5).
        ("{7}[Hardware Error]: event severity: info", None),
        ("{7}[Hardware Error]: event severity: unknown", None),
    ],
)
def test_classify_hardware_error_lines(line: str, expected: Finding | None) -> None:
    assert classify(line) == expected


# ---------------------------------------------------------------------------- EDAC


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("[Mon Jan 27 19:27:15 2020] EDAC MC0: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#2_DIMM#0 (channel:2 slot:0 page:0x849923 offset:0x380 grain:32 syndrome:0x0 -  area:DRAM err_code:0001:0092 socket:0 ha:0 channel_mask:4 rank:0)",
         EdacFinding("ce", 1, 0)),
        ("Feb 23 03:28:16  kernel: EDAC MC1: 1 CE memory scrubbing error on CPU_SrcID#1_Ha#0_Chan#0_DIMM#0 (channel:0 slot:0 page:0xee30a0 offset:0x0 grain:32 syndrome:0x0 -  area:DRAM err_code:0008:00c2 socket:1 ha:0 channel_mask:1 rank:0)",
         EdacFinding("ce", 1, 1)),
        ("May  7 06:45:12 errol kernel: [21584690.529877] EDAC MC0: 4 CE error on CPU#0Channel#2_DIMM#0 (channel:2 slot:0 page:0x0 offset:0x0 grain:8 syndrome:0x0)",
         EdacFinding("ce", 4, 0)),
        ("May  7 06:45:13 errol kernel: [21584691.723198] EDAC MC0: 2 CE error on CPU#0Channel#2_DIMM#0 (channel:2 slot:0 page:0x0 offset:0x0 grain:8 syndrome:0x0)",
         EdacFinding("ce", 2, 0)),
        # mcelog#74 as the kernel writes it (the reporter's markdown ate the leading E).
        ("EDAC MC0: 1 UE memory read error on CPU_SrcID#0_MC#0_Chan#0_DIMM#0 (channel:0 slot:0 page:0xe16677 offset:0x0 grain:32 -  err_code:0000:009f socket:0 imc:0 rank:0 bg:0 ba:3 row:dad3 col:3c0)",
         EdacFinding("ue", 1, 0)),
        ("[   20.041846] EDAC MC0: Giving out device to module amd64_edac controller F17h: DEV 0000:00:18.3 (INTERRUPT)",
         None),
        ("[   11.807485] EDAC MC1: Giving out device to module sb_edac controller Broadwell SrcID#0_Ha#0: DEV 0000:7f:12.0 (INTERRUPT)",
         None),
        ("Feb 23 03:28:16 kernel: EDAC sbridge MC1: HANDLING MCE MEMORY ERROR", None),
    ],
)
def test_classify_edac_lines(line: str, expected: Finding | None) -> None:
    """COL-3: EDAC CE/UE lines carry their error count; registration lines are not errors."""
    assert classify(_kmsg_text(line)) == expected


def test_edac_counts_sum_the_error_counts() -> None:
    lines = """
May  7 06:45:12 errol kernel: [21584690.529862] mce: [Hardware Error]: Machine check events logged
May  7 06:45:12 errol kernel: [21584690.529877] EDAC MC0: 4 CE error on CPU#0Channel#2_DIMM#0 (channel:2 slot:0 page:0x0 offset:0x0 grain:8 syndrome:0x0)
May  7 06:45:13 errol kernel: [21584691.723198] EDAC MC0: 2 CE error on CPU#0Channel#2_DIMM#0 (channel:2 slot:0 page:0x0 offset:0x0 grain:8 syndrome:0x0)
EDAC MC0: 1 UE memory read error on CPU_SrcID#0_MC#0_Chan#0_DIMM#0 (channel:0 slot:0 page:0xe16677 offset:0x0 grain:32 -  err_code:0000:009f socket:0 imc:0 rank:0 bg:0 ba:3 row:dad3 col:3c0)
"""
    signal = _tally(lines).signal({}, backlog_skipped=False)
    assert signal.edac == wire.KernelEdacCounts(ce=6, ue=1)
    assert signal.machine_checks == wire.MachineChecks()


# ---------------------------------------------------------------------------- Xid (COL-7)


@pytest.mark.parametrize(
    ("line", "bus", "xid"),
    [
        ("[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
         "0000:91:00.0", 79),
        ("May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
         "0000:2b:00.0", 79),
        ("[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).",
         "0000:9b:00.0", 119),
        ("[Sun Feb 23 16:27:12 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=1263500, name=cache_mgr_main, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20801813 0x4c).",
         "0000:9b:00.0", 119),
        ("[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
         "0000:cb:00.0", 13),
        ("[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Global Exception on (GPC 7, TPC 7, SM 0): Multiple Warp Errors",
         "0000:cb:00.0", 13),
        ("[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: ESR 0x57c730=0xc04000b 0x57c734=0x24 0x57c728=0x1f81fb60 0x57c72c=0x1174",
         "0000:cb:00.0", 13),
        ("[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
         "0000:cb:00.0", 109),
        ("[  365.969681] NVRM: Xid (PCI:0000:01:00): 31, pid=13705, name=UnrealEditor, channel 0x0000000c, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_PROP_0 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
         "0000:01:00.0", 31),
        ("NVRM: Xid (PCI:0000:01:00): 31, Ch 0000005a, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_1 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
         "0000:01:00.0", 31),
        ("[31609.615516] NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000052 intr 02000000",
         "0000:01:00.0", 32),
        ("kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
         "0000:dc:00.0", 45),
        ("kernel: NVRM: Xid (PCI:0000:ed:00): 45, pid=1818992, name=python3, Ch 0000000c caused by previous Xid 145",
         "0000:ed:00.0", 45),
        ("Dec  2 10:43:35 worker4 kernel: [240314.528856] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fdd60000 partition\u2026",
         "0000:07:00.0", 48),
        ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
         "0000:10:1c.0", 63),
        ("NVRM: Xid (PCI:0000:b5:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address",
         "0000:b5:00.0", 13),
        ("NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
         "0003:00:00.0", 74),
        ("NVRM: Xid (PCI:0000:66:00): 32, pid=2280636, name=train.3, Channel ID 0000000d intr0 00040000",
         "0000:66:00.0", 32),
        ("NVRM: Xid (PCI:0001:ab:cd): 69, pid=1310987, name=train.3, Class Error: ChId 0008, Class 0000cbc0, Offset 00000184, Data ffffffff, ErrorCode 00000004",
         "0001:ab:cd.0", 69),
        ("NVRM: Xid (PCI:0000:3f:00): 46", "0000:3f:00.0", 46),
        ("NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
         "0008:01:00.0", 154),
        ("NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
         "0018:01:00.0", 149),
        ("[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
         "0009:01:00.0", 149),
        ("[171167.621162] NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
         "0009:01:00.0", 154),
        ("[171167.897562] NVRM: Xid (PCI:0019:01:00): 154, GPU recovery action changed from 0x4 (Drain and Reset) to 0x1 (GPU Reset Required)",
         "0019:01:00.0", 154),
        ("[...] NVRM: Xid (0000:03:00): 14, Channel 00000001", "0000:03:00.0", 14),
        ("Jan 18 11:38:05 localhost kernel: [ 269.517039] NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff",
         "0000:01:00.0", 3),
        # Upper-case hex (FORMATS.md §2.7 grammar) normalises the same.
        ("NVRM: Xid (PCI:0000:CB:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error",
         "0000:cb:00.0", 48),
    ],
)
def test_classify_xid_every_observed_variant(line: str, bus: str, xid: int) -> None:
    """COL-7: every Xid form in FORMATS.md §2.7, PCI address normalised to dddd:bb:dd.f."""
    text = _kmsg_text(line).removeprefix("[...] ")
    assert text.startswith("NVRM: Xid (")
    assert classify(text) == XidFinding(bus, xid, text)


@pytest.mark.parametrize(
    ("line", "bus"),
    [
        ("[6781741.548783] NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.", "0000:91:00.0"),
        ("May 18 19:02:39 kernel: NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.",
         "0000:2b:00.0"),
        ("Jan 18 11:38:05 localhost kernel: [ 269.516977] NVRM: GPU at 0000:01:00.0 has fallen off the bus.",
         "0000:01:00.0"),
        # NVSentinel#155: one record, rendered by dmesg on three lines.
        ("[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\nNVRM: fallen off the bus and is not responding to commands.",
         "0000:b3:00.0"),
    ],
)
def test_classify_gpu_fallen_off_the_bus(line: str, bus: str) -> None:
    """COL-8: the off-the-bus lines name the GPU even where no Xid was logged."""
    text = _kmsg_text(line)
    assert text.startswith("NVRM: ")
    assert classify(text) == GpuOffBusFinding(bus, text)


@pytest.mark.parametrize(
    "line",
    [
        "[6781741.548768] NVRM: GPU at PCI:0000:91:00: GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b",
        "[6781741.548776] NVRM: GPU Board Serial Number: 1653723052734",
        "[6781741.548786] NVRM: GPU 0000:91:00.0: GPU serial number is 1653723052734.",
        "[Sun Feb 23 16:24:36 2025] NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00 (printing 1 of every 30).  The GPU likely needs to be reset.",
        "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).",
        "6,3964,206764307,-;nvidia-nvswitch2: open (major=510)".split(";", 1)[1],
        "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing",
        "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
        "perf: interrupt took too long (2509 > 2500), lowering kernel.perf_event_max_sample_rate to 79500",
    ],
)
def test_classify_gpu_lines_that_are_not_faults(line: str) -> None:
    assert classify(_kmsg_text(line)) is None


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("NVRM: Xid (PCI:zz:qq): 79, GPU has fallen off the bus.", id="xid-garbage-address"),
        pytest.param("NVRM: Xid (PCI:10000:91:00): 79, GPU has fallen off the bus.", id="xid-domain-too-wide"),
        pytest.param("NVRM: Xid (): 13, pid=1, name=x, y", id="xid-empty-address"),
        pytest.param("NVRM: Xid (PCI:0000:91:00): GPU has fallen off the bus.", id="xid-no-number"),
        pytest.param("NVRM: GPU nowhere: GPU has fallen off the bus.", id="off-bus-garbage-address"),
        pytest.param("NVRM: GPU has fallen off the bus.", id="off-bus-no-address"),
        pytest.param("nvidia-nvswitch0: SXid (PCI:bogus): 20034, Fatal, Link 30 LTSSM Fault Up", id="sxid-garbage-address"),
        pytest.param("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): Fatal, Link 30", id="sxid-no-number"),
    ],
)
def test_classify_unparsable_address_is_malformed(text: str) -> None:
    """COL-12: a record whose address cannot be parsed is malformed (SPEC), not guessed."""
    with pytest.raises(MalformedRecord):
        classify(text)


# ---------------------------------------------------------------------------- SXid


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
         ("nvidia-nvswitch1", "0000:06:00.0", 20034, "fatal")),
        ("[6781753.404848] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 Sub-engine instance 00",
         ("nvidia-nvswitch2", "0000:07:00.0", 20034, None)),
        ("[6781753.406566] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, 0x10000000, 0x00000000, 0x10000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000}",
         ("nvidia-nvswitch0", "0000:05:00.0", 20034, None)),
        ("[111111111.111] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)",
         ("nvidia-nvswitch3", "0000:05:00.0", 12028, "non-fatal")),
        ("[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
         ("nvidia-nvswitch0", "0000:00:00.0", 20034, "fatal")),
    ],
)
def test_classify_sxid(line: str, expected: tuple[str, str, int, SxidSeverity | None]) -> None:
    """COL-3: SXid headline lines carry the severity; Severity/Data lines are its details."""
    text = _kmsg_text(line)
    assert text.startswith("nvidia-nvswitch")
    device, bus, sxid, severity = expected
    assert classify(text) == SxidFinding(device, bus, sxid, severity, text)


def test_sxid_counts_one_per_event_not_per_detail_line() -> None:
    lines = """
[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up
[6781753.404848] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 Sub-engine instance 00
[6781753.406566] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, 0x10000000, 0x00000000, 0x10000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000}
[111111111.111] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)
[111111111.222] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 33 egress non-posted PRIV error
"""
    signal = _tally(lines).signal({}, backlog_skipped=False)
    assert signal.sxid == [
        wire.SxidEntry(
            device="0000:05:00.0", sxid=12028, count=2,
            last_message="nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 33 egress non-posted PRIV error",
        ),
        wire.SxidEntry(
            device="0000:06:00.0", sxid=20034, count=1,
            last_message="nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
        ),
    ]


# ---------------------------------------------------------------------------- read-only remount


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("[70098.185153] EXT4-fs (sdd1): Remounting filesystem read-only", "sdd1"),
        ("[wo jul 28 05:19:43 2021] EXT4-fs (sda1): Remounting filesystem read-only", "sda1"),
        # ext4_msg / f2fs_warn format strings (FORMATS.md §9.2).
        ("EXT4-fs (nvme0n1p2): Remounting filesystem read-only", "nvme0n1p2"),
        ("F2FS-fs (sdb1): Remounting filesystem read-only", "sdb1"),
        ("[70098.185011] EXT4-fs error (device sdd1): ext4_journal_check_start:83: comm rsync: Detected aborted journal", None),
        ("[70102.562220] EXT4-fs error: 1267 callbacks suppressed", None),
        ("[wo jul 28 05:19:43 2021] EXT4-fs error (device sda1): ext4_journal_check_start:83: Detected aborted journal", None),
        ("[2550325.178093] Aborting journal on device sda1-8.", None),
        ("[2550325.178156] JBD2: Error -5 detected when updating journal superblock for sda1-8.", None),
        ("[2550923.554814] EXT4-fs error (device sda1): ext4_wait_block_bitmap:471: comm seedlink: Cannot read block bitmap - block_group = 138, block_bitmap = 4194314", None),
    ],
)
def test_classify_remount_read_only(line: str, expected: str | None) -> None:
    """COL-3: the remount-ro line names its device; the errors before it do not count."""
    text = _kmsg_text(line)
    assert classify(text) == (RemountReadOnlyFinding(expected, text) if expected else None)


def test_remount_read_only_repeats_are_one_entry_per_device() -> None:
    lines = """
[70098.185011] EXT4-fs error (device sdd1): ext4_journal_check_start:83: comm rsync: Detected aborted journal
[70098.185153] EXT4-fs (sdd1): Remounting filesystem read-only
[70102.562220] EXT4-fs error: 1267 callbacks suppressed
[70103.185153] EXT4-fs (sdd1): Remounting filesystem read-only
[wo jul 28 05:19:43 2021] EXT4-fs (sda1): Remounting filesystem read-only
"""
    signal = _tally(lines).signal({}, backlog_skipped=False)
    assert signal.remount_read_only == [
        wire.RemountReadOnly(device="sda1", last_message="EXT4-fs (sda1): Remounting filesystem read-only"),
        wire.RemountReadOnly(device="sdd1", last_message="EXT4-fs (sdd1): Remounting filesystem read-only"),
    ]


# ---------------------------------------------------------------------------- out of band (COL-2)


@pytest.mark.parametrize(
    ("finding", "expected"),
    [
        (MachineCheckFinding(False), True),
        (MachineCheckFinding(True), True),
        (HardwareErrorFinding("corrected"), True),
        (HardwareErrorFinding("fatal"), True),
        (EdacFinding("ue", 1, 0), True),
        (EdacFinding("ce", 4, 0), False),
        (XidFinding("0000:91:00.0", 13, "m"), True),
        (GpuOffBusFinding("0000:91:00.0", "m"), True),
        (SxidFinding("nvidia-nvswitch0", "0000:05:00.0", 20034, "fatal", "m"), False),
        (RemountReadOnlyFinding("sda1", "m"), False),
        (None, False),
    ],
)
def test_is_out_of_band(finding: Finding | None, expected: bool) -> None:
    """COL-2: machine checks, hardware error records, EDAC UE and Xids report at once."""
    assert is_out_of_band(finding) is expected


# ---------------------------------------------------------------------------- the tally


def test_signal_from_nothing_is_ok_and_empty() -> None:
    """COL-5: nothing seen is zero counts, status ok, the backlog answer passed through."""
    signal = KmsgTally().signal({}, backlog_skipped=None)
    assert signal == wire.KmsgSignal(status="ok", backlog_skipped=None)
    assert KmsgTally().signal({}, backlog_skipped=True).backlog_skipped is True


def test_xid_per_device_matched_by_normalised_pci_and_unmatched_still_listed() -> None:
    """COL-7: one entry per (device, Xid); matched by bus id in any form; unmatched → null."""
    tally = KmsgTally()
    t1, t2 = T0, T0 + timedelta(minutes=3)
    first = "NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4)."
    second = "NVRM: Xid (PCI:0000:9b:00): 119, pid=1263500, name=cache_mgr_main, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20801813 0x4c)."
    stray = "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
    tally.add(_record(first, 1), t1)
    tally.add(_record(second, 2), t2)
    tally.add(_record(stray, 3), t2)
    signal = tally.signal({"00000000:9B:00.0": 4}, backlog_skipped=True)
    assert signal.xid == [
        wire.XidEntry(pci_bus_id="0000:9b:00.0", gpu_index=4, xid=119, count=2, last_at=t2,
                      last_message=second),
        wire.XidEntry(pci_bus_id="0018:01:00.0", gpu_index=None, xid=149, count=1, last_at=t2,
                      last_message=stray),
    ]
    as_json = msgspec.json.decode(wire.encode(signal))
    assert as_json["xid"][1]["gpuIndex"] is None
    assert as_json["xid"][0]["pciBusId"] == "0000:9b:00.0"
    assert as_json["backlogSkipped"] is True


def test_worst_xid_stays_listed_after_a_later_application_xid() -> None:
    """COL-7: a DBE then an app exception on the same card: both entries, each with its time,
    so ingest grades by the worst (48) and names the most recent (13)."""
    tally = KmsgTally()
    t1, t2 = T0, T0 + timedelta(hours=1)
    dbe = "NVRM: Xid (PCI:0000:cb:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fdd60000"
    app = "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter"
    tally.add(_record(dbe, 1), t1)
    tally.add(_record(app, 2), t2)
    tally.add(_record(app, 3), t2)
    entries = {e.xid: e for e in tally.signal({"0000:cb:00.0": 0}, None).xid}
    assert entries[48] == wire.XidEntry(pci_bus_id="0000:cb:00.0", gpu_index=0, xid=48, count=1,
                                        last_at=t1, last_message=dbe)
    assert (entries[13].count, entries[13].last_at, entries[13].gpu_index) == (2, t2, 0)
    assert entries[13].last_at is not None and entries[48].last_at is not None
    assert entries[13].last_at > entries[48].last_at


def test_fallen_off_the_bus_with_xid_79_counts_once() -> None:
    """COL-8: the Xid 79 line and the driver's off-the-bus line are one event."""
    lines = """
[6781741.548768] NVRM: GPU at PCI:0000:91:00: GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b
[6781741.548776] NVRM: GPU Board Serial Number: 1653723052734
[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
[6781741.548783] NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.
[6781741.548786] NVRM: GPU 0000:91:00.0: GPU serial number is 1653723052734.
"""
    signal = _tally(lines).signal({}, backlog_skipped=False)
    assert [(e.pci_bus_id, e.xid, e.count, e.gpu_index) for e in signal.xid] == [
        ("0000:91:00.0", 79, 1, None)
    ]
    assert signal.xid[0].last_message.startswith("NVRM: Xid (PCI:0000:91:00): 79")


def test_fallen_off_the_bus_without_xid_is_graded_as_xid_79() -> None:
    """COL-8: NVSentinel#155, the GPU fell off before any Xid: still reported as Xid 79."""
    message = "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\nNVRM: fallen off the bus and is not responding to commands."
    tally = KmsgTally()
    finding = tally.add(_record(message), T0)
    assert is_out_of_band(finding)
    tally.add(_record(message, 2), T0 + timedelta(seconds=5))
    assert tally.signal({"0000:b3:00.0": 2}, None).xid == [
        wire.XidEntry(pci_bus_id="0000:b3:00.0", gpu_index=2, xid=79, count=1, last_at=T0,
                      last_message=message)
    ]


def test_off_the_bus_line_before_its_xid_79_is_still_one_event() -> None:
    tally = KmsgTally()
    off_bus = "NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus."
    xid = "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."
    tally.add(_record(off_bus, 1), T0)
    tally.add(_record(xid, 2), T0)
    tally.add(_record(xid, 3), T0 + timedelta(minutes=1))
    [entry] = tally.signal({}, None).xid
    assert (entry.count, entry.last_message, entry.last_at) == (2, xid, T0 + timedelta(minutes=1))


def test_malformed_records_are_counted_and_later_records_still_count() -> None:
    """COL-12: refused reads and unparsable addresses are counted; the tally goes on."""
    tally = KmsgTally()
    for raw in (b"garbage", b"6,1,2,-;ok\nnot a continuation\n"):
        try:
            tally.add(parse_record(raw), T0)
        except MalformedRecord:
            tally.add_malformed()
    assert tally.add(_record("NVRM: Xid (PCI:zz:qq): 79, GPU has fallen off the bus.", 3), T0) is None
    good = "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."
    finding = tally.add(parse_record(b"4,4,5,-;" + good.encode() + b"\n"), T0)
    assert finding == XidFinding("0000:2b:00.0", 79, good)
    tally.add(_record("mce: [Hardware Error]: CPU 2: Machine Check: 0 Bank 6: cc59dec000041152", 5), T0)
    signal = tally.signal({}, backlog_skipped=False)
    assert tally.malformed_records == signal.malformed_records == 3
    assert [(e.xid, e.count) for e in signal.xid] == [(79, 1)]
    assert signal.machine_checks == wire.MachineChecks(corrected=1)


def test_userspace_records_cannot_forge_faults() -> None:
    """COL-3: only facility 0 is the kernel; `echo … > /dev/kmsg` arrives as facility 1."""
    forged = parse_record(b"12,9,10,-;NVRM: Xid (PCI:0000:91:00): 79, GPU has fallen off the bus.\n")
    tally = KmsgTally()
    assert tally.add(forged, T0) is None
    assert tally.signal({}, None).xid == []
    trusting = KmsgTally(kernel_only=False)
    assert isinstance(trusting.add(forged, T0), XidFinding)


def test_whole_mixed_buffer() -> None:
    """COL-3/COL-5: one pass over a buffer holding every kind of fault."""
    buffer = MCELOG_70 + HOME_ASSISTANT_2989 + JSK_ROBOT_1776 + BERT_PREVIOUS_BOOT + GRONDO_EDAC_10 + """
[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter
[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up
[70098.185153] EXT4-fs (sdd1): Remounting filesystem read-only
EDAC MC0: 1 UE memory read error on CPU_SrcID#0_MC#0_Chan#0_DIMM#0 (channel:0 slot:0 page:0xe16677 offset:0x0 grain:32 -  err_code:0000:009f socket:0 imc:0 rank:0 bg:0 ba:3 row:dad3 col:3c0)
NVRM: Xid (PCI:nonsense): 13, pid=1, name=x, y
"""
    signal = _tally(buffer).signal({"0000:cb:00.0": 1}, backlog_skipped=False)
    assert signal.status == "ok"
    assert signal.machine_checks == wire.MachineChecks(corrected=3, fatal=1)
    assert signal.hardware_errors == wire.HardwareErrorRecords(corrected=1, fatal=1)
    assert signal.edac == wire.KernelEdacCounts(ce=1, ue=1)
    assert [(e.pci_bus_id, e.gpu_index, e.xid, e.count) for e in signal.xid] == [
        ("0000:cb:00.0", 1, 13, 1)
    ]
    assert [(e.device, e.sxid, e.count) for e in signal.sxid] == [("0000:00:00.0", 20034, 1)]
    assert [e.device for e in signal.remount_read_only] == ["sdd1"]
    assert signal.malformed_records == 1
    assert signal.backlog_skipped is False
