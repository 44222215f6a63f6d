"""NVIDIA's Xid catalog as data (XID-1): what an Xid means and what to do about it.

``xid_catalog.json`` beside this module transcribes NVIDIA's "Analyzing Xid Errors with the Xid
Catalog" (its source, date and version are in the file and in :data:`CATALOG`); it is read once,
at import, through ``importlib.resources``, and nothing here does any other I/O.

Per Xid the catalog gives an *immediate* resolution bucket (what recovers the GPU now: RESTART_APP,
RESET_GPU, RESTART_BM, RESTART_VM, CHECK_MECHANICALS, CHECK_UVM, UPDATE_SWFW, CONTACT_SUPPORT,
IGNORE or a WORKFLOW_*) and an *investigatory* one (what to look into if it comes back). Two
families need the log line itself:

- NVLink5 Xids 144-150: the first two registers in the parentheses, IntrInfo and Error Status,
  select a row of NVIDIA's "XID 144-150 Decode" sheet, whose bucket is the action
  (:func:`nvlink5_fields`, :func:`decode_nvlink5`). A line that cannot be decoded keeps the Xid's
  own bucket, WORKFLOW_NVLINK5_ERR. A row that says XID_154_EVAL defers to the Xid 154 logged
  with it (which carries its own action) and is RESTART_APP on its own.
- Xid 154 states the recovery action: "GPU recovery action changed from 0x0 (None) to 0x2 (Node
  Reboot Required)" is RESTART_BM (:func:`xid154_action`).

An Xid the catalog does not list, and a 154 whose action cannot be read, take the catalog's
documented default: CONTACT_SUPPORT, both immediate and investigatory (NVIDIA lists every unused
code as CONTACT_SUPPORT, and NVIDIA NVSentinel resolves an unknown Xid the same way).

Grading: one rule, derived from the bucket, with no second list of Xids:

1. SPEC ING-2's reference grading holds where it speaks: Xid 48, 63, 64, 74, 79, 92, 94 and 95 are
   critical and sticky. The catalog agrees for 48 (WORKFLOW_XID_48), 64 and 95 (RESET_GPU), 74
   (WORKFLOW_NVLINK_ERR) and 79 (RESTART_BM); it does not for 63 (IGNORE: a row remapping
   event), 92 (IGNORE: a high single-bit error rate) and 94 (RESTART_APP: a contained error), which
   keep ING-2's grade all the same.
2. Every other code is graded by the bucket of its recommended action (decoded from its log line
   where the catalog says to): RESET_GPU, RESTART_BM, RESTART_VM, CONTACT_SUPPORT,
   CHECK_MECHANICALS and the hardware workflows (WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR,
   WORKFLOW_NVLINK5_ERR) are critical; RESTART_APP, IGNORE, CHECK_UVM, UPDATE_SWFW and
   WORKFLOW_XID_45 (the cleanup after another fault) are warnings.

3. A code the catalog does not list (a newer driver's, a garbled line) is a warning with the
   default's action, CONTACT_SUPPORT: the operator is told, but a driver upgrade that logs
   codes this file does not know yet never holds a fleet's GPUs out of service by itself.

Critical and sticky go together: a critical Xid is held until the GPU is serviced or replaced
(ING-3); a warning is raised while its count climbs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Final, Literal

import msgspec

Grade = Literal["critical", "warning"]

DATA_FILE: Final = "xid_catalog.json"

# The immediate buckets of NVIDIA's catalog (its "Guidance Classes"). XID_154 is not an action:
# it is Xid 154's own row, "follow the action the message reports".
IMMEDIATE_BUCKETS: Final = (
    "RESTART_APP", "RESET_GPU", "RESTART_BM", "RESTART_VM", "CHECK_MECHANICALS", "CHECK_UVM",
    "UPDATE_SWFW", "CONTACT_SUPPORT", "IGNORE", "WORKFLOW_XID_13", "WORKFLOW_XID_31", "WORKFLOW_XID_45",
    "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR",
)
READ_FROM_MESSAGE: Final = "XID_154"
# A 144-150 decode row that defers to the Xid 154 logged with it.
DEFER_TO_XID154: Final = "XID_154_EVAL"

# Rule 2 of the module docstring: the buckets that make an Xid critical (and sticky).
SEVERE_BUCKETS: Final = frozenset({
    "RESET_GPU", "RESTART_BM", "RESTART_VM", "CONTACT_SUPPORT", "CHECK_MECHANICALS",
    "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR",
})
# Rule 1: SPEC ING-2's reference grading (the catalog disagrees for 63, 92 and 94; ING-2 wins).
REFERENCE_CRITICAL: Final = frozenset({48, 63, 64, 74, 79, 92, 94, 95})

# Healthplane's order of the buckets, least to most disruptive, to name one action for several
# Xids (a condition over many GPUs): a human (CONTACT_SUPPORT, CHECK_MECHANICALS) outranks a
# reboot, a reboot a GPU reset, a reset restarting the application.
ESCALATION: Final = (
    "IGNORE", "WORKFLOW_XID_13", "WORKFLOW_XID_31", "WORKFLOW_XID_45", "RESTART_APP", "CHECK_UVM",
    "UPDATE_SWFW", "RESET_GPU", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR",
    "RESTART_VM", "RESTART_BM", "CHECK_MECHANICALS", "CONTACT_SUPPORT",
)
_RANK: Final = {bucket: rank for rank, bucket in enumerate(ESCALATION)}


# ---------------------------------------------------------------------------- the data file


class _Source(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    title: str
    url: str
    spreadsheet: str


class _Default(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    immediate: str
    investigatory: str
    basis: str


class _Row(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    code: int
    name: str
    mnemonic: str
    immediate: str
    investigatory: str


class _Action2(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    intrinfo_v1: str
    intrinfo_v2: str
    immediate: str


class _DecodeRow(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    code: int
    unit: str
    intrinfo_v1: str
    intrinfo_v2: str
    error_status: list[str] | None
    immediate: str
    investigatory: str
    severity: str
    action2: _Action2 | None = None


class _Nvlink5(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    codes: list[int]
    without_xid154: str
    form: str
    decode: str
    rows: list[_DecodeRow]


class _RecoveryAction(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    value: int
    name: str
    immediate: str
    basis: str


class _Xid154(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    form: str
    decode: str
    actions: list[_RecoveryAction]


class _File(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    version: int
    source: _Source
    date: str
    driver_branch: str
    date_note: str
    buckets: dict[str, str]
    default: _Default
    xids: list[_Row]
    nvlink5: _Nvlink5
    xid154: _Xid154


# ---------------------------------------------------------------------------- the catalog


@dataclass(frozen=True, slots=True)
class XidInfo:
    """One Xid as the catalog has it; ``known`` False: not in it, the default's actions."""

    code: int
    name: str
    immediate: str
    investigatory: str
    known: bool
    mnemonic: str = ""


