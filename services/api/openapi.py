"""``GET /api/openapi.json``: the API's OpenAPI 3.1 document, its schemas generated from the
wire Structs (the same source as ``proto/``), so the document cannot drift from what the
API returns: the node view, the event and the command outcome are the stored records."""

from __future__ import annotations

from functools import cache
from typing import Any, Final

import msgspec

from healthplane.contracts import wire

VERBS: Final = ("cordon", "uncordon", "drain", "evict", "deprovision")
_REF = "#/components/schemas/{name}"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(name=name)}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERROR: Final = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
_ERRORS: Final = {
    "401": _json(_ERROR, "no token, or one this control plane did not sign, expired or revoked"),
    "404": _json(_ERROR, "no such node"),
}
_NODE: Final = {"name": "nodeId", "in": "path", "required": True, "schema": {"type": "string"},
                "description": "the node id, percent-encoded"}
_CLUSTER: Final = {"name": "cluster", "in": "query", "schema": {"type": "string"}}


def _query(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "in": "query", "schema": schema}
    if description:
        out["description"] = description
    return out


@cache
def document() -> dict[str, Any]:
    _, components = msgspec.json.schema_components([wire.NodeView, wire.NodeEvent, wire.CommandOutcome],
                                                   ref_template=_REF)
    summary_cluster = {"type": "object", "properties": {
        "cluster": {"type": "string"}, "readable": {"type": "boolean"}, "nodes": {"type": ["integer", "null"]},
        "health": {"type": ["object", "null"], "additionalProperties": {"type": "integer"}},
        "worstScore": {"type": ["integer", "null"]}, "label": {"type": "string"}}}
    components["Summary"] = {"type": "object", "properties": {
        "clusters": {"type": "array", "items": summary_cluster},
        "fleet": {"type": "object", "properties": {"nodes": {"type": ["integer", "null"]},
                                                   "healthy": {"type": ["integer", "null"]},
                                                   "healthyPercent": {"type": ["number", "null"]}}}}}
    components["CommandBody"] = {"type": "object", "properties": {
        "reason": {"type": "string"}, "active": {"type": "boolean", "description": "drain: requeue running work"},
        "evict": {"type": "boolean", "description": "deprovision: also take its running work off"},
        "force": {"type": "boolean", "description": "deprovision: now, no hold"},
        "cluster": {"type": "string"}, "timeout": {"type": "number", "description": "seconds to wait (default 10)"}}}
    paths: dict[str, Any] = {
        "/api/v1/nodes": {"get": {
            "summary": "every node's view (node list -o json), filtered, sorted, paged",
            "parameters": [_CLUSTER, _query("status", {"type": "string"}, "repeatable"),
                           _query("health", {"type": "string"}, "repeatable"),
                           _query("domain", {"type": "string"}, "KIND=VALUE, e.g. rack=r12: only nodes in that "
                                  "failure domain; repeatable, a node must be in all (DOM-1)"),
                           _query("sort", {"type": "string"}, "node, cluster, status, health, score, jobs; '-' first "
                                  "for descending"),
                           _query("pageSize", {"type": "integer", "minimum": 1}),
                           _query("pageToken", {"type": "string"})],
            "responses": {"200": _json({"type": "object", "properties": {
                "nodes": {"type": "array", "items": _ref("NodeView")}, "total": {"type": "integer"},
                "nextPageToken": {"type": ["string", "null"]}}}, "the views"), "401": _ERRORS["401"]}}},
        "/api/v1/nodes/{nodeId}": {"get": {
            "summary": "one node (node show -o json)", "parameters": [_NODE, _CLUSTER],
            "responses": {"200": _json(_ref("NodeView"), "the node's view"), **_ERRORS}}},
        "/api/v1/nodes/{nodeId}/events": {"get": {
            "summary": "the node's events, oldest first (node events -o json)",
            "parameters": [_NODE, _CLUSTER, _query("type", {"type": "string"}, "repeatable"),
                           _query("since", {"type": "string"}, "24h, 30m, 7d or an RFC 3339 time"),
                           _query("latest", {"type": "boolean"}), _query("pageSize", {"type": "integer"}),
                           _query("pageToken", {"type": "string"})],
            "responses": {"200": _json({"type": "object", "properties": {
                "events": {"type": "array", "items": _ref("NodeEvent")},
                "nextPageToken": {"type": ["string", "null"]}}}, "one page"), **_ERRORS}}},
        "/api/v1/summary": {"get": {
            "summary": "per cluster: nodes by health, the worst score; fleet totals (node summary -o json)",
            "responses": {"200": _json(_ref("Summary"), "the summary"), "401": _ERRORS["401"]}}},
        "/api/v1/breakfix": {"get": {
            "summary": "per cluster and fault class: incidents and the mean time from a fault to out of service, to "
                       "remediated, to back in service (MTTR), and between incidents per node (healthplane breakfix)",
            "parameters": [_CLUSTER, _query("since", {"type": "string"}, "30d (default), 24h or an RFC 3339 time")],
            "responses": {"200": _json({"type": "object"}, "the figures"), **_ERRORS}}},
        "/api/v1/events/stream": {"get": {
            "summary": "node events live as server-sent events (events watch): id = the event's position, event = "
                       "its type, data = the event; Last-Event-ID resumes right after that position",
            "parameters": [_CLUSTER, _query("node", {"type": "string"}),
                           _query("type", {"type": "string"}, "repeatable, any case"),
                           _query("since", {"type": "string"}, "24h, 30m, 7d or an RFC 3339 time (default: from now)"),
                           {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"},
                            "description": "resume after this position (a browser's EventSource sends it)"}],
            "responses": {"200": {"description": "the event stream",
                                  "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                          "400": _json(_ERROR, "a bad parameter"), "401": _ERRORS["401"]}}},
        "/api/v1/config": {"get": {
            "summary": "the cluster config in force (config show -o json)",
            "responses": {"200": _json({"type": "object"}, "the config"), "401": _ERRORS["401"]}}},
    }
    for verb in VERBS:
        paths[f"/api/v1/nodes/{{nodeId}}/{verb}"] = {"post": {
            "summary": f"node {verb}: the same hp.cmd command and outcome as the CLI's",
            "parameters": [_NODE],
            "requestBody": {"content": {"application/json": {"schema": _ref("CommandBody")}}},
            "responses": {
                "200": _json(_ref("CommandOutcome"), "applied"),
                "202": _json({"type": "object"}, "accepted; eviction has not answered yet (pending)"),
                "400": _json(_ERROR, "a flag combination the CLI refuses too"),
                "403": _json(_ERROR, "the caller's identity may not send it (a viewer)"),
                "409": _json(_ERROR, "refused, with the CLI's message"),
                "503": _json(_ERROR, "not known yet; retry"), **_ERRORS}}}
    return {"openapi": "3.1.0",
            "info": {"title": "Healthplane API", "version": "1",
                     "description": "Node health of the fleet: the CLI's reads and commands over HTTP (API-1)."},
            "components": {"schemas": components,
                           "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}}},
            "security": [{"bearer": []}], "paths": paths}
