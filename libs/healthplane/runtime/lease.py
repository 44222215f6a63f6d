"""Leader election among replicas: a lease in the ``healthplane-leases`` KV bucket.

The bucket's TTL expires a lease whose holder stopped renewing; renewal is a compare-and-set
on the revision the holder last wrote, so two replicas never both *renew* it. That alone
does not stop two from *writing*: a holder learns it lost the lease only at its next attempt,
and one whose event loop stalled (a GC pause, a slow disk, SIGSTOP) wakes up past the TTL,
after a standby has taken over, still believing it leads.

So the lease is also a **fence** (:meth:`Lease.fence`): a writer asks before each write, and
the answer is the revision only while the last successful renewal, timed on the monotonic
clock from *before* its request was sent, is younger than the TTL minus a margin. The key
cannot have expired on the server before that (it lives TTL from its write, which came
after the request was sent), so a holder that gets a revision is still the holder. Writers
stamp it on their outputs (``Hp-Lease-Rev``); a new holder's revision is always higher (the
bucket's sequence), and readers that fold those outputs pass over a lower revision after a
higher one, which covers the last window: a write queued in the client before the stall.

A dead holder is also seen sooner than its TTL (HA-8). While it holds, a holder subscribes to
its lease's presence subject (``streams.lease_presence_subject``) and answers there; a standby
that finds the key held by another asks there each round. nats-server answers *no responders*
at once when no connection in the cluster subscribes: the holder's process is gone (kill -9
closes its socket, and the server drops its subscriptions with it), or its connection is. Once
that has been the answer for ``ABSENT_FOR_S`` without a break, the standby takes the key with
a compare-and-set on the revision it read, so a holder that reconnected and renewed meanwhile
keeps it. A holder that is slow to answer (a GC pause, a busy host, SIGSTOP) still has its
subscription: its silence is a timeout, not an absence, and only the TTL ends its lease. A
takeover this way is as safe as one at the TTL: the new holder's revision is higher, it marks
the streams it writes (runtime.fencing), and the server refuses the old holder's writes from
then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from nats import errors as nats_errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from healthplane.contracts.streams import LEASE_TTL_S as TTL_S
from healthplane.contracts.streams import LEASES_BUCKET as BUCKET
from healthplane.contracts.streams import lease_presence_subject

HEADER = "Hp-Lease-Rev"
RETRY_S = 0.5
# How long one round waits for the bucket (give Lease a JetStreamContext with this timeout):
# a renewal answers in milliseconds, and one sent while the bucket's raft group elects a
# leader gets no answer at all; with nats-py's 5 s default, the round in flight when the
# election ended held the fence closed up to 5 s longer (HA-2's resume, measured up to 13 s).
ROUND_TIMEOUT_S = 2.0
# A release at a clean stop answers in milliseconds too; unanswered (the bus gone), the TTL
# frees the key anyway, and the stop goes on.
RELEASE_TIMEOUT_S = 1.0
# Who holds a lease: a name that stays the same across a restart of the same replica (``up``
# names each child, the systemd unit the host), so a replica restarted after a crash takes its
# own lease back at once instead of waiting out the TTL. Two live processes must never share
# one; without it each process is its own (host:pid).
INSTANCE_ENV = "HEALTHPLANE_INSTANCE"
# How long a standby waits for its question to the holder: a live holder answers in
# milliseconds, and one that does not answer in this time is slow, which is not dead.
PROBE_TIMEOUT_S = 0.5
# How long the holder must have had no connection on the bus before a standby takes its lease:
# longer than a client's reconnect to another server after losing its own (sub-second on a
# loaded 2-core host, docs/operations.md), so a server loss is ridden out, not taken over.
ABSENT_FOR_S = 1.5


def instance_name() -> str:
    return os.environ.get(INSTANCE_ENV) or f"{socket.gethostname()}:{os.getpid()}"


async def ttl_in_force(js: JetStreamContext) -> float:
    """The leases bucket's TTL (its ``max_age``), which stream administration sets (HA-8,
    ``leases.ttlSeconds``): every holder and standby times its renewals and its fence by the
    bucket's own clock, never by a number of its own that could disagree with it."""
    info = await js.stream_info(f"KV_{BUCKET}")
    return float(info.config.max_age or TTL_S)