@dataclass(frozen=True, slots=True)
class BitPattern:
    """A 32-bit IntrInfo pattern of the decode sheet ('-': any bit), as a mask and its value."""

    text: str
    mask: int
    value: int

    @classmethod
    def parse(cls, text: str) -> BitPattern:
        if len(text) != 32 or set(text) - set("01-"):
            raise ValueError(f"{text!r}: not a 32-bit pattern of 0, 1 and -")
        return cls(text, int(text.replace("0", "1").replace("-", "0"), 2), int(text.replace("-", "0"), 2))

    def matches(self, register: int) -> bool:
        return register & self.mask == self.value


@dataclass(frozen=True, slots=True)
class Nvlink5Row:
    """A row of "XID 144-150 Decode": V1 patterns for drivers before R575, V2 from R575."""

    code: int
    unit: str
    v1: BitPattern
    v2: BitPattern
    error_status: frozenset[int] | None  # None: any
    immediate: str
    investigatory: str
    severity: str
    action2: tuple[BitPattern, BitPattern, str] | None = None

    def action(self, intrinfo: int, error_status: int) -> str | None:
        """This row's bucket for these registers, None when the row does not apply."""
        if self.error_status is not None and error_status not in self.error_status:
            return None
        if self.v1.matches(intrinfo) or self.v2.matches(intrinfo):
            return self.immediate
        if self.action2 is not None and (self.action2[0].matches(intrinfo) or self.action2[1].matches(intrinfo)):
            return self.action2[2]
        return None


