"""Pure rules of the webhook dispatcher: which endpoints want an event, the CloudEvent
envelope, how an HTTP answer is judged and what follows it, how long to wait before a retry,
when an endpoint is down (``Reachability``: paused and probed, INT-2) and what deliveries are
ordered by (the event's node). No I/O, no clock, no randomness: times and
random draws arrive as arguments (docs/webhooks.md explains the behaviour to operators).

Rules and no ``fold.py``: the dispatcher folds no input into state. Each endpoint's durable
consumer is its backlog and its position (INT-2): an event is acked once its delivery is
over, so nothing the process holds needs rebuilding after a crash. The endpoints in force are
replaced whole by each config record (:func:`plan_reload`), their consumer slots kept by
:func:`assign_slots`. What is left are decisions on one event, one config or one answer at a
time: functions, not a step over inputs.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal
from urllib.parse import urlsplit, urlunsplit

import cel
import pydantic
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from healthplane.contracts import streams, subjects, wire
from healthplane.contracts.config import WEBHOOK_FILTER_VARIABLE, ClusterConfig, Webhook
from healthplane.contracts.expressions import Bindings, compile_expression
from healthplane.runtime.settings import EnvSettings

SERVICE: Final = "webhook-dispatcher"
STREAM: Final = "HP_NODE_EVENTS"
# The consumer metadata key that records which endpoint holds a slot (its label: no secret).
SLOT_OWNER: Final = streams.WEBHOOK_SLOT_OWNER
CONTENT_TYPE: Final = "application/cloudevents+json; charset=utf-8"
TYPE_PREFIX: Final = "io.healthplane.node."
SOURCE_PREFIX: Final = "/healthplane/"

# The CloudEvent ``source`` is the service that owns the event type (ARCHITECTURE.md: each
# type has exactly one writer). Not the event's ``actor``: NODE_CORDONED written by eviction
# for `healthplane node cordon` carries the operator as actor, but its source is eviction.
SOURCE_SERVICE: Final[Mapping[str, str]] = streams.EVENT_WRITERS

_JSON: Final = JSONFormat()


# ---------------------------------------------------------------------------- settings


class Settings(EnvSettings):
    """Service tuning (environment ``HEALTHPLANE_WEBHOOK_*``, through the one settings reader);
    the endpoints themselves come from the cluster config."""

    PREFIX = "HEALTHPLANE_WEBHOOK_"
    # events read and not yet settled per endpoint: its consumer's max_ack_pending (INT-2)
    queue_size: int = pydantic.Field(1024, alias="QUEUE_SIZE")
    concurrency: int = pydantic.Field(16, alias="CONCURRENCY")    # requests in flight per endpoint (one connection each)
    # an event read and not settled within this is sent to the dispatcher again (a crash's
    # in-flight events come back after it); one still held then is kept, not queued twice
    ack_wait_s: float = pydantic.Field(30.0, gt=0, alias="ACK_WAIT_SECONDS")
    # one attempt's whole deadline: pool wait, connect, send, the answer
    timeout_s: float = pydantic.Field(10.0, gt=0, alias="TIMEOUT_SECONDS")
    connect_timeout_s: float = pydantic.Field(5.0, gt=0, alias="CONNECT_TIMEOUT_SECONDS")
    backoff_base_s: float = pydantic.Field(0.5, gt=0, alias="BACKOFF_BASE_SECONDS")  # first retry after 0.25..0.5 s, doubling
    backoff_cap_s: float = pydantic.Field(30.0, gt=0, alias="BACKOFF_CAP_SECONDS")
    drain_s: float = pydantic.Field(5.0, ge=0, alias="DRAIN_SECONDS")  # on SIGTERM: time the queues get to empty

    @pydantic.field_validator("queue_size", "concurrency")
    @classmethod
    def _at_least_one(cls, value: int) -> int:
        return max(1, value)  # 0 means "as little as possible", not "none"


# ---------------------------------------------------------------------------- endpoints


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One configured webhook. ``key`` follows it across reloads (the URL as configured);
    ``label`` is the only form that reaches logs and metrics."""

    key: str = field(repr=False)
    label: str
    url: str = field(repr=False)
    secret: str = field(repr=False)
    events: frozenset[str] | None
    max_attempts: int
    filter: str | None = None  # INT-3: CEL over ``event``, the event as JSON

    def wants(self, event_type: str) -> bool:
        """WEB-1: every type when the filter is omitted, else the listed ones."""
        return self.events is None or event_type in self.events

    def selects(self, event: wire.NodeEvent) -> bool:
        """INT-3: the CEL filter, true for this event (no filter: every event). An expression
        that cannot be evaluated on it (a field it lacks) does not select it."""
        if self.filter is None:
            return True
        return Bindings({WEBHOOK_FILTER_VARIABLE: wire.to_builtins(event)}).test(_program(self.filter))

    @property
    def subjects(self) -> tuple[str, ...]:
        """The stream filters of its consumer: its event types, as every install stores them."""
        return streams.stored_filters(STREAM, subjects.event_type_filters(self.events))


