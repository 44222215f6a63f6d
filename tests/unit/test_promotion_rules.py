"""Promotion rules (RUL-1, RUL-2): count-in-window over a node's fault occurrences, the engine
alone (hypothesis against a brute-force count) and folded in health-ingest (reports in, events
out, the count surviving a snapshot)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthplane.contracts import promotion, wire
from healthplane.contracts.config import ConfigError, parse_cluster_config
from healthplane.runtime.fold import Inbound
from healthplane_health_ingest.fold import IngestCore
from healthplane_health_ingest.rules import IngestState
from tests.support.records import subject_for

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
GPU0, GPU1 = "0000:18:00.0", "0000:19:00.0"


def _rule(**fields: object) -> promotion.Rule:
    return promotion.Rule(**{"name": "r", "kind": "xid", "group": "gpu", "count": 3, "window_s": 3600,
                             **fields})  # type: ignore[arg-type]


def _xid(minutes: float, code: int = 79, device: str = GPU0, count: int = 1) -> promotion.Occurrence:
    return promotion.Occurrence(T0 + timedelta(minutes=minutes), "xid", str(code), device, count, "critical",
                                "RESTART_BM")


def _run(rules: Sequence[promotion.Rule], occurrences: Sequence[promotion.Occurrence]) -> list[promotion.Firing]:
    windows = promotion.NodeWindows()
    return [f for o in occurrences for f in promotion.observe(rules, windows, o)]


def test_rul1_count_within_the_window_fires_once_and_starts_again() -> None:
    fired = _run([_rule()], [_xid(0), _xid(10), _xid(20), _xid(30), _xid(40), _xid(50)])
    assert [(f.at, f.count, f.first_at) for f in fired] == [
        (T0 + timedelta(minutes=20), 3, T0), (T0 + timedelta(minutes=50), 3, T0 + timedelta(minutes=30))]


def test_rul1_occurrences_outside_the_window_do_not_count() -> None:
    assert _run([_rule()], [_xid(0), _xid(40), _xid(70), _xid(101)]) == []  # never 3 within an hour
    assert len(_run([_rule()], [_xid(0), _xid(40), _xid(70), _xid(99)])) == 1  # 40, 70, 99


def test_rul1_a_burst_merges_into_one_occurrence() -> None:
    burst = [_xid(0), _xid(0.5), _xid(1), _xid(30), _xid(30.2)]
    assert _run([_rule(burst_s=120)], burst) == []  # two bursts: 2 occurrences
    assert len(_run([_rule()], burst)) == 1
    # A report's delta of 3 counts 3, unless bursts merge.
    assert len(_run([_rule()], [_xid(0, count=3)])) == 1
    assert _run([_rule(burst_s=120)], [_xid(0, count=3)]) == []


def test_rul1_per_gpu_versus_across_gpus() -> None:
    """Xid 31 twice on one GPU: validate; on different GPUs: the application's (the published rules)."""
    rules = [_rule(name="same", codes=frozenset({"31"}), count=2, action="validate"),
             _rule(name="across", codes=frozenset({"31"}), group="across-gpus", count=2, action="none")]
    assert [f.rule for f in _run(rules, [_xid(0, 31, GPU0), _xid(5, 31, GPU0)])] == ["same"]
    fired = _run(rules, [_xid(0, 31, GPU0), _xid(5, 31, GPU1)])
    assert [(f.rule, f.devices) for f in fired] == [("across", (GPU0, GPU1))]
    assert _run(rules, [_xid(0, 79, GPU0), _xid(5, 79, GPU1)]) == []  # another code


def test_rul1_fatal_and_bucket_selectors_and_gpu_and_code() -> None:
    fatal = _rule(fatal=True, count=2)
    warning = promotion.Occurrence(T0, "xid", "13", GPU0, 1, "warning", "RESTART_APP")
    assert _run([fatal], [warning, warning]) == []
    assert len(_run([fatal], [_xid(0), _xid(1, 48)])) == 1  # any fatal Xid counts together per GPU
    per_code = _rule(group="gpu-and-code", count=2)
    assert _run([per_code], [_xid(0), _xid(1, 48)]) == []
    bucket = _rule(buckets=frozenset({"RESET_GPU"}), count=1)
    assert _run([bucket], [_xid(0)]) == []  # asks RESTART_BM