@dataclass(frozen=True, slots=True)
class RecoveryAction:
    """What an Xid 154 line's new recovery action (``to 0x2 (Node Reboot Required)``) asks."""

    value: int
    name: str
    immediate: str


@dataclass(frozen=True, slots=True)
class Catalog:
    version: int
    source_title: str
    source_url: str
    date: str
    driver_branch: str
    note: str
    default: XidInfo  # code 0: the row every unknown code takes
    default_basis: str
    buckets: Mapping[str, str]  # bucket -> one line of what it means
    xids: Mapping[int, XidInfo]
    nvlink5: Mapping[int, tuple[Nvlink5Row, ...]]
    nvlink5_without_xid154: str
    recovery_actions: tuple[RecoveryAction, ...]


def _load() -> Catalog:
    raw = resources.files(__package__ or "healthplane.contracts").joinpath(DATA_FILE).read_bytes()
    data = msgspec.json.decode(raw, type=_File)
    known = {*IMMEDIATE_BUCKETS, READ_FROM_MESSAGE, DEFER_TO_XID154}
    immediates = [row.immediate for row in data.xids] + [data.default.immediate, data.nvlink5.without_xid154]
    immediates += [r.immediate for r in data.nvlink5.rows] + [r.action2.immediate for r in data.nvlink5.rows if r.action2]
    immediates += [a.immediate for a in data.xid154.actions]
    unknown = sorted(set(immediates) - known)
    if unknown:
        raise ValueError(f"{DATA_FILE}: buckets outside the catalog's: {', '.join(unknown)}")
    rows: dict[int, list[Nvlink5Row]] = {code: [] for code in data.nvlink5.codes}
    for r in data.nvlink5.rows:
        second = (BitPattern.parse(r.action2.intrinfo_v1), BitPattern.parse(r.action2.intrinfo_v2),
                  r.action2.immediate) if r.action2 else None
        status = frozenset(int(s, 16) for s in r.error_status) if r.error_status is not None else None
        rows[r.code].append(Nvlink5Row(r.code, r.unit, BitPattern.parse(r.intrinfo_v1), BitPattern.parse(r.intrinfo_v2),
                                       status, r.immediate, r.investigatory, r.severity, second))
    default = XidInfo(0, data.default.name, data.default.immediate, data.default.investigatory, known=False)
    return Catalog(
        version=data.version, source_title=data.source.title, source_url=data.source.url, date=data.date,
        driver_branch=data.driver_branch, note=data.date_note, default=default, default_basis=data.default.basis,
        buckets=MappingProxyType(dict(data.buckets)),
        xids=MappingProxyType({row.code: XidInfo(row.code, row.name, row.immediate, row.investigatory, True,
                                                 row.mnemonic) for row in data.xids}),
        nvlink5=MappingProxyType({code: tuple(found) for code, found in rows.items()}),
        nvlink5_without_xid154=data.nvlink5.without_xid154,
        recovery_actions=tuple(RecoveryAction(a.value, a.name, a.immediate) for a in data.xid154.actions),
    )


CATALOG: Final = _load()


# ---------------------------------------------------------------------------- reading it


def lookup(code: int) -> XidInfo:
    """The catalog's row for ``code``; the documented default (``known`` False) when it has none."""
    info = CATALOG.xids.get(code)
    if info is not None:
        return info
    default = CATALOG.default
    return XidInfo(code, default.name, default.immediate, default.investigatory, known=False)


