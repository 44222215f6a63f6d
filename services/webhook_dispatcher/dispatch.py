"""``healthplane service webhook-dispatcher``: node events to HTTP endpoints (WEB-1..WEB-4,
INT-2, INT-3).

At least once, with the stream as the backlog (INT-2). Each endpoint has a durable pull
consumer of its own on ``HP_NODE_EVENTS`` (a ``Lane``), filtered to the event types it wants,
read through the shared pull loop. An event read is held until its delivery is over (a 2xx,
or its attempts spent and a dead letter stored) and only then acked: a crash, a burst or a
receiver's outage leaves the rest in the consumer, and the stream's retention is the only
bound. The consumer's ``max_ack_pending`` bounds what one endpoint holds, so a slow or dead
endpoint lags on its own consumer and never delays another. An endpoint that is down stops
reading and spends no attempts until a probe is answered; deliveries are in stream order per
node (``Lane``).

nats-server grants consumers by whole name (SEC-8), so the consumers are a fixed set of
slots (``streams.WEBHOOK_SLOTS``) and each endpoint holds one, recorded in the consumer's
metadata (``rules.assign_slots`` keeps it across restarts and config changes).

Endpoints come from ``nodeEventWebhooks`` in the cluster config, read at start and then
watched on ``hp.config``: ``healthplane config apply`` changes them without a restart.
``healthplane webhooks replay`` asks on ``hp.webhook.replay.{actor}`` for an endpoint's
dead letters to be sent again.

Wiring only: the decisions are ``rules``, the HTTP adapter ``send`` and ``transport``, the
series ``metrics``. A record that is not a node event is set aside as a dead letter.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime

import httpx
import msgspec
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from healthplane.contracts import streams, subjects, wire
from healthplane.contracts.config import ConfigError, decode_config
from healthplane.contracts.webhooks import ReplayAnswer, ReplayRequest, signature_headers
from healthplane.runtime import configstore, consumers, deadletters, metrics
from healthplane.runtime.deadletters import SetAside
from healthplane.runtime.lifecycle import ServiceContext
from healthplane.runtime.publish import Publisher
from healthplane.runtime.pull import Delivery, PullLoop
from healthplane.runtime.replay import StoredMsg, follow, read_all
from healthplane_webhook_dispatcher.metrics import (
    CONFIG_VERSION,
    DEAD_LETTERS,
    DELIVERIES,
    DOWN,
    ENDPOINTS,
    FILTERED,
    HELD,
    LAG,
    LATENCY,
    GiveUpReason,
    forget,
)
from healthplane_webhook_dispatcher.rules import (
    CONTENT_TYPE,
    SERVICE,
    SLOT_OWNER,
    STREAM,
    Endpoint,
    Reachability,
    Settings,
    after_attempt,
    after_result,
    assign_slots,
    backoff_delay,
    endpoints_from_config,
    envelope,
    event_type_of_subject,
    fails_the_endpoint,
    judge,
    node_key,
    plan_reload,
    retry_after_seconds,
    scrub,
    secret_reader,
)
from healthplane_webhook_dispatcher.send import EndpointSender

LEGACY_CONSUMER = "webhook-dispatcher"  # the one durable before INT-2 (streams.NAMED_DURABLES)
CONFIG_FOLLOW_S = 1.0  # a config change reaches the endpoints within a second
LAG_EVERY_S = 5.0  # how often each endpoint's lag is read from its consumer
MAX_PULL_BATCH = 256
NodeKey = tuple[str, str]  # cluster, node id: what deliveries are ordered by


def consumer_config(endpoint: Endpoint, slot: int, settings: Settings) -> ConsumerConfig:
    """The durable of ``endpoint`` in ``slot``: its event types as filters, at most
    ``queue_size`` events unsettled (the server's bound on what it holds), the endpoint's
    label recorded so that the slot stays its own across restarts and config changes.
    ``DeliverPolicy.NEW``: a new endpoint gets what happens from now on, not 90 days of
    history; after that the consumer resumes from its ack floor."""
    config = consumers.durable(
        streams.consumer_name(SERVICE, STREAM, slot), deliver=DeliverPolicy.NEW,
        filter_subjects=endpoint.subjects, ack_wait_s=settings.ack_wait_s, max_ack_pending=settings.queue_size)
    return dataclasses.replace(config, description=f"webhook deliveries to {endpoint.label}",
                               metadata={SLOT_OWNER: endpoint.label})


class Held:
    """One event an endpoint holds until its delivery is over; the body is built on first use.
    ``reply`` is the ack subject of its latest delivery (None: a replayed dead letter, which
    is acked by nobody)."""

    __slots__ = ("_body", "data", "event", "reply", "seq", "subject")

    def __init__(self, seq: int, reply: str | None, subject: str, data: bytes, event: wire.NodeEvent) -> None:
        self.seq, self.reply, self.subject, self.data, self.event = seq, reply, subject, data, event
        self._body: bytes | None = None

    def body(self) -> bytes:
        if self._body is None:
            self._body = envelope(self.event)
        return self._body


class Lane:
    """One endpoint: its consumer slot and pull loop, the events it holds, its workers and its
    connection pool.

    Order per node: the events held wait in a queue per node (stream order), and a node's next
    event goes out only once the one before it is over (delivered or dead-lettered, retries
    included); different nodes go concurrently, up to ``concurrency`` at a time, taking turns.

    An outage pauses it (``rules.Reachability``): once an attempt could not connect, or
    attempts of two different events failed in a row, the endpoint is down. Then the pull loop stops (what is not read waits in
    the consumer), no event spends attempts, what is held is kept from redelivery with
    in-progress acks, and one probe at a time goes out on the retry backoff, each with the
    next event waiting its turn; the first answer resumes everything."""

    def __init__(self, ctx: ServiceContext, endpoint: Endpoint, slot: int, settings: Settings, *,
                 rejects: SetAside, clock: Callable[[], float] = time.time,
                 draw: Callable[[], float] = random.random) -> None:
        self.endpoint = endpoint
        self.slot = slot
        self.consumer = streams.consumer_name(SERVICE, STREAM, slot)
        self._nc, self._js = ctx.nc, ctx.js
        self._settings = settings
        self._log = ctx.log.bind(endpoint=endpoint.label, consumer=self.consumer)
        self._clock, self._draw = clock, draw
        self._rejects = rejects
        # Its own producer: two endpoints' dead letters of one event are two records.
        self._undelivered = SetAside(ctx.nc, Publisher(ctx.nc), SERVICE, f"{SERVICE}.slot{slot}", ctx.log)
        self.held: dict[int, Held] = {}  # by stream sequence: what the consumer counts as ack pending
        # Per node, its events not yet out, in stream order; a node is here while one of its
        # events is held. ``_ready``: the nodes with one waiting and none under way.
        self._waiting: dict[NodeKey, deque[Held]] = {}
        self._ready: deque[NodeKey] = deque()
        self._busy: set[NodeKey] = set()
        self._wake = asyncio.Semaphore(0)  # one per node in _ready
        self._closing = False
        self._went_idle = asyncio.Event()
        self.in_flight = 0  # events being carried by a worker (attempt, backoff or parked)
        self._attempting = 0  # HTTP attempts under way
        self.delivered = 0  # events this endpoint answered 2xx (the metric, for tests and benches)
        self.reachability = Reachability()
        self.probes = 0  # probes sent while down (since the last outage began)
        self._down_since = 0.0
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._parked: deque[asyncio.Future[bool]] = deque()  # workers waiting, while down: True is a probe turn
        self._next_result: asyncio.Future[None] | None = None  # resolved at the end of the next attempt
        self._probe_over = asyncio.Event()
        self._probe_retry_after: float | None = None
        self._probing: asyncio.Task[None] | None = None
        self.sender = EndpointSender(endpoint.url, settings)
        self.loop = self._pull_loop()
        self.task: asyncio.Task[None] | None = None
        self._workers: list[asyncio.Task[None]] = []
        label = endpoint.label
        self._delivered = DELIVERIES.labels(label, "delivered")
        self._latency = LATENCY.labels(label)
        self._filtered = FILTERED.labels(label)
        HELD.labels(label).set_function(lambda: len(self.held))
        DOWN.labels(label).set_function(lambda: 1 if self.reachability.down else 0)

    def _pull_loop(self) -> PullLoop:
        return PullLoop(self._nc, STREAM, self.consumer, self.handle, service=SERVICE,
                        batch=min(MAX_PULL_BATCH, self._settings.queue_size), log=self._log,
                        recreate=self.ensure_consumer)

    async def ensure_consumer(self) -> None:
        await consumers.ensure(self._js, STREAM, consumer_config(self.endpoint, self.slot, self._settings))

    def start(self) -> asyncio.Task[None]:
        self._workers = [asyncio.create_task(self._work()) for _ in range(self._settings.concurrency)]
        self.task = asyncio.create_task(self._read())
        return self.task

    async def _read(self) -> None:
        """The pull loop while the endpoint is up; none while it is down (a new one on resume:
        the server drops the pull requests of an inbox nobody listens on)."""
        while True:
            await self.loop.run()  # returns once stopped; raises if the connection is gone
            if self._closing:
                return
            await self._resumed.wait()
            if self._closing:
                return
            self.loop = self._pull_loop()

    def update(self, endpoint: Endpoint) -> None:
        """Same label, new settings: from the next attempt on. A new URL gets a new pool; the
        old one is closed once the attempts under way on it are over."""
        if endpoint.url != self.endpoint.url:
            old, self.sender = self.sender, EndpointSender(endpoint.url, self._settings)
            asyncio.get_running_loop().call_later(self._settings.timeout_s + 1,
                                                  lambda: asyncio.ensure_future(old.aclose()))
        self.endpoint = endpoint
        self._log = self._log.bind(endpoint=endpoint.label)

    # ------------------------------------------------------------------ events in

    async def handle(self, batch: list[Delivery]) -> None:
        """Hold each event this endpoint wants (the pull loop leaves it unsettled) and queue
        it behind its node's; ack at once what it does not want. Never waits on a receiver."""
        endpoint = self.endpoint
        for delivery in batch:
            seq = delivery.stream_seq
            already = self.held.get(seq)
            if already is not None:
                # Sent again by the server (held past ack_wait, waiting behind a slow receiver):
                # still ours, in its place, acked through its newest delivery once it is over.
                already.reply = delivery.msg.reply
                delivery.hold()
                continue
            event_type = event_type_of_subject(delivery.msg.subject)
            if event_type is None:
                await self._rejects.reject(delivery, "not a node event subject")
                continue
            if not endpoint.wants(event_type):
                continue  # its filter changed since the server sent it
            try:
                event = wire.decode(wire.NodeEvent, delivery.msg.data)
            except wire.WireError as exc:
                await self._rejects.reject(delivery, str(exc))
                continue
            if not endpoint.selects(event):
                self._filtered.inc()
                continue
            held = Held(seq, delivery.msg.reply, delivery.msg.subject, delivery.msg.data or b"", event)
            self.held[seq] = held
            delivery.hold()
            self._offer(held)
        metrics.MESSAGES_PROCESSED.labels(SERVICE, STREAM).inc(len(batch))

    def _offer(self, held: Held) -> None:
        """Behind the node's earlier events; a node new here is ready at once (one already
        here is ready, or its event under way readies it when over)."""
        key = node_key(held.event)
        waiting = self._waiting.get(key)
        if waiting is None:
            self._waiting[key] = deque((held,))
            self._ready.append(key)
            self._wake.release()
        else:
            waiting.append(held)

    def replay(self, letters: list[deadletters.DeadLetter]) -> int:
        """Queue dead letters of this endpoint for delivery again; the count of those queued
        (one whose payload is cut short or not an event is skipped)."""
        queued = 0
        for letter in letters:
            if letter.truncated:
                self._log.warning("dead letter not replayed: cut short", dead_letter=letter.id)
                continue
            try:
                event = wire.decode(wire.NodeEvent, letter.payload)
            except wire.WireError as exc:
                self._log.warning("dead letter not replayed: not an event", dead_letter=letter.id, reason=str(exc))
                continue
            self._offer(Held(letter.input_seq, None, letter.input_subject, letter.payload, event))
            queued += 1
        return queued

    # ------------------------------------------------------------------ delivery

    async def _work(self) -> None:
        while True:
            await self._wake.acquire()
            if self._closing or not self._ready:
                continue
            key = self._ready.popleft()
            waiting = self._waiting[key]
            held = waiting.popleft()
            self._busy.add(key)
            self.in_flight += 1
            try:
                await self._carry(held)
            finally:
                self.in_flight -= 1
                self._busy.discard(key)
                if self._waiting.get(key) is waiting:
                    if waiting:  # its next event, behind the nodes that waited meanwhile
                        self._ready.append(key)
                        self._wake.release()
                    else:
                        del self._waiting[key]
                if self.in_flight == 0:
                    self._went_idle.set()

    async def _carry(self, held: Held) -> None:
        """Deliver, record a dead letter if it came to nothing, then ack: in that order, so a
        crash anywhere before the ack delivers it again rather than losing it."""
        outcome, attempts, detail = await self._deliver(held)
        if outcome != "delivered":
            await self._give_up(held, outcome, attempts, detail)
        if held.reply is None:
            return
        if self.held.get(held.seq) is held:
            del self.held[held.seq]
        try:
            await self._nc.publish(held.reply, b"+ACK")
        except Exception as exc:  # the bus away: the server sends it again after ack_wait
            self._log.warning("ack not sent; the event will be delivered again", seq=held.seq, error=str(exc))

    async def _deliver(self, held: Held) -> tuple[str, int, str]:
        """WEB-3/WEB-4: every attempt signed afresh with the same event id; retried with
        backoff up to ``maxAttempts``; 2xx ends it, a 4xx other than 408/429 too.

        INT-2: an attempt counts against the event only while the endpoint is up, before and
        after it; while it is down the event waits (or is sent as the probe) and spends none.
        Its attempts are spent only when the endpoint is seen to work meanwhile (or nothing
        else is under way to tell): a failure that turns out to be an outage keeps it."""
        attempts = 0
        while True:
            probe = False
            if self.reachability.down:
                probe = await self._wait_while_down()
            endpoint = self.endpoint  # a reload may change secret or maxAttempts meanwhile
            answers_before = self.reachability.answers
            self._attempting += 1
            try:
                status, detail, retry_after, connected = await self._attempt(endpoint, held)
            finally:
                self._attempting -= 1
            was = self.reachability
            self._judged(held, status, detail, retry_after, connected)
            if probe:
                self._probe_retry_after = retry_after
                self._probe_over.set()
            counted = not was.down and not self.reachability.down
            if counted:
                attempts += 1
            elif status is not None and not fails_the_endpoint(status):
                attempts += 1  # an answer (2xx, a refusal) ends the event whatever the endpoint was
            verdict = after_attempt(status, max(attempts, 1), endpoint.max_attempts)
            if verdict in ("delivered", "rejected"):
                return verdict, attempts, detail
            if not counted:
                continue  # the endpoint is down: wait for it, spending nothing
            if verdict == "max_attempts":
                if await self._endpoint_works(answers_before):
                    return verdict, attempts, detail
                attempts -= 1  # that failure was the outage's: it gets one more once it is over
                continue
            await asyncio.sleep(backoff_delay(attempts, self._draw(), base_s=self._settings.backoff_base_s,
                                              cap_s=self._settings.backoff_cap_s, retry_after_s=retry_after))

    async def _endpoint_works(self, answers_before: int) -> bool:
        """Whether the endpoint is known to work while an event's last attempt failed: it
        answered some other attempt since that one began (true), or other attempts under way
        fail too and put it down (false); with nothing else under way, there is nothing to
        tell an outage by and the event is judged on its own (true)."""
        while True:
            if self.reachability.down:
                return False
            if self.reachability.answers > answers_before or not self._attempting:
                return True
            if self._next_result is None:
                self._next_result = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._next_result)

    def _judged(self, held: Held, status: int | None, detail: str, retry_after: float | None,
                connected: bool) -> None:
        """The endpoint's reachability after an attempt's result; going down or coming up."""
        was = self.reachability
        now = self.reachability = after_result(was, held.seq, status, connected=connected)
        if now.down and not was.down:
            self._went_down(detail, retry_after)
        elif was.down and not now.down:
            self._came_up(detail)
        if self._next_result is not None:
            self._next_result.set_result(None)
            self._next_result = None

    def _went_down(self, detail: str, retry_after: float | None) -> None:
        self._down_since = time.monotonic()
        self.probes = 0
        self._probe_retry_after = retry_after
        self._resumed.clear()
        self.loop.stop()
        self._log.warning("webhook endpoint down; deliveries paused", last_result=detail, held=len(self.held))
        if self._probing is not None:
            self._probing.cancel()
        self._probing = asyncio.create_task(self._probe())

    def _came_up(self, detail: str) -> None:
        self._log.info("webhook endpoint back; deliveries resumed", last_result=detail, probes=self.probes,
                       down_for_s=round(time.monotonic() - self._down_since, 1), held=len(self.held))
        self._resumed.set()
        self._probe_over.set()
        while self._parked:
            turn = self._parked.popleft()
            if not turn.done():
                turn.set_result(False)

    async def _wait_while_down(self) -> bool:
        """Park until the endpoint is up (False) or this event is the next probe (True)."""
        turn: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._parked.append(turn)
        try:
            return await turn
        finally:
            if not turn.done():
                turn.cancel()

    async def _probe(self) -> None:
        """While the endpoint is down: keep what is held from redelivery (in-progress acks,
        every third of the ack wait) and send one probe at a time, the parked events taking
        turns, each after the retry backoff (a ``Retry-After`` honoured up to its cap)."""
        keep_alive = asyncio.create_task(self._keep_held())
        try:
            while self.reachability.down and not self._closing:
                self.probes += 1
                await asyncio.sleep(backoff_delay(self.probes, self._draw(), base_s=self._settings.backoff_base_s,
                                                  cap_s=self._settings.backoff_cap_s,
                                                  retry_after_s=self._probe_retry_after))
                turn = None
                while self.reachability.down and turn is None:
                    while self._parked and turn is None:
                        candidate = self._parked.popleft()
                        turn = None if candidate.done() else candidate
                    if turn is None:
                        if not self.in_flight and not self._ready:  # nothing to probe with or wait for
                            self._judged_empty()
                            return
                        await asyncio.sleep(self._settings.backoff_base_s)
                if turn is None:
                    return
                self._probe_over.clear()
                self._probe_retry_after = None
                turn.set_result(True)
                await self._probe_over.wait()
        finally:
            keep_alive.cancel()

    def _judged_empty(self) -> None:
        self.reachability = Reachability(answers=self.reachability.answers)
        self._came_up("nothing held")

    async def _keep_held(self) -> None:
        every_s = self._settings.ack_wait_s / 3
        while True:
            for held in list(self.held.values()):
                if held.reply is not None and self._nc.is_connected:
                    try:
                        await self._nc.publish(held.reply, b"+WPI")
                    except Exception:  # the bus away: it comes back by redelivery, kept once
                        break
            await asyncio.sleep(every_s)

    async def _attempt(self, endpoint: Endpoint, held: Held) -> tuple[int | None, str, float | None, bool]:
        """(status or None, what to log, ``Retry-After`` seconds, whether it connected)."""
        body = held.body()
        headers = signature_headers(endpoint.secret, held.event.id, int(self._clock()), body)
        headers["Content-Type"] = CONTENT_TYPE
        sender = self.sender
        started = time.perf_counter()
        try:
            status, retry_after = await sender.post(body, headers)
        except Exception as exc:  # no answer (httpx.HTTPError and anything odder): a failed
            # attempt, retried like the others; a worker never dies of a receiver.
            self._latency.observe(time.perf_counter() - started)
            DELIVERIES.labels(endpoint.label, "error").inc()
            connected = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)  # refused, unreachable, TLS
            return None, scrub(f"{type(exc).__name__}: {exc}".rstrip(": "), endpoint), None, connected
        self._latency.observe(time.perf_counter() - started)
        verdict = judge(status)
        if verdict == "delivered":
            self.delivered += 1
            self._delivered.inc()
        else:
            DELIVERIES.labels(endpoint.label, "rejected" if verdict == "rejected" else "failed").inc()
        return status, f"HTTP {status}", retry_after_seconds(retry_after), True

    async def _give_up(self, held: Held, reason: str, attempts: int, detail: str) -> None:
        """INT-2: attempts spent (or a 4xx): a dead letter with the endpoint and the last
        answer, stored before the event is acked. A replayed one that fails again keeps the
        dead letter it came from."""
        give_up: GiveUpReason = "rejected" if reason == "rejected" else "max_attempts"
        if held.reply is not None:
            await self._undelivered.store(deadletters.record(
                service=SERVICE, producer=self._undelivered.producer, input_stream=STREAM, input_seq=held.seq,
                input_subject=held.subject, payload=held.data, reason="undelivered",
                error=f"{give_up} after {attempts} attempt(s), last answer: {detail}",
                max_payload=self._nc.max_payload, endpoint=self.endpoint.label), "undelivered", detail)
        DEAD_LETTERS.labels(self.endpoint.label, give_up).inc()
        self._log.warning("webhook delivery dead-lettered", reason=give_up, event_id=held.event.id,
                          event_type=held.event.type, node_id=held.event.node_id, attempts=attempts,
                          last_result=detail, replayed=held.reply is None)

    # ------------------------------------------------------------------ lifecycle

    async def close(self, grace_s: float, *, give_back: bool = True) -> None:
        """Stop reading; give the deliveries under way ``grace_s`` to end (none while the
        endpoint is down: they wait for it); then hand back (nak) everything still held, in
        the order it was read, so that the next holder of the consumer sends it at once and in
        order rather than after ack_wait. Nothing is lost either way: it was never acked."""
        self._closing = True
        self.loop.stop()
        self._resumed.set()
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)
        if self._probing is not None:
            self._probing.cancel()
            await asyncio.gather(self._probing, return_exceptions=True)
        self._went_idle.clear()
        if self.in_flight and grace_s > 0 and not self.reachability.down:
            try:
                await asyncio.wait_for(self._went_idle.wait(), grace_s)
            except TimeoutError:
                pass
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        if give_back and self._nc.is_connected:
            for held in self.held.values():
                if held.reply is not None:
                    await self._nc.publish(held.reply, b"-NAK")
        self.held.clear()
        self._waiting.clear()
        self._ready.clear()
        self._busy.clear()
        await self.sender.aclose()


