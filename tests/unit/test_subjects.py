"""Subject encoding: one reversible token per node id, safe for subjects and KV keys."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthplane.contracts import subjects

KV_KEY = re.compile(r"^[-/_=.A-Za-z0-9]+$")
ids = st.text(min_size=1, max_size=80)


@given(ids)
def test_token_round_trip(node_id: str) -> None:
    assert subjects.decode_token(subjects.encode_token(node_id)) == node_id


@given(ids)
def test_token_never_holds_subject_specials(node_id: str) -> None:
    token = subjects.encode_token(node_id)
    for forbidden in (".", "*", ">", " ", "\t", "\n", "\r"):
        assert forbidden not in token


@given(ids, ids)
def test_kv_key_is_valid_and_reversible(cluster: str, node_id: str) -> None:
    key = subjects.kv_node_key(cluster, node_id)
    assert KV_KEY.match(key)
    assert subjects.parse_kv_node_key(key) == (cluster, node_id)


@given(ids, ids, st.sampled_from(["NODE_CORDONED", "CONDITION_RAISED"]))
def test_event_subject_parses_back(cluster: str, node_id: str, event_type: str) -> None:
    parsed = subjects.parse(subjects.event(cluster, node_id, event_type))
    assert (parsed.kind, parsed.cluster, parsed.node_id, parsed.rest) == ("event", cluster, node_id, event_type)


@pytest.mark.parametrize(
    ("node_id", "token"),
    [("cn-042", "cn-042"), ("10.0.0.42/9100", "10=2E0=2E0=2E42=2F9100"), ("node.gpu_14", "node=2Egpu_14"),
     ("a=b", "a=3Db")],
)
def test_readable_ids_stay_readable(node_id: str, token: str) -> None:
    assert subjects.encode_token(node_id) == token


def test_every_builder_yields_one_token_per_part() -> None:
    assert subjects.report("default", "10.0.0.42/9100") == "hp.report.default.10=2E0=2E0=2E42=2F9100"
    assert subjects.command("default", "cn-1", "drain", "ops.alice") == "hp.cmd.default.cn-1.drain.ops=2Ealice"
    assert subjects.allocation("c", "n", "job.1/0") == "hp.alloc.c.n.job=2E1=2F0"
    assert subjects.node_events("c", "n.1") == "hp.event.c.n=2E1.*"
    assert subjects.snapshot("scorer", 3) == "hp.snapshot.scorer.3"


@pytest.mark.parametrize("bad", ["", "a.b", "=2", "=zz", "a b", "=FF"])
def test_decode_refuses_what_encode_cannot_produce(bad: str) -> None:
    with pytest.raises(subjects.SubjectError):
        subjects.decode_token(bad)


@pytest.mark.parametrize(("pattern", "subject", "matched"), [
    ("hp.report.>", "hp.report.c.n", True), ("hp.report.>", "hp.report", False),
    ("hp.event.*.*.X", "hp.event.c.n.X", True), ("hp.event.*.*.X", "hp.event.c.n.Y", False),
    ("hp.config", "hp.config", True), ("hp.config", "hp.config.x", False), ("hp.*", "hp.a.b", False),
])
def test_subject_matching_as_nats_does(pattern: str, subject: str, matched: bool) -> None:
    # Issue 16.2: an output no stream's subjects match is refused for good, not retried.
    assert subjects.matches(pattern, subject) is matched
