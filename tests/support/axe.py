"""The web UI's accessibility check (issue 44): axe-core (tools/ensure-axe fetches the pinned
release into .cache) run on a page open in Chromium; a page passes with no serious or critical
violation. The script is evaluated through the DevTools protocol, which the page's CSP
(``default-src 'self'``, no inline scripts) does not govern, so the page is checked as served."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

from playwright.sync_api import Page

VERSION = "4.14.1"  # tools/ensure-axe pins the same
AXE = Path(os.environ.get("HEALTHPLANE_AXE") or
           Path(__file__).resolve().parents[2] / ".cache" / f"axe-core-{VERSION}" / "axe.min.js")
BLOCKING = ("serious", "critical")


@cache
def _source() -> str:
    if not AXE.is_file():
        raise AssertionError(f"{AXE} missing: run `sh tools/ensure-axe` (`just test` does) or set HEALTHPLANE_AXE "
                             "to an axe.min.js")
    return AXE.read_text(encoding="utf-8")


def violations(page: Page, impacts: tuple[str, ...] = BLOCKING) -> list[dict[str, Any]]:
    """axe-core's violations on ``page`` as it is now, those of the given impacts."""
    if not page.evaluate("typeof window.axe === 'object'"):
        page.evaluate(_source() + "\n;undefined")
    found: list[dict[str, Any]] = page.evaluate("axe.run(document, {resultTypes: ['violations']})"
                                                ".then(r => r.violations)")
    return [v for v in found if v.get("impact") in impacts]


def described(found: list[dict[str, Any]]) -> str:
    """One line per violation and per element, for an assertion message."""
    lines = []
    for v in found:
        lines.append(f"{v['impact']} {v['id']}: {v['help']} ({v['helpUrl']})")
        lines += [f"    {' '.join(map(str, n['target']))}: {n.get('failureSummary', '').splitlines()[-1:]}"
                  for n in v["nodes"][:5]]
        if len(v["nodes"]) > 5:
            lines.append(f"    and {len(v['nodes']) - 5} more")
    return "\n".join(lines)


def assert_accessible(page: Page, what: str) -> None:
    found = violations(page)
    assert not found, f"{what}: axe-core {VERSION} found serious or critical violations:\n{described(found)}"
