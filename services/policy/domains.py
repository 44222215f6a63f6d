"""Failure domains in the policy (DOM-2, DOM-3), pure: no I/O, no clock, no logging.

Three pieces, each a plain function of plain data (``rules.py`` calls them from the fold):

* **the membership index** (:class:`Domain`, :func:`join`, :func:`leave`): per domain
  ``(cluster, kind, value)`` its members (node keys), the ones out of service (whoever took
  them out, as the definition's ``maxUnavailablePercent`` counts them), the ones failing
  (silent or degraded) with the moment each began to, and the ones silent. The fold leaves a
  node's domains and joins them again around every change to its facts, as it does for pools;
* **the budget** (:func:`budget`, :func:`over_budget`, DOM-2): ``maxUnavailable`` and
  ``maxUnavailablePercent`` (rounded down, as a definition's ceiling) of one domain; with both
  the lower binds; a refusal names the domain and its numbers;
* **the share-in-window rule** (:func:`threshold`, :func:`failing_within`, :func:`assess`,
  DOM-3): a domain with at least ``minMembers`` members is one fault when ``share`` % of them
  (rounded up, never fewer than 2: one node is the per-node path's) began failing within
  ``window``; it has recovered once fewer than that many have been failing for ``recoverAfter``.

docs/domains.md ("Budgets per domain", "A domain fault is one fault") is the operator's page.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Literal

import msgspec

from healthplane.contracts import wire
from healthplane.contracts.domains import fault_threshold


class LimitSettings(msgspec.Struct, frozen=True):
    """``nodeHealth.domainLimits[]`` as the fold keeps it (DOM-2)."""

    kind: str
    max_unavailable: int | None = None
    max_unavailable_percent: int | None = None


class FaultSettings(msgspec.Struct, frozen=True):
    """``nodeHealth.domainFaults[]`` as the fold keeps it (DOM-3)."""

    kind: str
    share: int = 50
    window_s: float = 600.0
    min_members: int = 4
    recover_after_s: float = 300.0
    action: wire.DomainAction = "needs-attention"


class Domain(msgspec.Struct):
    """One domain's members and facts, and its episode (degraded since when; the number of its
    last event, which numbers its event ids the same way on every replay)."""

    cluster: str
    kind: str
    value: str
    members: set[str] = msgspec.field(default_factory=set)
    unavailable: set[str] = msgspec.field(default_factory=set)  # out of service, whoever took it out
    failing: dict[str, datetime] = msgspec.field(default_factory=dict)  # node key -> failing since
    silent: set[str] = msgspec.field(default_factory=set)  # failing because its heartbeat is missed
    degraded_since: datetime | None = None  # DOMAIN_DEGRADED in force since
    below_since: datetime | None = None  # fewer failing than the threshold since (:func:`track`)
    issued: int = 0

    @property
    def name(self) -> str:
        """``rack=r12``: how events and messages name it."""
        return f"{self.kind}={self.value}"


def domain_key(cluster: str, kind: str, value: str) -> str:
    # NUL cannot occur in a cluster name, a kind or a value (control characters are refused).
    return f"{cluster}\x00{kind}\x00{value}"


# ---------------------------------------------------------------------------- the index


class MemberFacts(msgspec.Struct, frozen=True):
    """What the index keeps of one node, for each of its domains."""

    out_of_service: bool = False
    failing_since: datetime | None = None
    silent: bool = False


def join(index: dict[str, Domain], cluster: str, node_key: str, domains: Mapping[str, str],
         facts: MemberFacts) -> None:
    """Add ``node_key`` to each of its ``domains`` with its facts."""
    for kind, value in domains.items():
        key = domain_key(cluster, kind, value)
        domain = index.get(key)
        if domain is None:
            domain = index[key] = Domain(cluster=cluster, kind=kind, value=value)
        domain.members.add(node_key)
        if facts.out_of_service:
            domain.unavailable.add(node_key)
        if facts.failing_since is not None:
            domain.failing[node_key] = facts.failing_since
            if facts.silent:
                domain.silent.add(node_key)


def refresh(index: dict[str, Domain], cluster: str, node_key: str, domains: Mapping[str, str],
            facts: MemberFacts) -> None:
    """A member's facts as they are now, in each of its ``domains`` (it is a member of each:
    ``join`` put it there); set operations only, so a view that changed nothing costs little."""
    for kind, value in domains.items():
        domain = index.get(domain_key(cluster, kind, value))
        if domain is None:
            join(index, cluster, node_key, {kind: value}, facts)
            continue
        if facts.out_of_service:
            domain.unavailable.add(node_key)
        else:
            domain.unavailable.discard(node_key)
        if facts.failing_since is not None:
            domain.failing[node_key] = facts.failing_since
        else:
            domain.failing.pop(node_key, None)
        if facts.failing_since is not None and facts.silent:
            domain.silent.add(node_key)
        else:
            domain.silent.discard(node_key)


def leave(index: dict[str, Domain], cluster: str, node_key: str, domains: Mapping[str, str]) -> None:
    """Take ``node_key`` out of each of its ``domains``. A domain left without members is
    dropped unless it has an episode to remember (its event numbers must never repeat)."""
    for kind, value in domains.items():
        key = domain_key(cluster, kind, value)
        domain = index.get(key)
        if domain is None:
            continue
        domain.members.discard(node_key)
        domain.unavailable.discard(node_key)
        domain.failing.pop(node_key, None)
        domain.silent.discard(node_key)
        if not domain.members and domain.issued == 0 and domain.degraded_since is None:
            del index[key]


# ---------------------------------------------------------------------------- the budget (DOM-2)


class Budget(msgspec.Struct, frozen=True):
    allowed: int  # nodes of the domain that may be out of service at once
    words: str  # the bound that gives it, as a refusal names it


def budget(limit: LimitSettings, members: int) -> Budget | None:
    """How many of a ``members``-node domain may be out of service at once: the lower of
    ``maxUnavailable`` and ``maxUnavailablePercent`` (rounded down: 25 % of 10 is 2); None when
    the limit sets neither."""
    candidates: list[Budget] = []
    if limit.max_unavailable is not None:
        candidates.append(Budget(limit.max_unavailable, f"maxUnavailable {limit.max_unavailable}"))
    if limit.max_unavailable_percent is not None:
        allowed = limit.max_unavailable_percent * members // 100
        candidates.append(Budget(allowed, f"maxUnavailablePercent {limit.max_unavailable_percent}% "
                                          f"of {members} = {allowed}"))
    return min(candidates, key=lambda b: b.allowed) if candidates else None


def over_budget(limit: LimitSettings, domain: Domain, node_key: str) -> str | None:
    """Why taking ``node_key`` out of service would pass ``domain``'s budget, naming the domain
    and its numbers; None when it would not."""
    members = len(domain.members) + (node_key not in domain.members)
    unavailable = len(domain.unavailable) - (node_key in domain.unavailable)
    found = budget(limit, members)
    if found is None or unavailable + 1 <= found.allowed:
        return None
    return (f"halted: {unavailable} of {members} nodes of domain {domain.name} are out of service and one more "
            f"would pass domainLimits {domain.kind} {found.words}")


# ---------------------------------------------------------------------------- the share in a window (DOM-3)


def threshold(settings: FaultSettings, members: int) -> int:
    """Failing members that make a ``members``-node domain one fault (:func:`fault_threshold`)."""
    return fault_threshold(settings.share, members)


def failing_within(domain: Domain, now: datetime, window_s: float) -> int:
    """Members still failing that began to within the window ending ``now``."""
    horizon = now - timedelta(seconds=window_s)
    return sum(1 for since in domain.failing.values() if since >= horizon)


def track(domain: Domain, settings: FaultSettings, now: datetime) -> None:
    """After a change to the domain's facts: since when it has had fewer failing members than
    the threshold (None while it has as many). A fact, folded the same on a refold, so a
    recovery is due at the same moment whether or not the service restarted meanwhile."""
    members = len(domain.members)
    if members >= settings.min_members and len(domain.failing) >= threshold(settings, members):
        domain.below_since = None
    elif domain.below_since is None:
        domain.below_since = now


Verdict = Literal["degraded", "recovered"]


def assess(domain: Domain, settings: FaultSettings, now: datetime) -> Verdict | None:
    """Whether ``domain`` has just become one fault (``share`` of its members began failing
    within ``window``), or has just recovered from one (below the threshold for
    ``recoverAfter``). The caller records the episode (``degraded_since``) when it acts."""
    members = len(domain.members)
    if domain.degraded_since is None:
        need = threshold(settings, members)
        if members >= settings.min_members and failing_within(domain, now, settings.window_s) >= need:
            return "degraded"
        return None
    below = domain.below_since
    if below is not None and now - below >= timedelta(seconds=settings.recover_after_s):
        return "recovered"
    return None


def shared_conditions(conditions: Iterable[Iterable[str]]) -> dict[str, int]:
    """Condition type -> how many of the failing members carry it, most shared first."""
    counts: dict[str, int] = {}
    for member in conditions:
        for kind in set(member):
            counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