def test_rul1_the_same_xid_after_two_reboots() -> None:
    """gpud's rule: the same Xid still asking for a reboot after 2 reboots -> a human."""
    rule = _rule(buckets=frozenset({"RESTART_BM"}), group="gpu-and-code", count=1, window_s=7 * 86400,
                 after_reboots=2)
    reboot = [promotion.Occurrence(T0 + timedelta(hours=h), "reboot", "reboot") for h in (1, 2)]
    assert _run([rule], [_xid(0), reboot[0], _xid(90)]) == []  # one reboot so far
    fired = _run([rule], [_xid(0), *reboot, _xid(180)])
    assert len(fired) == 1 and "after 2 reboots" in fired[0].message


def test_rul2_record_mode_fires_the_same_marked_recorded() -> None:
    [fired] = _run([_rule(mode="record")], [_xid(0), _xid(1), _xid(2)])
    assert fired.mode == "record" and "(recorded only)" in fired.message


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 600), st.sampled_from([GPU0, GPU1])), max_size=40),
       st.integers(1, 4), st.integers(1, 240))
def test_rul1_firings_match_a_brute_force_count(events: list[tuple[int, str]], count: int, window_min: int) -> None:
    """RUL-1: per GPU, a firing exactly when ``count`` occurrences since the group's last firing
    fall within the window; bounded state whatever the input."""
    rule = _rule(count=count, window_s=window_min * 60)
    occurrences = [_xid(m, device=d) for m, d in sorted(events)]
    windows = promotion.NodeWindows()
    fired = [f for o in occurrences for f in promotion.observe([rule], windows, o)]
    expected: list[tuple[datetime, str]] = []
    since: dict[str, list[datetime]] = {}
    for o in occurrences:
        kept = [t for t in since.get(o.device, []) if o.at - t <= timedelta(minutes=window_min)] + [o.at]
        if len(kept) >= count:
            expected.append((o.at, o.device))
            kept = []
        since[o.device] = kept
    assert [(f.at, f.devices[0]) for f in fired] == expected
    assert all(len(v) < count for v in windows.counted.values())


def test_rul1_config_validates_each_rule_naming_the_field() -> None:
    defaults = parse_cluster_config({}).promotion_rules
    assert [r.name for r in defaults] == ["fatal-xid-repeated", "xid31-repeated-on-gpu", "xid31-across-gpus",
                                          "remediations-repeated", "reboot-did-not-fix-xid"]
    assert parse_cluster_config({"promotionRules": []}).promotion_rules == []
    for bad, says in [
        ({"name": "x", "kind": "xid", "count": 2, "window": "1 week"}, "window: '1 week' is not a duration"),
        ({"name": "x", "kind": "xid", "codes": ["79b"], "count": 2, "window": "1h"}, "'79b' is not an Xid number"),
        ({"name": "x", "kind": "reboot", "groupBy": "gpu", "count": 2, "window": "1h"}, "groupBy: gpu needs a kind"),
        ({"name": "x", "kind": "xid", "buckets": ["REBOOT"], "count": 2, "window": "1h"}, "'REBOOT' is not an Xid"),
        ({"name": "x", "kind": "condition", "codes": ["gpu_on_fire"], "count": 2, "window": "1h"},
         "'gpu_on_fire' is not a condition type"),
    ]:
        with pytest.raises(ConfigError) as caught:
            parse_cluster_config({"promotionRules": [bad]})
        assert says in str(caught.value) and "promotionRules" in str(caught.value)
        assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="used by another rule"):
        parse_cluster_config({"promotionRules": [defaults[0].model_dump(by_alias=True)] * 2})


# ---------------------------------------------------------------------------- in health-ingest


def _report(minute: int, counts: dict[tuple[str, int], int], sent: int | None = None) -> bytes:
    xid = [wire.XidEntry(pci_bus_id=bus, gpu_index=0, xid=code, count=n, last_at=T0,
                         last_message=f"NVRM: Xid (PCI:{bus}): {code}, pid=1") for (bus, code), n in counts.items()]
    report = wire.HealthReport(
        node_id="n1", cluster="c", hostname="n1", sent_at=T0 + timedelta(minutes=sent or minute),
        interval_seconds=30, trigger="kmsg",
        signals=wire.Signals(edac=wire.EdacSignal(status="ok"), smart=wire.SmartSignal(status="ok"),
                             ioerr=wire.IoerrSignal(status="ok"), kmsg=wire.KmsgSignal(status="ok", xid=xid),
                             mounts=wire.MountsSignal(status="ok"), gpu=wire.GpuSignal(status="ok")))
    return wire.encode(report)


