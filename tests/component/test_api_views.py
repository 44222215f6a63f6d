"""API-1 (issue 44): a page of ``GET /api/v1/nodes`` reads its views in one multi-subject
direct get (``replay.read_last``), where it made a get per view (a page of 1,000 took 12.1 s at
100,000 nodes under the pipeline, every get queueing behind the reports). On a real
nats-server: the page's order kept, a node without a view left out, more nodes than one answer
carries read in more requests, and filters that match more than that asked in halves."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from nats.js import JetStreamContext

from healthplane.client import reads
from healthplane.contracts import subjects
from healthplane.runtime import replay

pytestmark = pytest.mark.nats


async def _views(js: JetStreamContext, cluster: str, count: int) -> None:
    acks = await asyncio.gather(*(js.publish_async(subjects.node_view(cluster, f"n{i:04d}"),
                                                   b'{"nodeId":"n%04d","cluster":"%s"}' % (i, cluster.encode()))
                                  for i in range(count)))
    await asyncio.gather(*acks)


async def test_api1_a_page_of_views_in_the_pages_order_without_the_nodes_that_have_none(js: JetStreamContext) -> None:
    await _views(js, "lab", 3)
    await js.publish(subjects.node_view("lab", "n0001"), b'{"nodeId":"n0001","cluster":"lab","v":2}')
    found = await reads.latest_views(js, [("lab", "n0002"), ("lab", "gone"), ("lab", "n0001"), ("lab", "n0000")])
    assert found == [b'{"nodeId":"n0002","cluster":"lab"}', b'{"nodeId":"n0001","cluster":"lab","v":2}',
                     b'{"nodeId":"n0000","cluster":"lab"}']
    assert await reads.latest_views(js, []) == []


async def test_api1_more_views_than_one_answer_carries_are_all_read(js: JetStreamContext) -> None:
    count = replay.MULTI_LAST_MAX + 100
    await _views(js, "lab", count)
    wanted = [("lab", f"n{i:04d}") for i in reversed(range(count))]
    found = await reads.latest_views(js, wanted)
    assert [msgspec.json.decode(p)["nodeId"] for p in found] == [node for _, node in wanted]


async def test_api1_filters_matching_more_than_one_answer_are_asked_in_halves(js: JetStreamContext) -> None:
    await _views(js, "a", 600)
    await _views(js, "b", 600)
    both = await replay.read_last(js, "HP_NODES", [subjects.node_views("a"), subjects.node_views("b")])
    assert len(both) == 1200 and [m.seq for m in both] == sorted(m.seq for m in both)
    await _views(js, "c", replay.MULTI_LAST_MAX + 1)
    with pytest.raises(replay.TooManyResults):  # one filter cannot be halved: a reader asks for less
        await replay.read_last(js, "HP_NODES", [subjects.node_views("c")])