# "... Link 09 (0x025525c6 0x00000000 0x00000000 ...)": IntrInfo, then Error Status. Registers
# are 32 bits: a longer number is not one.
_NVLINK5_FIELDS: Final = re.compile(r"\bLink\s+-?\d{1,6}\s*\(\s*0x([0-9a-fA-F]{1,8})\s+0x([0-9a-fA-F]{1,8})\b")
# "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
_RECOVERY: Final = re.compile(
    r"recovery action changed from\s+0x[0-9a-fA-F]{1,8}\s*(?:\([^()]{0,64}\))?\s+to\s+"
    r"(?:0x(?P<value>[0-9a-fA-F]{1,8})\b)?\s*(?:\((?P<name>[^()]{1,64})\))?",
    re.IGNORECASE,
)


def nvlink5_fields(message: str) -> tuple[int, int] | None:
    """IntrInfo and Error Status from an NVLink5 Xid line, None when it has none."""
    found = _NVLINK5_FIELDS.search(message)
    return (int(found[1], 16), int(found[2], 16)) if found else None


def decode_nvlink5(code: int, intrinfo: int, error_status: int) -> str | None:
    """The decode sheet's bucket for an NVLink5 Xid's registers: the first row that applies,
    None when none does (or ``code`` is not 144-150)."""
    for row in CATALOG.nvlink5.get(code, ()):
        action = row.action(intrinfo, error_status)
        if action is not None:
            return action
    return None


def xid154_action(message: str) -> str | None:
    """The bucket of the recovery action an Xid 154 line changed to, by its value, else its
    name; None when the line says neither in a form the catalog knows."""
    found = _RECOVERY.search(message)
    if found is None:
        return None
    if found["value"] is not None:
        value = int(found["value"], 16)
        for action in CATALOG.recovery_actions:
            if action.value == value:
                return action.immediate
    name = (found["name"] or "").strip().casefold()
    for action in CATALOG.recovery_actions:
        if name and action.name.casefold() == name:
            return action.immediate
    return None


def recommended_action(code: int, message: str | None = None) -> str:
    """The immediate bucket for Xid ``code``, decoded from its log line where the catalog says
    the line decides (144-150, 154). Always one of :data:`IMMEDIATE_BUCKETS`."""
    info = lookup(code)
    if message and code in CATALOG.nvlink5:
        fields = nvlink5_fields(message)
        decoded = decode_nvlink5(code, *fields) if fields else None
        if decoded == DEFER_TO_XID154:
            return CATALOG.nvlink5_without_xid154
        if decoded is not None:
            return decoded
    if info.immediate == READ_FROM_MESSAGE:
        return (xid154_action(message) if message else None) or CATALOG.default.immediate
    return info.immediate


def grade(code: int, message: str | None = None) -> Grade:
    """Critical or warning, by the rule of the module docstring."""
    if code in REFERENCE_CRITICAL:
        return "critical"
    if not lookup(code).known:
        return "warning"  # rule 3: told to a human (CONTACT_SUPPORT), never held for good
    return "critical" if recommended_action(code, message) in SEVERE_BUCKETS else "warning"


def sticky(code: int, message: str | None = None) -> bool:
    """True for a critical Xid: held until the GPU is serviced or replaced (ING-3)."""
    return grade(code, message) == "critical"


def meaning(bucket: str) -> str:
    """One line of what a bucket asks for ("" for a name the catalog does not use)."""
    return CATALOG.buckets.get(bucket, "")


def rank(action: str | None) -> int:
    """Where ``action`` stands in :data:`ESCALATION` (-1: none, or no bucket of the catalog)."""
    return _RANK.get(action, -1) if action else -1


def worst_action(actions: Iterable[str | None]) -> str | None:
    """The most disruptive of ``actions`` (:data:`ESCALATION`), None when there is none."""
    present = [a for a in actions if a]
    return max(present, key=lambda a: (_RANK.get(a, -1), a)) if present else None
