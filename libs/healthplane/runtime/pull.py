"""The shared pull loop: batches kept in flight on one inbox subscription.

nats-py's ``fetch()`` waits for a batch, then asks for the next one, so the consumer idles for
a round trip per batch. Here one callback subscription on an inbox receives everything, raw
``$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`` requests ask for the next batch before the
current one is drained, and status messages are accounted for:

- ``100`` idle heartbeat: the request is alive;
- ``404``/``408``: the request ended; ``Nats-Pending-Messages`` says how much of it went unused;
- ``409``: the server cancelled it (consumer deleted, leadership change, max waiting…);
- ``503``: nobody answers for the consumer (it or the stream is gone, or the server restarted).

A watchdog re-issues requests when neither messages nor heartbeats arrive (reconnects,
server restarts) and asks the owner to recreate a missing consumer.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import ConnectionClosedError
from nats.js.errors import NotFoundError

from healthplane.runtime import metrics, nats_internals
from healthplane.runtime.backoff import Backoff
from healthplane.runtime.publish import pub_frame, write_frames, writes_frames

# ``held``: the handler took the delivery over and settles it itself, later (the webhook
# dispatcher acks an event once its delivery is over, INT-2).
Disposition = Literal["ack", "term", "nak", "held"]


@dataclass(slots=True)
class Delivery:
    """One data message with its JetStream metadata, and what to do with it afterwards."""

    msg: Msg
    stream: str
    stream_seq: int
    delivered: int
    timestamp_ns: int
    pending: int
    disposition: Disposition = "ack"
    nak_delay_s: float = 0.0
    reject_reason: str = field(default="")

    def term(self, reason: str) -> None:
        self.disposition, self.reject_reason = "term", reason

    def nak(self, delay_s: float = 1.0) -> None:
        self.disposition, self.nak_delay_s = "nak", delay_s

    def hold(self) -> None:
        self.disposition = "held"


BatchHandler = Callable[[list[Delivery]], Awaitable[None]]
TAP_TRIES = 5  # round trips a loop waits at start for a busy connection's parser to be between messages


def _ack_tokens(reply: str) -> tuple[list[str], int]:
    """A ``$JS.ACK`` subject's tokens and where its stream name is: the v1 form (9 tokens) or
    v2 with domain and account hash (12 tokens)."""
    tokens = reply.split(".")
    if len(tokens) == 9:
        return tokens, 2
    if len(tokens) >= 11:
        return tokens, 4
    raise ValueError(f"not a JetStream ack subject: {reply!r}")


def stream_seq_of(reply: str) -> int:
    """The stream sequence of a delivery, from its ``$JS.ACK`` subject."""
    tokens, base = _ack_tokens(reply)
    return int(tokens[base + 3])


def parse_ack_subject(reply: str) -> tuple[str, int, int, int, int]:
    """``(stream, delivered, stream_seq, timestamp_ns, pending)`` from a ``$JS.ACK`` subject."""
    tokens, base = _ack_tokens(reply)
    return (
        tokens[base],
        int(tokens[base + 2]),
        int(tokens[base + 3]),
        int(tokens[base + 5]),
        int(tokens[base + 6]),
    )


class PullLoop:
    def __init__(
        self,
        nc: NATS,
        stream: str,
        consumer: str,
        handler: BatchHandler,
        *,
        service: str = "",
        batch: int = 256,
        expires_s: float = 30.0,
        idle_heartbeat_s: float = 1.0,
        recreate: Callable[[], Awaitable[None]] | None = None,
        log: Any = None,
        linger_s: float = 0.0,
    ) -> None:
        self._nc = nc
        self._stream = stream
        self._consumer = consumer
        self._handler = handler
        self._batch = batch
        self._linger_s = linger_s
        self._expires_ns = int(expires_s * 1e9)
        self._hb_s = idle_heartbeat_s
        self._recreate = recreate
        self._log = log
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._request = msgspec.json.encode(
            {"batch": batch, "expires": self._expires_ns, "idle_heartbeat": int(idle_heartbeat_s * 1e9)}
        )
        self._inbox = nc.new_inbox()
        self._buffer: deque[Delivery] = deque()
        self._ready = asyncio.Event()
        self._outstanding = 0
        self._last_seen = time.monotonic()
        self._stopping = False
        self._consumer_missing = False
        self._reconnects_seen = nc.stats.get("reconnects", 0)
        self._lag = metrics.CONSUMER_LAG.labels(service, stream, consumer)
        self.delivered = 0
        self._tap: nats_internals.PullTap | None = None

    # ------------------------------------------------------------------ inbound

    async def _on_msg(self, msg: Msg) -> None:
        if not msg.reply:
            self._last_seen = time.monotonic()
            await self._on_status(msg)
            return
        self._take(msg)

    def _take(self, msg: Msg) -> None:
        """A delivery, from the subscription or straight from the parser (``nats_internals.PullTap``)."""
        self._last_seen = time.monotonic()
        try:
            stream, delivered, seq, ts, pending = parse_ack_subject(msg.reply)
        except ValueError:
            return
        self._outstanding = max(0, self._outstanding - 1)
        self._buffer.append(Delivery(msg, stream, seq, delivered, ts, pending))
        self._ready.set()

    async def _on_status(self, msg: Msg) -> None:
        headers = msg.headers or {}
        status = headers.get("Status", "")
        if status == "100":
            return
        unused = headers.get("Nats-Pending-Messages")
        if status in ("404", "408", "409"):
            if unused is not None:
                self._outstanding = max(0, self._outstanding - int(unused))
            else:
                self._outstanding = 0
            if status == "409":
                description = headers.get("Description", "")
                if "Deleted" in description:
                    self._consumer_missing = True
                if self._log is not None and "Exceeded" not in description:
                    self._log.warning("pull request cancelled", stream=self._stream,
                                      consumer=self._consumer, reason=description)
        elif status == "503":
            self._outstanding = 0
            self._consumer_missing = True
            return
        await self._top_up()

    async def _top_up(self) -> None:
        # Keep at most two batches requested-or-buffered: the next one is on its way
        # while the current one is handled, and memory stays bounded.
        if self._stopping or self._consumer_missing or not self._nc.is_connected:
            return
        while self._outstanding + len(self._buffer) <= self._batch:
            self._outstanding += self._batch
            await self._nc.publish(self._next_subject, self._request, reply=self._inbox)

    async def _tap_deliveries(self, sub: Subscription) -> None:
        """Deliveries straight from the connection's parser, where its fast path passed its
        self-test. Only before the first pull request: a tap put in place while deliveries
        flow would hand on the next ones before those nats-py still holds in the subscription's
        queue, out of order. Where the connection's parser is in the middle of a message (the
        first route on a busy connection), it is tried again after a round trip, a few times;
        then the loop keeps nats-py's path."""
        for _ in range(TAP_TRIES):
            self._tap = nats_internals.tap_pull(self._nc, sub, self._take)
            if self._tap is not None or not nats_internals.fast_paths(self._nc).parser:
                return
            try:
                await self._nc.flush(timeout=2)
            except Exception:  # not connected: nats-py's path, and the watchdog sees to the rest
                return

    # ------------------------------------------------------------------ watchdog

    async def _watchdog(self) -> None:
        backoff = Backoff(self._hb_s, 30.0)
        while not self._stopping:
            await asyncio.sleep(self._hb_s)
            if self._nc.is_closed:
                self._ready.set()  # run() raises: a closed client never comes back
                return
            reconnects = self._nc.stats.get("reconnects", 0)
            if reconnects != self._reconnects_seen:
                # Pull requests do not survive a reconnect.
                self._reconnects_seen = reconnects
                self._outstanding = 0
            silent_for = time.monotonic() - self._last_seen
            if self._outstanding and silent_for > 3 * self._hb_s:
                self._outstanding = 0
            if self._consumer_missing and self._nc.is_connected:
                if self._recreate is None or await self._still_there():
                    self._consumer_missing = False
                else:
                    try:
                        await self._recreate()
                        self._consumer_missing = False
                        backoff.reset()
                    except Exception as exc:
                        delay = backoff.next()
                        if self._log is not None:
                            self._log.warning("consumer missing, recreate failed", stream=self._stream,
                                              consumer=self._consumer, error=str(exc), retry_in_s=delay)
                        await asyncio.sleep(delay)
            if not self._outstanding:
                self._last_seen = time.monotonic()
                try:
                    await self._top_up()
                except Exception:  # not connected yet; next round
                    pass

    async def _still_there(self) -> bool:
        """Whether a consumer nobody answered for (503) exists after all: on a cluster its
        raft group is electing a leader (a member lost), and the pull requests go out again
        once one answers. Re-creating it then would reset it on a degraded cluster, which is
        slow and fails while the meta layer is busy. Only a consumer the server says is gone
        is re-created."""
        try:
            await self._nc.jetstream().consumer_info(self._stream, self._consumer)
        except NotFoundError:
            return False
        except Exception:
            # No answer yet (still electing, or the bus away): pull again; another 503 brings
            # us back here at the next round.
            return True
        return True

    # ------------------------------------------------------------------ main loop

    def stop(self) -> None:
        """Finish the batch in hand, settle it, and return from :meth:`run`."""
        self._stopping = True
        self._ready.set()

    async def run(self) -> None:
        sub = await self._nc.subscribe(self._inbox, cb=self._on_msg, pending_msgs_limit=-1,
                                       pending_bytes_limit=-1)
        await nats_internals.engage(self._nc)  # the self-test, once per connection
        await self._tap_deliveries(sub)
        watchdog = asyncio.create_task(self._watchdog())
        try:
            await self._top_up()
            while True:
                await self._ready.wait()
                if self._stopping:
                    break
                if self._nc.is_closed:
                    raise ConnectionClosedError
                if self._linger_s and len(self._buffer) < self._batch:
                    # A thin batch (the consumer is caught up): wait a moment for more, so what
                    # a batch costs (a write, its acks, a settlement) is paid by more records.
                    await asyncio.sleep(self._linger_s)
                    if self._stopping:
                        break
                batch = [self._buffer.popleft() for _ in range(min(self._batch, len(self._buffer)))]
                if not self._buffer:
                    self._ready.clear()
                if not batch:
                    continue
                await self._handler(batch)
                await self._settle(batch)
                self._lag.set(batch[-1].pending)
                self.delivered += len(batch)
                await self._top_up()
        finally:
            watchdog.cancel()
            if self._tap is not None:
                self._tap.remove()
            # Drain rather than unsubscribe: messages the server sent before it saw our
            # UNSUB still reach the buffer, and are handed back below instead of waiting
            # out ack_wait on the server.
            if self._nc.is_connected:
                try:
                    await sub.drain()  # type: ignore[no-untyped-call]
                except Exception:
                    await sub.unsubscribe()
            for left in self._buffer:
                if self._nc.is_connected:
                    await self._nc.publish(left.msg.reply, b"-NAK")
            self._buffer.clear()

    async def _settle(self, batch: list[Delivery]) -> None:
        """Every ack, term and nak of the batch as one write (the connection's outbound
        buffer, flushed once) rather than one ``nc.publish`` per message."""
        batch = [d for d in batch if d.disposition != "held"]
        if not batch:
            return
        if not writes_frames(self._nc):
            for d in batch:
                await self._nc.publish(d.msg.reply, _settlement(d))
            return
        frames = [pub_frame(d.msg.reply, _settlement(d)) for d in batch]
        await write_frames(self._nc, b"".join(frames), len(frames))


def _settlement(delivery: Delivery) -> bytes:
    if delivery.disposition == "ack":
        return b"+ACK"
    if delivery.disposition == "term":
        return b"+TERM " + delivery.reject_reason.encode()[:200]
    return b"-NAK " + msgspec.json.encode({"delay": int(delivery.nak_delay_s * 1e9)})