class Presence:
    """Whether the replica behind a key in the leases bucket still has a connection on the bus
    (HA-8): it answers on the key's presence subject (``streams.lease_presence_subject``) while
    it holds the key; another asks there. One per key: a lease's holder and its standbys, or a
    partitioned service's member keys (runtime.lifecycle.Members)."""

    def __init__(self, nc: NATS, key: str, answer: bytes, log: Any = None) -> None:
        self._nc, self.key, self._answer, self._log = nc, key, answer, log
        self._subject = lease_presence_subject(key)
        self._subscription: Subscription | None = None
        self._absent: tuple[int, float] | None = None  # (the key's revision, monotonic) first found absent

    async def hold(self, holding: bool) -> None:
        """Answer while ``holding``, and stop answering once not."""
        if holding == (self._subscription is not None):
            return
        try:
            if holding:
                self._subscription = await self._nc.subscribe(self._subject, cb=self._present)
                # On the server before we lead: nats-py sends a SUB with its next flush, and a
                # holder stalled before that would be taken for gone (seen in a loaded run).
                await self._nc.flush(timeout=2)  # seconds; nats-py takes an int
            elif self._subscription is not None:
                subscription, self._subscription = self._subscription, None
                await subscription.unsubscribe()
        except Exception as exc:  # the connection closing: the server drops the subscription anyway
            if self._log is not None:
                self._log.warning("lease presence not changed", key=self.key, error=str(exc) or type(exc).__name__)

    async def _present(self, msg: Msg) -> None:
        if msg.reply and self._subscription is not None:
            # A respond that fails is a connection going away, whose subscription goes with it.
            with contextlib.suppress(nats_errors.Error):
                await msg.respond(self._answer)

    async def gone(self, revision: int) -> bool:
        """Whether the replica that wrote ``revision`` of the key has had no connection on the
        bus for ``ABSENT_FOR_S``: every question since the first unanswered one met *no
        responders*. A newer revision (it wrote again) starts the count afresh."""
        try:
            await self._nc.request(self._subject, b"", timeout=PROBE_TIMEOUT_S)
        except nats_errors.NoRespondersError:
            now = time.monotonic()
            if self._absent is None or self._absent[0] != revision:
                self._absent = (revision, now)
            return now - self._absent[1] >= ABSENT_FOR_S
        except Exception:
            pass  # no answer in time (a slow holder), or our own connection down: proves nothing
        self._absent = None
        return False


