"""What each identity may publish and subscribe to (SEC-1), generated from the stream table.

nats-server enforces this, not our code: every role becomes a *scoped signing key* in the
control plane's account JWT (``healthplane.stack.keystore``), whose permission template is
:func:`template`. A user signed by that key gets exactly these permissions, the server
filling in the user's own tags: ``{{tag(cluster)}}``/``{{tag(node)}}`` for a node,
``{{tag(user)}}`` for a person. The user JWTs themselves carry no permissions, so a change
here reaches every identity with one push of the account JWT and no credential re-issued.

Where the permissions come from (``healthplane.contracts.streams``, the table the streams come from):

* **publish**: every channel whose ``writers`` name the role, its address parameters bound
  to the publisher (``{cluster}``/``{node}`` to a node's own, ``{actor}``/``{service}`` to its
  own identity, ``{type}`` to the event types ``EVENT_WRITERS`` gives it), the rest ``*``;
* **read**: a stream's ``readers`` (viewers and admins read every stream): the JetStream API
  subjects that consume and get from that stream, and nothing that changes it;
* **inbox**: every identity receives replies only under its own prefix (:func:`inbox`), so
  no identity reads another's JetStream acks or command answers.

Reads are granted per stream, not per subject filter: JetStream's consumer-create subject
does not carry every filter, and a service reads whole streams anyway. Nodes read nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from healthplane.contracts import streams, subjects
from healthplane.contracts.subjects import encode_token

NODE: Final = "collector"
SIM: Final = "sim"
VIEWER: Final = "viewer"
ADMIN: Final = "admin"
# SEC-10: stream administration (converge, replay, purge, delete, a bucket repaired by hand) is
# not the admin's who commands and applies config; a person does it as the maintainer.
MAINTAINER: Final = "maintainer"
# INT-1: a third party that follows node events (a ticketing bridge, a chat bot) and nothing
# else: it hears the events live and reads their history, and no other stream.
SUBSCRIBER: Final = "subscriber"
USER_ROLES: Final = (VIEWER, ADMIN, MAINTAINER, SUBSCRIBER)
# The roles a bearer token may carry (the HTTP API and the UI): never stream administration.
TOKEN_ROLES: Final = (VIEWER, ADMIN)
API: Final = "api"  # the HTTP API's own identity reads only; it commands as each caller
MEMBER: Final = "member"  # a federation member's leaf link, on the hub (FED)
SOURCED_STREAM: Final = "HP_NODES"  # what the hub sources from each member
HUB_CONSUMER: Final = "hub"  # the member's durable consumer the hub sources through
SERVICE_ROLES: Final = streams.SERVICES
WEBHOOK_DISPATCHER: Final = "webhook-dispatcher"  # answers `webhooks replay` (INT-2)
ROLES: Final = (NODE, SIM, VIEWER, ADMIN, MAINTAINER, SUBSCRIBER, MEMBER, *SERVICE_ROLES)

# The template functions nats-server expands from a user JWT's tags.
CLUSTER: Final = "{{tag(cluster)}}"
NODE_ID: Final = "{{tag(node)}}"
USER: Final = "{{tag(user)}}"

KV_STREAMS: Final = (f"KV_{streams.NODES_BUCKET}", f"KV_{streams.LEASES_BUCKET}")
_PARAMETER = re.compile(r"^\{(\w+)\}$")


@dataclass(frozen=True, slots=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    responds: bool = False  # may answer a request it received (one reply, nothing else)
    # SEC-11: per-connection bounds the server enforces (-1: none beyond the server's own).
    payload: int = -1  # bytes in one message
    subs: int = -1  # subscriptions at once

    def template(self) -> dict[str, object]:
        """The ``template`` of a scoped signing key (nats-io/jwt ``UserPermissionLimits``)."""
        out: dict[str, object] = {"pub": {"allow": list(self.publish)}, "sub": {"allow": list(self.subscribe)},
                                  "subs": self.subs, "data": -1, "payload": self.payload}
        if self.responds:
            out["resp"] = {"max": 1, "ttl": 0}
        return out


# A node's largest message is its health or resource report: 4.3 KiB for an 8-GPU node with
# every signal (tests/bench/test_health_ingest.py's template), 1.5 KiB for the simulator's with
# eight faults at once. 256 KiB is sixty times the largest seen, room for a node with hundreds
# of disks and a kernel log storm, and a thirty-second of the server's 8 MiB: a compromised
# node cannot make every fold decode 8 MB reports (SEC-11). Its subscriptions: its inbox and its
# remediation subject, and a few for requests in flight.
NODE_PAYLOAD_LIMIT: Final = 256 * 1024
NODE_SUBSCRIPTION_LIMIT: Final = 16


def inbox(role: str) -> str:
    """The inbox prefix of ``role``'s identities, as a template (nats-py ``inbox_prefix``)."""
    if role == NODE:
        return f"_INBOX.node.{CLUSTER}.{NODE_ID}"
    if role == SIM:
        return f"_INBOX.sim.{CLUSTER}"
    if role in USER_ROLES:  # by role too: a viewer alice never reads an admin alice's replies
        return f"_INBOX.{role}.{USER}"
    return f"_INBOX.service.{encode_token(role)}"


