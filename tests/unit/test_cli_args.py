"""The CLI's enumerated values (EVT-1): accepted in any case, held in their canonical form."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from healthplane.cli.main import build_parser, command_groups


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


def _cli(*code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *code], capture_output=True, text=True, timeout=60)


def test_cli_a_command_imports_its_own_group_and_no_other() -> None:
    """The CLI (SPEC's interface contract): every `healthplane` call and every service process
    starts through the command table; a command imports its own group's code, not every
    group's (`healthplane xid 79` was 0.52 s of CPU for all of them, 0.32 s for its own)."""
    done = _cli("-c", "import json, sys\nfrom healthplane.cli.main import main\nmain(['xid', '79'])\n"
                      "print(json.dumps(sorted(sys.modules)))")
    assert done.returncode == 0, done.stderr
    assert "Xid 79" in done.stdout
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    assert "healthplane.cli.xid_cmd" in loaded
    others = {"healthplane.cli.node_cmd", "healthplane.cli.up", "healthplane.cli.config_cmd",
              "healthplane.cli.creds_cmd", "healthplane.cli.breakfix_cmd", "healthplane_collector.sim_cli",
              "healthplane_collector.main", "healthplane.contracts.config"}
    assert not others & loaded


def test_cli_help_lists_every_group_and_a_group_its_own_arguments() -> None:
    """The CLI: `--help` names every group (the library's and the collector's) from the table
    alone; a group's `--help` has its arguments; an unknown group is a usage error naming it."""
    listed = _cli("-m", "healthplane.cli", "--help")
    assert listed.returncode == 0, listed.stderr
    for group in command_groups():
        assert group.name in listed.stdout and group.help[:30] in " ".join(listed.stdout.split())
    node = _cli("-m", "healthplane.cli", "node", "--help")
    assert node.returncode == 0 and "cordon" in node.stdout and "deprovision" in node.stdout
    sim = _cli("-m", "healthplane.cli", "sim", "inject", "--help")
    assert sim.returncode == 0 and "--fault" in sim.stdout
    unknown = _cli("-m", "healthplane.cli", "nodes", "list")
    assert unknown.returncode == 2 and "invalid choice: 'nodes'" in unknown.stderr
