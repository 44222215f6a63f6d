"""Dead letters: inputs a service could not process, kept with why (``HP_DEAD_LETTERS``).

An input lands here when its service's core raised on it (a bug, or a record no rule
foresaw), when it is malformed, or when an output it caused is one JetStream refuses for good
(too large, a subject no stream takes). The service records it, counts it
(``healthplane_dead_letters_total{service,reason}``), acks it and goes on with the next
input: one bad record never wedges a service (REL-3).

A dead letter is the input itself: its payload, byte for byte, as the message body (so
``healthplane dead-letters replay`` can send it again once the bug is fixed), and what
happened in headers (``Hp-Dead-*``). On subject ``hp.dead.{service}.{input stream}``, with a
deterministic ``Nats-Msg-Id`` so a retry never records one twice. A service reads its own
dead letters at start and skips those inputs while it replays: its state is that of a
replay without them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane import __version__
from healthplane.contracts import subjects
from healthplane.runtime import metrics
from healthplane.runtime.backoff import Backoff
from healthplane.runtime.logs import LogBudget
from healthplane.runtime.publish import Outbound, Publisher, PublishError
from healthplane.runtime.pull import Delivery
from healthplane.runtime.replay import StoredMsg, read_all

STREAM: Final = "HP_DEAD_LETTERS"
# ``undelivered``: a webhook delivery that spent its attempts (INT-2); its endpoint in
# ``Hp-Dead-Endpoint``, sent again by ``healthplane webhooks replay``, never re-published.
Reason = Literal["malformed", "error", "refused", "undelivered"]
# Room left in a message for the headers: an input as large as the server takes still fits,
# its payload cut short and marked so (a truncated dead letter cannot be replayed).
HEADROOM_BYTES: Final = 4096
ERROR_CHARS: Final = 500

SERVICE, PRODUCER, INPUT_STREAM, INPUT_SEQ, INPUT_SUBJECT = (
    "Hp-Dead-Service", "Hp-Producer", "Hp-Dead-Stream", "Hp-Dead-Seq", "Hp-Dead-Subject")
REASON, ERROR, VERSION, TRUNCATED = "Hp-Dead-Reason", "Hp-Dead-Error", "Hp-Service-Version", "Hp-Dead-Truncated"
ENDPOINT = "Hp-Dead-Endpoint"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead letter as read back."""

    id: int  # its sequence in HP_DEAD_LETTERS
    service: str
    producer: str
    input_stream: str
    input_seq: int
    input_subject: str
    reason: str
    error: str
    service_version: str
    recorded_at: datetime | None
    payload: bytes
    truncated: bool
    endpoint: str | None = None  # a webhook's label, for an undelivered event

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "id": self.id, "service": self.service, "inputStream": self.input_stream,
            "inputSeq": self.input_seq, "inputSubject": self.input_subject, "reason": self.reason,
            "error": self.error, "serviceVersion": self.service_version,
            "recordedAt": self.recorded_at.isoformat().replace("+00:00", "Z") if self.recorded_at else None,
            "bytes": len(self.payload), "truncated": self.truncated}
        if self.endpoint is not None:
            out["endpoint"] = self.endpoint
        return out


def one_line(text: str) -> str:
    return " ".join(text.split())[:ERROR_CHARS]


def record(*, service: str, producer: str, input_stream: str, input_seq: int, input_subject: str,
           payload: bytes, reason: Reason, error: str, max_payload: int,
           endpoint: str | None = None) -> tuple[str, bytes, dict[str, str]]:
    """The dead letter of one input: (subject, body, headers), ready to store."""
    headers = {
        SERVICE: service, PRODUCER: producer, INPUT_STREAM: input_stream, INPUT_SEQ: str(input_seq),
        INPUT_SUBJECT: input_subject, REASON: reason, ERROR: one_line(error) or reason, VERSION: __version__,
        "Nats-Msg-Id": f"dead:{producer}:{input_stream}:{input_seq}",
    }
    if endpoint is not None:
        headers[ENDPOINT] = endpoint
    room = max(0, max_payload - HEADROOM_BYTES)
    if len(payload) > room:
        payload, headers[TRUNCATED] = payload[:room], "true"
    return subjects.dead_letter(service, input_stream), payload, headers


