"""proto/ is generated from the wire Structs; a stale committed copy fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest
from pydantic_asyncapi.v3 import AsyncAPI

from healthplane.contracts import proto, streams, wire

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
    assert set(document["components"]["messages"]) == {k.__name__ for k in wire.RECORDS.values()} | {"DeadLetter"}
    report = next(c for c in document["channels"].values() if c["address"].startswith("hp.report"))
    assert "Stream HP_REPORTS" in report["description"]


def test_schema_requires_the_contract_fields() -> None:
    event = json.loads((PROTO / "schemas" / "NodeEvent.json").read_text())
    body = event["$defs"]["NodeEvent"]
    assert set(body["required"]) == {"id", "nodeId", "cluster", "type", "occurredAt", "message", "actor"}


def _extras(model: pydantic.BaseModel, where: str = "") -> list[str]:
    """Keys the AsyncAPI 3 models took only because they allow extensions: each must be an
    ``x-`` extension, or it is a misspelt field."""
    found = [f"{where}.{key}" for key in (model.__pydantic_extra__ or {}) if not key.startswith("x-")]
    for name, value in model:
        for item in (value.values() if isinstance(value, dict) else value if isinstance(value, list) else [value]):
            if isinstance(item, pydantic.BaseModel):
                found += _extras(item, f"{where}.{name}")
    return found


def _refs(node: object) -> list[str]:
    if isinstance(node, dict):
        return ([node["$ref"]] if isinstance(node.get("$ref"), str) else []) + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_asyncapi_is_a_valid_asyncapi_3_document() -> None:
    # Issue 17: the generated document is checked against the AsyncAPI 3 object model, every
    # key is one it defines (or an x- extension), and every $ref resolves.
    document = json.loads((PROTO / "asyncapi.json").read_text())
    parsed = AsyncAPI.model_validate(document)
    assert _extras(parsed) == []
    for ref in _refs(document):
        node: object = document
        for part in ref.removeprefix("#/").split("/"):
            assert isinstance(node, dict) and part in node, f"{ref} does not resolve"
            node = node[part]


@pytest.mark.parametrize("channel", streams.CHANNELS, ids=lambda c: c.address)
def test_every_channel_is_held_by_its_stream(channel: streams.Channel) -> None:
    # Issue 17: one table: a stream's subjects are derived from its channels, so every channel
    # the document lists is one a stream stores.
    from healthplane.contracts.subjects import matches

    concrete = ".".join("x" if token.startswith("{") else token for token in channel.address.split("."))
    holders = [s.name for s in streams.STREAMS if any(matches(p, concrete) for p in s.subjects)]
    assert len(holders) == 1, holders
