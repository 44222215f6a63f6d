"""The web UI's pages (API-3): server-rendered with Jinja2 (autoescaped), from the same
reads and the same words as the CLI. Pure helpers here; the routes are ``app``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import jinja2

from healthplane.client.reads import detail
from healthplane.contracts import wire

TEMPLATES: Final = Path(__file__).parent / "templates"
STATIC: Final = Path(__file__).parent / "static"


def quote_id(node_id: str) -> str:
    """A node id as one path segment: ``/``, ``%``, ``+``, spaces, ``#``, ``?`` and UTF-8 escaped (UI-1)."""
    return quote(node_id, safe="")


def node_path(node_id: str, verb: str | None = None) -> str:
    """The node page's path (with ``verb``: its command form's), the one way a link to a node is built."""
    return f"/nodes/{quote_id(node_id)}" + (f"/{quote(verb, safe='')}" if verb else "")


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
    return env


def trend(events: Sequence[wire.NodeEvent], now: datetime, width: int = 640, height: int = 160) -> dict[str, Any]:
    """The score trend (reference 000: "a trend can be plotted directly" from SCORE_CHANGED):
    a step line through each change, held to ``now``, as SVG coordinates."""
    changes = [(e.occurred_at, e.score) for e in events if e.type == "SCORE_CHANGED" and e.score is not None]
    if not changes:
        return {"points": [], "path": "", "width": width, "height": height, "first": None, "last": None}
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
    return {"points": points, "path": "".join(steps), "width": width, "height": height,
            "first": when(start), "last": when(end)}
