"""CEL expressions for policy rule sets (POL-7) and detectors (POL-8): compile once, check
the names an expression uses, evaluate against plain JSON-shaped values.

The library is ``common-expression-language`` (the Rust ``cel`` crate behind a Python
binding); docs/policy.md has the measurement that chose it. That library resolves names only
when an expression runs, so :func:`compile_expression` checks them itself: the variables an
expression may read (``event`` for a HealthEvent match, ``node`` for a Node match) and the
functions it may call, so that ``config validate`` refuses a typo instead of the policy
discovering it on the first fault.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, Final

import cel

# CEL's standard functions and operators as the Rust crate names them (what
# ``Program.functions()`` reports), plus the macros, which it reports as functions too.
STANDARD_FUNCTIONS: Final = frozenset({
    "size", "contains", "startsWith", "endsWith", "matches", "has", "all", "exists", "exists_one",
    "map", "filter", "int", "uint", "double", "string", "bytes", "bool", "timestamp", "duration",
    "dyn", "type", "max", "min", "getFullYear", "getMonth", "getDayOfYear", "getDayOfMonth", "getDate",
    "getDayOfWeek", "getHours", "getMinutes", "getSeconds", "getMilliseconds",
})
_MACRO_VARIABLE = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*,")


class ExpressionError(ValueError):
    """An expression that cannot be used; ``str()`` says why, for the config error message."""


def _is_operator(name: str) -> bool:
    return not name[:1].isalpha()  # "_&&_", "!_", "@in", "_[_]", "@not_strictly_false"


@lru_cache(maxsize=4096)
def _compiled(expression: str) -> cel.Program:
    try:
        return cel.compile(expression)
    except ValueError as exc:
        raise ExpressionError(_first_line(str(exc))) from None


def compile_expression(expression: str, variables: Iterable[str]) -> cel.Program:
    """The compiled program, shared by every caller with the same text (compile once).
    Refuses a syntax error, a variable other than ``variables`` (and those a macro binds) and
    an unknown function."""
    if not expression.strip():
        raise ExpressionError("the expression is empty")
    program = _compiled(expression)
    bound = set(_MACRO_VARIABLE.findall(expression))
    allowed = set(variables)
    unknown = sorted(v for v in program.variables() if v not in allowed and v not in bound)
    if unknown:
        raise ExpressionError(
            f"unknown variable {unknown[0]!r}; this expression can read {', '.join(sorted(allowed))}")
    functions = sorted(f for f in program.functions() if not _is_operator(f) and f not in STANDARD_FUNCTIONS)
    if functions:
        raise ExpressionError(f"unknown function {functions[0]!r}")
    return program


class Bindings:
    """The variables one evaluation sees, converted to CEL values once and shared by every
    expression evaluated against them (the conversion costs more than most expressions)."""

    __slots__ = ("_context",)

    def __init__(self, variables: Mapping[str, Any]) -> None:
        self._context = cel.Context(variables=dict(variables))

    def test(self, program: cel.Program) -> bool:
        """True only for a boolean true. A missing key, a type mismatch or a non-boolean result
        is false: a rule that cannot be evaluated on this input does not match it."""
        try:
            return program.execute(self._context) is True
        except (RuntimeError, TypeError, ValueError, KeyError, IndexError, OverflowError):
            return False


def _first_line(message: str) -> str:
    # The crate's parse errors span several lines (a caret diagram); the first says it all.
    return message.strip().splitlines()[0] if message.strip() else "cannot be compiled"
