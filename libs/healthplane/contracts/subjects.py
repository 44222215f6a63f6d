"""Every subject and KV key Healthplane uses, built and parsed in one place.

Node ids come from operators and hardware (``10.0.0.42/9100``, ``node.gpu_14``) and may hold
characters a NATS subject token cannot (``.``, ``*``, ``>``, whitespace) or a KV key cannot
(anything outside ``[-/_=.A-Za-z0-9]``). :func:`encode_token` maps any string to one token
that is valid in both places and :func:`decode_token` reverses it exactly.

The encoding keeps ``[A-Za-z0-9_-]`` as is and writes every other UTF-8 byte as ``=XX``
(upper-case hex), quoted-printable style, so ``cn-042`` stays readable and the common case
costs nothing.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

PREFIX: Final = "hp"

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_ESCAPE: Final = "="
_PLAIN_RE = re.compile(r"[A-Za-z0-9_-]+")
_SAFE_CHARS: Final = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"  # = _SAFE
_TOKEN_RE = re.compile(r"^(?:[A-Za-z0-9_-]|=[0-9A-F]{2})+$")


class SubjectError(ValueError):
    """A subject or token that does not follow the Healthplane scheme."""


def encode_token(value: str) -> str:
    """Encode ``value`` (a node id, cluster name…) into one subject token."""
    if not value:
        raise SubjectError("an empty string cannot be a subject token")
    if _PLAIN_RE.fullmatch(value):
        return value  # the common case (cn-042): nothing to escape
    raw = value.encode("utf-8")
    return "".join(chr(b) if b in _SAFE else f"{_ESCAPE}{b:02X}" for b in raw)


def decode_token(token: str) -> str:
    """Reverse :func:`encode_token`; refuses anything it could not have produced."""
    if not _TOKEN_RE.match(token):
        raise SubjectError(f"not an encoded token: {token!r}")
    if _ESCAPE not in token:
        return token
    out = bytearray()
    i = 0
    while i < len(token):
        ch = token[i]
        if ch == _ESCAPE:
            out.append(int(token[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(ord(ch))
            i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SubjectError(f"token {token!r} does not decode to UTF-8") from exc


# Subject builders. Cluster and node are always encoded; verbs, event types and
# allocation ids are encoded too so that no caller can smuggle a wildcard in.


def report(cluster: str, node_id: str) -> str:
    return f"{PREFIX}.report.{encode_token(cluster)}.{encode_token(node_id)}"


def resource(cluster: str, node_id: str) -> str:
    return f"{PREFIX}.resource.{encode_token(cluster)}.{encode_token(node_id)}"


def assessment(cluster: str, node_id: str) -> str:
    return f"{PREFIX}.assess.{encode_token(cluster)}.{encode_token(node_id)}"


def event(cluster: str, node_id: str, event_type: str) -> str:
    return f"{PREFIX}.event.{encode_token(cluster)}.{encode_token(node_id)}.{encode_token(event_type)}"


def node_view(cluster: str, node_id: str) -> str:
    return f"{PREFIX}.node.{encode_token(cluster)}.{encode_token(node_id)}"


def command(cluster: str, node_id: str, verb: str, actor: str) -> str:
    """``hp.cmd.{cluster}.{node}.{verb}.{actor}``: the last token is the sender's identity,
    which nats-server binds (SEC-1: admin ``alice`` may publish only ``hp.cmd.*.*.*.alice``)."""
    return (f"{PREFIX}.cmd.{encode_token(cluster)}.{encode_token(node_id)}.{encode_token(verb)}."
            f"{encode_token(actor)}")


def command_outcome(cluster: str, node_id: str) -> str:
    """Where eviction answers a command (applied, refused, retry): kept with the commands."""
    return f"{PREFIX}.outcome.{encode_token(cluster)}.{encode_token(node_id)}"


def allocation(cluster: str, node_id: str, allocation_id: str) -> str:
    return (
        f"{PREFIX}.alloc.{encode_token(cluster)}.{encode_token(node_id)}."
        f"{encode_token(allocation_id)}"
    )


def job_outcome(cluster: str, node_id: str, job_id: str) -> str:
    """JOB-1: how a run of ``job_id`` ended on ``node_id``."""
    return f"{PREFIX}.jobend.{encode_token(cluster)}.{encode_token(node_id)}.{encode_token(job_id)}"


def job(cluster: str, job_id: str) -> str:
    return f"{PREFIX}.job.{encode_token(cluster)}.{encode_token(job_id)}"


def directive(cluster: str, node_id: str) -> str:
    return f"{PREFIX}.directive.{encode_token(cluster)}.{encode_token(node_id)}"


def provision(cluster: str, node_id: str) -> str:
    """Where the provisioner answers a ``terminate`` directive: kept with the commands."""
    return f"{PREFIX}.provision.{encode_token(cluster)}.{encode_token(node_id)}"


def remediate(cluster: str, node_id: str) -> str:
    """One node's remediation requests (REM): readable by that node only."""
    return f"{PREFIX}.remediate.{encode_token(cluster)}.{encode_token(node_id)}"


