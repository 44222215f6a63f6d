"""Failure domains (DOM-1): the groups a node fails with — its rack, its NVLink domain, its
leaf switch, its power feed, and any group a site names — as ``{kind: value}``.

Pure: no I/O, no clock, no logging. The scorer resolves each node's domains into its view
(``NodeView.domains``); policy (DOM-2, DOM-3), the CLI, the api and any reader of the
``substrate-nodes`` bucket use the same functions, so every one of them sees the same groups.
docs/domains.md is the operator's page.

**Kinds.** ``rack``, ``nvlink`` (an NVLink domain: one NVL72 rack, or several racks on one
fabric), ``switch`` (the leaf switch), ``power`` (the power feed or PDU) are the well-known
kinds; any other name matching :data:`KIND_PATTERN` (``row``, ``cooling``, ``pod``) is a
site-named kind and works the same way. A node has at most one value per kind.

**Where a domain comes from.**

1. *The hardware* (:func:`hardware_domains`): the resource report's GPUs carry NVML's GPU fabric
   info (``devices[].fabric``: cluster UUID, clique id, state). A node whose GPUs finished
   fabric registration (state ``completed``, cluster UUID not all zeros) is in the NVLink
   domain :func:`nvlink_domain` names. Hardware without a fabric (PCIe cards, HGX boards
   without multi-node NVLink, NVML's NOT_SUPPORTED) tells nothing, which is not an error.
   The same report's ``annotations`` may tell the node's other domains as its agent was told
   them at provisioning (``domain.healthplane.io/rack: r12``, :data:`TOLD_PREFIX`; the
   simulator's ``--rack-size``), counted only for the kinds the config's ``fromReports`` lists.
2. *The cluster config* (:class:`Spec`, the config's ``domains:`` section): ``rules`` that map
   node ids by pattern to a value, and ``nodes``, an explicit ``node id -> {kind: value}``.

**Precedence, per kind.** What the hardware tells wins over the config (today only
``nvlink`` is told by hardware: the fabric knows its own membership better than a file kept
by hand; the config's ``nvlink`` applies to nodes whose hardware does not tell). Within the
config, ``nodes`` wins over ``rules``, and among rules the first in the file that matches
the node and yields a value for a kind gives that kind. Later rules still give other kinds.
What the node's annotations tell counts last, for a kind the config's ``fromReports`` lists and
neither gives: by default a report places a node in no rack.

**Patterns.** A rule has exactly one of ``match`` (a glob over the whole node id, as
``fnmatch.fnmatchcase``: ``*``, ``?``, ``[seq]``; case-sensitive) or ``regex`` (a Python
regular expression that must match the whole node id, ``re.fullmatch``). With ``regex`` the
``value`` may name the expression's groups as ``{group}`` (``regex: 'gpu-r(?P<n>\\d+)-.*'``,
``value: 'r{n}'``); without ``value`` the group named after the kind is the value
(``kind: rack, regex: 'gpu-r(?P<rack>\\d+)-.*'``). A rule whose group did not take part in the
match, or whose value comes out empty or invalid, gives nothing for that node.

**The NVLink domain id** is ``{clusterUuid}.{cliqueId}``: the fabric's cluster UUID in the
canonical lower-case 8-4-4-4-12 form, a dot, the clique id in decimal
(``6b1d6c4e-2e0f-4c65-9d3e-0d8f8a1c2b3a.32766``), the form NVIDIA's GPU Feature Discovery
gives its ``nvidia.com/gpu.clique`` node label. Nodes share an NVLink domain exactly when both
numbers are equal. Should a node's GPUs disagree (a fault in the fabric's own
configuration), the domain most of its GPUs are in wins, ties by the lower id.
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from healthplane.contracts import wire

WELL_KNOWN_KINDS: Final = ("rack", "nvlink", "switch", "power")
# Kinds some hardware tells; for these, what the hardware says wins over the config.
HARDWARE_KINDS: Final = frozenset({"nvlink"})
# A resource report's annotation ``{TOLD_PREFIX}{kind}`` tells the node's domain of that kind
# as its agent knows it (any kind but HARDWARE_KINDS); the config wins over it.
TOLD_PREFIX: Final = "domain.healthplane.io/"
KIND_PATTERN: Final = r"^[a-z][a-z0-9_-]{0,31}$"
VALUE_MAX: Final = 256
ZERO_UUID: Final = "00000000-0000-0000-0000-000000000000"

_KIND: Final = re.compile(KIND_PATTERN)
_PLACEHOLDER: Final = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class DomainError(ValueError):
    """A kind, value, pattern or selector that cannot be used; ``str()`` is one line saying why."""


def check_kind(kind: str) -> str:
    if not _KIND.match(kind):
        raise DomainError(f"kind {kind!r}: a lower-case name, letters, digits, '-' or '_', at most 32 "
                          f"(e.g. {', '.join(WELL_KNOWN_KINDS)})")
    return kind


def check_value(value: str) -> str:
    if not value or len(value) > VALUE_MAX:
        raise DomainError(f"value {value[:40]!r}: 1 to {VALUE_MAX} characters")
    if any(ord(c) < 0x20 or c == "\x7f" for c in value):
        raise DomainError(f"value {value[:40]!r}: control characters are not allowed")
    return value


# ---------------------------------------------------------------------------- the hardware


def nvlink_domain(cluster_uuid: str, clique_id: int) -> str:
    """The NVLink domain id of a fabric's cluster UUID and clique id (module doc)."""
    return f"{cluster_uuid.lower()}.{clique_id}"


