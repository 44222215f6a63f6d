"""SEC-11: every list and free-text string a node sends is bounded when it is decoded. A node's
message may hold 256 KiB (its identity's cap), room for ~100,000 tiny list items, each a key in
some fold's state: a record past a bound is a ``WireError`` naming the field and the bound,
which every fold sets aside as malformed (REL-3); a record at the bound, and the largest real
machine's report, are taken."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healthplane.contracts import wire
from healthplane.runtime.fold import Inbound
from healthplane_health_ingest.fold import IngestCore
from healthplane_health_ingest.rules import IngestState
from tests.support.records import resource_report, subject_for

NOW = "2026-11-30T08:00:00Z"
XID = {"pciBusId": "0000:18:00.0", "gpuIndex": 0, "xid": 79, "count": 1, "lastMessage": "NVRM: Xid 79"}
GPU = {"index": 0, "pciBusId": "0000:18:00.0", "ecc": {"status": "ok", "volatile": {"corrected": 0, "uncorrected": 0},
                                                       "aggregate": {"corrected": 0, "uncorrected": 0}},
       "throttle": {"reasons": []}}
DISK = {"name": "/dev/sda", "protocol": "ATA", "passed": True}


def report(**signals: dict[str, Any]) -> dict[str, Any]:
    """A health report as JSON-shaped values, every signal ok and empty unless given."""
    return {"nodeId": "n1", "cluster": "c1", "hostname": "n1", "sentAt": NOW, "intervalSeconds": 30,
            "trigger": "scheduled",
            "signals": {name: {"status": "ok", **signals.get(name, {})}
                        for name in ("edac", "smart", "ioerr", "kmsg", "mounts", "gpu")}}


def decode(value: dict[str, Any]) -> wire.HealthReport:
    return wire.decode(wire.HealthReport, msgspec.json.encode(value))


# (where, the bound, a report whose field at ``where`` holds n items)
LISTS: list[tuple[str, int, Any]] = [
    ("$.signals.kmsg.xid", wire.XID_ENTRIES_MAX, lambda n: report(kmsg={"xid": [XID] * n})),
    ("$.signals.kmsg.sxid", wire.SXID_ENTRIES_MAX,
     lambda n: report(kmsg={"sxid": [{"device": "0000:05:00.0", "sxid": 11004, "count": 1, "lastMessage": "m"}] * n})),
    ("$.signals.kmsg.remountReadOnly", wire.MOUNTS_MAX,
     lambda n: report(kmsg={"remountReadOnly": [{"device": "sda1", "lastMessage": "m"}] * n})),
    ("$.signals.edac.controllers", wire.MEMORY_CONTROLLERS_MAX,
     lambda n: report(edac={"controllers": [{"name": "mc0", "ce": 0, "ue": 0}] * n})),
    ("$.signals.edac.controllers[0].dimms", wire.DIMMS_MAX,
     lambda n: report(edac={"controllers": [{"name": "mc0", "ce": 0, "ue": 0,
                                             "dimms": [{"name": "d", "ce": 0, "ue": 0}] * n}]})),
    ("$.signals.smart.devices", wire.DISKS_MAX, lambda n: report(smart={"devices": [DISK] * n})),
    ("$.signals.smart.devices[0].failingNow", wire.SMART_ATTRIBUTES_MAX,
     lambda n: report(smart={"devices": [{**DISK, "failingNow": [{"id": 5, "name": "Reallocated"}] * n}]})),
    ("$.signals.smart.devices[0].exitStatusBits", wire.EXIT_STATUS_BITS_MAX,
     lambda n: report(smart={"devices": [{**DISK, "exitStatusBits": ["bit3"] * n}]})),
    ("$.signals.ioerr.devices", wire.DISKS_MAX, lambda n: report(ioerr={"devices": [{"name": "sda", "count": 0}] * n})),
    ("$.signals.mounts.readOnly", wire.MOUNTS_MAX,
     lambda n: report(mounts={"readOnly": [{"mountPoint": "/d", "device": "/dev/sdb1", "fsType": "ext4"}] * n})),
    ("$.signals.gpu.devices", wire.GPUS_MAX, lambda n: report(gpu={"devices": [GPU] * n})),
    ("$.signals.gpu.devices[0].throttle.reasons", wire.THROTTLE_REASONS_MAX,
     lambda n: report(gpu={"devices": [{**GPU, "throttle": {"reasons": ["HwSlowdown"] * n}}]})),
]
TEXTS: list[tuple[str, int, Any]] = [
    ("$.signals.smart.reason", wire.TEXT_MAX, lambda s: report(smart={"status": "failed", "reason": s})),
    ("$.signals.kmsg.xid[0].lastMessage", wire.TEXT_MAX, lambda s: report(kmsg={"xid": [{**XID, "lastMessage": s}]})),
    ("$.signals.gpu.devices[0].uuid", wire.NAME_MAX, lambda s: report(gpu={"devices": [{**GPU, "uuid": s}]})),
    ("$.signals.mounts.readOnly[0].mountPoint", wire.PATH_MAX,
     lambda s: report(mounts={"readOnly": [{"mountPoint": s, "device": "/dev/sdb1", "fsType": "ext4"}]})),
    ("$.hostname", wire.NAME_MAX, lambda s: {**report(), "hostname": s}),
]


@pytest.mark.parametrize(("where", "bound", "build"), LISTS, ids=[w for w, _, _ in LISTS])
def test_sec11_a_list_at_its_bound_is_taken_and_one_past_it_refused_naming_field_and_bound(
        where: str, bound: int, build: Any) -> None:
    """SEC-11: exactly ``bound`` items decode; ``bound + 1`` is one WireError line naming both."""
    assert decode(build(bound))
    with pytest.raises(wire.WireError) as refused:
        decode(build(bound + 1))
    assert str(refused.value) == f"invalid HealthReport: Expected `array` of length <= {bound} - at `{where}`"


@pytest.mark.parametrize(("where", "bound", "build"), TEXTS, ids=[w for w, _, _ in TEXTS])
def test_sec11_a_text_at_its_bound_is_taken_and_one_past_it_refused(where: str, bound: int, build: Any) -> None:
    """SEC-11: strings too: ``bound`` characters decode, one more is refused naming the field."""
    assert decode(build("x" * bound))
    with pytest.raises(wire.WireError, match=rf"Expected `str` of length <= {bound} - at `{re.escape(where)}`"):
        decode(build("x" * (bound + 1)))


def test_sec11_a_report_of_100000_list_items_is_refused_naming_the_field() -> None:
    """SEC-11: the issue's attack: 100,000 Xid entries (each a state key in health-ingest)."""
    with pytest.raises(wire.WireError) as refused:
        decode(report(kmsg={"xid": [{**XID, "pciBusId": f"{i:012x}"} for i in range(100_000)]}))
    assert "\n" not in str(refused.value)
    assert f"length <= {wire.XID_ENTRIES_MAX}" in str(refused.value) and "$.signals.kmsg.xid" in str(refused.value)


