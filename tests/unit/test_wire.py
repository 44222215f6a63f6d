"""Wire records: camelCase JSON, strict decoders whose errors name the field."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from healthplane.contracts import wire

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


def _event() -> wire.NodeEvent:
    return wire.NodeEvent(
        id="e1", node_id="cn-1", cluster="default", type="SCORE_CHANGED", occurred_at=NOW,
        message="score 90 (was 100)", actor="scorer", score=90, previous_score=100,
    )


def test_node_event_is_camel_case_and_leaves_out_unset_fields() -> None:
    # EVT-2: the stream record is the CLI JSON is the webhook data.
    data = msgspec.json.decode(wire.encode(_event()))
    assert data == {
        "id": "e1", "nodeId": "cn-1", "cluster": "default", "type": "SCORE_CHANGED",
        "occurredAt": "2026-11-30T08:00:00Z", "message": "score 90 (was 100)", "actor": "scorer",
        "score": 90, "previousScore": 100,
    }
    assert wire.decode(wire.NodeEvent, wire.encode(_event())) == _event()


def test_decode_error_names_the_field() -> None:
    bad = b'{"id":"e1","nodeId":"cn-1","cluster":"default","type":"SCORE_CHANGED",' \
          b'"occurredAt":"2026-11-30T08:00:00Z","message":"m","actor":"a","score":"high"}'
    with pytest.raises(wire.WireError, match=r"NodeEvent.*\$\.score"):
        wire.decode(wire.NodeEvent, bad)


def test_unknown_event_type_is_refused() -> None:
    bad = msgspec.json.encode({**msgspec.to_builtins(_event()), "type": "NODE_EXPLODED"})
    with pytest.raises(wire.WireError, match=r"\$\.type"):
        wire.decode(wire.NodeEvent, bad)


def test_malformed_json_is_a_wire_error() -> None:
    with pytest.raises(wire.WireError, match="malformed JSON"):
        wire.decode(wire.HealthReport, b"{not json")


def test_nested_field_path_in_report_errors() -> None:
    report = {
        "nodeId": "n", "cluster": "c", "hostname": "h", "sentAt": "2026-11-30T08:00:00Z",
        "intervalSeconds": 30, "trigger": "scheduled",
        "signals": {
            "edac": {"status": "ok", "controllers": [{"name": "mc0", "ce": "x", "ue": 0}]},
            "smart": {"status": "unavailable", "reason": "smartctl not found"},
            "ioerr": {"status": "ok"}, "kmsg": {"status": "ok"}, "mounts": {"status": "ok"},
            "gpu": {"status": "unavailable", "reason": "no NVIDIA driver"},
        },
    }
    with pytest.raises(wire.WireError, match=r"\$\.signals\.edac\.controllers\[0\]\.ce"):
        wire.decode(wire.HealthReport, msgspec.json.encode(report))


def test_gpu_ecc_unavailable_carries_no_zeros() -> None:
    # COL-10: unavailable ECC is null, never zero.
    ecc = wire.GpuEcc(status="unavailable", reason="ECC disabled")
    assert msgspec.json.decode(wire.encode(ecc)) == {
        "status": "unavailable", "reason": "ECC disabled", "volatile": None, "aggregate": None,
    }
