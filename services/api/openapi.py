"""``GET /api/openapi.json``: the API's OpenAPI 3.1 document, its schemas generated from the
wire Structs (the same source as ``proto/``), so the document cannot drift from what the
API returns: the node view, the event and the command outcome are the stored records."""

from __future__ import annotations

from functools import cache
from typing import Any, Final

import msgspec

from healthplane.contracts import wire

VERBS: Final = ("cordon", "uncordon", "drain", "evict", "deprovision", "validate", "remediate", "isolate")
# What each command does, as ``healthplane node VERB`` / ``healthplane isolate`` say it (UI-4).
VERB_SUMMARIES: Final = {
    "validate": "run a diagnostic suite on the node as a job and record the verdict (VAL-1); 200 with "
                "`passed` once the run has ended, 202 while it runs (follow it in the node's events)",
    "remediate": "drain the node, then climb the remediation ladder its fault calls for (REM-1)",
    "isolate": "bisect the nodes of the failed job `job` (one of them this node) with validation runs until "
               "the faulty node(s) are named (VAL-3); 202 while it runs",
}
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


def _dashboard_schema() -> dict[str, Any]:
    """``GET /api/v1/dashboard`` (services/api/dashboard.py ``board``): the keys a reader relies on."""
    text, count, maybe_text = {"type": "string"}, {"type": "integer"}, {"type": ["string", "null"]}
    properties: dict[str, Any] = {"count": count, "percent": maybe_text, "link": text}
    linked: dict[str, Any] = {"type": "object", "properties": properties}
    return {"type": "object", "required": ["asOf", "readable"], "properties": {
        "asOf": text, "readable": {"type": "boolean"},
        "unreadable": {"type": ["object", "null"], "properties": {"since": text, "reason": text}},
        "scope": maybe_text, "nodes": count, "link": text, "healthyPercent": maybe_text, "stale": count,
        "health": {"type": "array", "items": {**linked, "properties": {**properties, "health": text}}},
        "status": {"type": "array", "items": {**linked, "properties": {**properties, "status": text}}},
        "outOfService": linked,
        "scores": {"type": "array", "items": {"type": "object", "properties": {
            "bin": text, "min": {"type": ["integer", "null"]}, "max": {"type": ["integer", "null"]}, "count": count,
            "link": text}}},
        "conditions": {"type": "object", "properties": {"more": count, "top": {"type": "array", "items": {
            "type": "object", "properties": {"type": text, "title": text, "nodes": count, "link": text}}}}},
        "automation": {"type": "array", "items": {"type": "object", "properties": {
            "kind": {"enum": ["draining", "remediating", "validating", "replacing"]}, "count": count, "link": text,
            "words": text}}},
        "mode": {"type": "object"},
        "guardrails": {"type": "array", "items": {"type": "object", "properties": {
            "cluster": text, "name": text, "scope": text, "limit": {"type": ["integer", "null"]},
            "used": {"type": ["integer", "null"]}, "headroom": {"type": ["integer", "null"]},
            "state": {"enum": ["ok", "full", "tripped", "off"]}, "words": text}}},
        "needsAttention": {"type": "object", "properties": {
            "total": count, "byKind": {"type": "object", "additionalProperties": count},
            "items": {"type": "array", "items": {"type": "object", "properties": {
                "kind": text, "since": maybe_text, "cluster": maybe_text, "nodeId": maybe_text, "message": text,
                "fix": text, "link": maybe_text,
                # a domain-degraded item: the domain, and its blind members counted in it (DOM-3)
                "domain": text, "blindMembers": count}}}}},
        "timeline": {"type": "object", "properties": {
            "hours": {"type": "array", "items": text},
            "actions": {"type": "object", "additionalProperties": {"type": "array", "items": count}},
            "totals": {"type": "object", "additionalProperties": count}, "complete": {"type": "boolean"}}},
        "domains": {"type": "array", "items": {"type": "object", "properties": {
            "kind": text, "total": count, "more": count, "cells": {"type": "array", "items": {
                "type": "object", "properties": {"cluster": text, "value": text, "nodes": count,
                                                 "worst": {"enum": ["unknown", "degraded", "out", "healthy"]},
                                                 "link": text}}}}}},
        "clusters": {"type": "array", "items": {"type": "object"}}}}


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
    components["Dashboard"] = _dashboard_schema()
    components["CommandBody"] = {"type": "object", "properties": {
        "reason": {"type": "string"}, "active": {"type": "boolean", "description": "drain: requeue running work"},
        "evict": {"type": "boolean", "description": "deprovision: also take its running work off"},
        "force": {"type": "boolean", "description": "deprovision: now, no hold"},
        "suite": {"type": "string", "description": "validate, isolate: the suite (default: the config's defaultSuite)"},
        "job": {"type": "string", "description": "isolate: the failed job whose nodes are the suspects (required)"},
        "cluster": {"type": "string"},
        "timeout": {"type": "number", "description": "seconds to wait, up to 60 (default 10)"}}}
    paths: dict[str, Any] = {
        "/api/v1/nodes": {"get": {
            "summary": "every node's view (node list -o json), filtered, sorted, paged",
            "parameters": [_CLUSTER, _query("status", {"type": "string"}, "repeatable, any of them"),
                           _query("health", {"type": "string"}, "repeatable, any of them"),
                           _query("condition", {"type": "string"}, "a condition type (gpu_xid_errors): nodes with any "
                                  "of them active; repeatable"),
                           _query("hold", {"type": "string", "enum": ["cordon", "evict", "deprovision", "any", "none"]},
                                  "nodes with a hold of that effect (a drain is a cordon hold), any hold, or none; "
                                  "repeatable, any of them"),
                           _query("q", {"type": "string"}, "text in the node id, the hostname or a condition type"),
                           _query("scoreMin", {"type": "integer", "minimum": 0, "maximum": 100},
                                  "score at least (unscored nodes left out)"),
                           _query("scoreMax", {"type": "integer", "minimum": 0, "maximum": 100},
                                  "score at most (unscored nodes left out)"),
                           _query("domain", {"type": "string"}, "KIND=VALUE, e.g. rack=r12: only nodes in that "
                                  "failure domain; repeatable, a node must be in all (DOM-1)"),
                           _query("sort", {"type": "string"}, "node, cluster, status, health, score, jobs; '-' first "
                                  "for descending"),
                           _query("pageSize", {"type": "integer", "minimum": 1}),
                           _query("pageToken", {"type": "string"}, "nextPageToken or prevPageToken of a page read "
                                  "with the same sort: the page after (before) that page's last (first) node, by key, "
                                  "so nodes joining or leaving meanwhile cause no gap and no repeat")],
            "responses": {"200": _json({"type": "object", "properties": {
                "nodes": {"type": "array", "items": _ref("NodeView")},
                "total": {"type": "integer", "description": "every matching node, on any page"},
                "nextPageToken": {"type": ["string", "null"]},
                "prevPageToken": {"type": ["string", "null"]}}}, "the views"),
                          "400": _json(_ERROR, "a bad parameter"), "401": _ERRORS["401"]}}},
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
        "/api/v1/dashboard": {"get": {
            "summary": "UI-2: the dashboard's figures, of the fleet or of one cluster: counts by health and status "
                       "(percentages as text that never round a node away), a score histogram, the top conditions, "
                       "automation in progress, the breaker and every guardrail with its headroom, the "
                       "needs-attention queue (oldest first, each with its fix), actions per hour over the last "
                       "24 h, a failure-domain heatmap; every count with the nodes-table link that lists its nodes",
            "parameters": [_query("cluster", {"type": "string"}, "one cluster's figures (default: the fleet's)")],
            "responses": {"200": _json(_ref("Dashboard"), "the figures; readable false (and no figures) while "
                                       "the node views cannot be read"),
                          "401": _ERRORS["401"], "404": _json(_ERROR, "a federation hub has none")}}},
        "/api/v1/breakfix": {"get": {
            "summary": "per cluster and fault class: incidents and the mean time from a fault to out of service, to "
                       "remediated, to back in service (MTTR), and between incidents per node (healthplane breakfix)",
            "parameters": [_CLUSTER, _query("since", {"type": "string"}, "30d (default), 24h or an RFC 3339 time")],
            "responses": {"200": _json({"type": "object"}, "the figures"), **_ERRORS}}},
        "/api/v1/jobs/impact": {"get": {
            "summary": "JOB-4: every job that failed since a time, with its nodes and the conditions each node carried "
                       "when the job ended there (healthplane jobs impact -o json)",
            "parameters": [_CLUSTER, _query("since", {"type": "string"}, "24h (default), 30m, 7d or an RFC 3339 time")],
            "responses": {"200": _json({"type": "object", "properties": {
                "since": {"type": "string"}, "jobs": {"type": "array", "items": {"type": "object"}},
                "skipped": {"type": "integer"}}}, "the failed jobs, oldest first"),
                "400": _json(_ERROR, "a since that is neither a duration nor an RFC 3339 time"),
                "401": _ERRORS["401"]}}},
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
        "/api/v1/federation/members": {"get": {
            "summary": "on a federation hub: each member's reachability now (federation list), `since` when, its "
                       "last transitions (newest first) and its lag trend (UI-5)",
            "responses": {"200": _json({"type": "object"}, "the members"),
                          "404": _json(_ERROR, "not a federation hub"), "401": _ERRORS["401"]}}},
        "/api/v1/config": {"get": {
            "summary": "the cluster config in force (config show -o json)",
            "responses": {"200": _json({"type": "object"}, "the config"), "401": _ERRORS["401"]}}},
    }
    for verb in VERBS:
        paths[f"/api/v1/nodes/{{nodeId}}/{verb}"] = {"post": {
            "summary": f"node {verb}: the same hp.cmd command and outcome as the CLI's"
                       + (f"; {VERB_SUMMARIES[verb]}" if verb in VERB_SUMMARIES else ""),
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