def _program(expression: str) -> cel.Program:
    # Checked at `config apply` (config.Webhook); compiled once (expressions caches by text).
    return compile_expression(expression, [WEBHOOK_FILTER_VARIABLE])


def endpoint_label(url: str) -> str:
    """The URL without userinfo, query or fragment: what may carry credentials stays out of
    metrics and logs (``https://user:pw@hooks.example.com/x?token=1`` →
    ``https://hooks.example.com/x``)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _environment(environ: Mapping[str, str], name: str) -> str:
    """A proxy variable, the lower-case spelling first (as curl and urllib read them)."""
    return environ.get(name.lower()) or environ.get(name.upper()) or ""


def _bypassed(entry: str, host: str, port: int) -> bool:
    """Whether one ``NO_PROXY`` entry covers ``host:port``: a name and its subdomains
    (``example.com`` and ``.example.com`` both cover ``a.example.com``), an IP address, a
    CIDR range (``10.0.0.0/8``), each optionally with ``:port``."""
    entry = entry.strip().lower()
    if entry.startswith("[") and "]" in entry:  # [v6] or [v6]:port
        literal, _, rest = entry[1:].partition("]")
        if rest.startswith(":") and rest[1:] != str(port):
            return False
        entry = literal
    elif entry.count(":") == 1:  # name:port or v4:port (a bare v6 address has more colons)
        entry, _, entry_port = entry.partition(":")
        if entry_port != str(port):
            return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        try:
            return address in ipaddress.ip_network(entry, strict=False)
        except ValueError:
            return False
    name = entry.lstrip(".").removeprefix("*.")
    return bool(name) and (host == name or host.endswith("." + name))


def proxy_for(url: str, environ: Mapping[str, str]) -> str | None:
    """The proxy deliveries to ``url`` go through, from the environment: ``HTTPS_PROXY`` or
    ``HTTP_PROXY`` by the URL's scheme, else ``ALL_PROXY``; none where ``NO_PROXY`` covers
    the host (``*`` covers every host). A proxy given without a scheme is ``http://``."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    proxy = _environment(environ, f"{scheme}_proxy") or _environment(environ, "all_proxy")
    if not proxy:
        return None
    host = (parts.hostname or "").lower()
    port = parts.port or (443 if scheme == "https" else 80)
    for entry in _environment(environ, "no_proxy").split(","):
        if entry.strip() == "*" or (entry.strip() and _bypassed(entry, host, port)):
            return None
    return proxy if "://" in proxy else f"http://{proxy}"


@dataclass(frozen=True, slots=True)
class Unresolved:
    """Why a webhook's secret reference gave no secret (names the reference, never a secret)."""

    why: str


SecretOf = Callable[[Webhook], "str | Unresolved"]


