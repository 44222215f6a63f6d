"""The web UI's pages (API-3): server-rendered with Jinja2 (autoescaped), from the same
reads and the same words as the CLI. Pure helpers here; the routes are ``app``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote, unquote, urlencode

import jinja2

from healthplane.client.reads import detail
from healthplane.contracts import wire

TEMPLATES: Final = Path(__file__).parent / "templates"
STATIC: Final = Path(__file__).parent / "static"


def quote_id(node_id: str) -> str:
    """A node id as one path segment: ``/``, ``%``, ``+``, spaces, ``#``, ``?`` and UTF-8 escaped (UI-1).
    An id of dots alone (``.``, ``..``) would be a dot-segment, which clients fold away
    (RFC 3986 §5.2.4): its dots go escaped. (WHATWG browsers fold ``%2E`` segments as well,
    so in a browser such a node is reached through the table's filter, not its own path.)"""
    if node_id.strip(".") == "":
        return node_id.replace(".", "%2E")
    return quote(node_id, safe="")


def node_path(node_id: str, verb: str | None = None) -> str:
    """The node page's path (with ``verb``: its command form's), the one way a link to a node is built."""
    return f"/nodes/{quote_id(node_id)}" + (f"/{quote(verb, safe='')}" if verb else "")


def row_key(cluster: str, node_id: str) -> str:
    """A table row's key in the page (``data-key``, a bulk checkbox's value): cluster and node
    id, each percent-encoded, joined by ``/`` (which neither part then holds)."""
    return f"{quote(cluster, safe='')}/{quote(node_id, safe='')}"


def parse_row_key(text: str) -> tuple[str, str] | None:
    """``(cluster, node_id)`` of a :func:`row_key`; ``None`` for anything else."""
    cluster, slash, node_id = text.partition("/")
    if not slash or not cluster or not node_id or "/" in node_id:
        return None
    return unquote(cluster, errors="strict"), unquote(node_id, errors="strict")


def when(value: datetime | None) -> str:
    return value.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z") if value else "-"


def label(status: str) -> str:
    return status.replace("_", " ").capitalize()


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["when"] = when
    env.filters["label"] = label
    env.filters["title"] = wire.condition_title
    env.globals["detail"] = detail
    env.globals["node_path"] = node_path
    env.globals["row_key"] = row_key
    return env


# Time-axis steps, the first that gives at most TICKS_MAX ticks across the span is used.
TICK_STEPS: Final = tuple(timedelta(minutes=m) for m in (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 2880,
                                                          10080, 20160, 43200))
TICKS_MAX: Final = 6
AXIS_HEIGHT: Final = 22  # below the plot: the times


def trend(events: Sequence[wire.NodeEvent], now: datetime, width: int = 640, height: int = 160) -> dict[str, Any]:
    """The score trend (reference 000: "a trend can be plotted directly" from SCORE_CHANGED):
    a step line through each change, held to ``now``, as SVG coordinates; under it a time
    axis (UI-4), its ticks at round UTC times, and the scores 0, 50 and 100 beside it.
    ``height`` is the plot's; the drawing is :data:`AXIS_HEIGHT` taller for the times."""
    changes = [(e.occurred_at, e.score) for e in events if e.type == "SCORE_CHANGED" and e.score is not None]
    if not changes:
        return {"points": [], "path": "", "width": width, "height": height, "first": None, "last": None,
                "ticks": [], "levels": [], "drawn_height": height + AXIS_HEIGHT}
    start, end = changes[0][0], max(now, changes[-1][0])
    span_s = max((end - start).total_seconds(), 1.0)
    pad = 8

    def x(at: datetime) -> float:
        return round(pad + (width - 2 * pad) * (at - start).total_seconds() / span_s, 1)

    def y(score: int) -> float:
        return round(pad + (height - 2 * pad) * (100 - score) / 100, 1)

    points = [{"x": x(at), "y": y(score), "score": score, "at": when(at)} for at, score in changes]
    steps = [f"M{points[0]['x']},{points[0]['y']}"]
    for point in points[1:]:
        steps.append(f"H{point['x']}V{point['y']}")
    steps.append(f"H{x(end)}")
    ticks = [{"x": x(at), "label": label_at(at, step), "at": when(at),
              # A label at either edge is anchored inward, so the drawing does not cut it.
              "anchor": "start" if x(at) < 40 else "end" if x(at) > width - 40 else "middle"}
             for at, step in time_ticks(start, end)]
    return {"points": points, "path": "".join(steps), "width": width, "height": height,
            "first": when(start), "last": when(end), "ticks": ticks,
            # The score's label just inside the plot, clear of the line at 100 and at 0.
            "levels": [{"y": y(score), "label_y": y(score) + (-3 if score == 0 else 11), "score": score}
                       for score in (100, 50, 0)],
            "drawn_height": height + AXIS_HEIGHT}


def time_ticks(start: datetime, end: datetime) -> list[tuple[datetime, timedelta]]:
    """Round UTC times between ``start`` and ``end`` (each with the step), at most
    :data:`TICKS_MAX`: the smallest step of :data:`TICK_STEPS` that fits; a span too short for
    two of them gets its two ends (a one-second step: labelled to the second)."""
    span = end - start
    step = next((s for s in TICK_STEPS if span / s < TICKS_MAX), None)  # floor(span / s) + 1 ticks at most
    if step is None:  # longer than the largest step allows: as many days as it takes
        step = timedelta(days=span.days // (TICKS_MAX - 1) + 1)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    first = epoch + step * -(-(start - epoch) // step)  # the first multiple of step at or after start
    found = []
    at = first
    while at <= end:
        found.append((at, step))
        at += step
    if len(found) < 2:  # too short a span for two round times: its two ends, to the second
        return [(start, timedelta(seconds=1)), (end, timedelta(seconds=1))]
    return found


def label_at(at: datetime, step: timedelta) -> str:
    """A tick's label: the time of day for steps under a day (to the second under a minute;
    the date at midnight), the date for longer ones. UTC, as every time the UI shows."""
    at = at.astimezone(UTC)
    if step < timedelta(minutes=1):
        return at.strftime("%H:%M:%S")
    if step >= timedelta(days=1) or (at.hour == 0 and at.minute == 0):
        return at.strftime("%m-%d")
    return at.strftime("%H:%M")


# ---------------------------------------------------------------------------- the node page (UI-4)

# What the node page's timeline shows: remediation and validation, and how a node needing
# attention got there and left it.
TIMELINE_EVENTS: Final = ("VALIDATION_STARTED", "VALIDATION_PASSED", "VALIDATION_FAILED", "REMEDIATION_STARTED",
                          "REMEDIATION_SUCCEEDED", "REMEDIATION_FAILED", "NODE_NEEDS_ATTENTION", "NODE_SERVICED")
ATTRIBUTION_EVENTS: Final = ("JOB_FAILURE_ATTRIBUTED",)


def timeline(events: Iterable[wire.NodeEvent]) -> list[dict[str, Any]]:
    """The remediation and validation history, newest first: each entry its time, what it is
    (``validation`` / ``remediation`` / ``attention``), how it went (``started``, ``passed``,
    ``failed``...) and the facts of its record."""
    out = []
    for event in events:
        if event.type not in TIMELINE_EVENTS:
            continue
        kind, _, how = event.type.lower().partition("_")
        facts: list[str] = []
        if event.validation is not None:
            record = event.validation
            kind = "validation"
            facts += [f"suite {record.suite}", f"job {record.job}"]
            if record.duration_seconds is not None:
                facts.append(f"{record.duration_seconds:g} s")
            if record.nodes > 1:
                facts.append(f"{record.nodes} nodes")
            if record.isolating:
                facts.append(f"isolating job {record.isolating}, round {record.round}")
        if event.remediation is not None:
            kind = "remediation"
            facts += [event.remediation.action, f"attempt {event.remediation.attempt}"]
        if event.type == "NODE_NEEDS_ATTENTION":
            kind, how = "attention", "needs attention"
        elif event.type == "NODE_SERVICED":
            kind, how = "attention", "serviced"
        out.append({"at": event.occurred_at, "type": event.type, "kind": kind, "how": how, "facts": facts,
                    "message": event.message, "actor": event.actor})
    return sorted(out, key=lambda e: e["at"], reverse=True)


def attributions(events: Iterable[wire.NodeEvent]) -> list[dict[str, Any]]:
    """EVI-7: each job failure attributed to this node, newest first: when, the fault class
    it was put down to, the allocation and the words of the record."""
    found = [{"at": e.occurred_at, "fault": e.fault_class or "-", "allocation": e.allocation_id, "message": e.message}
             for e in events if e.type == "JOB_FAILURE_ATTRIBUTED"]
    return sorted(found, key=lambda e: e["at"], reverse=True)


# The Grafana dashboard deploy/grafana builds (OBS-3) and the panels of it about one node;
# tests/unit checks them against the committed dashboard, so a rename there fails here.
GRAFANA_DASHBOARD: Final = ("healthplane-node-reliability", "node-reliability")
GRAFANA_PANELS: Final = ((6, "Score history"), (7, "Active conditions"), (8, "Job failures attributed"))


def grafana_links(base: str | None, cluster: str, node_id: str) -> list[dict[str, str]]:
    """Links to the node's panels in Grafana at ``base`` (none without one): the dashboard
    with its ``cluster`` and ``node`` variables set, then each panel on its own."""
    if not base:
        return []
    uid, slug = GRAFANA_DASHBOARD
    root = f"{base.rstrip('/')}/d/{quote(uid, safe='')}/{slug}"
    variables = [("var-cluster", cluster), ("var-node", node_id)]
    links = [{"title": "Node Reliability dashboard", "url": f"{root}?{urlencode(variables)}"}]
    links += [{"title": title, "url": f"{root}?{urlencode([*variables, ('viewPanel', str(panel))])}"}
              for panel, title in GRAFANA_PANELS]
    return links


# ---------------------------------------------------------------------------- bulk commands (UI-3)

BULK_VERBS: Final = ("cordon", "drain", "uncordon", "validate")
_BULK_ASKS: Final = {
    "cordon": "Cordon {n} node(s): stop new work reaching them?",
    "drain": "Drain {n} node(s): cordon them and let their running work finish?",
    "drain-active": "Drain {n} node(s): cordon them and requeue their running work now?",
    "uncordon": "Uncordon {n} node(s): release their cordon holds?",
    "validate": "Validate {n} node(s): run the diagnostic suite on each, as a job?",
}


def bulk_question(verb: str, count: int, active: bool = False) -> str:
    """The question before a command on several nodes, as the CLI asks before its ``--all``
    forms: the verb, how many nodes, what it does; answered by a button, never by default."""
    return _BULK_ASKS["drain-active" if verb == "drain" and active else verb].format(n=count)


def bulk_summary(verb: str, outcomes: Sequence[dict[str, Any]], active: bool = False) -> str:
    """One line over a bulk command's outcomes: how many nodes, and how many of them went
    each way (``applied``, ``failed`` validation, ``refused``, ``retry``, ``pending``)."""
    counts = {result: sum(1 for o in outcomes if o["result"] == result)
              for result in ("applied", "failed", "refused", "retry", "pending")}
    said = ", ".join(f"{n} {result}" for result, n in counts.items() if n)
    what = "drain --active" if verb == "drain" and active else verb
    return f"{what} {len(outcomes)} node(s): {said}"