def nvlink_of(devices: Iterable[wire.ResourceDevice]) -> str | None:
    """The NVLink domain the GPUs' fabric info places the node in; None when none tells."""
    found = Counter(nvlink_domain(d.fabric.cluster_uuid, d.fabric.clique_id) for d in devices
                    if d.fabric is not None and d.fabric.state == "completed"
                    and d.fabric.cluster_uuid.lower() != ZERO_UUID)
    if not found:
        return None
    return min(found.items(), key=lambda item: (-item[1], item[0]))[0]


def told_domains(annotations: Mapping[str, str]) -> dict[str, str]:
    """The domains a report's annotations tell (:data:`TOLD_PREFIX`); a kind the hardware tells,
    or a kind or value that cannot be used, tells nothing."""
    found = {}
    for key, value in annotations.items():
        kind = key.removeprefix(TOLD_PREFIX)
        if kind == key or kind in HARDWARE_KINDS:
            continue
        try:
            found[check_kind(kind)] = check_value(value)
        except DomainError:
            continue
    return found


def told_annotations(domains: Mapping[str, str]) -> dict[str, str]:
    """``domains`` as the annotations that tell them (what an agent, or the simulator, sends)."""
    return {TOLD_PREFIX + kind: value for kind, value in domains.items()}


def hardware_domains(report: wire.ResourceReport) -> dict[str, str]:
    """What a resource report tells of the node's domains (``{}``: nothing): its hardware's
    NVLink domain, and what its annotations tell (:func:`told_domains`)."""
    found = told_domains(report.annotations) if report.annotations else {}
    nvlink = nvlink_of(report.devices)
    if nvlink is not None:
        found["nvlink"] = nvlink
    return found


# ---------------------------------------------------------------------------- the config


class Rule(msgspec.Struct, frozen=True, kw_only=True):
    """One ``domains.rules`` entry, as folded (the config's own model validates it first)."""

    kind: str
    match: str | None = None  # a glob over the whole node id
    regex: str | None = None  # a regular expression matching the whole node id
    value: str | None = None  # with regex: may name its groups as {group}


class Spec(msgspec.Struct, frozen=True, kw_only=True):
    """The config's ``domains:`` section, as the folds keep it (snapshot-safe plain data)."""

    rules: tuple[Rule, ...] = ()
    nodes: dict[str, dict[str, str]] = {}
    reported: tuple[str, ...] = ()  # fromReports: kinds a node's annotations may tell (TOLD_PREFIX)


@dataclass(frozen=True, slots=True)
class _Compiled:
    kind: str
    pattern: re.Pattern[str]
    value: str | None        # a constant, a template with {group}s, or None: the kind's group
    template: bool


def compile_rule(rule: Rule) -> _Compiled:
    """The rule ready to match; :class:`DomainError` names what is wrong with it."""
    check_kind(rule.kind)
    if (rule.match is None) == (rule.regex is None):
        raise DomainError("a rule needs exactly one of match (a glob) or regex")
    if rule.match is not None:
        if not rule.match:
            raise DomainError("match: an empty glob matches no node id")
        if rule.value is None:
            raise DomainError("value: a match (glob) rule needs the value it gives")
        try:
            pattern = re.compile(fnmatch.translate(rule.match))
        except re.error as exc:  # none known on 3.11 (an empty range matches nothing): kept as a line
            raise DomainError(f"match {rule.match!r} is not a glob: {exc}") from None
        return _Compiled(rule.kind, pattern, check_value(rule.value), False)
    assert rule.regex is not None
    try:
        pattern = re.compile(rule.regex)
    except re.error as exc:
        raise DomainError(f"regex {rule.regex!r} is not a regular expression: {exc}") from None
    if rule.value is None:
        if rule.kind not in pattern.groupindex:
            raise DomainError(f"value: needed unless regex {rule.regex!r} has a group named after the kind "
                              f"((?P<{rule.kind}>...))")
        return _Compiled(rule.kind, pattern, None, False)
    names = _PLACEHOLDER.findall(rule.value)
    unknown = [name for name in names if name not in pattern.groupindex]
    if unknown:
        raise DomainError(f"value {rule.value!r}: {{{unknown[0]}}} is not a named group of regex {rule.regex!r}")
    if not names:
        check_value(rule.value)
    return _Compiled(rule.kind, pattern, rule.value, bool(names))


