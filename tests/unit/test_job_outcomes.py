"""JOB-1 and JOB-4, pure: sacct's JSON (Slurm 22.05's and 23.11's shapes, as their openapi
data parsers print them), the per-node outcome fold and its bounds, Slurm node states as
someone else's drain, and the reference scheduler's outcomes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthplane.contracts import joboutcomes, wire
from healthplane_slurm_adapter.records import SlurmError, SlurmNode
from healthplane_slurm_adapter.rules import drain_message, foreign_drain, wait_status
from healthplane_slurm_adapter.slurm import parse_sacct_json

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)

# Slurm 22.05 (openapi/dbv0.0.38): state and exit status as strings, numbers plain.
SACCT_2205 = {"meta": {"plugin": {"type": "openapi/dbv0.0.38"}}, "errors": [], "jobs": [
    {"job_id": 41, "account": "physics", "user": "alice", "partition": "gpu", "allocation_nodes": 2,
     "nodes": "cn-[01-02]", "state": {"current": "FAILED", "reason": "NonZeroExitCode"},
     "exit_code": {"status": "FAILED", "return_code": 3},
     "time": {"elapsed": 61, "start": 1796600000, "end": 1796600061, "submission": 1796599990}},
    {"job_id": 42, "account": "physics", "user": "bob", "partition": "gpu", "allocation_nodes": 1,
     "state": {"current": "CANCELLED by 1000", "reason": "None"},
     "exit_code": {"status": "SIGNALED", "return_code": 0, "signal": {"signal_id": 9, "name": "KILL"}},
     "time": {"elapsed": 5, "start": 1796600100, "end": 1796600105}}]}
# Slurm 23.11 (data_parser v0.0.40): lists of flags, numbers as {set, infinite, number}.
SACCT_2311 = {"meta": {}, "errors": [], "warnings": [], "jobs": [
    {"job_id": 77, "account": "", "user": "carol", "partition": "batch", "allocation_nodes": 1,
     "state": {"current": ["TIMEOUT"], "reason": "None"},
     "exit_code": {"status": ["SIGNALED"], "return_code": {"set": True, "infinite": False, "number": 0},
                   "signal": {"id": {"set": True, "infinite": False, "number": 15}, "name": "TERM"}},
     "time": {"elapsed": 3600, "start": 1796600000, "end": 1796603600, "limit": {"set": True, "number": 60}}}]}


def test_job1_sacct_json_of_slurm_2205_and_2311() -> None:
    """JOB-1: both shapes give the state, the wait status (exit code, signal), times, whose."""
    old = parse_sacct_json(json.dumps(SACCT_2205).encode())
    assert (old[41].state, wait_status(old[41].status), old[41].account, old[41].user, old[41].size) == (
        "FAILED", (3, None), "physics", "alice", 2)
    assert (old[41].started_at, old[41].ended_at) == (1796600000, 1796600061)
    assert (old[42].state, wait_status(old[42].status)) == ("CANCELLED", (None, 9))
    new = parse_sacct_json(json.dumps(SACCT_2311).encode())
    assert (new[77].state, wait_status(new[77].status), new[77].partition) == ("TIMEOUT", (None, 15), "batch")


@pytest.mark.parametrize("said", [b"", b"not json", b'{"jobs": [{"job_id": "x"}]}', b'{"jobs": {}}',
                                  b'{"errors": [{"error": "Slurm accounting storage is disabled"}]}'])
def test_job1_unexpected_sacct_output_is_one_clear_error(said: bytes) -> None:
    """JOB-1: output that is not sacct's JSON is a SlurmError naming the command, never a traceback."""
    with pytest.raises(SlurmError) as raised:
        parse_sacct_json(said)
    assert str(raised.value).startswith("sacct --json: ")


def outcome(job: str, minutes: float, kind: wire.JobOutcomeKind = "completed", node: str = "cn-1",
            attempt: int = 0) -> wire.JobOutcome:
    return wire.JobOutcome(job_id=job, node_id=node, cluster="c", outcome=kind, ended_at=T0 + timedelta(minutes=minutes),
                           scheduler="slurm", attempt=attempt)


