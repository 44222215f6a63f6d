"""Federation (FED): one hub, many member control planes, on NATS's own multi-cluster features.

The transport (docs/federation.md, with the measurements behind it):

* every member's nats-server runs its own JetStream *domain* (its cluster's name) and opens a
  *leaf node* connection to the hub with the member credentials the hub issued
  (``healthplane federation attach``); the hub's server runs domain ``hub``;
* the member keeps one durable consumer on its own ``HP_NODES`` for the hub (``hub``: its own
  cluster's views, the latest per node first, then every change), delivering on a subject
  only that member may publish to (``hp.fed.deliver.<member>``); the hub keeps one
  *aggregate* stream per member, ``HP_FED_<member>``, that *sources* through that consumer
  (nats-server's durable sourcing) and keeps the latest view per node. nats-server moves
  the records, acks them by flow control and resumes where it stopped after an outage; as
  ``HP_NODES`` keeps only the latest view per node, a catch-up moves each changed node once;
* reachability is a fact the hub's server already keeps: the source's ``active``, the time
  since the member's consumer last delivered anything, a record or its idle heartbeat
  (every second while the link is up). Past :data:`UNREACHABLE_AFTER_S` the member's nodes
  report no health at all, "unreachable since T", never their last answer (FED-2);
* commands stay the member's (FED-3): a command for a member's node is the ordinary
  ``hp.cmd.*`` record, which the leaf carries to the member's own ``HP_COMMANDS``, and the
  member's eviction decides it; its outcome comes back over the same link. What else may
  cross is bounded twice: by the member credentials' permissions on the hub
  (``permissions.member``) and by the member's own leaf configuration, which refuses from
  the hub any new consumer and any stream change (``natsserver.Federation``).

Pure parts (names, configs, :class:`Member` and its rules) are tested directly; the reads
are the CLI's and the API's.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext

from healthplane.client import reads
from healthplane.client.errors import EXIT_RETRY, CommandFailed
from healthplane.client.nodes import find_node
from healthplane.contracts import permissions, subjects, views, wire
from healthplane.contracts.permissions import HUB_CONSUMER, SOURCED_STREAM

HUB_DOMAIN: Final = "hub"
AGGREGATE_PREFIX: Final = "HP_FED_"
HEARTBEAT_NS: Final = 1_000_000_000  # the hub's consumer's idle heartbeat: what "active" counts
# A member's consumer sends an idle heartbeat about every second: ten missed ones is a link
# that is down, not a slow one. HEALTHPLANE_FEDERATION_UNREACHABLE_AFTER_S changes it.
UNREACHABLE_AFTER_S: Final = 10.0
_NAME_RE: Final = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")


UNREACHABLE_ENV: Final = "HEALTHPLANE_FEDERATION_UNREACHABLE_AFTER_S"


class FederationError(CommandFailed):
    """One line naming what is wrong (exit 1)."""


def unreachable_after_s(environ: Mapping[str, str] = os.environ) -> float:
    """FED-2's threshold: :data:`UNREACHABLE_AFTER_S`, or ``$HEALTHPLANE_FEDERATION_UNREACHABLE_AFTER_S``."""
    text = environ.get(UNREACHABLE_ENV)
    if not text:
        return UNREACHABLE_AFTER_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise FederationError(f"{UNREACHABLE_ENV}={text!r}: a number of seconds above 0")
    return value


def check_member_name(name: str) -> str:
    """A member's name is its cluster's name, its JetStream domain and part of a stream name:
    lower-case letters, digits, ``-`` and ``_``, at most 32, and not the hub's own domain."""
    if not _NAME_RE.fullmatch(name):
        raise FederationError(f"cluster name {name!r} cannot join a federation: use 1-32 lower-case letters, "
                              "digits, '-' or '_', starting with a letter or digit")
    if name == HUB_DOMAIN:
        raise FederationError(f"cluster name {HUB_DOMAIN!r} is the hub's own; choose another")
    return name


def aggregate_stream(member: str) -> str:
    return AGGREGATE_PREFIX + check_member_name(member)


def aggregate_config(member: str, replicas: int = 1) -> dict[str, Any]:
    """The hub's copy of one member's node views: sourced through the consumer the member
    made for the hub (:func:`hub_consumer_config`), never published to. nats-server's durable
    sourcing (2.14+): the hub holds no consumer of its own in the member, and while the member
    is away the hub listens on the deliver subject, so the member's first heartbeat when it
    returns starts the catch-up at once instead of after the source's retry backoff."""
    return {
        "name": aggregate_stream(member),
        "description": f"node views of federation member {member}, sourced from its {SOURCED_STREAM}",
        "subjects": [],
        "retention": "limits",
        "storage": "file",
        "max_msgs_per_subject": 1,
        "num_replicas": replicas,
        "allow_direct": True,
        "sources": [{"name": SOURCED_STREAM, "external": {"api": f"$JS.{member}.API"},
                     "consumer": {"name": HUB_CONSUMER, "deliver_subject": permissions.deliver_subject(member)}}],
    }