def parse(msg: StoredMsg) -> DeadLetter:
    headers: Mapping[str, str] = msg.headers
    seq = headers.get(INPUT_SEQ, "0")
    return DeadLetter(
        id=msg.seq, service=headers.get(SERVICE, "?"), producer=headers.get(PRODUCER, ""),
        input_stream=headers.get(INPUT_STREAM, "?"), input_seq=int(seq) if seq.isdigit() else 0,
        input_subject=headers.get(INPUT_SUBJECT, ""), reason=headers.get(REASON, "?"),
        error=headers.get(ERROR, ""), service_version=headers.get(VERSION, "?"), recorded_at=msg.time,
        payload=msg.data or b"", truncated=headers.get(TRUNCATED) == "true", endpoint=headers.get(ENDPOINT))


async def read(nc: NATS, js: JetStreamContext, service: str | None = None) -> list[DeadLetter]:
    return [parse(m) for m in await read_all(nc, js, STREAM, subjects.dead_letters(service))]


async def skipped_inputs(nc: NATS, js: JetStreamContext, service: str, producer: str) -> set[tuple[str, int]]:
    """The inputs ``producer`` dead-lettered: a replay passes over them."""
    return {(d.input_stream, d.input_seq) for d in await read(nc, js, service)
            if d.producer == producer}


class SetAside:
    """The one path for input a service cannot process (processor, bridge, dispatcher):
    :meth:`reject` a malformed delivery (terminated, counted, logged, dead-lettered) and
    :meth:`store` a dead letter, retried until stored; ``before_write`` is asked first (a
    lease fence that raises once this replica may no longer write)."""

    def __init__(self, nc: NATS, publisher: Publisher, service: str, producer: str, log: Any = None,
                 before_write: Callable[[], object] | None = None) -> None:
        self._nc, self._publisher, self._log = nc, publisher, log
        self.service, self.producer = service, producer
        self._before_write = before_write
        # A peer flooding garbage gets one line per interval, the rest counted in it: every
        # rejection is still counted and dead-lettered.
        self._log_budget = LogBudget(interval_s=10.0)

    async def reject(self, delivery: Delivery, why: str, kind: str = "malformed") -> None:
        delivery.term(why)
        metrics.MESSAGES_REJECTED.labels(self.service, delivery.stream, kind).inc()
        if self._log is not None and self._log_budget.allow(time.monotonic()):
            self._log.warning("input rejected", stream=delivery.stream, seq=delivery.stream_seq,
                              subject=delivery.msg.subject, reason=why,
                              suppressed_since_last=self._log_budget.take_suppressed())
        await self.dead_letter(delivery, "malformed", why)

    async def dead_letter(self, delivery: Delivery, reason: Reason, why: str) -> None:
        await self.store(record(
            service=self.service, producer=self.producer, input_stream=delivery.stream,
            input_seq=delivery.stream_seq, input_subject=delivery.msg.subject, payload=delivery.msg.data or b"",
            reason=reason, error=why, max_payload=self._nc.max_payload), reason, why)

    async def store(self, dead: Outbound, reason: str, why: str) -> None:
        """Retried until stored: a dead letter is the one record of that input there is."""
        backoff = Backoff(0.2, 5.0)
        while True:
            if self._before_write is not None:
                self._before_write()
            try:
                await self._publisher.store_all([dead])
                break
            except PublishError as exc:
                if self._nc.is_closed:
                    raise
                delay = backoff.next()
                if self._log is not None:
                    self._log.warning("dead letter not stored, retrying", error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
        metrics.DEAD_LETTERS.labels(self.service, reason).inc()
        if self._log is not None and reason != "malformed":  # malformed inputs are logged as rejected
            headers = dead[2] or {}
            self._log.error("input set aside as a dead letter", stream=headers.get(INPUT_STREAM),
                            seq=headers.get(INPUT_SEQ), subject=headers.get(INPUT_SUBJECT),
                            reason=reason, error=one_line(why))