def endpoints_from_config(config: ClusterConfig, secret_of: SecretOf) -> tuple[list[Endpoint], list[tuple[str, str]]]:
    """The endpoints in config order, each with the secret ``secret_of`` resolves from its
    reference (SEC-9), and ``(label, why)`` for each left out because its secret could not be
    read. The same URL twice stays two endpoints (``#2``), and two URLs that differ only where
    credentials live get distinct labels the same way."""
    out: list[Endpoint] = []
    left_out: list[tuple[str, str]] = []
    keys: set[str] = set()
    labels: set[str] = set()
    for hook in config.node_event_webhooks:
        url = str(hook.url)
        key, label = url, endpoint_label(url)
        n = 1
        while key in keys:
            n += 1
            key = f"{url}#{n}"
        n = 1
        base_label = label
        while label in labels:
            n += 1
            label = f"{base_label}#{n}"
        keys.add(key)
        labels.add(label)
        secret = secret_of(hook)
        if isinstance(secret, Unresolved):
            left_out.append((label, secret.why))
            continue
        out.append(Endpoint(key=key, label=label, url=url, secret=secret,
                            events=frozenset(hook.events) if hook.events is not None else None,
                            max_attempts=hook.max_attempts, filter=hook.filter))
    return out, left_out


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    added: tuple[Endpoint, ...]
    updated: tuple[Endpoint, ...]    # same label, new URL/secret/filters/attempts: consumer kept
    removed: tuple[str, ...]         # labels


def plan_reload(current: Mapping[str, Endpoint], wanted: Sequence[Endpoint]) -> ReloadPlan:
    """What a new config changes, by label (``current`` is keyed by it). An endpoint whose
    label stays keeps its consumer, so its backlog and position (a credential rotated in its
    URL too); a changed secret applies from the next attempt (each is signed when sent)."""
    wanted_labels = {e.label for e in wanted}
    return ReloadPlan(
        added=tuple(e for e in wanted if e.label not in current),
        updated=tuple(e for e in wanted if e.label in current and current[e.label] != e),
        removed=tuple(k for k in current if k not in wanted_labels),
    )


@dataclass(frozen=True, slots=True)
class SlotPlan:
    slots: Mapping[str, int]   # label -> the slot its consumer is in
    freed: tuple[int, ...]     # slots whose consumer no endpoint wants now: deleted
    left_out: tuple[str, ...]  # labels past the cap: no slot


def assign_slots(held: Mapping[int, str | None], wanted: Sequence[str], slots: int) -> SlotPlan:
    """INT-2: which consumer slot each endpoint has. ``held`` is what the consumers record
    (slot -> the label in its metadata, ``None`` for one that records none). An endpoint that
    holds a slot keeps it (its backlog and position are that consumer); a new one takes the
    lowest free slot, in config order; a slot held for no wanted endpoint is freed. So a
    config change never moves an endpoint, and the same state gives the same plan."""
    wanted_set = set(wanted)
    kept: dict[str, int] = {}
    for slot, label in sorted(held.items()):
        if label is not None and label in wanted_set and label not in kept and 0 <= slot < slots:
            kept[label] = slot
    taken = set(kept.values())
    freed = tuple(slot for slot in sorted(held) if slot not in taken)
    free = iter(s for s in range(slots) if s not in taken)
    assigned = dict(kept)
    left_out: list[str] = []
    for label in dict.fromkeys(wanted):
        if label in assigned:
            continue
        taken_by = next(free, None)
        if taken_by is None:
            left_out.append(label)
        else:
            assigned[label] = taken_by
    return SlotPlan({label: assigned[label] for label in dict.fromkeys(wanted) if label in assigned}, freed,
                    tuple(left_out))


