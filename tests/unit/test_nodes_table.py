"""UI-3: the nodes table's pure core (``healthplane_api.fold``): server-side filters, keyset
paging with an exact count, and how many rows a live re-read would move."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthplane.contracts import views
from healthplane_api import fold, pages

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
CONDITIONS = ["gpu_xid_errors", "gpu_ecc_errors", "memory_errors", "disk_degraded"]


def _row(node_id: str, cluster: str = "a", *, status: str = "READY", health: str = "HEALTHY",
         score: int | None = 100, jobs: int = 0, conditions: tuple[str, ...] = (),
         holds: tuple[str, ...] = (), domains: dict[str, str] | None = None) -> views.ListRow:
    return views.ListRow(node_id=node_id, cluster=cluster, hostname=f"host-{node_id}", status=status, health=health,
                         score=score, jobs=jobs,
                         conditions=[views.ConditionRow(type=c, severity="critical") for c in conditions],
                         holds=[views.HoldRow(effect=h, actor="alice") for h in holds],
                         last_reported_at=NOW, report_interval_seconds=30, domains=domains or {})


rows = st.builds(
    _row, node_id=st.from_regex(r"n[0-9]{1,3}", fullmatch=True), cluster=st.sampled_from(["a", "b", "c"]),
    status=st.sampled_from(["READY", "CORDONED", "OFFLINE", "NOT_READY"]),
    health=st.sampled_from(["HEALTHY", "DEGRADED", "UNKNOWN"]), score=st.none() | st.integers(0, 100),
    jobs=st.integers(0, 3), conditions=st.lists(st.sampled_from(CONDITIONS), max_size=2, unique=True).map(tuple),
    holds=st.lists(st.sampled_from(["cordon", "evict", "deprovision"]), max_size=2).map(tuple),
    domains=st.sampled_from([{}, {"rack": "r1"}, {"rack": "r2"}, {"rack": "r1", "power": "p1"}]))

queries = st.fixed_dictionaries({}, optional={
    "cluster": st.sampled_from(["a", "b"]),
    "status": st.lists(st.sampled_from(["READY", "CORDONED", "OFFLINE"]), max_size=2),
    "health": st.lists(st.sampled_from(["HEALTHY", "DEGRADED", "UNKNOWN"]), max_size=2),
    "condition": st.lists(st.sampled_from(CONDITIONS), max_size=2),
    "hold": st.lists(st.sampled_from(["cordon", "evict", "any", "none"]), max_size=2),
    "domain": st.sampled_from([["rack=r1"], ["rack=r1", "power=p1"]]),
    "text": st.sampled_from(["n1", "HOST-n2", "xid"]),
    "score_min": st.integers(0, 100),
    "score_max": st.integers(0, 100),
})
sorts = st.sampled_from([f"{sign}{name}" for name in fold.SORTS for sign in ("", "-")])


def _index(found: list[views.ListRow]) -> fold.ViewIndex:
    index = fold.ViewIndex()
    for row in found:
        index.apply(msgspec.json.encode(row))
    return index


def _key(row: views.ListRow) -> tuple[str, str]:
    return row.cluster, row.node_id


@settings(max_examples=300)
@given(initial=st.lists(rows, max_size=40, unique_by=_key), query=queries, sort=sorts, size=st.integers(1, 7),
       data=st.data())
def test_ui3_paging_while_rows_come_and_go_shows_every_row_present_throughout_exactly_once(
        initial: list[views.ListRow], query: dict[str, object], sort: str, size: int, data: st.DataObject) -> None:
    """UI-3: between any two page reads nodes join and leave; a node that matched throughout
    is on exactly one page, no node is on two, and every page's total is the exact count."""
    index = _index(initial)
    matches = fold.Filter.of(**query).matcher()  # type: ignore[arg-type]
    present_throughout = {_key(r) for r in initial}
    seen: list[tuple[str, str]] = []
    ever_joined: set[tuple[str, str]] = set()  # a node that left is not back under the same id
    token = None
    for _ in range(200):
        page = index.page(sort=sort, page_size=size, token=token, **query)  # type: ignore[arg-type]
        assert len(page.rows) <= size
        assert page.total == sum(1 for r in index.rows.values() if matches(r))
        assert all(matches(r) for r in page.rows)
        seen += [_key(r) for r in page.rows]
        token = page.next_page_token
        if token is None:
            break
        # Meanwhile: new nodes join, some leave (decommissioned).
        for row in data.draw(st.lists(rows, max_size=3), label="joined"):
            joined = msgspec.structs.replace(row, node_id=f"new-{row.node_id}")
            # A join only: the same new id drawn again would be a change of a row already
            # shown, which may move it past the page read (found once in a full run).
            if fold.key_of(joined.cluster, joined.node_id) not in index.rows and _key(joined) not in ever_joined:
                ever_joined.add(_key(joined))
                index.apply(msgspec.json.encode(joined))
        for key in data.draw(st.lists(st.sampled_from(sorted(index.rows) or [""]), max_size=2), label="left"):
            if key in index.rows:
                gone = index.rows[key]
                index.remove(gone.cluster, gone.node_id, NOW)
                present_throughout.discard(_key(gone))
    assert len(seen) == len(set(seen)), "a node was on two pages"
    expected = {_key(r) for r in initial if _key(r) in present_throughout and matches(r)}
    assert expected <= set(seen), f"never shown: {sorted(expected - set(seen))}"


