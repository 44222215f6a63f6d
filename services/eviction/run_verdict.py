"""Reading a validation run (VAL-1): did the suite pass on the nodes it ran on, and if not,
why, in one line. Pure: the runner (the scheduler's job, Slurm's ``sbatch``) hands over the
exit status and the tail of the output it kept; nothing here runs anything.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import msgspec

from healthplane.contracts import wire
from healthplane.contracts.config import Suite


class Rule(msgspec.Struct, frozen=True, kw_only=True):
    """One configured suite as the services keep it (in a fold's state, in a job): what a
    scheduler runs, and how its run is read (``passWhen``)."""

    suite: wire.ValidationSuite
    exit_code: int = 0
    output_matches: str | None = None
    json_field: str | None = None
    json_equals: Any = None
    across: str | None = None  # DOM-4: the domain kind the suite runs across (acrossDomain)


def rule_of(name: str, suite: Suite) -> Rule:
    when = suite.pass_when
    return Rule(suite=wire.ValidationSuite(name=name, command=list(suite.command),
                                           timeout_seconds=suite.timeout_seconds, gpus=suite.gpus),
                exit_code=when.exit_code, output_matches=when.output_matches, json_field=when.json_field,
                json_equals=when.json_equals, across=suite.across_domain)


@dataclass(frozen=True, slots=True)
class Verdict:
    passed: bool
    reason: str


def _field(document: Any, path: str) -> tuple[bool, Any]:
    for part in path.split("."):
        if isinstance(document, dict) and part in document:
            document = document[part]
        elif isinstance(document, list) and part.isdigit() and int(part) < len(document):
            document = document[int(part)]
        else:
            return False, None
    return True, document


def judge(rule: Rule, exit_code: int | None, output: str, *, timed_out: bool = False) -> Verdict:
    """The verdict on one run of ``rule``'s suite: its deadline, then its exit status, then
    what its output must show (``passWhen``)."""
    if timed_out:
        return Verdict(False, f"timed out after {rule.suite.timeout_seconds}s")
    if exit_code is None:
        return Verdict(False, "ended without an exit status (killed or lost)")
    if exit_code != rule.exit_code:
        return Verdict(False, f"exit status {exit_code} (passes with {rule.exit_code})")
    if rule.output_matches is not None and re.search(rule.output_matches, output, re.MULTILINE) is None:
        return Verdict(False, f"output does not match /{rule.output_matches}/")
    if rule.json_field is not None:
        try:
            document = json.loads(output)
        except json.JSONDecodeError as exc:
            return Verdict(False, f"output is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})")
        found, value = _field(document, rule.json_field)
        if not found:
            return Verdict(False, f"output has no field {rule.json_field}")
        if value != rule.json_equals:
            return Verdict(False, f"{rule.json_field} is {json.dumps(value)} (passes with {json.dumps(rule.json_equals)})")
    return Verdict(True, "passed")