def hardware(cluster: str, node_id: str) -> str:
    """A simulated node's hidden hardware truth (``sim inject --fault silent-gpu``)."""
    return f"{PREFIX}.hardware.{encode_token(cluster)}.{encode_token(node_id)}"


def provider(cluster: str, node_id: str) -> str:
    """How the simulated provisioner answers terminations of one node (``sim provider``)."""
    return f"{PREFIX}.provider.{encode_token(cluster)}.{encode_token(node_id)}"


def policy_command(cluster: str, action: str, actor: str) -> str:
    """An operator's instruction to the policy service (breaker reset): kept with the commands,
    outside ``hp.cmd.>`` so that eviction never sees it; the last token is the sender."""
    return f"{PREFIX}.policy.{encode_token(cluster)}.{encode_token(action)}.{encode_token(actor)}"


def sender(subject: str, tokens: int) -> str | None:
    """The identity token of a command subject that has ``tokens`` tokens before it
    (``hp.cmd`` 5, ``hp.policy`` 4); ``None`` on a subject without one (an insecure peer
    that predates the token: its payload's actor is then unverified)."""
    parts = subject.split(".")
    return decode_token(parts[tokens]) if len(parts) == tokens + 1 else None


CONFIG: Final = f"{PREFIX}.config"


def partition_label(partition: int, partitions: int = 1) -> str:
    """How a partition is named in subjects, consumers and producers: ``0`` for the one
    partition of an unpartitioned service, ``2of4`` for partition 2 of 4 (HA-4), so that two
    layouts of one service never share a snapshot, a fence or a producer id."""
    return str(partition) if partitions == 1 else f"{partition}of{partitions}"


def snapshot(service: str, partition: int = 0, partitions: int = 1) -> str:
    return f"{PREFIX}.snapshot.{encode_token(service)}.{partition_label(partition, partitions)}"


def job_key(cluster: str, job_id: str) -> str:
    """A job's key in a service's state (job ids are unique per cluster)."""
    return f"{cluster}\x00{job_id}"


def node_key(cluster: str, node_id: str) -> str:
    """A node's key in a service's folded state (a dict key, never a subject): NUL cannot
    occur in a cluster name or node id, so the pair is unambiguous. Interned: a fold keeps a
    node's key in several places (its nodes, a pool's members, a deadline), and at 100,000
    nodes each copy is 7 MB; an interned string is freed like any other once unreferenced."""
    return sys.intern(f"{cluster}\x00{node_id}")


# DOM-3: a failure domain's events are node events without a node. They go on the node-id
# place of ``hp.event.{cluster}.{node}.{TYPE}`` as a reserved id, ``domain:{kind}={value}``
# (``domain:rack=r12``, token ``domain=3Arack=3Dr12``): a kind is a lower-case name and the
# ``domain:`` prefix is reserved, so a real node id never names a domain by accident.
DOMAIN_PREFIX: Final = "domain:"


