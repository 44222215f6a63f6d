"""HA-8: a standby takes a dead holder's lease well inside the TTL, and never a live one's.

The holder is a real process (``python -c``, its own connection with the scorer's
credentials), so its death is the kernel closing its socket, as in production; the TTL is the
default 10 s, so a takeover within a few seconds can only be the presence check's."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError

from healthplane.contracts import streams
from healthplane.runtime import converge
from healthplane.runtime.connect import connect
from healthplane.runtime.lease import ABSENT_FOR_S, Lease
from healthplane.stack.natsserver import NatsCluster, NatsServer
from tests.support.secure import creds_for, env_for

pytestmark = pytest.mark.nats

# A holder as its own process: holds the scorer's lease with presence, as runtime.lifecycle does.
HOLDER = """
import asyncio, os, sys
from healthplane.runtime.connect import connect
from healthplane.runtime.lease import Lease

async def main():
    nc = await connect(os.environ["HEALTHPLANE_NATS_URL"], name="holder",
                       creds=os.environ.get("HEALTHPLANE_NATS_CREDS"), give_up_after=10)
    lease = Lease(nc.jetstream(timeout=2), "scorer", "holder", ttl_s=float(sys.argv[1]), nc=nc)
    while not await lease.attempt():
        await asyncio.sleep(0.2)
    print("holding", flush=True)
    await lease.run(asyncio.Event())

