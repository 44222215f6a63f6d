"""What a failed end-to-end test leaves to read: the tail of every service's log under its
``tmp_path`` (``up`` writes one per service in ``{data-dir}/logs``, a test's own fleet its
``sim.log``), attached to the report, so a failure seen once in CI can be diagnosed from its
output alone."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

LOG_TAIL_LINES = 25
LOG_SECTION_BYTES = 64 * 1024  # a report stays readable; the newest lines are kept


def _tail(path: Path, lines: int) -> str:
    with open(path, "rb") as file:
        file.seek(0, 2)
        file.seek(max(0, file.tell() - LOG_SECTION_BYTES))
        return "\n".join(file.read().decode(errors="replace").splitlines()[-lines:])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if not isinstance(tmp_path, Path):
        return
    for log in sorted(tmp_path.rglob("*.log")):
        if log.is_file() and log.stat().st_size:
            report.sections.append((f"log {log.relative_to(tmp_path)}", _tail(log, LOG_TAIL_LINES)))
