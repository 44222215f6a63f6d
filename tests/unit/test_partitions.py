"""HA-4, the pure parts of partitioning: which slots a partition owns, the filters that select
them in a stream as it stores records, the contract subject behind a stored one, which
replica owns which partition, and what the last layout had folded when P changes."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthplane.cli.main import _partitions
from healthplane.contracts import streams, subjects
from healthplane.runtime.lifecycle import owner
from healthplane.runtime.processor import Handoff

PARTITIONS = st.integers(min_value=1, max_value=streams.PARTITION_SLOTS)
NODE_IDS = st.text(min_size=1, max_size=20)


@given(PARTITIONS)
def test_ha4_every_slot_belongs_to_exactly_one_partition_and_shares_differ_by_one(partitions: int) -> None:
    owned = [slot for k in range(partitions) for slot in streams.slots_of(k, partitions)]
    assert sorted(owned) == list(range(streams.PARTITION_SLOTS))
    sizes = [len(streams.slots_of(k, partitions)) for k in range(partitions)]
    assert max(sizes) - min(sizes) <= 1
    assert all(slot % partitions == k for k in range(partitions) for slot in streams.slots_of(k, partitions))


def test_ha4_more_partitions_than_slots_is_refused() -> None:
    with pytest.raises(ValueError, match=r"P must be 1\.\.24"):
        streams.slots_of(0, 25)
    for bad in ("0", "25", "two"):
        with pytest.raises(argparse.ArgumentTypeError, match="a number of partitions from 1 to 24"):
            _partitions(bad)


def test_ha4_the_stream_appends_the_nodes_slot_to_the_contracts_subject() -> None:
    transform = streams.STREAMS_BY_NAME["HP_NODE_EVENTS"].slot_transform
    assert transform is not None
    assert transform.src == "hp.event.*.*.*"
    assert transform.dest == "hp.event.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}.{{partition(24,1,2)}}"
    assert streams.STREAMS_BY_NAME["HP_NODES"].slot_transform is None  # node list / show read it as ever
    assert streams.STREAMS_BY_NAME["HP_REPORTS"].config(1, slotted=False).subject_transform is None


def test_ha4_readers_filters_select_records_with_or_without_slots() -> None:
    assert streams.stored_filters("HP_NODE_EVENTS", ["hp.event.*.*.SCORE_CHANGED", "hp.event.c.n.>"]) == (
        "hp.event.*.*.SCORE_CHANGED", "hp.event.*.*.SCORE_CHANGED.*", "hp.event.c.n.>")
    assert streams.stored_filters("HP_NODES", ["hp.node.c.n"]) == ("hp.node.c.n",)  # no slots there
    assert streams.stored_filters("HP_ALLOCATIONS", ["hp.job.>"]) == ("hp.job.>",)


def test_ha4_a_partitions_filters_select_only_its_slots() -> None:
    assert streams.stored_filters("HP_ALLOCATIONS", ["hp.alloc.>"], streams.slots_of(1, 12)) == (
        "hp.alloc.*.*.*.1", "hp.alloc.*.*.*.13")
    assert streams.stored_filters("HP_ASSESSMENTS", [], streams.slots_of(5, 6)) == (
        "hp.assess.*.*.5", "hp.assess.*.*.11", "hp.assess.*.*.17", "hp.assess.*.*.23")
    assert streams.stored_filters("HP_CONFIG", [], streams.slots_of(0, 2)) == ()  # every partition reads it all
    with pytest.raises(ValueError, match=r"filter hp\.job\.> does not select node records"):
        streams.stored_filters("HP_ALLOCATIONS", ["hp.job.>"], [3])


@given(NODE_IDS, NODE_IDS, st.integers(min_value=0, max_value=23))
def test_ha4_the_contract_subject_behind_a_stored_one(cluster: str, node_id: str, slot: int) -> None:
    for published in (subjects.report(cluster, node_id), subjects.event(cluster, node_id, "SCORE_CHANGED"),
                      subjects.allocation(cluster, node_id, "j-1")):
        stored = f"{published}.{slot}"
        assert subjects.published(stored) == published
        assert subjects.parse(stored) == subjects.parse(published)
        assert subjects.published(published) == published
    view = subjects.node_view(cluster, node_id)
    assert subjects.published(view) == view  # a view has no slot: nothing to take off


def test_ha4_partition_labels_name_the_layout() -> None:
    assert subjects.partition_label(0) == "0"
    assert subjects.partition_label(2, 4) == "2of4"
    assert subjects.snapshot("scorer", 2, 4) == "hp.snapshot.scorer.2of4"


@given(st.lists(st.text(alphabet="abcdef", min_size=1, max_size=4), min_size=1, max_size=8, unique=True), PARTITIONS)
def test_ha4_every_partition_has_one_owner_and_the_shares_differ_by_one(members: list[str], partitions: int) -> None:
    live = sorted(members)
    owners = Counter(owner(k, live) for k in range(partitions))
    assert set(owners) <= set(live)
    shares = [owners.get(m, 0) for m in live]
    assert sum(shares) == partitions and max(shares) - min(shares) <= 1


def test_ha4_after_a_change_of_p_an_input_counts_as_folded_by_the_last_layouts_position_for_its_slot() -> None:
    # The last layout ran P = 2: partition 1 (odd slots) had folded HP_REPORTS up to 90,
    # partition 0 (even slots) up to 40; both had read the config up to 7 and 9.
    handoff = Handoff(2, {0: {"HP_REPORTS": 40, "HP_CONFIG": 7}, 1: {"HP_REPORTS": 90, "HP_CONFIG": 9}})
    assert handoff.folded("HP_REPORTS", 60, "hp.report.c.n.3")  # slot 3: partition 1, at 90
    assert not handoff.folded("HP_REPORTS", 60, "hp.report.c.n.4")  # slot 4: partition 0, at 40
    assert handoff.folded("HP_CONFIG", 7, "hp.config") and not handoff.folded("HP_CONFIG", 8, "hp.config")
    unpartitioned = Handoff(1, {0: {"HP_REPORTS": 50}})
    assert unpartitioned.folded("HP_REPORTS", 50, "hp.report.c.n.4") and not unpartitioned.folded(
        "HP_REPORTS", 51, "hp.report.c.n.4")