asyncio.run(main())
"""


@contextmanager
def _holder(server: NatsServer, ttl_s: float) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(ttl_s)], env=env_for(server, "scorer"),
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "holding"
        yield process
    finally:
        process.kill()
        process.wait()


async def _holder_name(js: JetStreamContext) -> str | None:
    try:
        entry = await (await js.key_value(streams.LEASES_BUCKET)).get("scorer")
    except KeyNotFoundError:
        return None
    return entry.value.decode() if entry.value else None


async def _standby_takes(standby: Lease, within_s: float) -> float | None:
    """Seconds until ``standby`` holds the lease, trying every 0.5 s as ``Lease.run`` does;
    ``None`` when it did not within ``within_s``."""
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        if await standby.attempt():
            return time.monotonic() - started
        await asyncio.sleep(0.5)
    return None


async def test_ha8_a_killed_holders_lease_is_taken_within_seconds_not_the_ttl(
        nats_server: NatsServer, js: JetStreamContext) -> None:
    ttl_s = (await js.stream_info(f"KV_{streams.LEASES_BUCKET}")).config.max_age
    assert ttl_s == streams.LEASE_TTL_S == 10.0
    nc = await connect(nats_server.url, name="standby", creds=creds_for(nats_server, "scorer"), give_up_after=5)
    try:
        standby = Lease(nc.jetstream(timeout=2), "scorer", "standby", ttl_s=ttl_s, nc=nc)
        with _holder(nats_server, ttl_s) as holder:
            # Alive: asked every round for longer than the absence it takes, it keeps its lease.
            assert await _standby_takes(standby, within_s=ABSENT_FOR_S + 2.0) is None
            assert await _holder_name(js) == "holder"
            holder.send_signal(signal.SIGKILL)
            holder.wait()
            taken_s = await _standby_takes(standby, within_s=ttl_s + 5)
        print(f"HA-8: the standby took the lease {taken_s} s after kill -9 of its holder (TTL {ttl_s:g} s)")
        assert taken_s is not None and taken_s < ttl_s / 2, f"taken after {taken_s} s: the TTL's doing, not presence"
        assert await _holder_name(js) == "standby" and standby.fence() is not None
        await standby.release()
    finally:
        await nc.close()


async def test_ha8_a_stopped_holder_keeps_its_lease_until_the_ttl(nats_server: NatsServer, js: JetStreamContext) -> None:
    # A holder that does not answer (SIGSTOP: a GC pause, a host too busy to schedule it) still
    # has its connection: its silence proves nothing, and only the TTL ends its lease.
    ttl_s = (await js.stream_info(f"KV_{streams.LEASES_BUCKET}")).config.max_age
    nc = await connect(nats_server.url, name="standby", creds=creds_for(nats_server, "scorer"), give_up_after=5)
    try:
        standby = Lease(nc.jetstream(timeout=2), "scorer", "standby", ttl_s=ttl_s, nc=nc)
        with _holder(nats_server, ttl_s) as holder:
            holder.send_signal(signal.SIGSTOP)
            stopped_at = time.monotonic()
            taken_s = await _standby_takes(standby, within_s=ttl_s + 5)
            assert taken_s is not None
            since_stop_s = time.monotonic() - stopped_at
            holder.send_signal(signal.SIGCONT)
        # Its last renewal came up to a third of the TTL before the stop.
        assert since_stop_s > ttl_s * 2 / 3 - 1.0, f"a stopped holder's lease taken {since_stop_s:.1f} s after the stop"
        await standby.release()
    finally:
        await nc.close()


async def test_ha8_sec1_no_other_identity_can_answer_for_a_holder_or_ask_after_it(
        nats_server: NatsServer, js: JetStreamContext) -> None:
    # Another service answering on the scorer's presence subject would keep a dead holder's
    # lease from its standby forever; the server refuses it the subscription (and the asking).
    subject = streams.lease_presence_subject("scorer")
    policy = await connect(nats_server.url, name="policy", creds=creds_for(nats_server, "policy"), give_up_after=5)
    scorer = await connect(nats_server.url, name="scorer", creds=creds_for(nats_server, "scorer"), give_up_after=5)
    try:
        async def answer(msg: Msg) -> None:
            await msg.respond(b"alive")

        await policy.subscribe(subject, cb=answer)
        await policy.flush(timeout=5)
        await asyncio.sleep(0.5)
        assert "permissions violation for subscription" in str(policy.last_error).lower()
        # Nobody holds the lease, and the policy's answer never reaches the scorer's question.
        with pytest.raises(Exception, match=r"(?i)no responders"):
            await scorer.request(subject, b"", timeout=2)
        with pytest.raises(Exception, match=r"(?i)permissions violation|timeout"):
            await policy.request(subject, b"", timeout=1)
    finally:
        await policy.close()
        await scorer.close()


async def test_ha8_a_holder_whose_server_is_killed_keeps_its_lease(cluster: NatsCluster) -> None:
    # A server lost under a holder (kill -9 of the nats-server it is connected to) is not its
    # death: it reconnects to another server and answers again sooner than a standby takes
    # the lease (ABSENT_FOR_S), and its next renewal after the leases bucket's election (when
    # that server led it) keeps the lease. A takeover here would restart every service whose
    # holder was on that server from its snapshot.
    admin = await connect(cluster.url, name="maintainer", creds=creds_for(cluster, "maintainer", "test"),
                          give_up_after=10)
    holder_nc = await connect(cluster.url, name="holder", creds=creds_for(cluster, "scorer"), give_up_after=10)
    running: asyncio.Task[None] | None = None
    stop = asyncio.Event()
    try:
        await converge.ensure(admin.jetstream(), servers=3)
        victim = next(s for s in cluster.servers if s.url.endswith(f":{holder_nc.connected_url.port}"))
        standby_nc = await connect(next(s for s in cluster.servers if s is not victim).url, name="standby",
                                   creds=creds_for(cluster, "scorer"), give_up_after=10)
        holder = Lease(holder_nc.jetstream(timeout=2), "scorer", "holder", nc=holder_nc, rides_out=True)
        standby = Lease(standby_nc.jetstream(timeout=2), "scorer", "standby", nc=standby_nc)
        assert await holder.attempt()
        running = asyncio.create_task(holder.run(stop))
        victim.kill()
        assert await _standby_takes(standby, within_s=streams.LEASE_TTL_S + 5) is None
        assert holder.fence() is not None, "the holder never renewed after its server was lost"
        await standby_nc.close()
    finally:
        stop.set()
        if running is not None:
            await running
        await holder_nc.close()
        await admin.close()
