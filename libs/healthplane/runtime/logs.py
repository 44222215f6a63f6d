"""Structured logs: JSON in production (or when not on a terminal), readable on a terminal."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

import structlog


def configure(service: str, *, json: bool | None = None, level: str | None = None) -> Any:
    """Set up structlog once per process and return a logger bound to ``service``.

    ``HEALTHPLANE_LOG_FORMAT`` (``json``/``console``) and ``HEALTHPLANE_LOG_LEVEL`` override.
    """
    fmt = os.environ.get("HEALTHPLANE_LOG_FORMAT")
    if json is None:
        json = fmt == "json" if fmt else not sys.stderr.isatty()
    level_name = (level or os.environ.get("HEALTHPLANE_LOG_LEVEL") or "info").upper()
    renderer: Any = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level_name, logging.INFO)
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    return structlog.get_logger().bind(service=service)


def get(**bound: Any) -> Any:
    return structlog.get_logger().bind(**bound)


@dataclass
class LogBudget:
    """At most one line per interval for a repetitive condition; the rest are counted and
    reported with the next line (a burst of 20,000 drops is one line, not 20,000)."""

    interval_s: float = 10.0
    last_at: float | None = None
    suppressed: int = 0

    def allow(self, now: float) -> bool:
        if self.last_at is None or now - self.last_at >= self.interval_s:
            self.last_at = now
            return True
        self.suppressed += 1
        return False

    def take_suppressed(self) -> int:
        count, self.suppressed = self.suppressed, 0
        return count
