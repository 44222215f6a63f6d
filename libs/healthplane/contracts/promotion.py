"""Promotion rules (RUL-1..RUL-3): count-in-window over a node's fault occurrences, then a
named condition and an action.

A rule says which occurrences count (a kind, and codes, catalog buckets or fatal ones
among it), how they group (per GPU, per GPU and code, per node, or across the GPUs of a
node), how many within which window, and what a firing means: a condition (type and the
rule's name as its reason) with an action — ``validate``, ``remediate``,
``needs-attention`` — or ``none`` (recorded only: the application's fault, say). A rule in
``record`` mode (RUL-2) fires the same way, and only the record is written.

Occurrences are read from node events alone, so health-ingest (live, folding the events it
and eviction wrote) and ``healthplane rules backtest`` (the same events, read back from the
stream) fold the same input to the same answer:

- ``FAULT_OBSERVED`` (health-ingest, from the reports): a new Xid, SXid, fatal machine check
  or uncorrectable memory error, with its code, device and how many since the last report;
- ``REMEDIATION_STARTED`` (eviction): kind ``remediation``, the step as code;
- ``REMEDIATION_SUCCEEDED`` of a reboot: kind ``reboot``;
- ``CONDITION_RAISED``: kind ``condition``, the condition type as code.

Bounded: per node and rule group at most ``count`` times (a firing empties its group), for
``across-gpus`` at most ``count`` devices, and the node's last ``REBOOTS_KEPT`` reboots.
Pure: times arrive with the events; no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

import msgspec

from healthplane.contracts import wire

Kind = Literal["xid", "sxid", "mce", "edac", "nic", "condition", "remediation", "reboot"]
KINDS: Final[tuple[str, ...]] = Kind.__args__  # type: ignore[attr-defined]
Group = Literal["gpu", "gpu-and-code", "node", "across-gpus"]
GROUPS: Final[tuple[str, ...]] = Group.__args__  # type: ignore[attr-defined]
Action = Literal["validate", "remediate", "needs-attention", "none"]
ACTIONS: Final[tuple[str, ...]] = Action.__args__  # type: ignore[attr-defined]
Mode = Literal["act", "record"]
# Kinds whose occurrences name a device (a GPU's PCI address, an NVSwitch, a DIMM); the
# others are the node's.
DEVICE_KINDS: Final = frozenset({"xid", "sxid", "edac", "nic"})
REBOOTS_KEPT: Final = 16
# What a firing's condition tells the remediation ladder, in the Xid catalog's words (XID-2):
# eviction starts the ladder where the bucket says (docs/remediation.md).
ACTION_BUCKET: Final[dict[str, str | None]] = {
    "needs-attention": "CONTACT_SUPPORT", "remediate": "RESTART_BM", "validate": None, "none": None}


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule as the fold keeps it (``config.PromotionRule`` is the operator's form)."""

    name: str
    kind: str
    codes: frozenset[str] = frozenset()    # empty: any code of the kind
    buckets: frozenset[str] = frozenset()  # Xid catalog immediate buckets; empty: any
    fatal: bool = False                    # only fatal (critical) occurrences
    group: str = "gpu"
    count: int = 2
    window_s: int = 24 * 3600
    burst_s: int = 0                       # occurrences this close to the last counted one merge
    after_reboots: int = 0                 # count only once the node was rebooted this often within the window
    condition: str = "gpu_xid_errors"
    action: str = "needs-attention"
    mode: str = "act"

    def matches(self, occurrence: Occurrence) -> bool:
        return (occurrence.kind == self.kind
                and (not self.codes or occurrence.code in self.codes)
                and (not self.buckets or (occurrence.action or "") in self.buckets)
                and (not self.fatal or occurrence.severity == "critical"))

    def group_of(self, occurrence: Occurrence) -> str:
        if self.group == "gpu":
            return occurrence.device
        if self.group == "gpu-and-code":
            return f"{occurrence.device}\x00{occurrence.code}"
        return ""  # node, across-gpus: one group per node

    def describe(self) -> str:
        what = f"{self.kind} {'/'.join(sorted(self.codes))}".strip() if self.codes else f"any {self.kind}"
        if self.fatal:
            what = f"fatal {what}"
        if self.buckets:
            what += f" asking {'/'.join(sorted(self.buckets))}"
        where = {"gpu": "on one GPU", "gpu-and-code": "of one code on one GPU", "node": "on the node",
                 "across-gpus": "on different GPUs"}[self.group]
        after = f" after {self.after_reboots} reboots" if self.after_reboots else ""
        return f"{what} {self.count}x {where} within {_span(self.window_s)}{after}"


class Occurrence(msgspec.Struct, frozen=True):
    at: datetime
    kind: str
    code: str
    device: str = ""
    count: int = 1
    severity: str = "warning"
    action: str | None = None  # the Xid catalog's bucket, for Xids


class Firing(msgspec.Struct, frozen=True):
    """A rule that fired on a node: what counted, when."""

    rule: str
    at: datetime
    count: int
    devices: tuple[str, ...]
    first_at: datetime
    mode: str
    action: str
    condition: str
    message: str


