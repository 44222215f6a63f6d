"""VAL-1: suites in the cluster config (refused at `config validate` with the field named) and
the verdict on a run, table-driven as the issue lists the ways a run is read."""

from __future__ import annotations

from typing import Any

import pytest

from healthplane.contracts.config import ConfigError, Suite, parse_cluster_config
from healthplane_eviction.run_verdict import judge, rule_of

DIAG = {"command": ["dcgmi", "diag", "-r", "2"], "timeoutSeconds": 900, "gpus": 8}


def test_val1_suites_round_trip_through_the_applied_config() -> None:
    config = parse_cluster_config({"validation": {
        "suites": {"diag": DIAG, "nccl": {"command": ["all_reduce_perf", "-g", "8"],
                                          "passWhen": {"outputMatches": r"Avg bus bandwidth\s*:\s*[1-9]"}}},
        "defaultSuite": "diag", "validateBeforeReturn": True},
        "provisionerDefinitions": {"burst": {"validateBeforeReturn": False}}})
    again = parse_cluster_config(config.to_wire())
    assert again == config
    assert config.validate_before_return_for(None) and config.validate_before_return_for("gpu-pool")
    assert not config.validate_before_return_for("burst")
    assert config.validation.suites["diag"].gpus == 8 and config.validation.isolation.max_concurrent == 8


@pytest.mark.parametrize(("document", "message"), [
    ({"defaultSuite": "diag"}, r"validation: defaultSuite 'diag' is not a suite \(none defined\)"),
    ({"validateBeforeReturn": True}, r"validation: validateBeforeReturn needs defaultSuite"),
    ({"suites": {"d": {"command": []}}}, r"validation\.suites\.d\.command"),
    ({"suites": {"d": {"command": ["x"], "timeoutSeconds": 0}}}, r"validation\.suites\.d\.timeoutSeconds"),
    ({"suites": {"d": {"command": ["x"], "passWhen": {"outputMatches": "("}}}},
     r"validation\.suites\.d\.passWhen: outputMatches '\(' is not a regular expression"),
    ({"suites": {"d": {"command": ["x"], "passWhen": {"jsonField": "a.b"}}}},
     r"validation\.suites\.d\.passWhen: jsonField 'a\.b' needs jsonEquals"),
    ({"suites": {"d": {"command": ["x"], "shell": True}}}, r"validation\.suites\.d\.shell: Extra inputs"),
    ({"suites": {"bad name": {"command": ["x"]}}}, r"validation\.suites\.bad name"),
    ({"isolation": {"maxConcurrent": 0}}, r"validation\.isolation\.maxConcurrent"),
])
def test_val1_a_bad_suite_is_refused_naming_the_field(document: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_cluster_config({"validation": document})


def _suite(**pass_when: Any) -> Suite:
    return Suite.model_validate({"command": ["diag"], "timeoutSeconds": 60, "passWhen": pass_when})


@pytest.mark.parametrize(("suite", "exit_code", "output", "timed_out", "passed", "reason"), [
    (_suite(), 0, "", False, True, "passed"),
    (_suite(), 1, "", False, False, "exit status 1 (passes with 0)"),
    (_suite(), None, "", False, False, "ended without an exit status (killed or lost)"),
    (_suite(), 0, "", True, False, "timed out after 60s"),
    (_suite(exitCode=3), 3, "", False, True, "passed"),
    (_suite(outputMatches=r"^Result: PASS$"), 0, "GPU 0\nResult: PASS\n", False, True, "passed"),
    (_suite(outputMatches=r"^Result: PASS$"), 0, "Result: FAIL\n", False, False, "output does not match /^Result: PASS$/"),
    (_suite(jsonField="summary.result", jsonEquals="pass"), 0, '{"summary": {"result": "pass"}}', False, True, "passed"),
    (_suite(jsonField="gpus.3.ok", jsonEquals=True), 0, '{"gpus": [1, 2, 3, {"ok": false}]}', False, False,
     "gpus.3.ok is false (passes with true)"),
    (_suite(jsonField="summary.result", jsonEquals="pass"), 0, '{"summary": {}}', False, False,
     "output has no field summary.result"),
    (_suite(jsonField="a", jsonEquals=1), 0, "not json", False, False, "output is not JSON (Expecting value at line 1 column 1)"),
])
def test_val1_a_run_is_read_by_its_deadline_exit_status_and_output(suite: Suite, exit_code: int | None, output: str,
                                                                  timed_out: bool, passed: bool, reason: str) -> None:
    verdict = judge(rule_of("diag", suite), exit_code, output, timed_out=timed_out)
    assert (verdict.passed, verdict.reason) == (passed, reason)
