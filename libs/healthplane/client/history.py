"""Folding the node events stored since a time (``rules backtest``, ``breakfix``): one read of
``HP_NODE_EVENTS`` by direct gets (a reader's rights suffice, SEC-8), in stream order, the
wanted types picked by the subject's last token before any decode.

One subject filter, not one per type: a stream-order merge of several filters holds every
record read in memory first (``replay.read_all``), which a month of a fleet's events is not."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.runtime.replay import StoredMsg, read_all

STREAM = "HP_NODE_EVENTS"


@dataclass(slots=True)
class Read:
    events: int = 0  # of the wanted types, folded
    skipped: int = 0  # records that did not decode, passed over
    seconds: float = 0.0


async def fold_since(nc: NATS, js: JetStreamContext, since: datetime, types: Collection[str],
                     fold: Callable[[wire.NodeEvent], None], cluster: str | None = None) -> Read:
    """Hand every stored event of ``types`` since ``since`` (of ``cluster``) to ``fold``."""
    found = Read()
    decode = msgspec.json.Decoder(wire.NodeEvent).decode
    wanted = frozenset(types)
    started = time.perf_counter()

    def sink(msg: StoredMsg) -> None:
        if msg.subject.rpartition(".")[2] not in wanted:
            return
        try:
            event = decode(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            found.skipped += 1
            return
        found.events += 1
        fold(event)

    filter_ = f"hp.event.{subjects.encode_token(cluster)}.>" if cluster else "hp.event.>"
    await read_all(nc, js, STREAM, filter_, start_time=since, sink=sink)
    found.seconds = time.perf_counter() - started
    return found