class Lease:
    def __init__(self, js: JetStreamContext, name: str, holder: str, *, ttl_s: float = TTL_S,
                 on_change: Callable[[bool], None] | None = None, log: Any = None,
                 wanted: Callable[[], bool] | None = None, rides_out: bool = False,
                 nc: NATS | None = None) -> None:
        self._js, self.name, self.holder = js, name, holder
        # Where the holder answers and the standby asks (no connection given: the TTL alone).
        self._presence = Presence(nc, name, holder.encode(), log) if nc is not None else None
        # A holder whose writes wait on its fence (a Processor's do) is told it lost the lease
        # only when it has: a fence that closes while the bus elects a leader, and reopens
        # with the next renewal, then costs a pause instead of a takeover from the snapshot
        # (consumers re-created on a degraded cluster). Others are told at the closure.
        self._rides_out = rides_out
        self._announced = False
        # Whether to compete at all (a partition this replica owns, HA-4); one it holds is
        # renewed until its holder releases it.
        self._wanted = wanted
        self.ttl_s = ttl_s
        self._renew_every_s = ttl_s / 3
        # The fence closes this long before the key can expire: time for the renewal's own
        # round trip and for clocks that do not tick at quite the same rate.
        self._valid_for_s = ttl_s - max(1.0, ttl_s / 5)
        self._on_change = on_change
        self._log = log
        self._revision: int | None = None
        self._renewed_at: float | None = None  # monotonic, taken before the request was sent
        self.is_leader = False
        self.unanswered = False  # the last round got no answer from the bus
        self._kv: KeyValue | None = None

    def _set(self, leader: bool, *, announce: bool = True) -> None:
        self.is_leader = leader
        if announce and leader != self._announced:
            self._announced = leader
            if self._log is not None:
                self._log.info("lease acquired" if leader else "lease lost", lease=self.name, holder=self.holder)
            if self._on_change is not None:
                self._on_change(leader)

    async def attempt(self) -> bool:
        """One round: renew the lease we hold, or take it when it is free. Any failure (the
        bus down, the bucket's raft group electing a leader after a server loss) is a round
        that proves nothing: the next one tries again."""
        value = self.holder.encode()
        sent_at = time.monotonic()
        try:
            kv = await self._bucket()
            if self._revision is not None:
                self._revision = await kv.update(self.name, value, last=self._revision)
            else:
                self._revision = await self._take(kv, value)
            self._renewed_at = sent_at
        except (KeyWrongLastSequenceError, KeyNotFoundError, NotFoundError):
            self._revision = None  # another holder has it, or it expired: not ours
        except Exception as exc:
            # No answer (the bus down, the bucket electing a leader): the lease may still be
            # ours, and the fence alone decides whether we may write until a renewal gets
            # through or the TTL runs out. Dropping it here would leave the service without a
            # holder for a whole TTL after every server loss.
            self.unanswered = True
            if self._log is not None:
                self._log.warning("lease renewal failed", lease=self.name, error=str(exc) or type(exc).__name__)
            return self.fence() is not None
        self.unanswered = False
        if self._presence is not None:
            await self._presence.hold(self._revision is not None)
        self._set(self._revision is not None)
        return self.is_leader

    async def _bucket(self) -> KeyValue:
        """The bucket, looked up once: ``js.key_value`` asks the JetStream API for the stream's
        info, a request that a loaded cluster's API queue may hold for seconds, and a renewal
        needs none (an update is a plain publish with an expected sequence)."""
        if self._kv is None:
            self._kv = await self._js.key_value(BUCKET)
        return self._kv

    async def _take(self, kv: KeyValue, value: bytes) -> int:
        """Create the key; when it holds our own name already, take it over: it is this
        instance's lease from before a restart (the process that held it is gone, and this is
        its replacement), or one of our renewals that landed without its answer."""
        try:
            return await kv.create(self.name, value)
        except KeyWrongLastSequenceError:
            entry = await kv.get(self.name)
            if entry.revision is None or (entry.value != value and not await self._holder_gone(entry.revision)):
                raise
            if entry.value != value and self._log is not None:
                self._log.warning("lease holder gone from the bus: taking over before its TTL", lease=self.name,
                                  holder=(entry.value or b"").decode(errors="replace"), absent_for_s=ABSENT_FOR_S)
            return await kv.update(self.name, value, last=entry.revision)

    async def _holder_gone(self, revision: int) -> bool:
        return self._presence is not None and await self._presence.gone(revision)

    def fence(self) -> int | None:
        """The lease's revision while this holder may still write; ``None`` once it may not
        (never held, lost, or not renewed within the TTL minus the margin)."""
        if self._revision is None or self._renewed_at is None:
            return None
        if time.monotonic() - self._renewed_at >= self._valid_for_s:
            if self._log is not None and self.is_leader:
                self._log.warning("lease not renewed in time: writes fenced off", lease=self.name,
                                  since_renewal_s=round(time.monotonic() - self._renewed_at, 2))
            # Not renewed in time: no more writes. The revision is kept for the next renewal's
            # compare-and-set, which succeeds only if nobody took the key meanwhile and it has
            # not expired, so a holder that rides out a bucket election leads again at once.
            self._set(False, announce=not self._rides_out)
            return None
        return self._revision

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            if self._wanted is None or self._wanted() or self._revision is not None:
                await self.attempt()
            # A holder renews at a third of the TTL; a standby, or a holder whose round the bus
            # did not answer, tries again soon: a lease that lapses is taken within RETRY_S.
            delay = self._renew_every_s if self.is_leader and not self.unanswered else RETRY_S
            try:
                await asyncio.wait_for(stopping.wait(), delay)
            except TimeoutError:
                pass
        await self.release()

    async def release(self) -> None:
        if self._revision is not None:
            try:  # a courtesy to the next holder, bounded: a bus that is gone answers nothing
                kv = await self._bucket()
                await asyncio.wait_for(kv.delete(self.name, last=self._revision), RELEASE_TIMEOUT_S)
            except Exception:
                pass  # it expires with the TTL
            self._revision = None
        if self._presence is not None:
            await self._presence.hold(False)
        self._set(False)