def test_job1_fold_keeps_end_order_and_one_entry_per_run() -> None:
    """JOB-1: out-of-order records land in end order; a record folded again is one entry."""
    state = joboutcomes.fold([outcome("2", 5, "failed"), outcome("1", 1), outcome("2", 5, "failed"),
                              outcome("2", 9, attempt=1)])
    [history] = state.nodes.values()
    assert [(e.job_id, e.attempt) for e in history.entries] == [("1", 0), ("2", 0), ("2", 1)]
    assert history.counts() == {"completed": 2, "failed": 1}
    assert history.counts(T0 + timedelta(minutes=2)) == {"failed": 1, "completed": 1}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.floats(0, 20 * 24 * 60), st.sampled_from(wire.JOB_OUTCOMES)),
                max_size=400))
def test_job1_fold_is_bounded_and_replays_the_same_from_a_snapshot(
        runs: list[tuple[int, float, wire.JobOutcomeKind]]) -> None:
    """JOB-1: at most HISTORY_MAX per node, none older than WINDOW before its newest, sorted;
    folding half, snapshotting (msgspec round trip) and folding the rest equals folding all."""
    records = [outcome(str(job), minutes, kind, node=f"cn-{job % 3}") for job, minutes, kind in runs]
    whole = joboutcomes.fold(records)
    for history in whole.nodes.values():
        assert len(history.entries) <= joboutcomes.HISTORY_MAX
        ends = [e.ended_at for e in history.entries]
        assert ends == sorted(ends)
        assert not ends or ends[-1] - ends[0] <= joboutcomes.WINDOW
        assert len({e.key for e in history.entries}) == len(history.entries)
    half = len(records) // 2
    snapshot = msgspec.json.encode(joboutcomes.fold(records[:half]))
    restored = msgspec.json.decode(snapshot, type=joboutcomes.JobOutcomesState)
    assert msgspec.json.encode(joboutcomes.fold(records[half:], restored)) == msgspec.json.encode(whole)


def node(state: str, flags: list[str], why: str = "", user: str | None = "root") -> SlurmNode:
    return SlurmNode(name="cn-1", state=state, state_flags=flags, reason=why, reason_set_by_user=user,
                     reason_changed_at=1796600000)


@pytest.mark.parametrize(("seen", "expected"), [
    (node("idle", ["DRAIN"], "bad DIMM, ticket 4711"), ("DRAIN", "drained in Slurm by root: bad DIMM, ticket 4711")),
    (node("mixed", ["DRAIN"], "bad DIMM"), ("DRAIN", "drained in Slurm by root: bad DIMM")),
    (node("down", [], "Not responding", "slurm"), ("DOWN", "set DOWN in Slurm by slurm: Not responding")),
    (node("idle", ["FAIL"], "flaky PSU"), ("FAIL", "set FAIL in Slurm by root: flaky PSU")),
    (node("down", ["DRAIN", "FAIL"], "psu"), ("FAIL", "set FAIL in Slurm by root: psu")),
    (node("idle", ["DRAIN"], "", None), ("DRAIN", "drained in Slurm: no reason given")),
    (node("idle", ["DRAIN"], "healthplane: hold h-1 (cordon)"), None),
    (node("down", ["DRAIN"], "healthplane: score 30 below drainBelow 45"), None),
    (node("idle", []), None),
    (node("down", [], ""), None),
    (node("idle", ["NOT_RESPONDING"]), None),
    (node("allocated", ["COMPLETING"]), None),
])
def test_job4_whose_drain_a_slurm_node_shows(seen: SlurmNode, expected: tuple[str, str] | None) -> None:
    """JOB-4: someone else's DRAIN, DOWN or FAIL (the strongest shown) with reason and user; ours
    (the prefix) and nodes in service are none."""
    found = foreign_drain(seen, "healthplane:")
    assert (None if found is None else (found.state, drain_message(found))) == expected