class Dispatcher:
    def __init__(self, ctx: ServiceContext, settings: Settings, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._ctx = ctx
        self._clock = clock
        self._js = ctx.js
        self._log = ctx.log
        self._settings = settings
        self.lanes: dict[str, Lane] = {}  # by endpoint label
        self.config_version = 0
        self._configs: asyncio.Queue[wire.ConfigEnvelope] = asyncio.Queue()
        self._follow: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []  # config reconcile, lag
        self._config_stop = asyncio.Event()
        self._stopping = asyncio.Event()
        self._failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._replays: Subscription | None = None
        self._rejects = SetAside(ctx.nc, Publisher(ctx.nc), SERVICE, f"{SERVICE}.0", ctx.log)
        # SEC-9: secrets come from this host (a small local file, read at each config change).
        self._secret_of = secret_reader(_read_head, os.environ)

    @property
    def workers(self) -> dict[str, Lane]:
        return self.lanes

    async def start(self) -> None:
        """Endpoints first, then events: no consumer is made before the config is known."""
        try:
            await self._js.delete_consumer(STREAM, LEGACY_CONSUMER)
            self._log.info("consumer of the previous version deleted", consumer=LEGACY_CONSUMER)
        except NotFoundError:
            pass
        found = await configstore.read(self._js)
        for record in found.skipped:
            self._log.warning("config record skipped", seq=record.seq, reason=record.reason)
        if found.in_force is not None:
            await self.apply_config(found.in_force.envelope)
        else:
            self._log.info("no cluster config applied yet; no webhook endpoints")
        # From past the newest record, valid or not: the skipped ones were named once already.
        # Followed by direct gets, not a consumer of its own: a consumer on HP_CONFIG would
        # need a grant that reaches every service's durable there (SEC-8).
        self._follow = asyncio.create_task(follow(
            self._ctx.nc, configstore.STREAM, subjects.CONFIG, self._on_configs, start_seq=found.last_seq + 1,
            stopping=self._config_stop, every_s=CONFIG_FOLLOW_S))
        self._tasks = [asyncio.create_task(self._reconcile_configs()), asyncio.create_task(self._watch_lag())]
        self._replays = await self._ctx.nc.subscribe(f"{subjects.WEBHOOK_REPLAY}.*", cb=self._on_replay)

    # ------------------------------------------------------------------ config

    def _on_configs(self, records: list[StoredMsg], caught_up: bool) -> None:
        for record in records:
            try:
                self._configs.put_nowait(wire.decode(wire.ConfigEnvelope, record.data))
            except wire.WireError as exc:
                self._log.warning("config record ignored", seq=record.seq, reason=str(exc))

    async def _reconcile_configs(self) -> None:
        while True:
            applied = await self._configs.get()
            try:
                await self.apply_config(applied)
            except Exception as exc:  # the bus away mid-change: the next config, or a restart, converges
                self._log.error("webhook endpoints not reconciled", version=applied.version, error=str(exc))

    async def apply_config(self, applied: wire.ConfigEnvelope) -> None:
        """WEB-1, INT-2: the endpoints of the config in force, reconciled with the running
        lanes and their consumer slots."""
        if applied.version <= self.config_version:
            return
        try:
            config = decode_config(applied)
        except ConfigError as exc:
            self._log.warning("config does not validate; webhook endpoints unchanged",
                              version=applied.version, reason=_scrub_config_error(str(exc), applied))
            return
        wanted, left_out = endpoints_from_config(config, self._secret_of)
        for label, why in left_out:  # SEC-9: names the reference, never a secret
            self._log.error("webhook endpoint left out: its secret cannot be read", endpoint=label, reason=why,
                            version=applied.version)
        slots = assign_slots(await self._slots_held(), [e.label for e in wanted], streams.WEBHOOK_SLOTS)
        for label in slots.left_out:
            self._log.error("webhook endpoint left out: every consumer slot is taken", endpoint=label,
                            slots=streams.WEBHOOK_SLOTS)
        wanted = [e for e in wanted if e.label in slots.slots]
        plan = plan_reload({label: lane.endpoint for label, lane in self.lanes.items()}, wanted)
        for label in plan.removed:
            lane = self.lanes.pop(label)
            await lane.close(0.0, give_back=False)
            forget(label)
        for slot in slots.freed:  # an endpoint removed: its consumer and what it still held go
            try:
                await self._js.delete_consumer(STREAM, streams.consumer_name(SERVICE, STREAM, slot))
            except NotFoundError:
                pass
        for endpoint in plan.updated:
            lane = self.lanes[endpoint.label]
            refilter = endpoint.subjects != lane.endpoint.subjects
            lane.update(endpoint)
            if refilter:
                await lane.ensure_consumer()
        for endpoint in plan.added:
            lane = Lane(self._ctx, endpoint, slots.slots[endpoint.label], self._settings, rejects=self._rejects,
                        clock=self._clock)
            await lane.ensure_consumer()
            lane.start().add_done_callback(self._lane_ended)
            self.lanes[endpoint.label] = lane
        self.config_version = applied.version
        CONFIG_VERSION.set(applied.version)
        ENDPOINTS.set(len(self.lanes))
        self._log.info("webhook endpoints in force", version=applied.version, endpoints=[
            {"endpoint": e.label, "slot": slots.slots[e.label],
             "events": sorted(e.events) if e.events is not None else "all",
             "filter": e.filter, "maxAttempts": e.max_attempts} for e in wanted])

    async def _slots_held(self) -> dict[int, str | None]:
        """Which slots have a consumer, and the endpoint each records."""
        async def owner(slot: int) -> tuple[int, str | None] | None:
            try:
                info = await self._js.consumer_info(STREAM, streams.consumer_name(SERVICE, STREAM, slot))
            except NotFoundError:
                return None
            return slot, (info.config.metadata or {}).get(SLOT_OWNER)

        found = await asyncio.gather(*(owner(slot) for slot in range(streams.WEBHOOK_SLOTS)))
        return dict(held for held in found if held is not None)

    def _lane_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and not self._failed.done():
            self._failed.set_exception(task.exception())  # type: ignore[arg-type]

    # ------------------------------------------------------------------ replay

    async def _on_replay(self, msg: Msg) -> None:
        try:
            actor = subjects.decode_token(msg.subject.rpartition(".")[2])
        except subjects.SubjectError:
            actor = "?"
        try:
            request = msgspec.json.decode(msg.data, type=ReplayRequest)
        except msgspec.ValidationError as exc:
            await msg.respond(msgspec.json.encode(ReplayAnswer(endpoint="", error=f"not a replay request: {exc}")))
            return
        except msgspec.DecodeError:
            await msg.respond(msgspec.json.encode(ReplayAnswer(endpoint="", error="not a replay request: not JSON")))
            return
        try:
            answer = await self.replay(request.endpoint, request.since)
        except Exception as exc:  # HP_DEAD_LETTERS unreadable just now: said to the asker, who may retry
            answer = ReplayAnswer(endpoint=request.endpoint, error=f"dead letters not read: {exc}; retry")
        self._log.info("webhook replay requested", actor=actor, endpoint=request.endpoint,
                       since=wire.rfc3339(request.since), queued=answer.queued, error=answer.error)
        await msg.respond(msgspec.json.encode(answer))

    async def replay(self, label: str, since: datetime) -> ReplayAnswer:
        """INT-2: the dead letters of endpoint ``label`` recorded since ``since``, queued for
        delivery again (signed afresh, same event id). Each stays in HP_DEAD_LETTERS: a replay
        that fails again is the same dead letter, and may be replayed again."""
        lane = self.lanes.get(label)
        if lane is None:
            known = ", ".join(sorted(self.lanes)) or "none"
            return ReplayAnswer(endpoint=label, error=f"no webhook endpoint {label} in force (endpoints: {known})")
        stored = await read_all(self._ctx.nc, self._js, deadletters.STREAM, subjects.dead_letters(SERVICE),
                                start_time=since)
        letters = [letter for letter in map(deadletters.parse, stored)
                   if letter.endpoint == label and letter.reason == "undelivered"]
        return ReplayAnswer(endpoint=label, queued=lane.replay(letters))

    # ------------------------------------------------------------------ lag

    async def _watch_lag(self) -> None:
        """INT-2: how far each endpoint is behind, from its consumer (what is stored and not
        read, and what is read and not settled)."""
        while True:
            await asyncio.sleep(LAG_EVERY_S)
            for label, lane in list(self.lanes.items()):
                try:
                    info = await self._js.consumer_info(STREAM, lane.consumer)
                except Exception:  # gone meanwhile, or the bus away: the next round
                    continue
                if self.lanes.get(label) is lane:
                    LAG.labels(label).set(info.num_pending + info.num_ack_pending)

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        self._stopping.set()

    async def _wait_stopping(self) -> None:
        await self._stopping.wait()

    async def run(self) -> None:
        stopping: asyncio.Future[None] = asyncio.ensure_future(self._wait_stopping())
        try:
            await asyncio.wait({stopping, self._failed}, return_when=asyncio.FIRST_COMPLETED)
            if self._failed.done():
                self._failed.result()  # a lane's pull loop died (the connection closed): say so
        finally:
            stopping.cancel()
            await self.shutdown()

    async def shutdown(self) -> None:
        if self._replays is not None:
            try:
                await self._replays.unsubscribe()
            except Exception:
                pass
            self._replays = None
        self._config_stop.set()
        if self._follow is not None:
            await asyncio.gather(self._follow, return_exceptions=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        lanes, self.lanes = list(self.lanes.values()), {}
        await asyncio.gather(*(lane.close(self._settings.drain_s) for lane in lanes))
        for lane in lanes:
            forget(lane.endpoint.label)


def _scrub_config_error(message: str, applied: wire.ConfigEnvelope) -> str:
    """A config error may quote a value; never let it quote a webhook's secret or URL."""
    hooks = applied.config.get("nodeEventWebhooks")
    for hook in hooks if isinstance(hooks, list) else []:
        if not isinstance(hook, dict):
            continue
        for key in ("secret", "url"):
            value = hook.get(key)
            if isinstance(value, str) and value:
                message = message.replace(value, "***")
    return message


def _read_head(path: str, limit: int) -> bytes:
    with open(path, "rb") as found:
        return found.read(limit)
