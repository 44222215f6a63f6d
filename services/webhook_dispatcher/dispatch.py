"""``healthplane service webhook-dispatcher``: node events to HTTP endpoints (WEB-1..WEB-4).

One durable pull consumer reads ``HP_NODE_EVENTS`` through the shared pull loop. Each event is
handed to the bounded queue of every endpoint whose filter wants it, and acked right after:
the stream is the durable record and a webhook a notification on top of it, so the
dispatcher never holds the stream for a receiver. What happens next is per endpoint: its
own queue, its own connection pool and a fixed number of workers, so a slow or dead
endpoint fills and overflows only its own queue (counted in
``healthplane_webhook_dropped_total{reason="queue_full"}``) and never delays another.

Endpoints come from ``nodeEventWebhooks`` in the cluster config, read at start and then
watched on ``hp.config``: ``healthplane config apply`` changes them without a restart.

Wiring only: the decisions are ``rules``, the HTTP adapter ``send`` and ``transport``, the
series ``metrics``. A record that is not a node event is set aside as a dead letter.
"""
from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable
from typing import Any

from nats.js.api import DeliverPolicy

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import ConfigError, decode_config
from healthplane.contracts.webhooks import signature_headers
from healthplane.runtime import configstore, consumers, metrics
from healthplane.runtime.deadletters import SetAside
from healthplane.runtime.lifecycle import ServiceContext
from healthplane.runtime.logs import LogBudget
from healthplane.runtime.publish import Publisher
from healthplane.runtime.pull import Delivery, PullLoop
from healthplane.runtime.replay import StoredMsg, follow
from healthplane_webhook_dispatcher.metrics import (
    CONFIG_VERSION,
    DELIVERIES,
    DROPPED,
    ENDPOINTS,
    LATENCY,
    QUEUE_DEPTH,
    DropReason,
    forget_queue_depth,
)
from healthplane_webhook_dispatcher.rules import (
    CONTENT_TYPE,
    SERVICE,
    BoundedQueue,
    Endpoint,
    Settings,
    after_attempt,
    backoff_delay,
    endpoints_from_config,
    envelope,
    event_type_of_subject,
    judge,
    plan_reload,
    retry_after_seconds,
    scrub,
    secret_reader,
)
from healthplane_webhook_dispatcher.send import EndpointSender

CONSUMER = "webhook-dispatcher"  # its own (contracts.streams.NAMED_DURABLES, SEC-8)
CONFIG_FOLLOW_S = 1.0  # a config change reaches the endpoints within a second
STREAM = "HP_NODE_EVENTS"


class Pending:
    """One event on its way to one or more endpoints; the body is built once, on first use."""

    __slots__ = ("_body", "event")

    def __init__(self, event: wire.NodeEvent) -> None:
        self.event = event
        self._body: bytes | None = None

    def body(self) -> bytes:
        if self._body is None:
            self._body = envelope(self.event)
        return self._body


