"""ensure(): creates every stream and the nodes bucket, is idempotent, refuses conflicts."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig

from healthplane.contracts import streams
from healthplane.runtime import converge, lease

pytestmark = pytest.mark.nats


async def test_ensure_twice_is_a_no_op(nc) -> None:  # type: ignore[no-untyped-def]
    js = nc.jetstream()
    first = await converge.ensure(js)
    assert set(first.created) == {s.name for s in streams.STREAMS} | {"KV_substrate-nodes", "KV_healthplane-leases"}
    second = await converge.ensure(js)
    assert second.created == () and second.updated == ()
    info = await js.stream_info("HP_NODE_EVENTS")
    assert info.config.max_age == pytest.approx(90 * 86400)
    assert (await js.stream_info("HP_DIRECTIVES")).config.retention == RetentionPolicy.LIMITS


@pytest.mark.insecure  # the leases are a service's own keys (SEC-10); this plays two replicas
async def test_ha8_the_lease_ttl_is_the_buckets_and_stream_administration_sets_it(js: JetStreamContext) -> None:
    # HA-8: the leases bucket's TTL is the one number every holder and standby times by;
    # ensure() sets it in place, and leaves it alone when not told.
    assert await lease.ttl_in_force(js) == streams.LEASE_TTL_S
    assert "KV_healthplane-leases" in (await converge.ensure(js, lease_ttl_s=3.0)).updated
    assert await lease.ttl_in_force(js) == 3.0
    assert (await converge.ensure(js)).updated == ()
    assert await lease.ttl_in_force(js) == 3.0
    # The server expires a holder that stops renewing after the bucket's 3 s, not the default 10 s.
    holder = lease.Lease(js, "scorer", "a", ttl_s=3.0)
    standby = lease.Lease(js, "scorer", "b", ttl_s=3.0)
    assert await holder.attempt() and not await standby.attempt()
    started = time.monotonic()
    while not await standby.attempt():
        assert time.monotonic() - started < 6.0, "the lease outlived the bucket's TTL"
        await asyncio.sleep(0.2)
    assert 2.0 < time.monotonic() - started


async def test_updatable_drift_is_converged(js: JetStreamContext) -> None:
    drifted = streams.STREAMS_BY_NAME["HP_REPORTS"].config(1)
    drifted.max_msgs_per_subject = 5
    await js.update_stream(drifted)
    result = await converge.ensure(js)
    assert result.updated == ("HP_REPORTS",)
    assert (await js.stream_info("HP_REPORTS")).config.max_msgs_per_subject == 64


async def test_conflicting_stream_is_reported_by_name_and_field(nc) -> None:  # type: ignore[no-untyped-def]
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="HP_DIRECTIVES", subjects=["hp.directive.>"],
                                     retention=RetentionPolicy.WORK_QUEUE, storage=StorageType.FILE))
    with pytest.raises(converge.StreamConflict, match=r"HP_DIRECTIVES .*retention is workqueue, want limits"):
        await converge.ensure(js)