@given(found=st.lists(rows, max_size=40, unique_by=_key), query=queries, sort=sorts, size=st.integers(1, 7))
def test_ui3_pages_forward_are_the_whole_sorted_list_and_back_retraces_them(
        found: list[views.ListRow], query: dict[str, object], sort: str, size: int) -> None:
    """UI-3: with nothing changing, the pages in order are the whole sorted list; each page's
    `before` counts the rows ahead of it, and its previous token gives the page before."""
    index = _index(found)
    whole = index.page(sort=sort, page_size=None, **query)  # type: ignore[arg-type]
    pages: list[fold.Page] = []
    token = None
    while True:
        page = index.page(sort=sort, page_size=size, token=token, **query)  # type: ignore[arg-type]
        pages.append(page)
        token = page.next_page_token
        if token is None:
            break
    assert [r for p in pages for r in p.rows] == whole.rows
    assert [p.before for p in pages] == [i * size for i in range(len(pages))]
    for earlier, later in itertools.pairwise(pages):
        assert later.prev_page_token is not None
        back = index.page(sort=sort, page_size=size, token=later.prev_page_token, **query)  # type: ignore[arg-type]
        assert back.rows == earlier.rows and back.before == earlier.before
    assert pages[0].prev_page_token is None


def test_ui3_filters_by_condition_hold_domain_score_and_text_in_any_case() -> None:
    index = _index([
        _row("n1", conditions=("gpu_xid_errors",), score=55, health="DEGRADED", holds=("cordon",)),
        _row("n2", conditions=("gpu_ecc_errors",), score=40, health="DEGRADED", domains={"rack": "r1"}),
        _row("n3", cluster="b", score=100, holds=("evict", "cordon")),
        _row("n4", score=None, health="UNKNOWN", status="OFFLINE"),
    ])

    def listed(**query: object) -> list[str]:
        return [r.node_id for r in index.page(sort="node", page_size=None, **query).rows]  # type: ignore[arg-type]

    assert listed(condition=["gpu_xid_errors"]) == ["n1"]
    assert listed(condition=["GPU_XID_ERRORS", "gpu_ecc_errors"]) == ["n1", "n2"]  # any of them
    assert listed(hold=["cordon"]) == ["n1", "n3"] and listed(hold=["evict"]) == ["n3"]
    assert listed(hold=["none"]) == ["n2", "n4"] and listed(hold=["any"]) == ["n1", "n3"]
    assert listed(domain=["rack=r1"]) == ["n2"]
    assert listed(score_max=59) == ["n1", "n2"] and listed(score_min=50, score_max=60) == ["n1"]
    assert listed(status=["offline"], health=["unknown"]) == ["n4"]
    assert listed(text="XID") == ["n1"] and listed(text="host-n3") == ["n3"]
    assert listed(cluster="b", hold=["cordon"]) == ["n3"]
    for query, said in [({"condition": ["gpu_on_fire"]}, "condition 'gpu_on_fire': one of memory_errors"),
                        ({"hold": ["drain"]}, "hold 'drain': one of cordon, evict, deprovision, any, none"),
                        ({"status": ["up"]}, "status 'UP': one of READY, CORDONED, NOT_READY, OFFLINE"),
                        ({"score_min": 101}, "scoreMin 101: a score from 0 to 100"),
                        ({"domain": ["rack"]}, "rack")]:
        with pytest.raises(fold.PageError, match=said):
            index.page(**query)  # type: ignore[arg-type]