def _bindings(role: str) -> dict[str, str]:
    """How the address parameters bind for ``role``; a parameter not named here is ``*``."""
    if role == NODE:
        return {"cluster": CLUSTER, "node": NODE_ID}
    if role == SIM:
        return {"cluster": CLUSTER}
    if role in USER_ROLES:
        return {"actor": USER}
    bound = {"actor": role, **streams.COMMAND_BINDINGS.get(role, {})}
    return {**{name: encode_token(value) for name, value in bound.items()}, "service": encode_token(role)}


def _bind(address: str, bindings: dict[str, str], event_type: str | None = None) -> str:
    """The address with its parameters bound; an unbound last one is ``>`` (a snapshot's
    partition may be several tokens), any other ``*``."""
    parts = address.split(".")
    tokens = []
    for index, token in enumerate(parts):
        parameter = _PARAMETER.match(token)
        if parameter is None:
            tokens.append(token)
        elif parameter.group(1) == "type" and event_type is not None:
            tokens.append(encode_token(event_type))
        else:
            tokens.append(bindings.get(parameter.group(1), ">" if index == len(parts) - 1 else "*"))
    return ".".join(tokens)


def writes(role: str, channel: streams.Channel) -> bool:
    if "{type}" in channel.address:
        return role in streams.EVENT_WRITERS.values()
    return role in channel.writers


def publishes(role: str) -> tuple[str, ...]:
    """The record subjects ``role`` may append to (templates)."""
    bindings = _bindings(role)
    out: list[str] = []
    for channel in streams.CHANNELS:
        if "{type}" in channel.address:
            owned = [kind for kind, writer in streams.EVENT_WRITERS.items() if writer == role]
            out += [_bind(channel.address, bindings, kind) for kind in owned]
        elif role in channel.writers:
            out.append(_bind(channel.address, bindings))
    return tuple(out)


def reads(role: str) -> tuple[str, ...]:
    """The streams ``role`` may read (KV buckets are streams too)."""
    if role == SUBSCRIBER:
        return ("HP_NODE_EVENTS",)
    if role in USER_ROLES or role == API:  # the API reads what it shows people, as they could
        # ``*``: on a federation hub, the members' aggregates too, whose names come with the
        # members (people read every stream anyway).
        return (*(s.name for s in streams.STREAMS), *KV_STREAMS, "*")
    if role in (NODE,):
        return ()
    # A service also reads what it writes: on restart it skips inputs its output already
    # reflects (exactly-once, ARCHITECTURE.md rule 4).
    names = [s.name for s in streams.STREAMS if role in s.readers or any(writes(role, c) for c in s.channels)]
    if role in SERVICE_ROLES:
        names.append(f"KV_{streams.LEASES_BUCKET}")  # any service may run replicated (a lease)
    if role == "substrate-bridge":
        names.append(f"KV_{streams.NODES_BUCKET}")
    return tuple(names)


def stream_reads(stream: str) -> tuple[str, ...]:
    """The JetStream API subjects that read ``stream`` without a consumer (SEC-8): its info,
    gets and direct gets (``runtime.replay``), and what its consumers are and how far they
    got (``nats consumer ls/info``: read-only, and the list tells it all anyway; the control
    is what is kept from readers)."""
    api = "$JS.API"
    return (
        f"{api}.STREAM.INFO.{stream}", f"{api}.STREAM.MSG.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}", f"{api}.DIRECT.GET.{stream}.>",
        f"{api}.CONSUMER.NAMES.{stream}", f"{api}.CONSUMER.LIST.{stream}", f"{api}.CONSUMER.INFO.{stream}.*",
    )