def test_sec11_the_largest_real_machine_report_is_taken() -> None:
    """SEC-11: a 16-GPU node with every GPU throttling, 816 block devices (four 102-bay JBODs
    through multipath), 32 memory controllers of 24 DIMMs, 200 distinct Xids, 1000 read-only
    bind mounts and a kernel line as long as the kernel writes: every bound has room to spare."""
    big = report(
        edac={"controllers": [{"name": f"mc{m}", "ce": 1, "ue": 0,
                               "dimms": [{"name": f"dimm{d}", "label": f"CPU_SrcID#{m // 4}_MC#{m % 4}_Chan#{d // 2}_DIMM#{d % 2}",
                                          "ce": 0, "ue": 0} for d in range(24)]} for m in range(32)]},
        smart={"devices": [{**DISK, "name": f"/dev/sd{i}", "serial": f"ZL{i:08d}", "model": "ST18000NM000J-2TV103",
                            "exitStatusBits": ["bit2", "bit6"],
                            "failingNow": [{"id": a, "name": f"attr{a}"} for a in range(30)] if i == 0 else []}
                           for i in range(816)]},
        ioerr={"devices": [{"name": f"sd{i}", "count": i} for i in range(816)]},
        kmsg={"xid": [{**XID, "pciBusId": f"0000:{g:02x}:00.0", "xid": x, "lastMessage": "x" * 1000}
                      for g in range(16) for x in range(13)],
              "sxid": [{"device": f"0000:0{s}:00.0", "sxid": 11000 + x, "count": 3, "lastMessage": "m"}
                       for s in range(6) for x in range(12)]},
        mounts={"readOnly": [{"mountPoint": f"/var/lib/kubelet/pods/{i}/volumes/data", "device": "/dev/nvme0n1p1",
                              "fsType": "xfs"} for i in range(1000)]},
        gpu={"devices": [{**GPU, "index": g, "pciBusId": f"0000:{g:02x}:00.0",
                          "uuid": f"GPU-{g:08x}-1c2d-3e4f-5a6b-7c8d9e0f1a2b", "name": "NVIDIA H200",
                          "throttle": {"reasons": ["SwThermalSlowdown", "HwSlowdown", "HwThermalSlowdown",
                                                   "HwPowerBrakeSlowdown"], "thermal": True}} for g in range(16)]},
    )
    decoded = decode(big)
    assert len(decoded.signals.smart.devices) == 816 and len(decoded.signals.kmsg.xid) == 208
    resources = resource_report("n1", gpus=16, annotations=64)
    assert wire.decode(wire.ResourceReport, wire.encode(resources)) == resources