def _fold(reports: Sequence[tuple[int, bytes]], snapshot_after: int | None = None,
          ) -> tuple[IngestState, list[wire.NodeEvent]]:
    core, state = IngestCore(plugins=[]), IngestState()
    events: list[wire.NodeEvent] = []
    for seq, (minute, data) in enumerate(reports, 1):
        at = T0 + timedelta(minutes=minute)
        state, emits, _ = core.step(state, Inbound("HP_REPORTS", seq, subject_for("HP_REPORTS", data), data, {}, at,
                                                   True))
        events += [wire.decode(wire.NodeEvent, e.payload) for e in emits if e.subject.startswith("hp.event.")]
        if seq == snapshot_after:  # a restart: the state as a snapshot holds it
            state = msgspec.json.Decoder(IngestState).decode(msgspec.json.encode(state))
    return state, events


def test_rul1_xid31_twice_on_one_gpu_is_observed_fired_and_raised() -> None:
    reports = [(0, _report(0, {(GPU0, 31): 1})), (10, _report(10, {(GPU0, 31): 2}))]
    state, events = _fold(reports)
    observed = [e for e in events if e.type == "FAULT_OBSERVED"]
    assert [(e.fault.kind, e.fault.code, e.fault.device, e.fault.count) for e in observed if e.fault] == [
        ("xid", "31", GPU0, 1), ("xid", "31", GPU0, 1)]
    [fired] = [e for e in events if e.type == "RULE_FIRED"]
    assert fired.rule is not None and (fired.rule.rule, fired.rule.action, fired.rule.count) == (
        "xid31-repeated-on-gpu", "validate", 2)
    condition = state.nodes["c\x00n1"].conditions["gpu_xid_errors"]
    assert condition.reason == "xid31-repeated-on-gpu" and "validate the node" in condition.message


def test_rul1_the_count_survives_a_restart_in_the_middle_of_the_window() -> None:
    """A kill -9 mid-window: the fold restarts from its snapshot, the count with it."""
    reports = [(m, _report(m, {(GPU0, 79): n})) for n, m in enumerate((0, 60, 120, 180, 240), 1)]
    straight = _fold(reports)
    restarted = _fold(reports, snapshot_after=3)
    assert [e.rule.rule for e in restarted[1] if e.rule] == ["fatal-xid-repeated"]
    assert [e.type for e in restarted[1]] == [e.type for e in straight[1]]
    condition = restarted[0].nodes["c\x00n1"].conditions["gpu_xid_errors"]
    assert (condition.reason, condition.severity, condition.recommended_action) == (
        "fatal-xid-repeated", "critical", "CONTACT_SUPPORT")


def test_rul2_a_rule_in_record_mode_writes_its_record_and_raises_nothing() -> None:
    core, state = IngestCore(plugins=[]), IngestState()
    config = wire.ConfigEnvelope(version=1, applied_at=T0, actor="t", config=parse_cluster_config(
        {"promotionRules": [{"name": "xid31-recorded", "kind": "xid", "codes": ["31"], "groupBy": "gpu", "count": 2,
                             "window": "1h", "action": "validate", "mode": "record"}]}).to_wire())
    data = wire.encode(config)
    state, _, _ = core.step(state, Inbound("HP_CONFIG", 1, "hp.config", data, {}, T0, True))
    events: list[wire.NodeEvent] = []
    for seq, (minute, count) in enumerate(((0, 1), (5, 2)), 1):
        report = _report(minute, {(GPU0, 31): count})
        state, emits, _ = core.step(state, Inbound("HP_REPORTS", seq, subject_for("HP_REPORTS", report), report, {},
                                                   T0 + timedelta(minutes=minute), True))
        events += [wire.decode(wire.NodeEvent, e.payload) for e in emits if e.subject.startswith("hp.event.")]
    [fired] = [e for e in events if e.type == "RULE_FIRED"]
    assert fired.rule is not None and fired.rule.mode == "record" and fired.rule.condition is None
    assert state.nodes["c\x00n1"].conditions["gpu_xid_errors"].reason != "xid31-recorded"