def consumer_control(stream: str, consumer: str) -> tuple[str, ...]:
    """Everything that makes, changes, reads from or acks one named consumer. Only by name:
    the unnamed create (``CONSUMER.CREATE.<stream>``) takes a name in its body and so reaches
    every consumer of the stream (it re-filters a durable), and is granted to no one where
    a service holds a durable."""
    api = "$JS.API.CONSUMER"
    return (f"{api}.CREATE.{stream}.{consumer}", f"{api}.CREATE.{stream}.{consumer}.>",
            f"{api}.DURABLE.CREATE.{stream}.{consumer}", f"{api}.DELETE.{stream}.{consumer}",
            f"{api}.MSG.NEXT.{stream}.{consumer}", f"$JS.ACK.{stream}.{consumer}.>")


def watches(stream: str) -> tuple[str, ...]:
    """An ordered push consumer the server names (nats-py's KV watch and ``keys()``): only on
    a KV stream, where no service holds a durable."""
    return (f"$JS.API.CONSUMER.CREATE.{stream}", f"$JS.FC.{stream}.>")


def own_consumers(role: str) -> tuple[str, ...]:
    """The consumer API of ``role``'s own durables (``streams.durables_of``) and its KV watches."""
    if role not in SERVICE_ROLES:
        return ()
    out = [subject for stream, consumer in streams.durables_of(role)
           for subject in consumer_control(stream, consumer)]
    out += watches(f"KV_{streams.LEASES_BUCKET}")  # its lease (runtime.lease)
    return tuple(out)


