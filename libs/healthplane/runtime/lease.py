"""Leader election among replicas: a lease in the ``healthplane-leases`` KV bucket.

The bucket's TTL expires a lease whose holder stopped renewing; renewal is a compare-and-set
on the revision the holder last wrote, so two replicas can never both believe they hold it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

from healthplane.streams import LEASE_TTL_S as TTL_S
from healthplane.streams import LEASES_BUCKET as BUCKET


class Lease:
    def __init__(self, js: JetStreamContext, name: str, holder: str, *, ttl_s: float = TTL_S,
                 on_change: Callable[[bool], None] | None = None, log: Any = None) -> None:
        self._js, self.name, self.holder = js, name, holder
        self._renew_every_s = ttl_s / 3
        self._on_change = on_change
        self._log = log
        self._revision: int | None = None
        self.is_leader = False

    def _set(self, leader: bool) -> None:
        if leader != self.is_leader:
            self.is_leader = leader
            if self._log is not None:
                self._log.info("lease acquired" if leader else "lease lost", lease=self.name, holder=self.holder)
            if self._on_change is not None:
                self._on_change(leader)

    async def attempt(self) -> bool:
        """One round: renew the lease we hold, or take it when it is free."""
        kv = await self._js.key_value(BUCKET)
        value = self.holder.encode()
        try:
            if self._revision is not None:
                self._revision = await kv.update(self.name, value, last=self._revision)
            else:
                self._revision = await kv.create(self.name, value)
        except (KeyWrongLastSequenceError, KeyNotFoundError, NotFoundError):
            self._revision = None
        except Exception as exc:  # the bus is down: we cannot prove we still hold it
            if self._log is not None:
                self._log.warning("lease renewal failed", lease=self.name, error=str(exc) or type(exc).__name__)
            self._revision = None
        self._set(self._revision is not None)
        return self.is_leader

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            await self.attempt()
            try:
                await asyncio.wait_for(stopping.wait(), self._renew_every_s)
            except TimeoutError:
                pass
        await self.release()

    async def release(self) -> None:
        if self._revision is not None:
            try:
                kv = await self._js.key_value(BUCKET)
                await kv.delete(self.name, last=self._revision)
            except Exception:
                pass  # it expires with the TTL
            self._revision = None
        self._set(False)
