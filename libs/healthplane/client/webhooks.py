"""Webhook endpoints as the bus shows them (INT-2): their consumer slots and how far behind
each is, and asking the webhook dispatcher to send an endpoint's dead letters again.

An endpoint's consumer records its label (the URL without credentials, what the logs and
metrics name); the secret and the URL itself stay on the dispatcher's host (SEC-9), so only
the dispatcher can deliver: ``replay`` is a request it answers on ``hp.webhook.replay.{actor}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import msgspec
from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from healthplane.client.connection import Identity, acked_or_refused
from healthplane.client.errors import EXIT_RETRY, CommandFailed
from healthplane.contracts import streams, subjects
from healthplane.contracts.webhooks import ReplayAnswer, ReplayRequest

STREAM = "HP_NODE_EVENTS"
SERVICE = "webhook-dispatcher"
REPLAY_TIMEOUT_S = 30.0  # reading the dead letters is the dispatcher's: a large backlog takes a moment


@dataclass(frozen=True, slots=True)
class EndpointState:
    endpoint: str
    slot: int
    consumer: str
    filters: tuple[str, ...]
    unread: int  # stored and not yet read by the dispatcher
    held: int    # read and not yet settled (being delivered, or waiting for a worker)

    def to_json(self) -> dict[str, object]:
        return {"endpoint": self.endpoint, "slot": self.slot, "consumer": self.consumer,
                "filters": list(self.filters), "unread": self.unread, "held": self.held,
                "lag": self.unread + self.held}


async def endpoints(nc: NATS) -> list[EndpointState]:
    """Every endpoint that holds a consumer slot, in slot order."""
    names = {streams.consumer_name(SERVICE, STREAM, slot): slot for slot in range(streams.WEBHOOK_SLOTS)}
    found = []
    for info in await nc.jetstream().consumers_info(STREAM):
        slot = names.get(info.name)
        if slot is None:
            continue
        config = info.config
        filters = tuple(config.filter_subjects or ([config.filter_subject] if config.filter_subject else []))
        found.append(EndpointState((config.metadata or {}).get(streams.WEBHOOK_SLOT_OWNER, "?"), slot, info.name,
                                   filters, info.num_pending or 0, info.num_ack_pending or 0))
    return sorted(found, key=lambda state: state.slot)


async def replay(nc: NATS, who: Identity, endpoint: str, since: datetime) -> ReplayAnswer:
    """Ask the dispatcher to send ``endpoint``'s dead letters recorded since ``since`` again;
    its answer says how many it queued. No dispatcher running is retryable."""
    request = msgspec.json.encode(ReplayRequest(endpoint=endpoint, since=since))
    try:
        reply = await acked_or_refused(nc, who, "ask for a webhook replay (an admin's)", nc.request(
            subjects.webhook_replay(who.actor), request, timeout=REPLAY_TIMEOUT_S))
    except NoRespondersError as exc:
        raise CommandFailed("no webhook dispatcher is running to replay; retry once it is", EXIT_RETRY) from exc
    except (TimeoutError, NatsTimeoutError) as exc:
        raise CommandFailed(f"the webhook dispatcher did not answer within {REPLAY_TIMEOUT_S:g} s; retry",
                            EXIT_RETRY) from exc
    try:
        answer = msgspec.json.decode(reply.data, type=ReplayAnswer)
    except msgspec.MsgspecError as exc:
        raise CommandFailed(f"the webhook dispatcher's answer is not one: {exc}") from exc
    if answer.error is not None:
        raise CommandFailed(answer.error)
    return answer
