"""Generate ``proto/``: JSON Schema for every wire record and an AsyncAPI document listing
every subject, its stream and its payload. ``just proto`` runs ``python -m healthplane.contracts.proto``;
a test fails when the committed files differ from what this produces.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from healthplane.contracts import streams, wire

PARAMETERS = {
    "cluster": "Cluster name, encoded as one subject token (healthplane.contracts.subjects.encode_token)",
    "node": "Node id, encoded as one subject token (healthplane.contracts.subjects.encode_token)",
    "type": "Node event type, e.g. CONDITION_RAISED",
    "verb": "Command verb: cordon, uncordon, drain, evict, deprovision, replace, hold-release, service",
    "alloc": "Allocation id, encoded as one subject token",
    "job": "Job id, encoded as one subject token",
    "action": "Policy instruction: breaker-reset",
    "service": "Service name",
    "partition": "Partition number",
    "stream": "The input stream of the record set aside, e.g. HP_REPORTS",
    "actor": "The sender's identity (its credentials' user or service name), bound by nats-server (SEC-1)",
}
DEAD_LETTER = "DeadLetter"


def schemas() -> dict[str, Any]:
    """One self-contained JSON Schema document per record."""
    return {
        kind.__name__: {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"https://healthplane.dev/proto/{kind.__name__}.json",
            **msgspec.json.schema(kind),
        }
        for kind in wire.RECORDS.values()
    }


def asyncapi() -> dict[str, Any]:
    kinds = list(wire.RECORDS.values())
    _, components = msgspec.json.schema_components(kinds, ref_template="#/components/schemas/{name}")
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for definition in streams.STREAMS:
        for channel in definition.channels:
            address, writer = channel.address, channel.writer
            name = wire.RECORDS[channel.record].__name__ if channel.record else DEAD_LETTER
            channel_id = address.replace(".", "_").replace("{", "").replace("}", "")
            messages[name] = {
                "name": name,
                "contentType": "application/json",
                "payload": {"$ref": f"#/components/schemas/{name}"},
            } if channel.record else {
                "name": name,
                "contentType": "application/octet-stream",
                "summary": "The input a service set aside, byte for byte; what happened is in its "
                           "Hp-Dead-* headers (docs/runtime.md)",
                "payload": {},
            }
            params = [p.strip("{}") for p in address.split(".") if p.startswith("{")]
            channels[channel_id] = {
                "address": address,
                "description": f"{channel.description}. Stream {definition.name}; written by {writer}.",
                "messages": {name: {"$ref": f"#/components/messages/{name}"}},
                **({"parameters": {p: {"description": PARAMETERS[p]} for p in params}} if params else {}),
            }
            operations[f"publish_{channel_id}"] = {
                "action": "send",
                "channel": {"$ref": f"#/channels/{channel_id}"},
                "summary": f"{writer} appends to {address}",
            }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Healthplane",
            "version": "1",
            "description": "Every subject on the Healthplane bus. All payloads are JSON, UTF-8; "
            "keys camelCase; times RFC 3339 UTC with Z.",
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {
            "messages": messages,
            "schemas": components,
        },
        "x-streams": [
            {"name": s.name, "subjects": list(s.subjects), "retention": s.retention.value,
             "maxAgeSeconds": s.max_age, "maxMsgsPerSubject": s.max_msgs_per_subject}
            for s in streams.STREAMS
        ],
    }


def render() -> dict[str, str]:
    """Relative path -> file text: everything ``proto/`` must hold."""
    files = {
        f"schemas/{name}.json": json.dumps(schema, indent=2, sort_keys=True) + "\n"
        for name, schema in schemas().items()
    }
    files["asyncapi.json"] = json.dumps(asyncapi(), indent=2, sort_keys=True) + "\n"
    return files


def write(folder: Path) -> list[Path]:
    written = []
    for relative, text in render().items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "proto")
    for path in write(target):
        print(path)