def event_type_of_subject(subject: str) -> str | None:
    """The TYPE token of ``hp.event.{cluster}.{node}.{TYPE}`` (as stored: a partition slot
    after it is passed over), or None if it is not one."""
    prefix, _, token = subjects.published(subject).rpartition(".")
    if not prefix.startswith("hp.event.") or prefix.count(".") != 3:
        return None
    try:
        return subjects.decode_token(token)
    except subjects.SubjectError:
        return None


# ---------------------------------------------------------------------------- envelope


def cloud_event(event: wire.NodeEvent) -> CloudEvent:
    """WEB-2: the CloudEvents 1.0 envelope; ``data`` is the event exactly as
    ``healthplane node events -o json`` renders it (the same ``wire.to_builtins``)."""
    return CloudEvent(
        attributes={
            "id": event.id,
            "source": SOURCE_PREFIX + SOURCE_SERVICE.get(event.type, event.actor),
            "type": TYPE_PREFIX + event.type,
            "subject": event.node_id,
            "time": event.occurred_at,
            "datacontenttype": "application/json",
        },
        data=wire.to_builtins(event),
    )


def envelope(event: wire.NodeEvent) -> bytes:
    """The structured-mode JSON body (built once per event, shared by every endpoint)."""
    return _JSON.write(cloud_event(event))


# ---------------------------------------------------------------------------- answers and retries

Verdict = Literal["delivered", "retry", "rejected"]
Next = Literal["delivered", "retry", "rejected", "max_attempts"]


def judge(status: int) -> Verdict:
    """2xx delivered; 408 and 429 retried; any other 4xx means the receiver refuses this
    request as it is, and sending it again cannot help; everything else is retried."""
    if 200 <= status < 300:
        return "delivered"
    if 400 <= status < 500 and status not in (408, 429):
        return "rejected"
    return "retry"


def after_attempt(status: int | None, attempt: int, max_attempts: int) -> Next:
    """WEB-3/WEB-4, what follows attempt ``attempt`` (1-based) that got ``status`` (None: no
    HTTP answer): done (``delivered``), dropped (``rejected`` by a 4xx, or ``max_attempts``
    spent), or another attempt after a backoff (``retry``)."""
    verdict = judge(status) if status is not None else "retry"
    if verdict == "retry" and attempt >= max_attempts:
        return "max_attempts"
    return verdict


# ---------------------------------------------------------------------------- outage


# Attempts of this many different events failing in a row put an endpoint down: one event
# failing alone may be that event (a payload the receiver chokes on), two cannot both be.
OUTAGE_EVENTS: Final = 2


def fails_the_endpoint(status: int | None) -> bool:
    """Whether an attempt's result speaks against the endpoint rather than the event: no HTTP
    answer at all (refused, reset, past its deadline, not HTTP) or a status that is retried
    (5xx, 408, 429, 3xx). A 2xx, or a 4xx refusing that payload, is an answer: the endpoint
    works."""
    return status is None or judge(status) == "retry"


@dataclass(frozen=True, slots=True)
class Reachability:
    """INT-2: whether an endpoint is down, from its attempts' results in the order they end.

    The endpoint is down once an attempt could not connect to it at all (nothing reached the
    receiver, so it cannot be about the event), or once attempts of ``OUTAGE_EVENTS``
    different events failed it in a row (:func:`fails_the_endpoint`); it is up again at its
    next answer, a 2xx or a refusing 4xx (a probe's, or an attempt's that was under way).
    ``failing`` holds the events (stream sequences) whose attempts failed it since its last
    answer (at most ``OUTAGE_EVENTS``); ``answers`` counts the answers so far, so that a
    caller can tell whether it answered since a moment it noted."""

    down: bool = False
    failing: frozenset[int] = frozenset()
    answers: int = 0