def hub_consumer_config(cluster: str) -> dict[str, Any]:
    """The durable consumer a member keeps on its own ``HP_NODES`` for the hub (``up
    --attach`` makes it): its own cluster's views only, the latest of each node first and
    every change after, delivered to the deliver subject only this member may publish on."""
    return {
        "durable_name": HUB_CONSUMER,
        "description": "the federation hub's source of this cluster's node views (FED-1)",
        "deliver_subject": permissions.deliver_subject(check_member_name(cluster)),
        "deliver_policy": "last_per_subject",
        "filter_subject": subjects.node_views(cluster),
        "ack_policy": "flow_control",
        "flow_control": True,
        "idle_heartbeat": HEARTBEAT_NS,
        "max_deliver": -1,
    }


async def attach(nc: NATS, member: str, replicas: int = 1) -> None:
    """Create the member's aggregate on the hub (again: a no-op)."""
    config = aggregate_config(member, replicas)
    try:
        await _api(nc, f"$JS.API.STREAM.INFO.{config['name']}", {})
    except FederationError as exc:
        if exc.code == EXIT_RETRY:  # no answer is not "no such stream"
            raise
        await _api(nc, f"$JS.API.STREAM.CREATE.{config['name']}", config)


async def offer_to_hub(nc: NATS, cluster: str) -> None:
    """On a member: the consumer the hub sources through (made again: a no-op)."""
    config = hub_consumer_config(cluster)
    await _api(nc, f"$JS.API.CONSUMER.DURABLE.CREATE.{SOURCED_STREAM}.{HUB_CONSUMER}",
               {"stream_name": SOURCED_STREAM, "config": config})


# ---------------------------------------------------------------------------- members


@dataclass(frozen=True, slots=True)
class Member:
    """What the hub knows of one member: when its source last delivered (``None``: never),
    how far behind the source is, and what the server says went wrong with it."""

    name: str
    last_heard_at: datetime | None
    lag: int
    error: str | None = None

    @property
    def stream(self) -> str:
        return aggregate_stream(self.name)

    def reachable(self, now: datetime, unreachable_after_s: float = UNREACHABLE_AFTER_S) -> bool:
        return self.last_heard_at is not None and (now - self.last_heard_at).total_seconds() <= unreachable_after_s

    def data_age_s(self, now: datetime) -> float | None:
        return None if self.last_heard_at is None else max(0.0, (now - self.last_heard_at).total_seconds())

    def why_no_health(self) -> str:
        """FED-2's words for a member whose nodes show no health."""
        if self.last_heard_at is None:
            return f"cluster {self.name} has not connected to the hub yet"
        return f"cluster {self.name} unreachable since {wire.rfc3339(self.last_heard_at)}"

    def to_builtins(self, now: datetime, unreachable_after_s: float = UNREACHABLE_AFTER_S) -> dict[str, Any]:
        reachable = self.reachable(now, unreachable_after_s)
        return {"cluster": self.name, "reachable": reachable,
                "lastHeardAt": wire.rfc3339(self.last_heard_at) if self.last_heard_at else None,
                "dataAgeSeconds": self.data_age_s(now), "lag": self.lag,
                **({} if reachable else {"reason": self.why_no_health()}),
                **({"error": self.error} if self.error else {})}


def member_of(info: dict[str, Any], now: datetime) -> Member | None:
    """A :class:`Member` from the hub's raw stream info of an aggregate (``None``: not one)."""
    name = str(info.get("config", {}).get("name", ""))
    if not name.startswith(AGGREGATE_PREFIX):
        return None
    sources = info.get("sources") or []
    source = sources[0] if sources else {}
    active_ns = int(source.get("active", -1))
    # The server reports how long ago the source last delivered, in nanoseconds; -1: never.
    heard = None if active_ns < 0 else now - timedelta(microseconds=active_ns / 1000)
    error = source.get("error")
    return Member(name[len(AGGREGATE_PREFIX):], heard, int(source.get("lag", 0)),
                  str(error.get("description", error)) if isinstance(error, dict) else None)