def _extra_publish(role: str) -> tuple[str, ...]:
    """What is not a record: lease keys, stream management, the simulator's control subjects."""
    if role == NODE:
        return ()
    # What streams there are, with their configs and states (`nats stream ls`): read-only.
    common: tuple[str, ...] = ("$JS.API.INFO", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST", "$JS.API.STREAM.INFO.*")
    if role in SERVICE_ROLES:
        # Its lease, and those of its partitions and their members (HA-4): scorer.2of4, scorer.members.X.
        own_lease = f"$KV.{streams.LEASES_BUCKET}.{encode_token(role)}"
        own_lease_tree = f"{own_lease}.>"
        # A stream only this service writes it may purge (the scorer drops a removed node's view);
        # the replicas' fence marks (runtime.fencing) are every service's and do not count.
        owned = tuple(f"$JS.API.STREAM.PURGE.{s.name}" for s in streams.STREAMS
                      if all(c.writers == (role,) for c in s.channels if not c.address.startswith(streams.FENCE_PREFIX)))
        common = (*common, *owned, own_lease, own_lease_tree, *_lease_presence(role))
        if role == "substrate-bridge":  # it writes the nodes bucket; the maintainer sizes it (BRG-1, SEC-10)
            return (*common, f"$KV.{streams.NODES_BUCKET}.>")
        return common
    if role == ADMIN:
        # Commands as itself (its channels above), applies config, drives the simulator, asks
        # the webhook dispatcher to send dead-lettered deliveries again (INT-2), as itself.
        return (*common, "hp.sim.>", f"{subjects.WEBHOOK_REPLAY}.{USER}")
    if role == MAINTAINER:
        # Stream administration (SEC-10): creates, converges, purges and deletes the streams
        # (``healthplane up``, ``streams converge``), moves a stream's leadership off a member
        # before its host goes down (HA-2), offers a federation member's consumer to its hub,
        # repairs the nodes bucket by hand, and replays dead letters to the subject they came
        # from: any record subject but the actor-bound commands, remediation requests and the
        # config (applying config is the admin's).
        replayable = tuple(c.subject for c in streams.CHANNELS
                           if "{actor}" not in c.address and c.record is not None
                           and not c.address.startswith(("hp.remediate.", "hp.config")))
        return (*common, "$JS.API.STREAM.CREATE.*", "$JS.API.STREAM.UPDATE.*", "$JS.API.STREAM.PURGE.*",
                "$JS.API.STREAM.DELETE.*", "$JS.API.STREAM.LEADER.STEPDOWN.*",
                *consumer_control(SOURCED_STREAM, HUB_CONSUMER), f"$KV.{streams.NODES_BUCKET}.>", *replayable)
    return common


def _lease_presence(role: str) -> tuple[str, ...]:
    """Where its lease holders answer and its standbys ask whether they are still connected
    (runtime.lease): its own leases' only, so no other identity can keep a dead holder's lease
    alive or pass for it."""
    own = streams.lease_presence_subject(encode_token(role))
    return (own, f"{own}.>")


def _extra_subscribe(role: str) -> tuple[str, ...]:
    if role == SIM:  # the simulator's injected faults, the provisioner's answers, its nodes' remediation (REM-2)
        return (f"hp.sim.{CLUSTER}.inject", f"hp.provision.{CLUSTER}.*", f"hp.remediate.{CLUSTER}.*")
    if role == NODE:  # its own remediation subject (REM)
        return (f"hp.remediate.{CLUSTER}.{NODE_ID}",)
    if role == SUBSCRIBER:  # node events, live (docs/subscribing.md)
        return tuple(c.subject for c in streams.STREAMS_BY_NAME["HP_NODE_EVENTS"].channels
                     if not c.address.startswith(streams.FENCE_PREFIX))
    if role in USER_ROLES:  # people read every record live too (the CLI waits for outcomes)
        return tuple(dict.fromkeys(c.subject for c in streams.CHANNELS))
    if role == WEBHOOK_DISPATCHER:  # `webhooks replay` requests, answered once each (INT-2)
        return (f"{subjects.WEBHOOK_REPLAY}.*", *_lease_presence(role))
    if role in SERVICE_ROLES:
        return _lease_presence(role)
    return ()


def member() -> Permissions:
    """A federation member's leaf connection to the hub (FED, ``healthplane.client.federation``).

    For a leaf connection nats-server reads a user's permissions from the hub's side:
    *subscribe* is what the hub may send into the member, *publish* what the member may send
    back. Into the member: the API of the one consumer the member made for the hub (its
    info and reset) with its flow control, and commands for the member's own cluster
    (FED-3). Back: that consumer's deliveries, on the member's own deliver subject (so a
    member can write into its own aggregate only), the replies to the hub's requests, the
    outcomes of its own cluster's commands, and replies to the hub's people (the JetStream
    acks of the commands they forwarded)."""
    hub_consumer = f"{SOURCED_STREAM}.{HUB_CONSUMER}"
    into = (f"$JS.{CLUSTER}.API.CONSUMER.>", f"$JS.FC.{hub_consumer}.*",
            f"$JS.FC.{CLUSTER}.*.{hub_consumer}.*", f"hp.cmd.{CLUSTER}.>")
    back = (deliver_subject(CLUSTER), "$JSC.R.>", f"hp.outcome.{CLUSTER}.>",
            *(f"_INBOX.{role}.*.>" for role in USER_ROLES))
    return Permissions(back, into)


def deliver_subject(cluster: str) -> str:
    """Where a federation member's consumer for the hub delivers: the hub's aggregate of that
    member listens here, and only that member may publish here."""
    return f"hp.fed.deliver.{cluster}"


def reserved_names() -> frozenset[str]:
    """Names no person may be given (SEC-10): every automation actor's — the services and the
    other non-person roles, and the actors commands are bound to (the Slurm adapter's
    ``slurm``) — so that a hold or a command never passes a person for automation."""
    bound = {binding["actor"] for binding in streams.COMMAND_BINDINGS.values() if "actor" in binding}
    return frozenset({*(r for r in ROLES if r not in USER_ROLES), *bound})


def of(role: str) -> Permissions:
    """Everything ``role`` may do on the bus, as the template of its signing key."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; one of {', '.join(ROLES)}")
    if role == MEMBER:
        return member()
    own_inbox = f"{inbox(role)}.>"
    publish = [*publishes(role), *_extra_publish(role), own_inbox]
    for stream in reads(role):
        publish += stream_reads(stream)
    publish += own_consumers(role)
    subscribe = [own_inbox, *_extra_subscribe(role)]
    # The simulator answers `sim inject` requests on the asker's inbox.
    if role == NODE:
        return Permissions(tuple(dict.fromkeys(publish)), tuple(dict.fromkeys(subscribe)),
                           payload=NODE_PAYLOAD_LIMIT, subs=NODE_SUBSCRIPTION_LIMIT)
    return Permissions(tuple(dict.fromkeys(publish)), tuple(dict.fromkeys(subscribe)),
                       responds=role in (SIM, WEBHOOK_DISPATCHER))