def test_sec11_resource_report_lists_and_annotations_are_bounded() -> None:
    """SEC-11: a resource report's devices and annotations (kept per node by health-ingest)."""
    ok = resource_report("n1", gpus=wire.GPUS_MAX, annotations=wire.ANNOTATIONS_MAX)
    assert wire.decode(wire.ResourceReport, wire.encode(ok)) == ok
    with pytest.raises(wire.WireError, match=rf"length <= {wire.GPUS_MAX} - at `\$\.devices`"):
        wire.decode(wire.ResourceReport, wire.encode(resource_report("n1", gpus=wire.GPUS_MAX + 1)))
    with pytest.raises(wire.WireError, match=rf"length <= {wire.ANNOTATIONS_MAX} - at `\$\.annotations`"):
        wire.decode(wire.ResourceReport, wire.encode(resource_report("n1", annotations=wire.ANNOTATIONS_MAX + 1)))


def test_sec11_lists_other_folds_keep_are_bounded() -> None:
    """SEC-11: a command's hold ids and a simulated node's failing GPUs are kept by folds too."""
    command = {"id": "c", "nodeId": "n", "cluster": "c", "verb": "hold-release", "actor": "a", "issuedAt": NOW,
               "holdIds": ["h"] * (wire.HOLDS_MAX + 1)}
    with pytest.raises(wire.WireError, match=r"at `\$\.holdIds`"):
        wire.decode(wire.Command, msgspec.json.encode(command))
    hardware = {"nodeId": "n", "cluster": "c", "failingGpus": [0] * (wire.GPUS_MAX + 1), "setAt": NOW, "actor": "a"}
    with pytest.raises(wire.WireError, match=r"at `\$\.failingGpus`"):
        wire.decode(wire.SimHardware, msgspec.json.encode(hardware))


def test_sec11_health_ingest_refuses_an_oversize_report_as_the_processor_sets_aside() -> None:
    """SEC-11, REL-3 at the core: the fold raises the WireError (the processor dead-letters,
    counts and logs it: tests/security/test_wire_bounds.py plays that live) before touching the
    state, and the node's next report is folded as if the bad one never came."""
    bad = msgspec.json.encode(report(kmsg={"xid": [XID] * (wire.XID_ENTRIES_MAX + 1)}))
    good = msgspec.json.encode(report(kmsg={"xid": [XID]}))
    core, state = IngestCore(plugins=[]), IngestState()
    at = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    with pytest.raises(wire.WireError, match=r"\$\.signals\.kmsg\.xid"):
        core.step(state, Inbound("HP_REPORTS", 1, subject_for("HP_REPORTS", bad), bad, {}, at, True))
    assert state.nodes == {}
    state, emits, _ = core.step(state, Inbound("HP_REPORTS", 2, subject_for("HP_REPORTS", good), good, {}, at, True))
    assert "gpu_xid_errors" in state.nodes["c1\x00n1"].conditions and emits


# Every list of the report (one of them long: near its bound or far past it), its items made
# of arbitrary JSON where the schema wants a struct.
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                     max_leaves=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(LISTS), st.sampled_from([-1, 0, 1, 2, 10_000]), st.booleans(),
       st.lists(st.tuples(st.sampled_from(["edac", "smart", "ioerr", "kmsg", "mounts", "gpu"]),
                          st.text(max_size=12), _JSON), max_size=3))
def test_sec11_decoding_any_list_never_raises_anything_but_a_wire_error(
        field: tuple[str, int, Any], past: int, as_text: bool, junk: list[tuple[str, str, Any]]) -> None:
    """SEC-11, REL-3: whatever the lengths and whatever the items, a report either decodes or
    is one WireError (never an exception a fold would not set aside)."""
    where, bound, build = field
    value = build(max(0, bound + past))
    for signal, key, item in junk:
        value["signals"][signal][key] = item
    data = msgspec.json.encode(value)
    if as_text:
        data = data.replace(b'"ok"', b'"o\\u0000k"', 1)
    try:
        decoded = wire.decode(wire.HealthReport, data)
    except wire.WireError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(decoded, wire.HealthReport)
    assert past <= 0 or junk, f"{where}: {bound + past} items taken past the bound of {bound}"
