"""Snapshots larger than a message: chunked, verified, and never damaged by a crash mid-write."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pytest
from nats.js import JetStreamContext

from healthplane.runtime import snapshots

pytestmark = pytest.mark.nats
NOW = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


async def test_large_state_round_trips_in_chunks(js: JetStreamContext) -> None:
    state = b'{"blob":"' + os.urandom(3 * 1024 * 1024).hex().encode() + b'"}'  # ~6 MiB, barely compressible
    manifest = await snapshots.save(js, service="big", partition=0, taken_at=NOW, positions={"S": 7},
                                    outputs={"O": 3}, state_json=state, previous_slot=None)
    assert manifest.chunks > 1
    loaded = await snapshots.load(js, "big", 0)
    assert loaded is not None and loaded[1] == state and loaded[0].positions == {"S": 7}


async def test_crash_while_writing_leaves_the_snapshot_in_force(js: JetStreamContext) -> None:
    first = await snapshots.save(js, service="s", partition=0, taken_at=NOW, positions={"S": 1}, outputs={},
                                 state_json=b'{"v":1}', previous_slot=None)
    # The next snapshot goes to the other slot; a crash after its chunks, before its manifest:
    await js.publish(snapshots.chunk_subject("s", 0, 1 - first.slot, 0), b"partial", headers={
        snapshots.DIGEST_HEADER: "other"})
    loaded = await snapshots.load(js, "s", 0)
    assert loaded is not None and loaded[1] == b'{"v":1}'


async def test_mismatched_chunk_is_reported_not_used(js: JetStreamContext) -> None:
    first = await snapshots.save(js, service="t", partition=0, taken_at=NOW, positions={}, outputs={},
                                 state_json=b'{"v":1}', previous_slot=None)
    await js.publish(snapshots.chunk_subject("t", 0, first.slot, 0), b"junk", headers={snapshots.DIGEST_HEADER: "x"})
    with pytest.raises(snapshots.SnapshotDamaged, match="belongs to another snapshot"):
        await snapshots.load(js, "t", 0)
