"""SEC-7: the subject is the identity. ``subjects.names_node`` decides, for any ids the
encoding carries (the references' ``10.0.0.42/9100``, ``%``, ``+``, spaces, UTF-8), whether a
subject is one node's; the folds' codecs refuse a payload naming another node before it is
folded."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthplane.contracts import subjects, wire
from healthplane.runtime.fold import IdentityMismatch, Inbound, node_record
from tests.support.records import resource_report

ids = st.text(min_size=1, max_size=24)
T0 = datetime(2026, 12, 4, tzinfo=UTC)


@given(ids, ids, ids, ids)
def test_sec7_a_subject_names_exactly_its_own_node(cluster: str, node: str, other_cluster: str, other: str) -> None:
    for subject in (subjects.report(cluster, node), subjects.resource(cluster, node),
                    subjects.event(cluster, node, "CONDITION_RAISED"), subjects.allocation(cluster, node, "a-1")):
        assert subjects.names_node(subject, cluster, node)
        assert subjects.names_node(subject, other_cluster, other) is (other_cluster == cluster and other == node)


@pytest.mark.parametrize("node", ["10.0.0.42/9100", "n%41", "a+b", "with space", "gpü-1", "a=7E", "cn-042"])
def test_sec7_the_references_id_forms_and_escape_lookalikes(node: str) -> None:
    subject = subjects.report("lab", node)
    assert subjects.names_node(subject, "lab", node)
    # A node whose token spells another id's escape ("a~" is "a=7E") speaks only for itself.
    assert not subjects.names_node(subjects.report("lab", "a~"), "lab", "a=7E")
    assert not subjects.names_node(subject + "x", "lab", node)
    assert not subjects.names_node(subject, "lab", node + "x")


def test_sec7_a_codec_refuses_another_nodes_payload_naming_both() -> None:
    codec = node_record(wire.ResourceReport)
    data = wire.encode(resource_report("sim-003", cluster="lab"))
    own = Inbound("HP_RESOURCES", 1, subjects.resource("lab", "sim-003"), data, {}, T0, True)
    assert codec(own).node_id == "sim-003"
    forged = Inbound("HP_RESOURCES", 2, subjects.resource("lab", "sim-002"), data, {}, T0, True)
    with pytest.raises(IdentityMismatch, match=re.escape("hp.resource.lab.sim-002 carries a record of node 'sim-003'")):
        codec(forged)
