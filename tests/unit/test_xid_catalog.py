"""XID-1: NVIDIA's Xid catalog as data: its rows, the NVLink5 and Xid 154 decodes, grading, the
``healthplane xid`` command and the action health-ingest puts on an Xid condition.

The expected rows below are read from NVIDIA's "Analyzing Xid Errors with the Xid Catalog"
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), the log lines from real
drivers as NVIDIA NVSentinel's and leptonai/gpud's parser tests quote them (reference/FORMATS.md
§2.7)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from datetime import UTC, datetime, timedelta
from fnmatch import fnmatch
from importlib import resources
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthplane.contracts import wire, xid
from healthplane_collector.agent import Collector, Settings
from healthplane_collector.sim import SimNode
from healthplane_health_ingest import rules
from healthplane_health_ingest.rules import IngestState, assess

ROOT = Path(__file__).resolve().parents[2]
HEALTHPLANE = Path(sys.executable).parent / "healthplane"
T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)

# (code, description, immediate, investigatory) as NVIDIA's table "Xids" has them.
PUBLISHED = [
    (13, "Graphics Engine Exception", "RESTART_APP", "WORKFLOW_XID_13"),
    (31, "GPU memory page fault", "RESTART_APP", "WORKFLOW_XID_31"),
    (43, "GPU stopped processing", "IGNORE", "CONTACT_SUPPORT"),
    (45, "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda "
         "applications and hitting a DBE", "WORKFLOW_XID_45", "Solo: RESTART_FM; Not Solo: IGNORE (follow other Xid)"),
    (48, "Double Bit ECC Error", "WORKFLOW_XID_48", "WORKFLOW_XID_48"),
    (63, "GPU memory remapping event", "IGNORE", "IGNORE"),
    (64, "GPU memory remapping failure", "RESET_GPU", "CONTACT_SUPPORT"),
    (74, "NVLINK Error", "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT"),
    (79, "GPU has fallen off the bus", "RESTART_BM", "CONTACT_SUPPORT"),
    (92, "High single-bit ECC error rate", "IGNORE", "CONTACT_SUPPORT"),
    (94, "Contained memory error", "RESTART_APP", "IGNORE (sympathetic)"),
    (95, "Uncontained memory error", "RESET_GPU", "IGNORE (sympathetic)"),
    (119, "GSP RPC Timeout", "RESET_GPU", "INVESTIGATE_SW"),
    (120, "GSP Error", "RESET_GPU", "INVESTIGATE_SW"),
    (140, "ECC Unrecovered Error", "RESET_GPU", "CONTACT_SUPPORT"),
    (144, "NVLINK: SAW Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (145, "NVLINK: RLW Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (146, "NVLINK: TLW Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (147, "NVLINK: TREX Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (148, "NVLINK: NVLPW_CTRL Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (149, "NVLINK: NETIR Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (150, "NVLINK: MSE Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (154, "GPU Recovery Action Changed", "XID_154", "N/A Informational only regarding another Xid"),
]


@pytest.mark.parametrize(("code", "name", "immediate", "investigatory"), PUBLISHED)
def test_xid1_the_catalog_has_nvidias_row(code: int, name: str, immediate: str, investigatory: str) -> None:
    info = xid.lookup(code)
    assert (info.code, info.name, info.immediate, info.investigatory, info.known) == (
        code, name, immediate, investigatory, True)


def test_xid1_the_file_names_its_source_date_and_version() -> None:
    catalog = xid.CATALOG
    assert catalog.source_url == "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
    assert "Analyzing Xid Errors with the Xid Catalog" in catalog.source_title
    assert catalog.date and catalog.driver_branch and catalog.version >= 1
    assert sorted(catalog.xids) == list(range(1, 162))  # 162-172 carry no bucket: left out


def test_xid1_every_bucket_is_one_of_the_catalogs() -> None:
    immediate = {*xid.IMMEDIATE_BUCKETS, xid.READ_FROM_MESSAGE}
    assert {info.immediate for info in xid.CATALOG.xids.values()} <= immediate
    decoded = {*xid.IMMEDIATE_BUCKETS, xid.DEFER_TO_XID154}
    rows = [row for found in xid.CATALOG.nvlink5.values() for row in found]
    assert {row.immediate for row in rows} | {row.action2[2] for row in rows if row.action2} <= decoded
    assert {a.immediate for a in xid.CATALOG.recovery_actions} <= set(xid.IMMEDIATE_BUCKETS)
    assert all(xid.meaning(bucket) for bucket in immediate)  # `healthplane xid` explains each


@pytest.mark.parametrize("code", [0, 162, 172, 999, 22013, -1, 2**70])
def test_xid1_an_unknown_xid_takes_the_documented_default(code: int) -> None:
    info = xid.lookup(code)
    assert not info.known and info.code == code
    assert (info.immediate, info.investigatory) == ("CONTACT_SUPPORT", "CONTACT_SUPPORT")
    assert xid.recommended_action(code, "NVRM: Xid (PCI:0000:66:00): 999, pid=1234, name=test") == "CONTACT_SUPPORT"
    assert "CONTACT_SUPPORT" in xid.CATALOG.default_basis


# ---------------------------------------------------------------------------- NVLink5 144-150

NVLINK5_LINES = [
    # NVSentinel csv_test.go: "NL5 XID" -> COMPONENT_RESET (NETIR_LINK_EVT, V1 IntrInfo[25:20] = 100101)
    ("NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 "
     "0x00000000 0x00000000 0x00000000 0x00000000)", 149, "RESET_GPU"),
    # gpud kmsg_test.go (GB200)
    ("[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 "
     "0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)", 149, "RESET_GPU"),
    # NVSentinel: RLW_REMAP error status 0x40 is fatal, V1 (before R575) and V2 (R575 on) IntrInfo
    ("NVRM: Xid (PCI:0000:00:08.0): 145, RLW_REMAP Nonfatal XC1 i0 Link 10 (0x00000082 0x00000040 0x00000000 "
     "0x00000000 0x00000000 0x00000000)", 145, "RESET_GPU"),
    ("NVRM: Xid (PCI:0000:00:08.0): 145, RLW_REMAP Nonfatal XC1 i0 Link 10 (0x00000004 0x00000040 0x00000000 "
     "0x00000000 0x00000000 0x00000000)", 145, "RESET_GPU"),
    # RLW_REMAP status 0x1: XID_154_EVAL, and no Xid 154 on this line: RESTART_APP
    ("NVRM: Xid (PCI:0000:00:08.0): 145, RLW_REMAP Nonfatal XC1 i0 Link 10 (0x00000082 0x00000001 0x00000000 "
     "0x00000000 0x00000000 0x00000000)", 145, "RESTART_APP"),
    # SAW_MVB (V1 ...0000100001) status 0x4: non-fatal, IGNORE; status 0x2: RESET_GPU
    ("NVRM: Xid (PCI:0000:1b:00): 144, pid=1234, name=python3, SAW_MVB Nonfatal XC0 i0 Link -1 (0x00000021 "
     "0x00000004 0x00000000 0x00000000 0x00000000 0x00000000)", 144, "IGNORE"),
    ("NVRM: Xid (PCI:0000:1b:00): 144, SAW_MVB Fatal XC0 i0 Link -1 (0x00000001 0x00000002 0x00000000 "
     "0x00000000 0x00000000 0x00000000)", 144, "RESET_GPU"),
    # RLW_RXPIPE status 0x1: IGNORE, its "action 2" IntrInfo bit (V1 bit 10) promotes it to RESET_GPU
    ("NVRM: Xid (PCI:0000:1b:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 3 (0x000000c2 0x00000001 0x0 0x0 0x0 0x0)",
     145, "IGNORE"),
    ("NVRM: Xid (PCI:0000:1b:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 3 (0x000004c2 0x00000001 0x0 0x0 0x0 0x0)",
     145, "RESET_GPU"),
    # NETIR_BER_EVENT: non-fatal bit errors, IGNORE (investigate the link and cables)
    ("NVRM: Xid (PCI:0000:1b:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 7 (0x00000226 0x00000002 0x0 0x0 0x0 0x0)",
     149, "IGNORE"),
    # MSE watchdog / degraded
    ("NVRM: Xid (PCI:0000:1b:00): 150, MSE_WATCHDOG Fatal XC0 i0 Link -1 (0x00000000 0xffffffff 0x0 0x0 0x0 0x0)",
     150, "RESET_GPU"),
    # No fields, or fields no row of the sheet has: the Xid's own bucket, the workflow
    ("NVRM: Xid (PCI:0000:1b:00): 149, pid=1234, name=python3", 149, "WORKFLOW_NVLINK5_ERR"),
    ("NVRM: Xid (PCI:0000:1b:00): 149, NETIR Fatal XC0 i0 Link 7 (0x00000000 0x00000000 0x0 0x0 0x0 0x0)",
     149, "WORKFLOW_NVLINK5_ERR"),
    ("NVRM: Xid (PCI:0000:1b:00): 146, TLW_CTRL Fatal XC0 i0 Link 7 (0x00000123 0x12345678 0x0 0x0 0x0 0x0)",
     146, "WORKFLOW_NVLINK5_ERR"),
]


@pytest.mark.parametrize(("line", "code", "action"), NVLINK5_LINES)
def test_xid1_nvlink5_is_decoded_from_intrinfo_and_error_status(line: str, code: int, action: str) -> None:
    assert xid.recommended_action(code, line) == action
    assert xid.grade(code, line) == ("critical" if action in xid.SEVERE_BUCKETS else "warning")


def test_xid1_nvlink5_fields_are_the_first_two_registers() -> None:
    assert xid.nvlink5_fields(NVLINK5_LINES[0][0]) == (0x025525C6, 0)
    assert xid.nvlink5_fields("NVRM: Xid (PCI:0000:1b:00): 149, pid=1") is None
    assert xid.nvlink5_fields("Link 1 (0x123456789 0x0)") is None  # not a 32-bit register
    assert xid.decode_nvlink5(79, 0x025525C6, 0) is None


def test_xid1_nvlink5_rows_never_disagree_about_one_intrinfo() -> None:
    """Rows are tried against both the V1 and the V2 patterns (the driver version is not in the
    line): any two rows of one Xid that could match the same registers name the same action."""
    def overlap(a: xid.BitPattern, b: xid.BitPattern) -> bool:
        return (a.value ^ b.value) & a.mask & b.mask == 0

    for rows in xid.CATALOG.nvlink5.values():
        for first in rows:
            for second in rows:
                shared = (first.error_status is None or second.error_status is None
                          or first.error_status & second.error_status)
                patterns = any(overlap(a, b) for a in (first.v1, first.v2) for b in (second.v1, second.v2))
                if shared and patterns:
                    assert first.immediate == second.immediate, (first.unit, second.unit)


# ---------------------------------------------------------------------------- Xid 154

XID154_LINES = [
    ("NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
     "RESET_GPU"),
    ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
     "RESTART_BM"),
    ("[171167.621162] NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 "
     "(Drain and Reset)", "RESET_GPU"),
    ("[171167.897562] NVRM: Xid (PCI:0019:01:00): 154, GPU recovery action changed from 0x4 (Drain and Reset) to "
     "0x1 (GPU Reset Required)", "RESET_GPU"),
    ("NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
     "IGNORE"),
    ("NVRM: Xid (PCI:0000:02:00): 154, GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)",
     "RESTART_APP"),
    # the value decides (a later driver names 0x2 "OS Reboot"); wrapped by a log shipper
    ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)",
     "RESTART_BM"),
    ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2\n"
     "                                 (Node Reboot Required)", "RESTART_BM"),
    # garbage (NVSentinel's out-of-order parentheses) and an action the catalog does not name
    ("NVRM: Xid (PCI:0000:01:00): 154 (", "CONTACT_SUPPORT"),
    ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x5 (Recover IMEX Domain)",
     "CONTACT_SUPPORT"),
]


@pytest.mark.parametrize(("line", "action"), XID154_LINES)
def test_xid1_xid154_action_is_read_from_its_line(line: str, action: str) -> None:
    assert xid.recommended_action(154, line) == action


def test_xid1_xid154_without_its_line_takes_the_default() -> None:
    assert xid.recommended_action(154) == xid.CATALOG.default.immediate == "CONTACT_SUPPORT"
    assert xid.grade(154, XID154_LINES[4][0]) == "warning"  # back to None: nothing to hold
    assert xid.sticky(154, XID154_LINES[1][0])


# ---------------------------------------------------------------------------- grading


def test_xid1_ing2_reference_codes_are_critical_and_sticky() -> None:
    for code in (48, 63, 64, 74, 79, 92, 94, 95):
        assert xid.grade(code) == "critical" and xid.sticky(code), code
    # The catalog's own buckets agree for five of them; ING-2 keeps 63, 92 and 94 critical.
    from_data = {c for c in xid.REFERENCE_CRITICAL if xid.recommended_action(c) in xid.SEVERE_BUCKETS}
    assert from_data == {48, 64, 74, 79, 95}


@pytest.mark.parametrize(("code", "grade"), [
    (13, "warning"), (31, "warning"), (43, "warning"), (45, "warning"), (8, "warning"), (78, "warning"),
    (159, "warning"), (119, "critical"), (120, "critical"), (140, "critical"), (54, "critical"), (151, "critical"),
    (144, "critical"), (150, "critical"), (999, "warning"),
])
def test_xid1_every_other_code_is_graded_by_its_bucket(code: int, grade: str) -> None:
    assert xid.grade(code) == grade
    assert xid.sticky(code) == (grade == "critical")


def test_xid1_the_worst_action_of_several() -> None:
    assert xid.worst_action(["RESTART_APP", "RESET_GPU", None]) == "RESET_GPU"
    assert xid.worst_action(["RESET_GPU", "RESTART_BM"]) == "RESTART_BM"
    assert xid.worst_action(["RESTART_BM", "CONTACT_SUPPORT"]) == "CONTACT_SUPPORT"
    assert xid.worst_action([]) is None
    assert set(xid.ESCALATION) == set(xid.IMMEDIATE_BUCKETS)


_XID_LINE = st.builds(
    lambda code, intrinfo, status, tail: (f"NVRM: Xid (PCI:0000:1b:00): {code}, UNIT Fatal XC0 i0 Link 3 "
                                          f"(0x{intrinfo:08x} 0x{status:08x} 0x0 0x0){tail}"),
    st.integers(140, 156), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.text(max_size=40))
_XID154_LINE = st.builds(
    lambda old, new, name: f"NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x{old:x} (None) "
                           f"to 0x{new:x} ({name})",
    st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.text(max_size=70))


@given(st.integers(), st.none() | st.text(max_size=300) | _XID_LINE | _XID154_LINE)
def test_xid1_any_code_and_any_line_never_raise(code: int, message: str | None) -> None:
    assert xid.lookup(code).code == code
    assert xid.recommended_action(code, message) in xid.IMMEDIATE_BUCKETS
    assert xid.grade(code, message) in ("critical", "warning")
    assert xid.sticky(code, message) == (xid.grade(code, message) == "critical")
    assert xid.recommended_action(154, message) in xid.IMMEDIATE_BUCKETS
    assert xid.recommended_action(149, message) in xid.IMMEDIATE_BUCKETS


def test_xid1_the_data_file_ships_with_the_package() -> None:
    assert resources.files("healthplane.contracts").joinpath(xid.DATA_FILE).is_file()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = project["tool"]["setuptools"]["package-data"]["healthplane"]
    assert any(fnmatch(f"contracts/{xid.DATA_FILE}", pattern) for pattern in shipped)


# ---------------------------------------------------------------------------- healthplane xid


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HEALTHPLANE), "xid", *args], capture_output=True, text=True, timeout=60, check=False)


def test_xid1_cli_explains_xid_79() -> None:
    done = _cli("79")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("Xid 79: GPU has fallen off the bus (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS)")
    assert "immediate action:     RESTART_BM — Restart the bare-metal node." in out
    assert "investigatory action: CONTACT_SUPPORT" in out
    assert "grade:                critical, sticky" in out
    assert xid.CATALOG.source_url in out and xid.CATALOG.date in out


def test_xid1_cli_json_and_an_unknown_code() -> None:
    done = _cli("999", "--json")
    assert done.returncode == 0, done.stderr
    explained = json.loads(done.stdout)
    assert explained["known"] is False and explained["immediate"] == "CONTACT_SUPPORT"
    assert explained["catalog"]["url"] == xid.CATALOG.source_url
    text = _cli("999").stdout
    assert text.startswith("Xid 999 is not in NVIDIA's Xid catalog: the catalog's default applies.")


@pytest.mark.parametrize("bad", ["abc", "-5", "7.9", "0x4f", ""])
def test_xid1_cli_bad_input_is_one_line_and_exit_2(bad: str) -> None:
    done = _cli(bad)
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1
    assert "not an Xid number" in done.stderr and "Traceback" not in done.stderr


# ---------------------------------------------------------------------------- health-ingest


async def _report(node: SimNode, now: datetime, entries: list[wire.XidEntry] | None = None) -> wire.HealthReport:
    collector = Collector(Settings(node_id=node.node_id, cluster="c"), node, node.kmsg)
    collector.refresh_inventory()
    report = await collector.collect("scheduled", now)
    if entries is None:
        return report
    kmsg = msgspec.structs.replace(report.signals.kmsg, xid=entries)
    return msgspec.structs.replace(report, signals=msgspec.structs.replace(report.signals, kmsg=kmsg))


async def test_xid1_an_xid_79_condition_and_event_carry_the_catalogs_action() -> None:
    node, state = SimNode("n1"), IngestState()
    node.inject("xid:79", 0, T0)
    _, changes = assess(state, await _report(node, T0), T0, 1)
    condition = state.nodes["c\x00n1"].conditions["gpu_xid_errors"]
    assert (condition.severity, condition.recommended_action) == ("critical", xid.recommended_action(79))
    assert condition.recommended_action == "RESTART_BM"
    assert json.loads(wire.encode(condition))["recommendedAction"] == "RESTART_BM"
    (raised,) = [c for c in changes if c.condition and c.condition.type == "gpu_xid_errors"]
    assert raised.condition is not None and raised.condition.recommended_action == "RESTART_BM"
    assert not hasattr(rules, "HARDWARE_XIDS")  # graded by the catalog, not a second list


async def test_xid1_an_application_xid_carries_its_action_and_other_conditions_none() -> None:
    node, state = SimNode("n1"), IngestState()
    node.inject("xid:13", 0, T0)
    node.inject("edac-ue", None, T0)
    assess(state, await _report(node, T0), T0, 1)
    conditions = state.nodes["c\x00n1"].conditions
    assert (conditions["gpu_xid_errors"].severity, conditions["gpu_xid_errors"].recommended_action) == (
        "warning", "RESTART_APP")
    assert conditions["memory_errors"].recommended_action is None


async def test_xid1_the_condition_names_the_worst_action_of_its_gpus() -> None:
    node, state = SimNode("n1"), IngestState()
    node.inject("xid:64", 0, T0)
    node.inject("xid:79", 1, T0)
    assess(state, await _report(node, T0), T0, 1)
    assert state.nodes["c\x00n1"].conditions["gpu_xid_errors"].recommended_action == "RESTART_BM"


async def test_xid1_health_ingest_reads_154_and_nvlink5_from_the_line() -> None:
    node, state = SimNode("n1"), IngestState()
    bus = (await _report(node, T0)).signals.gpu.devices[0].pci_bus_id

    def entry(code: int, line: str) -> wire.XidEntry:
        return wire.XidEntry(pci_bus_id=bus, gpu_index=0, xid=code, count=1, last_at=T0, last_message=line)

    assess(state, await _report(node, T0, [entry(154, XID154_LINES[4][0])]), T0, 1)
    condition = state.nodes["c\x00n1"].conditions["gpu_xid_errors"]
    assert (condition.severity, condition.recommended_action) == ("warning", "IGNORE")  # back to None
    later = T0 + timedelta(seconds=30)
    assess(state, await _report(node, later, [entry(149, NVLINK5_LINES[0][0])]), later, 2)
    condition = state.nodes["c\x00n1"].conditions["gpu_xid_errors"]
    assert (condition.severity, condition.recommended_action) == ("critical", "RESET_GPU")


async def test_xid1_a_fault_held_in_an_old_snapshot_gets_the_catalogs_action() -> None:
    node, state = SimNode("n1"), IngestState()
    node.inject("xid:48", 0, T0)
    assess(state, await _report(node, T0), T0, 1)
    # A snapshot from before findings carried actions: the held finding has none.
    encoded = msgspec.json.encode(state).replace(b',"action":"WORKFLOW_XID_48"', b"")
    restored = msgspec.json.decode(encoded, type=IngestState)
    held = restored.nodes["c\x00n1"].sticky
    assert held and all(s.finding.action is None for s in held.values())
    later = T0 + timedelta(seconds=30)
    assess(restored, await _report(node, later), later, 2)
    assert restored.nodes["c\x00n1"].conditions["gpu_xid_errors"].recommended_action == "WORKFLOW_XID_48"
