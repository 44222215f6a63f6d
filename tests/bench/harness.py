"""The one benchmark harness: every figure goes through ``record``; the session prints a table
and writes ``bench-results.json`` at the repo root (figures from earlier runs of other
benchmarks are kept, same-named ones replaced)."""

from __future__ import annotations

import json
import operator
from dataclasses import asdict, dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "bench-results.json"

_COMPARE = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


@dataclass
class Figure:
    value: float
    unit: str
    baseline: float | None
    ratio: float | None
    target: str
    meets: bool


figures: dict[str, Figure] = {}


def record(name: str, value: float, unit: str, *, baseline: float | None = None,
           target: str = "") -> Figure:
    """``target`` reads ``"ratio >= 3"`` or ``"value <= 20"``; no target means informational."""
    ratio = round(value / baseline, 3) if baseline else None
    meets = True
    if target:
        subject, op, bound = target.split()
        measured = ratio if subject == "ratio" else value
        meets = measured is not None and _COMPARE[op](measured, float(bound))
    figure = Figure(round(value, 3), unit, None if baseline is None else round(baseline, 3), ratio, target, meets)
    figures[name] = figure
    return figure


def table() -> str:
    rows = [("figure", "value", "unit", "baseline", "ratio", "target", "meets")]
    for name, f in figures.items():
        rows.append((name, f"{f.value:,.1f}", f.unit, "" if f.baseline is None else f"{f.baseline:,.1f}",
                     "" if f.ratio is None else f"{f.ratio:.2f}", f.target, "yes" if f.meets else "NO"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows)


def write() -> None:
    existing = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    existing.update({name: asdict(f) for name, f in figures.items()})
    RESULTS.write_text(json.dumps(existing, indent=2, sort_keys=True) + "\n")
