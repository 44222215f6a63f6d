"""A structlog-shaped log for pure and in-process tests: every line kept, in order, as
(level, message, fields), so a test asserts what a component said."""

from __future__ import annotations

from typing import Any


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda message, **fields: self.lines.append((level, message, fields))

    def bind(self, **fields: Any) -> Log:
        return self