def domain_node_id(kind: str, value: str) -> str:
    """The reserved node id of a domain's events: ``domain:rack=r12``."""
    return f"{DOMAIN_PREFIX}{kind}={value}"


def domain_of_node_id(node_id: str) -> tuple[str, str] | None:
    """``(kind, value)`` of a domain's reserved node id; None for a node's own id."""
    if not node_id.startswith(DOMAIN_PREFIX):
        return None
    kind, equals, value = node_id.removeprefix(DOMAIN_PREFIX).partition("=")
    return (kind, value) if equals and kind and value else None


def kv_node_key(cluster: str, node_id: str) -> str:
    """Key of a node in the ``substrate-nodes`` bucket."""
    return f"{encode_token(cluster)}.{encode_token(node_id)}"


# Filters (wildcards) for consumers.


def node_views(cluster: str | None = None) -> str:
    """Every node's view, or one cluster's (``node list``)."""
    return f"{PREFIX}.node.{encode_token(cluster)}.>" if cluster else f"{PREFIX}.node.>"


def node_view_in_any_cluster(node_id: str) -> str:
    """One node's view whatever its cluster (``node show NODE`` without ``--cluster``)."""
    return f"{PREFIX}.node.*.{encode_token(node_id)}"


def node_events(cluster: str | None, node_id: str, event_type: str | None = None) -> str:
    """Every event of one node (the per-node filter the CLI replays), or those of one type;
    ``cluster=None`` is any cluster (a decommissioned node has no view to name its cluster).
    Written for the contract's subject: ``streams.stored_filters`` adds the stored form."""
    where = encode_token(cluster) if cluster is not None else "*"
    kind = encode_token(event_type) if event_type else "*"
    return f"{PREFIX}.event.{where}.{encode_token(node_id)}.{kind}"


def events_of(cluster: str | None = None, node_id: str | None = None) -> str:
    """Every event of the fleet, of one cluster or of one node, whatever its type, as one filter
    (``events watch``). The final ``>`` also takes a partitioned install's stored form, whose
    slot is one more token (HA-4), so one filter reads every install in stream order."""
    where = encode_token(cluster) if cluster else "*"
    node = encode_token(node_id) if node_id else "*"
    return f"{PREFIX}.event.{where}.{node}.>"


@dataclass(frozen=True, slots=True)
class NodeSubject:
    """A parsed per-node subject: ``hp.<kind>.<cluster>.<node>[.<rest>]``."""

    kind: str
    cluster: str
    node_id: str
    rest: str | None
    actor: str | None = None  # a command's sender (its sixth token)


_NODE_KINDS = frozenset({"report", "resource", "assess", "event", "node", "cmd", "outcome", "alloc", "directive", "provision", "provider", "hardware", "remediate", "jobend"})


# The kinds whose stored subjects carry the node's partition slot last in a partitioned
# install (streams.PARTITION_SLOTS), and their length without it.
_SLOTTED_TOKENS = {"report": 4, "resource": 4, "assess": 4, "event": 5, "alloc": 5, "jobend": 5}


def published(subject: str) -> str:
    """The contract's subject of a stored record: without the partition slot a partitioned
    install's stream appends (HA-4); any other subject as it is."""
    parts = subject.split(".")
    if len(parts) > 2 and len(parts) == _SLOTTED_TOKENS.get(parts[1], -1) + 1 and parts[-1].isdigit():
        return subject.rpartition(".")[0]
    return subject


def names_node(subject: str, cluster: str, node_id: str) -> bool:
    """SEC-7: whether per-node ``subject`` (``hp.<kind>.<cluster>.<node>…``) is the subject of
    ``cluster``'s ``node_id``. On every input of every fold, so the common case decodes and
    encodes nothing: plain ids (``lab``, ``cn-042``) are their own tokens (``str.strip`` of the
    safe characters leaves nothing of a plain id); an id that needs escaping is encoded."""
    parts = subject.split(".", 4)
    if len(parts) < 4 or not cluster or not node_id:
        return False
    if parts[3] == node_id and parts[2] == cluster and not (cluster + node_id).strip(_SAFE_CHARS):
        return True
    return parts[3] == encode_token(node_id) and parts[2] == encode_token(cluster)


