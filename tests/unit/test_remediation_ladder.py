"""The remediation ladder's pure state machine (REM-1): it only climbs, every step ends, it
stops for good after the last rung, and attempts are bounded per node and window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthplane.contracts.config import ConfigError, parse_cluster_config
from healthplane_eviction import ladder as rem

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
LADDER = (rem.Rung("gpu-reset", 300), rem.Rung("reboot", 900), rem.Rung("needs-attention", 600))
WINDOW = timedelta(hours=24)


def test_rem1_xid79_reset_then_reboot_then_needs_attention_and_nothing_after() -> None:
    climb = rem.begin("GPU_XID_ERRORS", LADDER)
    climb, first = rem.drained(climb, T0, 4, WINDOW)
    assert (first.action, first.step) == ("run", "gpu-reset")
    climb, waiting = rem.outcome(climb, T0 + timedelta(seconds=30), ran=True, reason="reset", fault_active=True,
                                 max_attempts=4, window=WINDOW)
    assert waiting == rem.WAIT and climb.phase == "verifying"  # the next report may still clear it
    climb, second = rem.timed_out(climb, T0 + timedelta(seconds=300), 4, WINDOW)  # it did not: persisted
    assert (second.action, second.step) == ("run", "reboot")
    climb, third = rem.outcome(climb, T0 + timedelta(seconds=330), ran=False, reason="systemctl: refused",
                               fault_active=True, max_attempts=4, window=WINDOW)
    assert third.action == "needs-attention" and climb.final
    assert third.why == "GPU_XID_ERRORS: every step of its ladder was tried"
    # However long it runs, whatever arrives: nothing more.
    later = T0 + timedelta(days=3)
    for decided in (rem.timed_out(climb, later, 4, WINDOW)[1], rem.drained(climb, later, 4, WINDOW)[1],
                    rem.outcome(climb, later, ran=True, reason="", fault_active=False, max_attempts=4,
                                window=WINDOW)[1], rem.cleared(climb)[1]):
        assert decided == rem.WAIT


def test_rem1_a_step_whose_outcome_never_arrives_times_out_into_the_next_one() -> None:
    climb, _ = rem.drained(rem.begin("GPU_XID_ERRORS", LADDER), T0, 4, WINDOW)
    assert rem.timed_out(climb, T0 + timedelta(seconds=299), 4, WINDOW)[1] == rem.WAIT
    climb, decided = rem.timed_out(climb, T0 + timedelta(seconds=300), 4, WINDOW)
    assert (decided.action, decided.step) == ("run", "reboot")


def test_rem1_a_reset_that_clears_the_fault_succeeds() -> None:
    climb, _ = rem.drained(rem.begin("GPU_XID_ERRORS", LADDER), T0, 4, WINDOW)
    done, decided = rem.outcome(climb, T0, ran=True, reason="reset", fault_active=False, max_attempts=4,
                                window=WINDOW)
    assert decided == rem.Decision("succeeded", "gpu-reset", "reset") and done.final
    # Or its condition clears with the next report, within the rung's time.
    climb, _ = rem.outcome(climb, T0, ran=True, reason="reset", fault_active=True, max_attempts=4, window=WINDOW)
    done, decided = rem.cleared(climb)
    assert decided.action == "succeeded" and done.final


def test_rem1_attempts_are_bounded_per_node_across_episodes() -> None:
    earlier = (T0 - timedelta(hours=2), T0 - timedelta(hours=1))
    _, decided = rem.drained(rem.begin("GPU_XID_ERRORS", LADDER, earlier), T0, 2, WINDOW)
    assert decided.action == "needs-attention"
    assert decided.why == "GPU_XID_ERRORS: 2 remediation attempt(s) within 24 h, the bound"
    # Outside the window they no longer count.
    _, decided = rem.drained(rem.begin("GPU_XID_ERRORS", LADDER, earlier), T0 + timedelta(days=1), 2, WINDOW)
    assert decided.step == "gpu-reset"


EVENTS = st.lists(st.sampled_from(["fail", "ok-but-fault", "ok", "timeout", "cleared", "drained"]), max_size=30)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["gpu-reset", "reboot"]), st.integers(0, 2)), min_size=0, max_size=4),
       st.sampled_from(["replace", "needs-attention"]), EVENTS)
def test_rem1_a_ladder_never_loops_and_always_ends(agent: list[tuple[str, int]], last: str,
                                                   events: list[str]) -> None:
    """Whatever happens, the rungs run in order, each at most once plus its retries, and once
    final nothing runs."""
    rungs = (*(rem.Rung(a, 60, retries=r, backoff_s=30) for a, r in agent), rem.Rung(last, 60))
    climb, decided = rem.drained(rem.begin("GPU_XID_ERRORS", rungs), T0, 100, WINDOW)
    ran = [decided]
    runs = [climb.step] if decided.action == "run" else []
    now = T0
    for event in events:
        now += timedelta(seconds=61)
        if event == "timeout":
            climb, decided = rem.timed_out(climb, now, 100, WINDOW)
        elif event == "cleared":
            climb, decided = rem.cleared(climb)
        elif event == "drained":
            climb, decided = rem.drained(climb, now, 100, WINDOW)
        else:
            climb, decided = rem.outcome(climb, now, ran=event != "fail", reason=event,
                                         fault_active=event != "ok", max_attempts=100, window=WINDOW)
        ran.append(decided)
        if decided.action == "run":
            runs.append(climb.step)
    assert runs == sorted(runs)  # it only climbs
    for index, rung in enumerate(rungs):
        assert runs.count(index) <= 1 + rung.retries
    finals = [d for d in ran if d.action in ("replace", "needs-attention", "succeeded")]
    assert len(finals) <= 1 and (not finals or ran.index(finals[0]) == len(ran) - 1
                                 or all(d == rem.WAIT for d in ran[ran.index(finals[0]) + 1:]))
    # Without retries, steps that do not run reach the last rung in exactly len(agent) failures.
    if all(r == 0 for _, r in agent) and events[:len(agent)] == ["fail"] * len(agent) and len(events) >= len(agent):
        assert finals and finals[0].action == last


@pytest.mark.parametrize(("ladder", "message"), [
    ({"faultClass": "GPU_XID_ERRORS", "steps": [{"action": "gpu-reset"}]}, "must end in replace or needs-attention"),
    ({"faultClass": "GPU_XID_ERRORS", "steps": [{"action": "flash-firmware"}, {"action": "replace"}]},
     r"remediation\.ladders\[0\]\.steps\[0\]\.action: Input should be 'gpu-reset', 'reboot', 'replace' or 'needs-attention' \(got 'flash-firmware'\)"),
    ({"faultClass": "GPU_XID_ERRORS", "steps": [{"action": "replace"}, {"action": "needs-attention"}]},
     "steps.0: replace can only be the last step"),
    ({"faultClass": "DISK_DEGRADED", "xids": [79], "steps": [{"action": "replace"}]}, "xids narrows"),
    ({"faultClass": "GPU_FIRE", "steps": [{"action": "replace"}]}, "faultClass 'GPU_FIRE' is not a condition type"),
    ({"faultClass": "GPU_XID_ERRORS", "validateSuite": "diag", "steps": [{"action": "replace"}]},
     r"validateSuite 'diag' is not a validation suite \(none defined\)"),
])
def test_rem1_config_validate_refuses_a_ladder_that_could_loop_or_is_unknown(ladder: dict[str, Any],
                                                                            message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_cluster_config({"remediation": {"ladders": [ladder]}})
