"""``just screenshots``: the README's pictures of the web UI, from a real ``healthplane up``
with one injected fault, taken in Debian's Chromium: the dashboard, the nodes table and the
degraded node's page (docs/img/)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from playwright.sync_api import expect

from tests.support.browser import chromium
from tests.support.stack import running


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as root, running(Path(root), nodes=12) as stack, chromium() as browser:
        assert stack.cli("sim", "inject", "sim-005", "--fault", "xid:79", "--gpu", "0").returncode == 0
        page = browser.new_page(viewport={"width": 1280, "height": 760})
        page.goto(stack.api_url + "/login")
        page.fill("textarea[name=token]", stack.token("admin"))
        page.click("form.login button[type=submit]")
        expect(page.locator("#clusters")).to_contain_text("1 degraded, worst 55", timeout=20_000)
        page.screenshot(path=str(out / "dashboard.png"))
        page.goto(stack.api_url + "/nodes")
        expect(page.locator("#nodes")).to_contain_text("sim-005")
        page.screenshot(path=str(out / "nodes.png"))
        page.goto(stack.api_url + "/nodes/sim-005")
        expect(page.locator("#trend circle")).to_have_count(2)
        page.screenshot(path=str(out / "node.png"), full_page=True)
    print(f"screenshots: {', '.join(str(out / n) for n in ('dashboard.png', 'nodes.png', 'node.png'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img")))
