"""FED-1, FED-2: the pure parts of ``healthplane.client.federation`` — names, the stream and consumer
each side keeps, what the hub knows of a member, and the listing it shows."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthplane.client import federation, reads
from healthplane.contracts import permissions, subjects, views, wire
from healthplane.stack.natsserver import Federation, NatsCluster

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def _view(node: str, cluster: str, health: str = "HEALTHY", score: int | None = 100) -> bytes:
    return json.dumps({"nodeId": node, "cluster": cluster, "hostname": node, "status": "READY", "health": health,
                       "score": score, "jobs": 0, "lastReportedAt": (NOW - timedelta(seconds=5)).isoformat(),
                       "reportIntervalSeconds": 30}).encode()


def _listing(*payloads: bytes) -> reads.Listing:
    return reads.Listing(list(payloads), [views.decode_row(p) for p in payloads])


@pytest.mark.parametrize("name", ["a", "gpu-east_2", "0" * 32])
def test_fed1_member_names_that_are_a_domain_and_a_stream_name(name: str) -> None:
    assert federation.check_member_name(name) == name
    assert federation.aggregate_stream(name) == f"HP_FED_{name}"


@pytest.mark.parametrize("name", ["", "A", "a.b", "a b", "-a", "x" * 33, "hub", "a>", "a*"])
def test_fed1_names_a_federation_cannot_hold_are_refused_in_one_line(name: str) -> None:
    with pytest.raises(federation.FederationError) as refused:
        federation.check_member_name(name)
    assert "\n" not in str(refused.value) and repr(name) in str(refused.value)


def test_fed1_the_hub_sources_only_the_members_own_views_through_the_consumer_the_member_made() -> None:
    aggregate = federation.aggregate_config("a")
    [source] = aggregate["sources"]
    assert source["external"]["api"] == "$JS.a.API"
    assert source["consumer"] == {"name": permissions.HUB_CONSUMER, "deliver_subject": permissions.deliver_subject("a")}
    assert aggregate["subjects"] == [] and aggregate["max_msgs_per_subject"] == 1
    consumer = federation.hub_consumer_config("a")
    assert consumer["filter_subject"] == subjects.node_views("a")
    assert consumer["deliver_subject"] == permissions.deliver_subject("a")
    assert consumer["deliver_policy"] == "last_per_subject" and consumer["max_deliver"] == -1


def test_fed2_what_the_hub_knows_of_a_member_from_its_stream_info() -> None:
    info = {"config": {"name": "HP_FED_a"}, "sources": [{"name": "HP_NODES", "lag": 3, "active": 2_500_000_000}]}
    member = federation.member_of(info, NOW)
    assert member == federation.Member("a", NOW - timedelta(seconds=2.5), 3)
    assert member.reachable(NOW) and member.data_age_s(NOW) == 2.5
    never = federation.member_of({"config": {"name": "HP_FED_b"}, "sources": [{"active": -1}]}, NOW)
    assert never is not None and never.last_heard_at is None and not never.reachable(NOW)
    assert never.why_no_health() == "cluster b has not connected to the hub yet"
    assert federation.member_of({"config": {"name": "HP_NODES"}}, NOW) is None
    failing = federation.member_of({"config": {"name": "HP_FED_c"},
                                    "sources": [{"active": 1, "error": {"description": "no responders"}}]}, NOW)
    assert failing is not None and failing.error == "no responders"


@given(silent_ms=st.integers(min_value=0, max_value=3_600_000), threshold_ms=st.integers(min_value=1, max_value=600_000))
def test_fed2_a_member_is_reachable_exactly_while_it_was_heard_within_the_threshold(silent_ms: int,
                                                                                   threshold_ms: int) -> None:
    member = federation.Member("a", NOW - timedelta(milliseconds=silent_ms), 0)
    assert member.reachable(NOW, threshold_ms / 1000) == (silent_ms <= threshold_ms)
    assert member.data_age_s(NOW) == silent_ms / 1000
    if silent_ms > threshold_ms:
        assert member.why_no_health().startswith("cluster a unreachable since ")


def test_fed2_the_threshold_comes_from_the_environment_or_is_refused_in_one_line() -> None:
    assert federation.unreachable_after_s({}) == federation.UNREACHABLE_AFTER_S
    assert federation.unreachable_after_s({federation.UNREACHABLE_ENV: "4.5"}) == 4.5
    for bad in ("0", "-1", "soon", "nan"):
        with pytest.raises(federation.FederationError, match=federation.UNREACHABLE_ENV):
            federation.unreachable_after_s({federation.UNREACHABLE_ENV: bad})


def _found(reachable_b: bool) -> federation.FederatedListing:
    a = federation.Member("a", NOW - timedelta(seconds=1), 0)
    b = federation.Member("b", NOW - timedelta(seconds=1 if reachable_b else 60), 0)
    listings = {"a": _listing(_view("n2", "a"), _view("n1", "a", "DEGRADED", 40)),
                "b": _listing(_view("n1", "b", "DEGRADED", 55))}
    return federation.FederatedListing([a, b], listings, NOW, 10.0)


def test_fed1_a_reachable_members_nodes_are_its_own_views_byte_for_byte_in_node_order() -> None:
    found = _found(reachable_b=True)
    shown = json.loads(found.json())
    assert [(r["cluster"], r["nodeId"]) for r in shown] == [("a", "n1"), ("a", "n2"), ("b", "n1")]
    assert found.json() == b"[" + b",".join([_view("n1", "a", "DEGRADED", 40), _view("n2", "a"),
                                            _view("n1", "b", "DEGRADED", 55)]) + b"]"
    assert found.notes() == []


def test_fed2_an_unreachable_members_nodes_show_no_health_never_their_last_answer() -> None:
    found = _found(reachable_b=False)
    rows = {(r["cluster"], r["nodeId"]): r for r in json.loads(found.json())}
    assert rows[("a", "n1")]["score"] == 40  # a is untouched
    lost = rows[("b", "n1")]
    assert (lost["status"], lost["health"], lost["score"]) == ("UNKNOWN", "UNKNOWN", None)
    assert lost["unreachable"] == f"cluster b unreachable since {wire.rfc3339(NOW - timedelta(seconds=60))}"
    assert [(r.cluster, r.health, r.score) for r in found.rows()][-1] == ("b", "UNKNOWN", None)
    assert found.notes() == [f"{lost['unreachable']}; its nodes show no health"]
    summary = {c["cluster"]: c for c in federation.summary(found)["clusters"]}
    assert summary["a"]["label"] == "1 degraded, worst 40" and summary["a"]["reachable"]
    assert summary["b"] | {"health": None} == summary["b"] | {
        "cluster": "b", "readable": False, "reachable": False, "nodes": 1, "worstScore": None,
        "label": f"No health: {lost['unreachable']}", "health": None}


def test_fed1_a_member_attached_with_no_node_yet_has_its_row() -> None:
    found = federation.FederatedListing([federation.Member("c", None, 0)], {"c": _listing()}, NOW)
    [row] = federation.summary(found)["clusters"]
    assert row["label"] == "No health: cluster c has not connected to the hub yet" and row["nodes"] == 0
    assert msgspec.json.decode(found.json()) == []


def test_fed1_ha1_a_hub_cluster_listens_for_leafs_on_every_server_in_its_own_named_cluster(tmp_path: Path) -> None:
    """FED-1 on HA-1 (issue 46.6): each server of a three-server hub has its own leaf port and
    domain ``hub``; the cluster and its servers are named for the domain, so a member cluster
    (``healthplane-a``, never the hub's name: nats-server refuses a leaf from a cluster of its
    own name) and its servers are told apart from the hub's."""
    hub = NatsCluster(tmp_path / "hub", 3, federation=Federation(federation.HUB_DOMAIN, leaf_port=0),
                      leaf_ports=[7422, 7423, 7424])
    assert [s.name for s in hub.servers] == ["hub-0", "hub-1", "hub-2"]
    assert {s.routes.cluster for s in hub.servers if s.routes} == {"healthplane-hub"}
    assert [s.leaf_url for s in hub.servers] == [f"nats-leaf://127.0.0.1:{p}" for p in (7422, 7423, 7424)]
    assert all(s.federation and s.federation.domain == "hub" and s.federation.hub_url is None for s in hub.servers)
    free = NatsCluster(tmp_path / "free", 3, federation=Federation(federation.HUB_DOMAIN, leaf_port=0))
    assert len({s.leaf_url for s in free.servers}) == 3
    assert [s.name for s in NatsCluster(tmp_path / "plain", 3).servers] == ["hp-0", "hp-1", "hp-2"]


def test_fed1_ha1_every_server_of_a_member_cluster_has_the_remote_to_every_hub_url_and_the_guard() -> None:
    """FED-1 on HA-1: a member's each server connects a leaf to the hub, listing all the hub's
    URLs (nats-server picks one, the next when it is lost), with the member's own guard."""
    urls = "nats-leaf://h:7422, nats-leaf://h:7423,nats-leaf://h:7424"
    member = Federation("a", hub_url=urls)
    assert member.hub_urls == ["nats-leaf://h:7422", "nats-leaf://h:7423", "nats-leaf://h:7424"]
    text = member.leafnodes_config("127.0.0.1", "ACCOUNT")
    assert 'urls: ["nats-leaf://h:7422", "nats-leaf://h:7423", "nats-leaf://h:7424"]' in text
    assert "account: ACCOUNT" in text and '"$JS.a.API.STREAM.>"' in text and "listen" not in text
    cluster = NatsCluster("/nonexistent", 3, federation=member)
    assert [s.federation for s in cluster.servers] == [member] * 3
    assert [s.name for s in cluster.servers] == ["a-0", "a-1", "a-2"]
    assert all(s.leaf_url is None for s in cluster.servers)