async def _api(nc: NATS, subject: str, body: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
    try:
        reply = await nc.request(subject, json.dumps(body).encode(), timeout=timeout_s)
    except (NatsTimeoutError, NoRespondersError) as exc:
        # On a cluster, a stream whose leader was just lost answers nothing until nats-server
        # has elected another (seconds): the same call works again then.
        raise FederationError(f"{subject}: JetStream did not answer within {timeout_s:g}s (a stream leader being "
                              "elected, or the server unreachable); retry", EXIT_RETRY) from exc
    answer = json.loads(reply.data)
    if not isinstance(answer, dict):
        raise FederationError(f"{subject}: not a JetStream answer")
    if "error" in answer:
        raise FederationError(f"{subject}: {answer['error'].get('description', answer['error'])}")
    return answer


async def members(nc: NATS, now: datetime | None = None) -> list[Member]:
    """Every member attached to this hub, by name. The raw API, not ``js.stream_info``: the
    source's ``active`` and ``error`` are what is read here, and nats-py's model of a source
    drops the error."""
    now = now or datetime.now(UTC)
    names: list[str] = []
    offset = 0
    while True:
        page = await _api(nc, "$JS.API.STREAM.NAMES", {"offset": offset})
        batch = [str(n) for n in page.get("streams") or []]
        names += [n for n in batch if n.startswith(AGGREGATE_PREFIX)]
        offset += len(batch)
        if not batch or offset >= int(page.get("total", 0)):
            break
    found = []
    for name in names:
        member = member_of(await _api(nc, f"$JS.API.STREAM.INFO.{name}", {}), now)
        if member is not None:
            found.append(member)
    return sorted(found, key=lambda m: m.name)


# ---------------------------------------------------------------------------- the federated listing


def unknown_row(row: views.ListRow, member: Member) -> dict[str, Any]:
    """A node of an unreachable member: who it is, and nothing it was (FED-2): its status,
    health and score are no longer known to be true."""
    return {"nodeId": row.node_id, "cluster": row.cluster, "hostname": row.hostname, "status": "UNKNOWN",
            "health": "UNKNOWN", "score": None, "unreachable": member.why_no_health()}


@dataclass(frozen=True, slots=True)
class FederatedListing:
    """Every member's listing, and whether it may be shown."""

    members: list[Member]
    listings: dict[str, reads.Listing]
    now: datetime
    unreachable_after_s: float = UNREACHABLE_AFTER_S

    def reachable(self, member: Member) -> bool:
        return member.reachable(self.now, self.unreachable_after_s)

    def json(self) -> bytes:
        """``node list --federation -o json``: a reachable member's views byte for byte as its
        own ``node list -o json`` has them; an unreachable member's nodes without health."""
        parts: list[bytes] = []
        for member in self.members:
            listing = self.listings[member.name]
            order = views.list_order(listing.rows)
            if self.reachable(member):
                parts += [listing.payloads[i] for i in order]
            else:
                parts += [json.dumps(unknown_row(listing.rows[i], member)).encode() for i in order]
        return b"[" + b",".join(parts) + b"]"

    def rows(self) -> list[views.ListRow]:
        """The rows for the table: an unreachable member's with no health and no score."""
        out: list[views.ListRow] = []
        for member in self.members:
            listing = self.listings[member.name]
            shown = self.reachable(member)
            for i in views.list_order(listing.rows):
                row = listing.rows[i]
                out.append(row if shown else views.ListRow(
                    node_id=row.node_id, cluster=row.cluster, hostname=row.hostname, status="UNKNOWN",
                    health="UNKNOWN", score=None))
        return out

    def unreachable(self) -> list[Member]:
        return [m for m in self.members if not self.reachable(m)]

    def notes(self) -> list[str]:
        return [m.why_no_health() + "; its nodes show no health" for m in self.unreachable()]


def summary(found: FederatedListing) -> dict[str, Any]:
    """``node summary --federation`` and the hub's dashboard: a row per member in the words of
    its own dashboard, an unreachable member's saying so instead of its last answer."""
    out = reads.summarize(found.rows(), found.now)
    by_name = {entry["cluster"]: entry for entry in out["clusters"]}
    for member in found.members:
        entry = by_name.get(member.name)
        if entry is None:  # attached, no node known yet
            entry = by_name[member.name] = {"cluster": member.name, "readable": True, "nodes": 0,
                                            "health": {"healthy": 0, "degraded": 0, "unknown": 0},
                                            "worstScore": None, "label": "No nodes"}
            out["clusters"].append(entry)
        entry["reachable"] = found.reachable(member)
        if not entry["reachable"]:
            entry |= {"readable": False, "worstScore": None, "label": f"No health: {member.why_no_health()}"}
    out["clusters"].sort(key=lambda e: e["cluster"])
    return out


async def read_federated(nc: NATS, js: JetStreamContext, cluster: str | None = None,
                         unreachable_after_s: float = UNREACHABLE_AFTER_S) -> FederatedListing:
    found = [m for m in await members(nc) if cluster is None or m.name == cluster]
    now = datetime.now(UTC)
    listings = {m.name: await reads.read_listing(nc, js, m.name, stream=m.stream) for m in found}
    return FederatedListing(found, listings, now, unreachable_after_s)


def member_named(found: Iterable[Member], name: str) -> Member:
    for member in found:
        if member.name == name:
            return member
    raise FederationError(f"cluster {name} is not attached to this hub")


async def command_target(nc: NATS, js: JetStreamContext, node_id: str, cluster: str | None,
                         verb: str) -> tuple[str, str]:
    """FED-3 on a hub: the node's own cluster, if the hub can reach it now; else nothing is
    sent and the command is retryable."""
    found = await members(nc)
    view = await find_node(nc, js, node_id, cluster, [m.stream for m in found])
    member = member_named(found, view.cluster)
    if not member.reachable(datetime.now(UTC), unreachable_after_s()):
        raise CommandFailed(f"{verb} {view.node_id}: {member.why_no_health()}; only its own cluster executes "
                            "commands for its nodes, so nothing was sent; retry when it is back", EXIT_RETRY)
    return view.node_id, view.cluster
