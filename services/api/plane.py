"""The control plane's own health, as needs-attention items with the fix named (UI-2): a
service's durable consumer far behind its stream, the ``substrate-nodes`` bucket near its
cap, inputs set aside in ``HP_DEAD_LETTERS``. Pure: ``judge`` takes what JetStream said
(``live.Plane`` asks it, at most every few seconds) and says what is wrong.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from healthplane.contracts import streams

# A consumer this many records behind, or more than one record per node (a whole report
# interval of the fleet), is far behind: a fold that keeps up is a batch or two behind.
CONSUMER_BEHIND_AT: Final = 10_000
BUCKET_FULL_SHARE: Final = 0.8  # JetStream refuses new nodes' reports once the bucket is full (BRG-1)
DEAD_LETTERS: Final = "HP_DEAD_LETTERS"
NODES_BUCKET_STREAM: Final = f"KV_{streams.NODES_BUCKET}"


@dataclass(frozen=True, slots=True)
class Consumer:
    stream: str
    name: str
    pending: int


@dataclass(frozen=True, slots=True)
class Bucket:
    used: int
    capacity: int  # bytes; 0 or less: no cap


@dataclass(frozen=True, slots=True)
class Problem:
    key: str  # stable while the problem lasts: the dashboard dates it from its first sighting
    kind: str
    message: str
    fix: str


def service_of(consumer: str) -> str:
    """``scorer_2-HP_ASSESSMENTS`` -> ``scorer`` (``streams.consumer_name``); a name of another
    form is its own answer."""
    head = consumer.rpartition("-")[0] or consumer  # the stream's name, last, has no '-'
    return head.rpartition("_")[0] or head


def behind_at(fleet: int) -> int:
    return max(CONSUMER_BEHIND_AT, fleet)


def judge(consumers: Iterable[Consumer], bucket: Bucket | None, dead_letters: int, fleet: int) -> list[Problem]:
    """What is wrong with the control plane itself, each with what to do about it."""
    found: list[Problem] = []
    limit = behind_at(fleet)
    for consumer in consumers:
        if consumer.pending < limit:
            continue
        service = service_of(consumer.name)
        if service == "webhook-dispatcher":
            fix = ("an endpoint is slow or down: `healthplane webhooks list` names it and its lag; the dispatcher "
                   "retries with backoff and dead-letters what it gives up on (INT-2)")
        else:
            fix = (f"check that {service} runs (`healthplane up`'s table, its /readyz and log) and is not failing "
                   f"on one record (`healthplane dead-letters list`); if it is only slow, run it as more partitions "
                   f"(`up --partitions`, HA-4)")
        found.append(Problem(f"consumer:{consumer.stream}:{consumer.name}", "consumer-behind",
                             f"{service}'s consumer {consumer.name} is {consumer.pending:,} records behind "
                             f"{consumer.stream}", fix))
    if bucket is not None and bucket.capacity > 0 and bucket.used >= BUCKET_FULL_SHARE * bucket.capacity:
        share = 100 * bucket.used / bucket.capacity
        found.append(Problem(
            "bucket:substrate-nodes", "bucket-full",
            f"the {streams.NODES_BUCKET} bucket holds {bucket.used:,} of {bucket.capacity:,} bytes ({share:.0f} %)",
            "raise substrate.nodesBucketMaxBytes in the cluster config (`config apply`), then restart "
            "substrate-bridge or run `healthplane streams converge`: a full bucket refuses new nodes' resource "
            "reports (docs/substrate-bridge.md)"))
    if dead_letters > 0:
        found.append(Problem(
            "dead-letters", "dead-letters", f"{dead_letters:,} input(s) set aside in {DEAD_LETTERS}",
            "`healthplane dead-letters list` shows each with the service and the error; fix the cause, then "
            "`healthplane dead-letters replay ID`"))
    return found