def parse(subject: str) -> NodeSubject:
    """Parse any per-node subject back into kind, cluster, node id and the trailing token;
    a stored subject's partition slot (HA-4) is passed over."""
    parts = published(subject).split(".")
    if len(parts) < 4 or parts[0] != PREFIX or parts[1] not in _NODE_KINDS:
        raise SubjectError(f"not a Healthplane node subject: {subject!r}")
    if len(parts) > (6 if parts[1] == "cmd" else 5):
        raise SubjectError(f"too many tokens in subject: {subject!r}")
    rest = decode_token(parts[4]) if len(parts) >= 5 else None
    actor = decode_token(parts[5]) if len(parts) == 6 else None
    return NodeSubject(parts[1], decode_token(parts[2]), decode_token(parts[3]), rest, actor)


def parse_kv_node_key(key: str) -> tuple[str, str]:
    """``(cluster, node_id)`` of a ``substrate-nodes`` key."""
    cluster, sep, node = key.partition(".")
    if not sep or "." in node:
        raise SubjectError(f"not a node key: {key!r}")
    return decode_token(cluster), decode_token(node)


def dead_letter(service: str, input_stream: str) -> str:
    """``hp.dead.{service}.{input stream}``: an input ``service`` could not process."""
    return f"{PREFIX}.dead.{encode_token(service)}.{encode_token(input_stream)}"


def dead_letters(service: str | None = None) -> str:
    return f"{PREFIX}.dead.{encode_token(service)}.*" if service else f"{PREFIX}.dead.>"


# INT-2: ``healthplane webhooks replay`` asks the webhook dispatcher (a request, not a record:
# the dispatcher answers how many dead letters it sends again); the last token is the asker.
WEBHOOK_REPLAY: Final = f"{PREFIX}.webhook.replay"


def webhook_replay(actor: str) -> str:
    return f"{WEBHOOK_REPLAY}.{encode_token(actor)}"


def event_type_filters(event_types: Iterable[str] | None) -> tuple[str, ...]:
    """The stream filters of node events of ``event_types`` (every type: ``None``), in the
    contract's form (``streams.stored_filters`` adds a partitioned install's)."""
    if event_types is None:
        return (f"{PREFIX}.event.>",)
    return tuple(f"{PREFIX}.event.*.*.{encode_token(t)}" for t in sorted(set(event_types)))


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a final ``>`` one or more."""
    wanted, tokens = pattern.split("."), subject.split(".")
    for index, token in enumerate(wanted):
        if token == ">":
            return index == len(wanted) - 1 and len(tokens) > index
        if index >= len(tokens) or (token != "*" and token != tokens[index]):
            return False
    return len(tokens) == len(wanted)


class _Node:
    __slots__ = ("children", "end")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.end = False  # a pattern ends here


def matcher(patterns: Iterable[str]) -> Callable[[str], bool]:
    """Whether a subject matches any of ``patterns`` (:func:`matches`), with the patterns made
    into a tree of their tokens once: a subject is split once and walked down it, rather than
    tested against each pattern in turn (a follower of nineteen event types, on every record of
    a fleet's node events)."""
    root = _Node()
    for pattern in patterns:
        node = root
        for token in pattern.split("."):
            node = node.children.setdefault(token, _Node())
        node.end = True

    def walk(node: _Node, tokens: list[str], at: int) -> bool:
        if at == len(tokens):
            return node.end
        rest = node.children.get(">")
        if rest is not None and rest.end:
            return True
        for key in (tokens[at], "*"):
            child = node.children.get(key)
            if child is not None and walk(child, tokens, at + 1):
                return True
        return False

    return lambda subject: walk(root, subject.split("."), 0)