def test_ui3_a_token_is_bound_to_its_sort_and_a_forged_one_is_one_clear_line() -> None:
    index = _index([_row(f"n{i}") for i in range(5)])
    token = index.page(sort="score", page_size=2).next_page_token
    assert token is not None
    with pytest.raises(fold.PageError, match="pageToken is for sort 'score', not '-score'"):
        index.page(sort="-score", token=token)
    for forged in ["bogus", "b2ZmOjEw", fold._token("after", "score", ("n1", "a"))]:  # the old offset form too
        with pytest.raises(fold.PageError, match="is not a token this API gave"):
            index.page(sort="score", token=forged)


def test_ui3_a_hundred_thousand_nodes_filter_sort_and_page_correctly() -> None:
    """UI-3 at 100,000 nodes: the exact count, the first page, a page deep in the list and
    the last one agree with a plain sort of everything (correctness; the cost is one pass)."""
    shuffle = random.Random(3)
    found = [_row(f"gpu-{i:06d}", cluster=f"c{i % 4}", score=None if i % 97 == 0 else shuffle.randint(0, 100),
                  health=["HEALTHY", "DEGRADED", "UNKNOWN"][i % 3], conditions=("gpu_xid_errors",) if i % 11 == 0 else ())
             for i in range(100_000)]
    index = fold.ViewIndex({fold.key_of(r.cluster, r.node_id): r for r in found})
    expected = sorted((r for r in found if r.health != "HEALTHY" and r.conditions),
                      key=lambda r: (r.score is None, r.score or 0, r.cluster, r.node_id))
    query = {"health": ["DEGRADED", "UNKNOWN"], "condition": ["gpu_xid_errors"], "sort": "score", "page_size": 500}
    first = index.page(**query)  # type: ignore[arg-type]
    assert first.total == len(expected) > 5000 and first.rows == expected[:500]
    page, pages = first, 1
    while page.next_page_token is not None:
        page = index.page(token=page.next_page_token, **query)  # type: ignore[arg-type]
        assert page.rows == expected[page.before:page.before + 500]
        pages += 1
    assert pages == -(-len(expected) // 500) and page.rows == expected[(pages - 1) * 500:]
    everyone = index.page(sort="-node", page_size=100)
    assert everyone.total == 100_000 and [r.node_id for r in everyone.rows][:2] == ["gpu-099999", "gpu-099995"]


@pytest.mark.parametrize(("shown", "fresh", "changed"), [
    (["a", "b", "c"], ["a", "b", "c"], 0),
    (["a", "b", "c"], ["a", "c", "b"], 1),  # one row moved
    (["a", "b", "c"], ["x", "a", "b"], 2),  # one came in at the top, one fell off the end
    (["a", "b", "c"], ["c", "b", "a"], 2),
    ([], ["a"], 1),
    (["a"], [], 1),
])
def test_ui3_a_live_re_read_counts_the_rows_it_would_add_drop_or_move(shown: list[str], fresh: list[str],
                                                                      changed: int) -> None:
    assert fold.page_changes(shown, fresh) == changed


def test_ui3_a_decommissioned_node_leaves_the_page_count_at_once() -> None:
    index = _index([_row("n1"), _row("n2")])
    assert index.page().total == 2
    index.remove("a", "n1", NOW + timedelta(seconds=1))
    assert [r.node_id for r in index.page().rows] == ["n2"] and index.page().total == 1


@given(st.text(min_size=1, max_size=30), st.text(min_size=1, max_size=30))
def test_ui3_a_row_key_names_its_cluster_and_node_whatever_they_hold(cluster: str, node_id: str) -> None:
    """UI-3: the key a row carries in the page (and a bulk checkbox sends) gives back its node."""
    assert pages.parse_row_key(pages.row_key(cluster, node_id)) == (cluster, node_id)


@pytest.mark.parametrize(("verb", "active", "asked"), [
    ("cordon", False, "Cordon 3 node(s): stop new work reaching them?"),
    ("drain", False, "Drain 3 node(s): cordon them and let their running work finish?"),
    ("drain", True, "Drain 3 node(s): cordon them and requeue their running work now?"),
    ("uncordon", False, "Uncordon 3 node(s): release their cordon holds?"),
    ("validate", False, "Validate 3 node(s): run the diagnostic suite on each, as a job?"),
])
def test_ui3_a_bulk_command_asks_with_its_verb_and_how_many_nodes(verb: str, active: bool, asked: str) -> None:
    assert pages.bulk_question(verb, 3, active) == asked


def test_ui3_a_bulk_commands_summary_counts_each_outcome() -> None:
    outcomes = [{"result": "applied"}, {"result": "applied"}, {"result": "refused"}, {"result": "pending"}]
    assert pages.bulk_summary("drain", outcomes, active=True) == "drain --active 4 node(s): 2 applied, 1 refused, 1 pending"
