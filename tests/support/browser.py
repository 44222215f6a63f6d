"""Debian's Chromium (tools/ensure-chromium), headless, driven by Playwright's Python package:
the web UI's tests (API-5) and `just screenshots` run the browser operators run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Browser, sync_playwright

CHROMIUM = Path(os.environ.get("HEALTHPLANE_CHROMIUM", "/usr/bin/chromium"))
# Without the background-networking flags Chromium keeps trying hosts a closed network refuses.
FLAGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage")


@contextmanager
def chromium() -> Iterator[Browser]:
    if not CHROMIUM.is_file():
        raise AssertionError(f"{CHROMIUM} missing: run `sh tools/ensure-chromium` (`just test` does) or set "
                             "HEALTHPLANE_CHROMIUM to a Chromium binary")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=list(FLAGS), headless=True)
        try:
            yield browser
        finally:
            browser.close()