class EndpointWorker:
    """The queue, the connection pool and the workers of one endpoint."""

    def __init__(self, endpoint: Endpoint, settings: Settings, log: Any, *,
                 clock: Callable[[], float] = time.time,
                 draw: Callable[[], float] = random.random) -> None:
        self.endpoint = endpoint
        self._settings = settings
        self._log = log.bind(endpoint=endpoint.label)
        self._clock = clock
        self._draw = draw
        self.queue: BoundedQueue[Pending] = BoundedQueue(settings.queue_size)
        self._ready = asyncio.Semaphore(0)
        self.in_flight = 0
        self.delivered = 0  # events this endpoint answered 2xx (the metric, for tests and benches)
        self._tasks: list[asyncio.Task[None]] = []
        self._closing: DropReason | None = None
        self._went_idle = asyncio.Event()
        self._overflow_log = LogBudget()
        label = endpoint.label
        self._delivered = DELIVERIES.labels(label, "delivered")
        self._latency = LATENCY.labels(label)
        self._queue_full = DROPPED.labels(label, "queue_full")
        QUEUE_DEPTH.labels(label).set_function(lambda: len(self.queue))
        # The URL is the endpoint's identity: a reload that changes it makes a new worker.
        self.sender = EndpointSender(endpoint.url, settings)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work()) for _ in range(self._settings.concurrency)]

    def offer(self, pending: Pending) -> bool:
        if self._closing is None and self.queue.offer(pending):
            self._ready.release()
            return True
        self._queue_full.inc()
        if self._overflow_log.allow(time.monotonic()):
            self._log.warning("webhook queue full; event dropped", event_id=pending.event.id,
                              event_type=pending.event.type, queue_size=self.queue.capacity,
                              dropped_since_last_line=self._overflow_log.take_suppressed())
        return False

    @property
    def idle(self) -> bool:
        return not self.queue and not self.in_flight

    async def close(self, grace_s: float, reason: DropReason) -> None:
        """Stop taking events; give what is queued ``grace_s`` to go out, then drop the rest."""
        self._closing = reason
        self._went_idle.clear()
        if not self.idle and grace_s > 0:
            try:
                await asyncio.wait_for(self._went_idle.wait(), grace_s)
            except TimeoutError:
                pass
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        left = self.queue.drain()
        if left:
            DROPPED.labels(self.endpoint.label, reason).inc(len(left))
            self._log.warning("webhook events dropped at close", reason=reason, dropped=len(left))
        await self.sender.aclose()

    # ------------------------------------------------------------------ delivery

    async def _work(self) -> None:
        while True:
            await self._ready.acquire()
            pending = self.queue.take()
            if pending is None:
                continue
            self.in_flight += 1
            try:
                await self._deliver(pending)
            except asyncio.CancelledError:
                DROPPED.labels(self.endpoint.label, self._closing or "shutdown").inc()
                raise
            finally:
                self.in_flight -= 1
                if self.idle:
                    self._went_idle.set()

    async def _deliver(self, pending: Pending) -> None:
        """WEB-3/WEB-4: every attempt signed afresh with the same event id; retried with
        backoff up to ``maxAttempts``; 2xx ends it, a 4xx other than 408/429 too."""
        attempt = 0
        while True:
            attempt += 1
            endpoint = self.endpoint  # a reload may change secret or maxAttempts meanwhile
            status, detail, retry_after = await self._attempt(endpoint, pending)
            match after_attempt(status, attempt, endpoint.max_attempts):
                case "delivered":
                    return
                case "rejected" | "max_attempts" as reason:
                    self._drop(pending, reason, attempt, detail)
                    return
            await asyncio.sleep(backoff_delay(attempt, self._draw(), base_s=self._settings.backoff_base_s,
                                              cap_s=self._settings.backoff_cap_s, retry_after_s=retry_after))

    async def _attempt(self, endpoint: Endpoint, pending: Pending) -> tuple[int | None, str, float | None]:
        body = pending.body()
        headers = signature_headers(endpoint.secret, pending.event.id, int(self._clock()), body)
        headers["Content-Type"] = CONTENT_TYPE
        started = time.perf_counter()
        try:
            status, retry_after = await self.sender.post(body, headers)
        except Exception as exc:  # no answer (httpx.HTTPError and anything odder): a failed
            # attempt, retried like the others; a worker never dies of a receiver.
            self._latency.observe(time.perf_counter() - started)
            DELIVERIES.labels(endpoint.label, "error").inc()
            return None, scrub(f"{type(exc).__name__}: {exc}".rstrip(": "), endpoint), None
        self._latency.observe(time.perf_counter() - started)
        verdict = judge(status)
        if verdict == "delivered":
            self.delivered += 1
            self._delivered.inc()
        else:
            DELIVERIES.labels(endpoint.label, "rejected" if verdict == "rejected" else "failed").inc()
        return status, f"HTTP {status}", retry_after_seconds(retry_after)

    def _drop(self, pending: Pending, reason: DropReason, attempts: int, detail: str) -> None:
        DROPPED.labels(self.endpoint.label, reason).inc()
        self._log.warning("webhook delivery dropped", reason=reason, event_id=pending.event.id,
                          event_type=pending.event.type, node_id=pending.event.node_id,
                          attempts=attempts, last_result=detail)