def _value_of(rule: _Compiled, node_id: str) -> str | None:
    found = rule.pattern.fullmatch(node_id)
    if found is None:
        return None
    if rule.value is None:
        value = found.group(rule.kind)
    elif rule.template:
        groups = found.groupdict()
        if any(groups[name] is None for name in _PLACEHOLDER.findall(rule.value)):
            return None
        value = _PLACEHOLDER.sub(lambda m: groups[m.group(1)] or "", rule.value)
    else:
        return rule.value
    try:
        return check_value(value) if value is not None else None
    except DomainError:
        return None


class Resolver:
    """A :class:`Spec` compiled once (config apply is rare, resolution per node is not)."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self._rules = tuple(compile_rule(rule) for rule in spec.rules)

    def configured(self, node_id: str) -> dict[str, str]:
        """The config's domains of ``node_id``: ``nodes`` first, then the first rule per kind."""
        found = dict(self.spec.nodes.get(node_id, {}))
        for rule in self._rules:
            if rule.kind in found:
                continue
            value = _value_of(rule, node_id)
            if value is not None:
                found[rule.kind] = value
        return found

    def resolve(self, node_id: str, hardware: Mapping[str, str]) -> dict[str, str]:
        """Every domain of ``node_id``, kinds in name order: the hardware's where it tells a
        kind it may (:data:`HARDWARE_KINDS`), the config's for the rest, and what the node's
        annotations told for a kind neither gives that the config accepts from reports."""
        found = self.configured(node_id)
        for kind, value in hardware.items():
            if kind in HARDWARE_KINDS or (kind in self.spec.reported and kind not in found):
                found[kind] = value
        return dict(sorted(found.items()))


_RESOLVERS: dict[int, tuple[Spec, Resolver]] = {}


def resolver_for(spec: Spec) -> Resolver:
    """The compiled :class:`Resolver` of ``spec``, built once per spec object."""
    cached = _RESOLVERS.get(id(spec))
    if cached is not None and cached[0] is spec:
        return cached[1]
    if len(_RESOLVERS) >= 64:  # configs come and go: keep the cache small
        _RESOLVERS.clear()
    resolver = Resolver(spec)
    _RESOLVERS[id(spec)] = (spec, resolver)
    return resolver


def resolve(node_id: str, hardware: Mapping[str, str], spec: Spec) -> dict[str, str]:
    """``node_id``'s domains from what its hardware told and the config's ``domains``."""
    return resolver_for(spec).resolve(node_id, hardware)


def of_report(report: wire.ResourceReport, spec: Spec) -> dict[str, str]:
    """A ``substrate-nodes`` record's node's domains: the record is the node's latest resource
    report, which carries what its hardware tells; the config in force adds the rest."""
    return resolve(report.node_id, hardware_domains(report), spec)


# ---------------------------------------------------------------------------- DOM-3's threshold

# A domain fault is at least this many nodes failing together: one node is the per-node path's.
MIN_FAILING = 2


def fault_threshold(share: int, members: int) -> int:
    """Failing members that make a ``members``-node domain one fault (DOM-3, ``domainFaults``):
    ``share`` % rounded up, never fewer than :data:`MIN_FAILING`. The policy's rule and
    health-ingest's correlated silence count the same way."""
    return max(MIN_FAILING, -(-share * members // 100))


# ---------------------------------------------------------------------------- selecting


def parse_selector(text: str) -> tuple[str, str]:
    """``"rack=r12"`` → ``("rack", "r12")``: the kind before the first ``=``, the value after
    it (a value may hold ``=``); :class:`DomainError` when it is not of that form."""
    kind, equals, value = text.partition("=")
    if not equals:
        raise DomainError(f"domain {text!r}: expected KIND=VALUE, e.g. rack=r12")
    try:
        return check_kind(kind), check_value(value)
    except DomainError as exc:
        raise DomainError(f"domain {text!r}: {exc}") from None


def parse_selectors(texts: Iterable[str]) -> tuple[tuple[str, str], ...]:
    return tuple(parse_selector(text) for text in texts)


def selected(domains: Mapping[str, str], wanted: Sequence[tuple[str, str]]) -> bool:
    """Whether a node in ``domains`` is in every one of ``wanted`` (AND; none wanted: True)."""
    return all(domains.get(kind) == value for kind, value in wanted)


def describe(domains: Mapping[str, str]) -> str:
    """One line for text output: ``nvlink 6b1d….32766, rack r12`` (``-`` when none)."""
    return ", ".join(f"{kind} {value}" for kind, value in sorted(domains.items())) or "-"