class NodeWindows(msgspec.Struct, omit_defaults=True):
    """A node's open windows: per ``rule\\x00group`` the times counted (epoch seconds), per
    across-GPUs rule each device's latest time, and the node's recent reboots."""

    counted: dict[str, list[float]] = {}
    devices: dict[str, dict[str, float]] = {}
    reboots: list[float] = []


def of_fault(fault: wire.FaultObservation, at: datetime) -> Occurrence:
    """A FAULT_OBSERVED's fault as an occurrence (health-ingest counts it as it writes it)."""
    return Occurrence(at, fault.kind, fault.code, fault.device, fault.count, fault.severity, fault.recommended_action)


def of_raise(condition: wire.ConditionChange, at: datetime) -> Occurrence:
    """A CONDITION_RAISED's condition as an occurrence of kind ``condition``."""
    return Occurrence(at, "condition", condition.type, severity=condition.severity)


def occurrences_of(event: wire.NodeEvent) -> list[Occurrence]:
    """What a node event counts as (none for most)."""
    if event.type == "FAULT_OBSERVED" and event.fault is not None:
        return [of_fault(event.fault, event.occurred_at)]
    if event.type == "REMEDIATION_STARTED" and event.remediation is not None:
        return [Occurrence(event.occurred_at, "remediation", event.remediation.action)]
    if event.type == "REMEDIATION_SUCCEEDED" and event.remediation is not None \
            and event.remediation.action == "reboot":
        return [Occurrence(event.occurred_at, "reboot", "reboot")]
    if event.type == "CONDITION_RAISED" and event.condition is not None:
        return [of_raise(event.condition, event.occurred_at)]
    return []


def observe(rules: Sequence[Rule], windows: NodeWindows, occurrence: Occurrence) -> list[Firing]:
    """Fold one occurrence into the node's windows; the rules it makes fire."""
    at = occurrence.at.timestamp()
    if occurrence.kind == "reboot":
        windows.reboots = [*windows.reboots[-(REBOOTS_KEPT - 1):], at]
    fired: list[Firing] = []
    for rule in rules:
        if not rule.matches(occurrence):
            continue
        if rule.after_reboots and sum(1 for t in windows.reboots if at - rule.window_s <= t <= at) \
                < rule.after_reboots:
            continue
        if rule.group == "across-gpus":
            firing = _across(rule, windows, occurrence, at)
        else:
            firing = _count(rule, windows, occurrence, at)
        if firing is not None:
            fired.append(firing)
    return fired


def _count(rule: Rule, windows: NodeWindows, occurrence: Occurrence, at: float) -> Firing | None:
    key = f"{rule.name}\x00{rule.group_of(occurrence)}"
    times = [t for t in windows.counted.get(key, ()) if at - t <= rule.window_s]
    if times and rule.burst_s and at - times[-1] <= rule.burst_s:
        return None  # the same burst: merged into the occurrence already counted
    added = 1 if rule.burst_s else max(1, min(occurrence.count, rule.count))
    times = [*times, *([at] * added)][-rule.count:]
    if len(times) < rule.count:
        windows.counted[key] = times
        return None
    windows.counted.pop(key, None)  # fired: the next firing needs as many again
    first = datetime.fromtimestamp(times[0], occurrence.at.tzinfo)
    return _firing(rule, occurrence, len(times), (occurrence.device,) if occurrence.device else (), first)


def _across(rule: Rule, windows: NodeWindows, occurrence: Occurrence, at: float) -> Firing | None:
    seen = {d: t for d, t in windows.devices.get(rule.name, {}).items() if at - t <= rule.window_s}
    seen.pop(occurrence.device, None)
    seen[occurrence.device] = at
    if len(seen) < rule.count:
        windows.devices[rule.name] = dict(sorted(seen.items(), key=lambda item: item[1])[-rule.count:])
        return None
    windows.devices.pop(rule.name, None)
    first = datetime.fromtimestamp(min(seen.values()), occurrence.at.tzinfo)
    return _firing(rule, occurrence, len(seen), tuple(sorted(seen)), first)


def _firing(rule: Rule, occurrence: Occurrence, count: int, devices: tuple[str, ...], first: datetime) -> Firing:
    where = f" on {', '.join(devices)}" if devices else ""
    does = {"validate": "validate the node", "remediate": "remediate the node",
            "needs-attention": "a human looks at the node", "none": "no action"}[rule.action]
    recorded = " (recorded only)" if rule.mode == "record" else ""
    message = (f"rule {rule.name}: {rule.describe()} — {count} since {wire.rfc3339(first)}{where}; "
               f"{does}{recorded}")
    return Firing(rule.name, occurrence.at, count, devices, first, rule.mode, rule.action, rule.condition, message)


def forget(windows: NodeWindows, rules: Iterable[Rule]) -> None:
    """Drop the windows of rules no longer configured (a config apply removed or renamed them)."""
    names = {rule.name for rule in rules}
    windows.counted = {k: v for k, v in windows.counted.items() if k.split("\x00", 1)[0] in names}
    windows.devices = {k: v for k, v in windows.devices.items() if k in names}


def _span(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
