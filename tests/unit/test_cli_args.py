"""The CLI's enumerated values (EVT-1): accepted in any case, held in their canonical form."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from healthplane.cli.main import build_parser


def _choice_actions(parser: argparse.ArgumentParser) -> Iterator[tuple[argparse.ArgumentParser, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _choice_actions(sub)
        elif action.choices is not None:
            yield parser, action


@pytest.mark.parametrize(("argv", "field", "held"), [
    (["node", "events", "n1", "--type", "score_changed"], "type", ["SCORE_CHANGED"]),
    (["node", "events", "n1", "--type", "Hold_Created", "--type", "NODE_CORDONED"], "type",
     ["HOLD_CREATED", "NODE_CORDONED"]),
    (["node", "hold", "release", "--all", "--effect", "CORDON"], "effect", "cordon"),
    (["node", "list", "-o", "JSON"], "output", "json"),
    (["service", "Health-Ingest"], "name", "health-ingest"),
    (["events", "watch", "--type", "condition_raised", "--type", "Node_Cordoned", "-o", "Json"], "type",
     ["CONDITION_RAISED", "NODE_CORDONED"]),
])
def test_enumerated_values_in_any_case(argv: list[str], field: str, held: object) -> None:
    # EVT-1: the reference's own lower-case form (`--type score_changed`) is accepted.
    assert getattr(build_parser().parse_args(argv), field) == held


def test_every_enumerated_flag_accepts_any_case() -> None:
    # EVT-1: "every enumerated CLI value" — no flag added later may forget it.
    found = list(_choice_actions(build_parser()))
    assert len(found) >= 10
    for _parser, action in found:
        assert action.type is not None, f"{action.option_strings or action.dest} takes its choices in one case only"
        for choice in action.choices:  # type: ignore[union-attr]
            assert action.type(choice.swapcase()) == choice  # type: ignore[operator]


def test_an_unknown_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["node", "events", "n1", "--type", "bogus"])
    assert stopped.value.code == 2
    assert "invalid choice: 'bogus'" in capsys.readouterr().err


def test_bad_data_no_reader_expected_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 15.1: whatever record a command meets, no traceback: one line naming it, exit 1.
    from healthplane.cli import main as run_cli
    from healthplane.cli import node_cmd
    from healthplane.contracts import wire

    async def meets_a_bad_record(args: object) -> int:
        return wire.decode(wire.NodeView, b"{not json").jobs

    monkeypatch.setattr(node_cmd, "_run", meets_a_bad_record)
    assert run_cli(["node", "list"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "healthplane: invalid NodeView: malformed JSON (JSON is malformed: object keys must be strings (byte 1))"]