def after_result(state: Reachability, event: int, status: int | None, *, connected: bool = True) -> Reachability:
    """The endpoint's reachability once an attempt for ``event`` ended with ``status`` (None:
    no HTTP answer; ``connected`` False: not even a connection)."""
    if not fails_the_endpoint(status):
        return Reachability(down=False, failing=frozenset(), answers=state.answers + 1)
    if state.down or (connected and event in state.failing):
        return state
    failing = state.failing | {event}
    return Reachability(down=not connected or len(failing) >= OUTAGE_EVENTS, failing=failing,
                        answers=state.answers)


def node_key(event: wire.NodeEvent) -> tuple[str, str]:
    """What deliveries are ordered by: the event's node (in its cluster)."""
    return event.cluster, event.node_id


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` in its delay-seconds form; an HTTP date or garbage is ignored."""
    if value is None:
        return None
    value = value.strip()
    if not value.isascii() or not value.isdigit():
        return None
    return float(value)


def backoff_delay(attempt: int, draw: float, *, base_s: float, cap_s: float,
                  retry_after_s: float | None = None) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1-based) before the next one.

    Exponential with "equal jitter": the ceiling doubles from ``base_s`` up to ``cap_s`` and
    the wait is uniform in [ceiling/2, ceiling), so retries never come at once and a fleet
    of failed deliveries does not return in lockstep. ``draw`` is uniform in [0, 1). A
    receiver's ``Retry-After`` is honoured up to ``cap_s``.
    """
    # Not the shared ``runtime.backoff.Backoff``, which jitters ± around a nominal delay and
    # caps that nominal value: here ``base_s``/``cap_s`` are ceilings of the wait
    # (HEALTHPLANE_WEBHOOK_BACKOFF_CAP_SECONDS is the longest a retry ever waits) and the wait
    # is drawn below them. A Backoff matches only with both settings rescaled by 3/4 and
    # jitter 1/3, and then its rounding puts about 1 delay in 800 just outside
    # [ceiling/2, ceiling]; a receiver's Retry-After has no place in it either.
    ceiling = min(cap_s, base_s * math.pow(2, min(attempt - 1, 62)))
    delay = ceiling / 2 + min(max(draw, 0.0), 1.0) * ceiling / 2
    if retry_after_s is not None:
        delay = max(delay, min(retry_after_s, cap_s))
    return delay


# ---------------------------------------------------------------------------- log hygiene


def scrub(text: str, endpoint: Endpoint) -> str:
    """``text`` (an exception message, a config error) without the endpoint's secret or the
    parts of its URL that may hold credentials."""
    secrets = [endpoint.secret, endpoint.url, endpoint.key]
    parts = urlsplit(endpoint.url)
    secrets += [p for p in (parts.username, parts.password, parts.query, parts.fragment) if p]
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return re.sub(r"://[^/@\s]*@", "://***@", text)


MAX_SECRET_BYTES: Final = 4096


def secret_reader(read_file: Callable[[str, int], bytes], environ: Mapping[str, str]) -> SecretOf:
    """SEC-9: the dispatcher's own resolver of a webhook's secret reference — a file on its
    host (at most ``MAX_SECRET_BYTES``, surrounding whitespace dropped) or one of its
    environment variables. ``read_file`` is the I/O, given by ``dispatch``."""

    def secret_of(hook: Webhook) -> str | Unresolved:
        if hook.secret_env is not None:
            value = environ.get(hook.secret_env, "").strip()
            return value or Unresolved(f"environment variable {hook.secret_env} is not set or empty")
        path = hook.secret_file or ""
        try:
            data = read_file(path, MAX_SECRET_BYTES + 1)
        except OSError as exc:
            return Unresolved(f"cannot read secretFile {path}: {exc.strerror or type(exc).__name__}")
        if len(data) > MAX_SECRET_BYTES:
            return Unresolved(f"secretFile {path} is over {MAX_SECRET_BYTES} bytes")
        try:
            value = data.decode("utf-8").strip()
        except UnicodeDecodeError:
            return Unresolved(f"secretFile {path} is not UTF-8 text")
        return value or Unresolved(f"secretFile {path} is empty")

    return secret_of