class Dispatcher:
    def __init__(self, ctx: ServiceContext, settings: Settings, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._ctx = ctx
        self._clock = clock
        self._js = ctx.js
        self._log = ctx.log
        self._settings = settings
        self.workers: dict[str, EndpointWorker] = {}
        self.config_version = 0
        self._closing: set[asyncio.Task[None]] = set()
        self._config_follow: Any = None
        self._set_aside = SetAside(ctx.nc, Publisher(ctx.nc), SERVICE, f"{SERVICE}.0", ctx.log)
        self._processed = metrics.MESSAGES_PROCESSED.labels(SERVICE, STREAM)
        # SEC-9: secrets come from this host (a small local file, read at each config change).
        self._secret_of = secret_reader(_read_head, os.environ)
        self.loop = PullLoop(ctx.nc, STREAM, CONSUMER, self.handle, service=SERVICE, batch=512,
                             log=ctx.log, recreate=self.ensure_consumer)

    async def start(self) -> None:
        """Endpoints first, then events: nothing is acked before the config is known."""
        await self.ensure_consumer()
        found = await configstore.read(self._js)
        for record in found.skipped:
            self._log.warning("config record skipped", seq=record.seq, reason=record.reason)
        if found.in_force is not None:
            self.apply_config(found.in_force.envelope)
        else:
            self._log.info("no cluster config applied yet; no webhook endpoints")
        # From past the newest record, valid or not: the skipped ones were named once already.
        # Followed by direct gets, not a consumer of its own: a consumer on HP_CONFIG would
        # need a grant that reaches every service's durable there (SEC-8).
        self._config_stop = asyncio.Event()
        self._config_follow = asyncio.create_task(follow(
            self._ctx.nc, configstore.STREAM, subjects.CONFIG, self._on_configs, start_seq=found.last_seq + 1,
            stopping=self._config_stop, every_s=CONFIG_FOLLOW_S))

    async def ensure_consumer(self) -> None:
        # NEW on first creation: a first deployment notifies from now on instead of
        # replaying 90 days of history into every receiver. After that the durable
        # resumes from its ack floor.
        await consumers.ensure(self._js, STREAM, consumers.durable(
            CONSUMER, deliver=DeliverPolicy.NEW, filter_subjects=("hp.event.>",), ack_wait_s=30.0,
            max_ack_pending=4096))

    # ------------------------------------------------------------------ config

    def _on_configs(self, records: list[StoredMsg], caught_up: bool) -> None:
        for record in records:
            try:
                self.apply_config(wire.decode(wire.ConfigEnvelope, record.data))
            except wire.WireError as exc:
                self._log.warning("config record ignored", seq=record.seq, reason=str(exc))

    def apply_config(self, applied: wire.ConfigEnvelope) -> None:
        """WEB-1: the endpoints of the config in force, reconciled with the running ones."""
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
        current = {key: worker.endpoint for key, worker in self.workers.items()}
        plan = plan_reload(current, wanted)
        for key in plan.removed:
            self._close_in_background(self.workers.pop(key))
        for endpoint in plan.updated:
            self.workers[endpoint.key].endpoint = endpoint
        for endpoint in plan.added:
            worker = EndpointWorker(endpoint, self._settings, self._log, clock=self._clock)
            worker.start()
            self.workers[endpoint.key] = worker
        self.config_version = applied.version
        CONFIG_VERSION.set(applied.version)
        ENDPOINTS.set(len(self.workers))
        self._log.info("webhook endpoints in force", version=applied.version, endpoints=[
            {"endpoint": e.label, "events": sorted(e.events) if e.events is not None else "all",
             "maxAttempts": e.max_attempts} for e in wanted])

    def _close_in_background(self, worker: EndpointWorker) -> None:
        async def close() -> None:
            await worker.close(0.0, "endpoint_removed")
            # The label may have come back with another URL (only the query changed).
            if worker.endpoint.label not in {w.endpoint.label for w in self.workers.values()}:
                forget_queue_depth(worker.endpoint.label)

        task = asyncio.create_task(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    # ------------------------------------------------------------------ events

    async def handle(self, batch: list[Delivery]) -> None:
        """Hand each event to the queue of every endpoint that wants it, then ack (the pull
        loop settles the batch when this returns). Never waits on a receiver; a malformed
        record waits only for its dead letter to be stored."""
        workers = list(self.workers.values())
        for delivery in batch:
            event_type = event_type_of_subject(delivery.msg.subject)
            if event_type is None:
                await self._set_aside.reject(delivery, "not a node event subject")
                continue
            targets = [w for w in workers if w.endpoint.wants(event_type)]
            if not targets:
                continue
            try:
                event = wire.decode(wire.NodeEvent, delivery.msg.data)
            except wire.WireError as exc:
                await self._set_aside.reject(delivery, str(exc))
                continue
            pending = Pending(event)
            for worker in targets:
                worker.offer(pending)
        self._processed.inc(len(batch))

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        self.loop.stop()

    async def run(self) -> None:
        try:
            await self.loop.run()
        finally:
            await self.shutdown()

    async def shutdown(self) -> None:
        if self._config_follow is not None:
            self._config_stop.set()
            await asyncio.gather(self._config_follow, return_exceptions=True)
        workers, self.workers = list(self.workers.values()), {}
        await asyncio.gather(*(w.close(self._settings.drain_s, "shutdown") for w in workers),
                             *self._closing)
        for worker in workers:
            forget_queue_depth(worker.endpoint.label)


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
