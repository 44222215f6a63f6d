"""proto/ is generated from the wire Structs; a stale committed copy fails here."""

from __future__ import annotations

import json
from pathlib import Path

from healthplane import proto, wire

PROTO = Path(__file__).resolve().parents[2] / "proto"


def test_committed_proto_is_current() -> None:
    expected = proto.render()
    stale = [rel for rel, text in expected.items()
             if not (PROTO / rel).is_file() or (PROTO / rel).read_text(encoding="utf-8") != text]
    extra = sorted(str(p.relative_to(PROTO)) for p in PROTO.rglob("*.json")
                   if str(p.relative_to(PROTO)) not in expected)
    assert not stale and not extra, f"proto/ is stale ({stale or extra}); run `just proto` and commit"


def test_asyncapi_lists_every_subject_with_its_stream() -> None:
    document = json.loads((PROTO / "asyncapi.json").read_text())
    addresses = {c["address"] for c in document["channels"].values()}
    assert {"hp.report.{cluster}.{node}", "hp.event.{cluster}.{node}.{type}", "hp.config"} <= addresses
    assert set(document["components"]["messages"]) == {k.__name__ for k in wire.RECORDS.values()}
    report = next(c for c in document["channels"].values() if c["address"].startswith("hp.report"))
    assert "Stream HP_REPORTS" in report["description"]


def test_schema_requires_the_contract_fields() -> None:
    event = json.loads((PROTO / "schemas" / "NodeEvent.json").read_text())
    body = event["$defs"]["NodeEvent"]
    assert set(body["required"]) == {"id", "nodeId", "cluster", "type", "occurredAt", "message", "actor"}
