"""Wire records: every JSON payload on a Healthplane subject, as msgspec Structs.

Keys are camelCase on the wire (``rename="camel"``), times are RFC 3339 UTC with ``Z``.
Decoders are strict and built once per type; a decode error names the field path
(``$.signals.edac.controllers[0].ce``) so a bad report can be logged and counted precisely.
Every list and free-text string a node sends is bounded (SEC-11, the bounds below): one past
its bound is refused as "Expected `array` of length <= 4096 - at `$.signals.kmsg.xid`".
``proto/`` holds the JSON Schema generated from these classes (``just proto``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal, TypeVar

import msgspec

# ---------------------------------------------------------------------------- bounds (SEC-11)
#
# Every list and free-text string a node publishes is bounded when it is decoded, and so is
# every list of another record that a fold keeps: a node's message may hold 256 KiB
# (permissions.NODE_PAYLOAD_LIMIT), room for ~100,000 tiny list items, each a key in some
# fold's state. A record past a bound is a WireError naming the field and the bound, set aside
# like any malformed input (REL-3). Each bound is many times (mostly 10-50x) the largest real
# machine's figure, so it never refuses a real report; the collector cuts its own lists to the
# same bounds before it publishes (healthplane_collector.agent.within_bounds), keeping the worst
# and newest entries. Under a node's 256 KiB some bounds cannot bind (4096 Xid entries of ~70
# bytes each): they hold for identities without that cap, and if the cap is ever raised.

# GPUs per node: 4 on an NVL72 compute tray, 8 on HGX, 16 on the biggest (HGX-2, DGX-2),
# 20 in a dense PCIe chassis: 256 is 12x that. Also the GPU ids a request or fault names.
GPUS_MAX: Final = 256
# Disks per node (SMART devices, SCSI I/O error counters): a storage server with four 102-bay
# JBODs has 408 drives, seen twice through multipath 816 block devices: 8192 is 10x that.
DISKS_MAX: Final = 8192
# EDAC memory controllers per node: 8 sockets x 4 IMCs (Sapphire Rapids) = 32, 2 x 12 UMCs
# (AMD Genoa) = 24: 512 is 16x the largest.
MEMORY_CONTROLLERS_MAX: Final = 512
# DIMMs under one controller: ghes_edac lists every DIMM of the machine under mc0, 768 on a
# 32-socket HPE Superdome Flex: 8192 is 10x that.
DIMMS_MAX: Final = 8192
# SMART attributes failing on one disk: the ATA attribute table has 30 slots: 512 is 17x.
SMART_ATTRIBUTES_MAX: Final = 512
# smartctl's exit status has 8 bits: 64 is 8x every bit set at once.
EXIT_STATUS_BITS_MAX: Final = 64
# Throttle reasons of one GPU: NVML names 10 clock-event reasons: 256 is 25x.
THROTTLE_REASONS_MAX: Final = 256
# Xid entries per report, one per (device, Xid) since the agent started: a failing node logs a
# dozen distinct Xids on each of its GPUs, ~200 on a 16-GPU node: 4096 is 20x that (a storm of
# one Xid is one entry whose count climbs).
XID_ENTRIES_MAX: Final = 4096
# SXid entries per report, one per (NVSwitch, SXid): 4-6 NVSwitches with a dozen distinct
# SXids each, under 100: 4096 is 40x that.
SXID_ENTRIES_MAX: Final = 4096
# Read-only block-device mounts (and filesystems the kernel remounted read-only) per node: a
# container host with every pod's read-only bind mount of a host disk lists ~1000: 16384 is 16x.
MOUNTS_MAX: Final = 16384
# Annotations of one node (its collector config): a few dozen at most: 1024 is 20x.
ANNOTATIONS_MAX: Final = 1024
# Holds one command names (``hold release ID...``): a node carries a handful: 1024.
HOLDS_MAX: Final = 1024
# What a step retries on (``retry.on``): one or two words: 64.
RETRY_ON_MAX: Final = 64
# Nodes of one job or allocation: the largest jobs span ~10,000 nodes, this project is sized for
# fleets of 100,000: 1,000,000 is 10x the whole fleet.
JOB_NODES_MAX: Final = 1_000_000
# Names: hostnames (253 characters at most in DNS), node ids, device names, PCI bus ids (12),
# GPU UUIDs (40), serials, models, DIMM labels (~40), versions: 1024 is 4x DNS's limit and
# 25x the longest label.
NAME_MAX: Final = 1024
# Paths: mount points and the devices behind them: Linux's own PATH_MAX.
PATH_MAX: Final = 4096
# Free text: a signal's reason, a kernel log line (at most ~1 KiB of text, LOG_LINE_MAX),
# a probe's error: 16 KiB is 16x a kernel line. The one text that joins others (SMART's reason
# names every disk it could not read) is cut by the collector to fit.
TEXT_MAX: Final = 16384

Name = Annotated[str, msgspec.Meta(max_length=NAME_MAX)]
FilePath = Annotated[str, msgspec.Meta(max_length=PATH_MAX)]
Text = Annotated[str, msgspec.Meta(max_length=TEXT_MAX)]

# ---------------------------------------------------------------------------- enums

SignalStatus = Literal["ok", "unavailable", "failed"]
ReportTrigger = Literal["scheduled", "kmsg", "start"]
Severity = Literal["info", "warning", "critical"]
Health = Literal["HEALTHY", "DEGRADED", "UNKNOWN"]
NodeStatus = Literal["READY", "CORDONED", "NOT_READY", "OFFLINE"]
HoldEffect = Literal["cordon", "evict", "deprovision"]
PolicyMode = Literal["observe", "cordon", "drain", "replace"]
# "replace" is automation's (policy, POL-4): a passive deprovision that ends in NODE_REPLACED.
CommandVerb = Literal[
    "cordon", "uncordon", "drain", "evict", "deprovision", "replace", "hold-release", "service",
    "validate", "isolate", "remediate",
]
CommandResult = Literal["applied", "refused", "retry"]
# "requeued": ended by a requeue directive; the step runs again from the beginning elsewhere.
AllocationState = Literal["placed", "started", "finished", "failed", "requeued"]
RestartPolicy = Literal["never", "on-node-fault"]
# REM: a ladder's steps. The agent runs the first two itself; the others are the control plane's.
RemediationAction = Literal["gpu-reset", "reboot", "replace", "needs-attention"]
AgentAction = Literal["gpu-reset", "reboot"]
AGENT_ACTIONS: Final[tuple[str, ...]] = AgentAction.__args__  # type: ignore[attr-defined]
DirectiveAction = Literal["requeue", "fail", "terminate"]

EventType = Literal[
    "CONDITION_RAISED",
    "CONDITION_CLEARED",
    "HEARTBEAT_MISSED",
    "HEARTBEAT_RESUMED",
    "SCORE_CHANGED",
    "POLICY_RECOMMENDED",
    "POLICY_ACTED",
    "POLICY_HALTED",
    "NODE_REGISTERED",
    "NODE_CORDONED",
    "NODE_UNCORDONED",
    "NODE_DRAINED",
    "NODE_EVICTED",
    "NODE_DEPROVISIONED",
    "NODE_REPLACED",
    "NODE_SERVICED",
    "HOLD_CREATED",
    "HOLD_RELEASED",
    "JOB_FAILURE_ATTRIBUTED",
    "VALIDATION_STARTED",
    "VALIDATION_PASSED",
    "VALIDATION_FAILED",
    "REMEDIATION_STARTED",
    "REMEDIATION_SUCCEEDED",
    "REMEDIATION_FAILED",
    "NODE_NEEDS_ATTENTION",
    # RUL-1: a new hardware fault occurrence (health-ingest, from the reports), and a promotion
    # rule that fired on what occurred (health-ingest, in either mode: RUL-2).
    "FAULT_OBSERVED",
    "RULE_FIRED",
    # JOB-4: the scheduler's own word on a node (a drain, DOWN or FAIL someone else set there),
    # written by the scheduler integration that reads it (the Slurm adapter).
    "SCHEDULER_DRAINED",
    "SCHEDULER_UNDRAINED",
    # DOM-3: a failure domain (rack, NVLink domain, …) failing as one, and its recovery: node-less
    # events of the policy, on the domain's reserved node id (subjects.domain_node_id).
    "DOMAIN_DEGRADED",
    "DOMAIN_RECOVERED",
]
EVENT_TYPES: Final[tuple[str, ...]] = EventType.__args__  # type: ignore[attr-defined]

ConditionType = Literal[
    "memory_errors",
    "disk_degraded",
    "disk_readonly",
    "machine_check_errors",
    "gpu_ecc_errors",
    "gpu_xid_errors",
    "gpu_throttling",
    "heartbeat_missed",
    "collector_failed",
    "telemetry_stale",
    "validation_failed",
    "repeated_faults",  # RUL-1: a promotion rule's, where its occurrences have no class of their own
    "scheduler_drained",  # JOB-4: evidence only, never acted on by automation
    "job_failures_anomalous",  # JOB-2: a node whose jobs fail improbably often against its peers'
]
CONDITION_TYPES: Final[tuple[str, ...]] = ConditionType.__args__  # type: ignore[attr-defined]
_ACRONYMS: Final = {"gpu": "GPU", "smart": "SMART", "ecc": "ECC", "xid": "Xid"}


def rfc3339(value: datetime) -> str:
    """A moment as people read it in text: RFC 3339, UTC, whole seconds, ``Z`` (JSON keeps the
    full precision)."""
    return value.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def condition_title(condition_type: str) -> str:
    """The one spelling of a condition (or fault class) in text: ``gpu_xid_errors`` and
    ``GPU_XID_ERRORS`` are "GPU Xid Errors", ``disk_degraded`` is "Disk Degraded"."""
    return " ".join(_ACRONYMS.get(word, word.capitalize()) for word in condition_type.lower().split("_"))


SEVERITY_LEVEL: Final[dict[str, int]] = {"info": 1, "warning": 2, "critical": 3}


class Record(msgspec.Struct, frozen=True, kw_only=True, rename="camel", gc=False):
    """Base of every wire record.

    ``gc=False``: records are frozen trees (records, lists, strings, times), so they cannot
    take part in a reference cycle, and the garbage collector need not track them: decoding
    is cheaper and fewer tracked objects mean fewer collections on every service's hot path
    (figures: docs/benchmarks.md, "Service loop"). Never put a record inside a list held by
    itself."""


class Sparse(Record, frozen=True, kw_only=True, omit_defaults=True):
    """A record whose optional fields are left out when unset (node events, commands)."""


# ---------------------------------------------------------------------------- health report


class DimmCounts(Record, frozen=True, kw_only=True):
    name: Name
    label: Name | None = None
    ce: int
    ue: int


class EdacController(Record, frozen=True, kw_only=True):
    name: Name
    ce: int
    ue: int
    ce_noinfo: int = 0
    ue_noinfo: int = 0
    dimms: Annotated[list[DimmCounts], msgspec.Meta(max_length=DIMMS_MAX)] = []


class EdacSignal(Record, frozen=True, kw_only=True):
    status: SignalStatus
    reason: Text | None = None
    controllers: Annotated[list[EdacController], msgspec.Meta(max_length=MEMORY_CONTROLLERS_MAX)] = []


class SmartAttribute(Record, frozen=True, kw_only=True):
    id: int
    name: Name
    value: int | None = None
    worst: int | None = None
    thresh: int | None = None
    raw: int | None = None
    when_failed: Literal["now", "past", ""] = ""


class SmartDevice(Record, frozen=True, kw_only=True):
    name: Name
    protocol: Name | None = None  # "ATA", "NVMe", "SCSI"
    model: Name | None = None
    serial: Name | None = None
    passed: bool | None = None
    exit_status: int = 0
    exit_status_bits: Annotated[list[Name], msgspec.Meta(max_length=EXIT_STATUS_BITS_MAX)] = []
    critical_warning: int | None = None
    failing_now: Annotated[list[SmartAttribute], msgspec.Meta(max_length=SMART_ATTRIBUTES_MAX)] = []
    failed_in_past: Annotated[list[SmartAttribute], msgspec.Meta(max_length=SMART_ATTRIBUTES_MAX)] = []
    error: Text | None = None


class SmartSignal(Record, frozen=True, kw_only=True):
    status: SignalStatus
    reason: Text | None = None
    devices: Annotated[list[SmartDevice], msgspec.Meta(max_length=DISKS_MAX)] = []


class IoErrorCount(Record, frozen=True, kw_only=True):
    name: Name
    count: int


class IoerrSignal(Record, frozen=True, kw_only=True):
    status: SignalStatus
    reason: Text | None = None
    devices: Annotated[list[IoErrorCount], msgspec.Meta(max_length=DISKS_MAX)] = []


class XidEntry(Record, frozen=True, kw_only=True):
    pci_bus_id: Name
    gpu_index: int | None
    xid: int
    count: int
    last_at: datetime | None = None
    last_message: Text


class SxidEntry(Record, frozen=True, kw_only=True):
    device: Name
    sxid: int
    count: int
    last_message: Text


class MachineChecks(Record, frozen=True, kw_only=True):
    corrected: int = 0
    fatal: int = 0


class HardwareErrorRecords(Record, frozen=True, kw_only=True):
    """GHES/APEI records by severity."""

    corrected: int = 0
    recoverable: int = 0
    fatal: int = 0


class KernelEdacCounts(Record, frozen=True, kw_only=True):
    ce: int = 0
    ue: int = 0


class RemountReadOnly(Record, frozen=True, kw_only=True):
    device: FilePath
    last_message: Text


class KmsgSignal(Record, frozen=True, kw_only=True):
    status: SignalStatus
    reason: Text | None = None
    xid: Annotated[list[XidEntry], msgspec.Meta(max_length=XID_ENTRIES_MAX)] = []
    sxid: Annotated[list[SxidEntry], msgspec.Meta(max_length=SXID_ENTRIES_MAX)] = []
    machine_checks: MachineChecks = MachineChecks()
    hardware_errors: HardwareErrorRecords = HardwareErrorRecords()
    edac: KernelEdacCounts = KernelEdacCounts()
    remount_read_only: Annotated[list[RemountReadOnly], msgspec.Meta(max_length=MOUNTS_MAX)] = []
    backlog_skipped: bool | None = None
    malformed_records: int = 0


class ReadOnlyMount(Record, frozen=True, kw_only=True):
    mount_point: FilePath
    device: FilePath
    fs_type: Name


class MountsSignal(Record, frozen=True, kw_only=True):
    status: SignalStatus
    reason: Text | None = None
    read_only: Annotated[list[ReadOnlyMount], msgspec.Meta(max_length=MOUNTS_MAX)] = []


class EccCounts(Record, frozen=True, kw_only=True):
    corrected: int
    uncorrected: int


class GpuEcc(Record, frozen=True, kw_only=True):
    """Never zeros when unavailable: the counts are null then (COL-10)."""

    status: Literal["ok", "unavailable"]
    reason: Text | None = None
    volatile: EccCounts | None = None
    aggregate: EccCounts | None = None


class GpuThrottle(Record, frozen=True, kw_only=True):
    reasons: Annotated[list[Name], msgspec.Meta(max_length=THROTTLE_REASONS_MAX)] = []
    thermal: bool = False
    power_brake: bool = False


class GpuRowRemap(Record, frozen=True, kw_only=True):
    correctable: int = 0
    uncorrectable: int = 0
    pending: bool = False
    failed: bool = False


# NVML's GPU fabric state (nvmlGpuFabricState_t), "failed" when registration completed with an
# error status; NOT_SUPPORTED (no fabric) is no GpuFabric at all.
GpuFabricState = Literal["not-started", "in-progress", "completed", "failed"]


class GpuFabric(Record, frozen=True, kw_only=True):
    """DOM-1: NVML's GPU fabric info (``nvmlDeviceGetGpuFabricInfoV``) of a GPU on a multi-node
    NVLink fabric (GB200 NVL72 and the like): the fabric's cluster UUID (8-4-4-4-12, lower
    case) and the clique (partition) id. GPUs with equal pairs share an NVLink domain
    (``healthplane.contracts.domains.nvlink_domain``)."""

    cluster_uuid: Name
    clique_id: int
    state: GpuFabricState


class GpuDevice(Record, frozen=True, kw_only=True):
    index: int
    pci_bus_id: Name
    uuid: Name | None = None
    serial: Name | None = None
    name: Name | None = None
    memory_bytes: int | None = None  # total framebuffer, as the driver reports it
    ecc: GpuEcc
    throttle: GpuThrottle
    row_remap: GpuRowRemap | None = None
    temperature_c: int | None = None
    fabric: GpuFabric | None = None  # DOM-1: NVML only; None on hardware without a fabric


class GpuSignal(Record, frozen=True, kw_only=True):
    status: SignalStatus
    reason: Text | None = None
    source: Literal["nvml", "nvidia-smi"] | None = None
    driver_version: Name | None = None
    devices: Annotated[list[GpuDevice], msgspec.Meta(max_length=GPUS_MAX)] = []


class Signals(Record, frozen=True, kw_only=True):
    edac: EdacSignal
    smart: SmartSignal
    ioerr: IoerrSignal
    kmsg: KmsgSignal
    mounts: MountsSignal
    gpu: GpuSignal


class HealthReport(Record, frozen=True, kw_only=True):
    """``hp.report.{cluster}.{node}``: what the collector saw (``collector --once -o json``)."""

    node_id: Name
    cluster: Name
    hostname: Name
    sent_at: datetime
    interval_seconds: int
    trigger: ReportTrigger
    signals: Signals
    boot_id: Name | None = None
    agent_version: Name | None = None


class RemediationRequest(Sparse, frozen=True, kw_only=True):
    """``hp.remediate.{cluster}.{node}``: one step of a node's ladder for its agent to run
    (REM-2); only that node may read the subject, only eviction write it."""

    id: str
    node_id: str
    cluster: str
    action: AgentAction
    attempt: int
    requested_at: datetime
    timeout_seconds: int
    gpus: Annotated[list[int], msgspec.Meta(max_length=GPUS_MAX)] | None = None  # gpu-reset: these GPUs (None: every GPU)
    reason: str | None = None


class RemediationOutcome(Sparse, frozen=True, kw_only=True):
    """What the agent did with a request: ``succeeded`` (a reset that the driver accepted; a
    reboot proven by a new boot id), ``failed`` (it tried: the tool or the host said no, or
    the boot id did not change), ``refused`` (not its node, not an action it runs, too old)."""

    request_id: Name
    action: Name
    result: Literal["succeeded", "failed", "refused"]
    reason: Text
    finished_at: datetime
    boot_id_before: Name | None = None
    boot_id: Name | None = None


# ---------------------------------------------------------------------------- resource report


class ResourceDevice(Record, frozen=True, kw_only=True):
    kind: Literal["gpu"]
    vendor: Literal["nvidia", "amd", "other"]
    index: int
    pci_bus_id: Name
    uuid: Name | None = None
    model: Name | None = None
    memory_bytes: int | None = None
    fabric: GpuFabric | None = None  # DOM-1: the driver's fabric info; None: it tells none


class ResourceReport(Record, frozen=True, kw_only=True):
    """``hp.resource.{cluster}.{node}``: inventory and readiness (COL-11)."""

    node_id: Name
    cluster: Name
    hostname: Name
    sent_at: datetime
    ready: bool
    cores: int
    memory_bytes: int
    devices: Annotated[list[ResourceDevice], msgspec.Meta(max_length=GPUS_MAX)] = []
    annotations: Annotated[dict[Name, Text], msgspec.Meta(max_length=ANNOTATIONS_MAX)] = {}
    definition: Name | None = None
    provisioned: bool = False
    health_reporting: bool = True
    boot_id: Name | None = None  # /proc/sys/kernel/random/boot_id: a new one proves a reboot (REM-2)
    # REM-2: what became of the latest remediation request the agent took (its own subject
    # only), carried until a newer one and sent at once in a new resource report; a reboot's
    # comes from the new boot, whose ``boot_id`` differs from the outcome's ``boot_id_before``.
    remediation: RemediationOutcome | None = None


# ---------------------------------------------------------------------------- assessment


class Condition(Record, frozen=True, kw_only=True):
    type: ConditionType
    reason: str
    severity: Severity
    message: str
    first_seen: datetime
    observations: int = 1
    # XID-1: what NVIDIA's Xid catalog says to do (its immediate bucket, e.g. RESTART_BM), on
    # gpu_xid_errors: the most disruptive action among the Xids behind the condition.
    recommended_action: str | None = None


class Assessment(Record, frozen=True, kw_only=True):
    """``hp.assess.{cluster}.{node}``: the node's complete active condition set after one report."""

    node_id: str
    cluster: str
    assessed_at: datetime
    report_sent_at: datetime | None
    health: Health
    conditions: list[Condition]
    definition: str | None = None
    real_fault: bool = False
    last_report_at: datetime | None = None
    interval_seconds: int | None = None


# ---------------------------------------------------------------------------- node events


class ConditionChange(Sparse, frozen=True, kw_only=True):
    type: ConditionType
    reason: str
    severity: Severity
    message: str
    previous_severity: Severity | None = None
    recommended_action: str | None = None  # XID-1: the condition's, on gpu_xid_errors


class Contribution(Record, frozen=True, kw_only=True):
    reason: str
    condition: str
    points: int  # negative: points deducted


class FaultObservation(Sparse, frozen=True, kw_only=True):
    """The ``fault`` field of FAULT_OBSERVED (RUL-1): new occurrences of one coded fault on one
    device since the node's last report. ``kind``: xid, sxid, mce, edac, nic; ``code``: the
    Xid, SXid or error kind; ``recommended_action``: the Xid catalog's bucket (XID-1)."""

    kind: Name
    code: Name
    device: Name = ""
    count: int = 1
    severity: Severity = "warning"
    recommended_action: Name | None = None


class RuleFiring(Sparse, frozen=True, kw_only=True):
    """The ``rule`` field of RULE_FIRED (RUL-1, RUL-2): which promotion rule, in which mode,
    what counted and from when; ``condition``: the condition it raised (act mode, an action)."""

    rule: Name
    mode: Literal["act", "record"]
    action: Literal["validate", "remediate", "needs-attention", "none"]
    count: int
    devices: Annotated[list[Name], msgspec.Meta(max_length=GPUS_MAX)] = []
    first_at: datetime
    condition: Name | None = None


class ValidationRecord(Sparse, frozen=True, kw_only=True):
    """The ``validation`` field of VALIDATION_* events (VAL-1): which suite, which validation
    job, how long it ran (not how long it queued: VAL-4) and why it passed or failed. A run
    over several nodes (``nodes`` > 1, an isolation's group) that fails names no one node:
    only a single node's failure raises ``validation_failed`` — or a run across a domain
    (``domain``, DOM-4: a suite that needs the domain's fabric), whose members share its verdict."""

    suite: str
    job: str
    duration_seconds: float | None = None
    reason: str | None = None
    nodes: int = 1  # how many nodes the run covered
    isolating: str | None = None  # the failed job an isolation (VAL-3) is looking into
    round: int | None = None  # the isolation's round (1-based)
    domain: str | None = None  # DOM-4: "kind=value", the domain whose members the run covered


class RemediationRecord(Sparse, frozen=True, kw_only=True):
    """The ``remediation`` field of REMEDIATION_* events (REM-1)."""

    action: RemediationAction
    attempt: int
    reason: str | None = None
    request_id: str | None = None


# JOB-4: what the scheduler says of a node that someone else took out of service there.
SchedulerNodeState = Literal["DRAIN", "DOWN", "FAIL"]


class SchedulerDrain(Sparse, frozen=True, kw_only=True):
    """The ``scheduler`` field of SCHEDULER_DRAINED / SCHEDULER_UNDRAINED (JOB-4): the state
    someone other than Healthplane set on the node in the scheduler, with the reason and who
    set it when the scheduler says (Slurm's Reason, ``reason_set_by_user``,
    ``reason_changed_at``). On SCHEDULER_UNDRAINED: the drain that ended."""

    scheduler: Name  # "slurm"
    scheduler_node: Name  # the node's name in the scheduler
    state: SchedulerNodeState
    reason: Text | None = None
    set_by: Name | None = None
    set_at: datetime | None = None


# DOM-3: the members a domain event lists, at most (a leaf switch may hold thousands of
# nodes; the counts say how many there are).
DOMAIN_MEMBERS_MAX: Final = 1000
DomainAction = Literal["needs-attention", "drain"]


class DomainRecord(Sparse, frozen=True, kw_only=True):
    """The ``domain`` field of DOMAIN_DEGRADED / DOMAIN_RECOVERED (DOM-3): which domain, its
    members and the ones failing (silent or degraded; each list the first DOMAIN_MEMBERS_MAX by
    name, the counts whole), the conditions the failing members carry (type -> how many of
    them), the rule's numbers and what the policy does about it."""

    kind: Name
    value: Name
    members: Annotated[list[Name], msgspec.Meta(max_length=DOMAIN_MEMBERS_MAX)] = []
    member_count: int = 0
    failing: Annotated[list[Name], msgspec.Meta(max_length=DOMAIN_MEMBERS_MAX)] = []
    failing_count: int = 0
    silent_count: int = 0
    conditions: dict[Name, int] = {}
    threshold: int = 0  # failing members that make the domain one fault
    share: int = 0  # the configured percentage behind the threshold
    window_seconds: float = 0.0
    action: DomainAction = "needs-attention"
    drained: Annotated[list[Name], msgspec.Meta(max_length=DOMAIN_MEMBERS_MAX)] = []  # drain commands sent


class Hold(Record, frozen=True, kw_only=True):
    id: str
    effect: HoldEffect
    reason: str | None
    actor: str
    created_at: datetime


class NodeEvent(Sparse, frozen=True, kw_only=True):
    """``hp.event.{cluster}.{node}.{TYPE}``: the durable record; the CLI and webhooks show it as is."""

    id: str
    node_id: str
    cluster: str
    type: EventType
    occurred_at: datetime
    message: str
    actor: str
    condition: ConditionChange | None = None
    score: int | None = None
    previous_score: int | None = None
    contributions: list[Contribution] | None = None
    penalties: str | None = None
    action: str | None = None
    policy_mode: PolicyMode | None = None
    hold: Hold | None = None
    fault_class: str | None = None
    moved: int | None = None
    failed: int | None = None
    drain_mode: Literal["passive", "active"] | None = None
    allocation_id: str | None = None
    command_id: str | None = None
    hostname: str | None = None
    definition: str | None = None
    provisioned: bool | None = None
    config_version: int | None = None
    validation: ValidationRecord | None = None
    remediation: RemediationRecord | None = None
    fault: FaultObservation | None = None  # FAULT_OBSERVED (RUL-1)
    rule: RuleFiring | None = None  # RULE_FIRED (RUL-1, RUL-2)
    scheduler: SchedulerDrain | None = None  # SCHEDULER_DRAINED / SCHEDULER_UNDRAINED (JOB-4)
    domain: DomainRecord | None = None  # DOMAIN_DEGRADED / DOMAIN_RECOVERED (DOM-3)


# ---------------------------------------------------------------------------- node view


class ScoreExplanation(Record, frozen=True, kw_only=True):
    penalties: str
    contributions: list[Contribution]


class AttributedFailures(Record, frozen=True, kw_only=True):
    count: int = 0
    last: datetime | None = None
    by_fault: dict[str, int] = {}


class NeedsAttention(Record, frozen=True, kw_only=True):
    """REM-1: the node stopped at NODE_NEEDS_ATTENTION; nothing automatic touches it until a
    service record."""

    since: datetime
    reason: str


class NodeView(Record, frozen=True, kw_only=True):
    """``hp.node.{cluster}.{node}``: one folded view per node, the ``node show -o json`` shape;
    the stream keeps the latest per node, so ``node list`` reads one record per node."""

    node_id: str
    cluster: str
    hostname: str | None
    status: NodeStatus
    health: Health
    last_reported_at: datetime | None
    score: int | None
    score_explanation: ScoreExplanation | None
    conditions: list[Condition]
    attributed_failures: AttributedFailures
    holds: list[Hold]
    jobs: int = 0
    definition: str | None = None
    # The node's own report interval: a reader can tell a view gone stale (no report folded
    # for several intervals while the node is not OFFLINE: the pipeline is behind or down).
    report_interval_seconds: int | None = None
    needs_attention: NeedsAttention | None = None
    # DOM-1: kind -> value (rack, nvlink, switch, power, site-named), from the node's hardware
    # and the cluster config (healthplane.contracts.domains: the forms and the precedence).
    domains: dict[str, str] = {}


# ---------------------------------------------------------------------------- commands


class Command(Sparse, frozen=True, kw_only=True):
    """``hp.cmd.{cluster}.{node}.{verb}.{actor}``: an operator's or automation's request."""

    id: str
    node_id: str
    cluster: str
    verb: CommandVerb
    actor: str
    issued_at: datetime
    reason: str | None = None
    active: bool = False
    evict: bool = False
    force: bool = False
    batch_id: str | None = None
    hold_ids: Annotated[list[str], msgspec.Meta(max_length=HOLDS_MAX)] = []
    effect: HoldEffect | None = None
    suite: str | None = None  # validate, isolate: the suite to run (None: the config's defaultSuite)
    job_id: str | None = None  # isolate: the failed job whose nodes are the suspects


class CommandOutcome(Sparse, frozen=True, kw_only=True):
    """``hp.outcome.{cluster}.{node}``: what became of a command (events, or a refusal)."""

    command_id: str
    node_id: str
    cluster: str
    verb: CommandVerb
    result: CommandResult
    message: str
    decided_at: datetime
    event_ids: list[str] = []
    hold_ids: list[str] = []  # holds this command created or released
    moved: int | None = None  # drain --active / evict: allocations requeued
    failed: int | None = None  # evict: allocations failed
    skipped: bool = False  # an --all member left alone (not READY, static, not yet known)
    passed: bool | None = None  # validate: the suite's verdict (the outcome comes when the run ends)
    faulty: list[str] | None = None  # isolate: the nodes named faulty
    cleared: list[str] | None = None  # isolate: the suspects cleared by a passing run
    excluded: dict[str, str] | None = None  # validate, isolate: node -> why it could not take part (VAL-4)


class PolicyCommand(Sparse, frozen=True, kw_only=True):
    """``hp.policy.{cluster}.{action}.{actor}``: an operator's instruction to the policy service itself
    (``healthplane policy breaker reset``); kept with the commands, never seen by eviction."""

    id: str
    cluster: str
    action: Literal["breaker-reset"]
    actor: str
    issued_at: datetime
    reason: str | None = None


# ---------------------------------------------------------------------------- scheduler protocol


class Allocation(Sparse, frozen=True, kw_only=True):
    """``hp.alloc.{cluster}.{node}.{alloc}``: one step of a job on one node (EVI-8)."""

    id: str
    job_id: str
    node_id: str
    cluster: str
    state: AllocationState
    at: datetime
    reason: str | None = None
    retry_on: Annotated[list[str], msgspec.Meta(max_length=RETRY_ON_MAX)] = []
    retry_attempts: int = 0
    restart: RestartPolicy = "never"
    node_fault_restarts: int = 0
    # What a real scheduler knows of the job (SLU-3): whether it can be requeued at all (a
    # Slurm job submitted --no-requeue cannot; None: the scheduler requeues any step), who
    # runs it, where, and on which nodes.
    requeueable: bool | None = None
    user: str | None = None
    partition: str | None = None
    nodes: Annotated[list[str], msgspec.Meta(max_length=JOB_NODES_MAX)] | None = None
    # A validation run's step (VAL-1): its exit status (None: killed or lost), the tail of
    # its output (at most OUTPUT_TAIL_BYTES), whether the suite's timeout ended it.
    exit_code: int | None = None
    output: str | None = None
    timed_out: bool = False


# What a runner keeps of a validation run's output: its tail, enough for any verdict's pattern.
OUTPUT_TAIL_BYTES: Final = 4096

# JOB-1: how a job's run ended on a node, in the scheduler protocol's words. Slurm's end states
# map onto these (docs/slurm.md, "Job outcomes"); the reference scheduler's on completed,
# failed and cancelled (a step its fail directive ended).
JobOutcomeKind = Literal["completed", "failed", "node_fail", "timeout", "cancelled", "preempted", "out_of_memory"]
JOB_OUTCOMES: Final[tuple[str, ...]] = JobOutcomeKind.__args__  # type: ignore[attr-defined]
# Where an outcome was learnt: the scheduler integration saw the job end (squeue, its own
# allocation records), or the scheduler's accounting said so after it left the queue (sacct).
OutcomeSource = Literal["observed", "accounting"]


class JobOutcome(Sparse, frozen=True, kw_only=True):
    """``hp.jobend.{cluster}.{node}.{job}``: how one run of a job ended on one of its nodes
    (JOB-1), one record per run and node, written once by the scheduler integration when the
    run ends. A run that the scheduler started again (requeued) has no outcome of its own: its
    job goes on. ``exitCode`` and ``signal`` are the job's own (its batch script's wait status:
    a job killed by a signal has a signal and no exit code); ``size`` is how many nodes the run
    held, so a statistic can split the blame of a multi-node failure (JOB-2)."""

    job_id: Name
    node_id: Name
    cluster: Name
    outcome: JobOutcomeKind
    ended_at: datetime
    scheduler: Name  # "slurm", "reference"
    source: OutcomeSource = "observed"
    attempt: int = 0  # which run of the job (Slurm's restart count, the reference scheduler's attempt)
    started_at: datetime | None = None
    runtime_seconds: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    size: int = 1
    nodes: Annotated[list[Name], msgspec.Meta(max_length=JOB_NODES_MAX)] | None = None
    partition: Name | None = None
    user: Name | None = None
    account: Name | None = None
    reason: Text | None = None


class ValidationSuite(Sparse, frozen=True, kw_only=True):
    """What a scheduler needs to run a suite (the verdict is eviction's): the command (argv, no
    shell), its timeout, the GPUs each node gives it."""

    name: str
    command: list[str]
    timeout_seconds: int
    gpus: int = 0


class Job(Sparse, frozen=True, kw_only=True):
    """``hp.job.{cluster}.{job}``: work submitted to the reference scheduler (``sim submit``).
    Each of ``steps`` runs as one allocation for ``duration_seconds``; ``retry_on``,
    ``retry_attempts`` and ``restart`` are what the step declared (EVI-3, EVI-5, EVI-6)."""

    id: str
    cluster: str
    steps: int
    duration_seconds: float
    submitted_at: datetime
    submitted_by: str
    retry_on: Annotated[list[str], msgspec.Meta(max_length=RETRY_ON_MAX)] = []
    retry_attempts: int = 0
    restart: RestartPolicy = "never"
    definition: str | None = None
    # A validation job (VAL-1, written by eviction): step i runs on ``nodes[i]``, held or not,
    # as soon as that node has room; it runs ``validation``'s command instead of sleeping.
    nodes: Annotated[list[str], msgspec.Meta(max_length=JOB_NODES_MAX)] | None = None
    validation: ValidationSuite | None = None
    # ``sim submit --fails-everywhere``: a bad application, whose every step fails within seconds
    # wherever it runs (the job's fault, never a node's: JOB-2 must blame no node for it).
    fails_everywhere: bool = False


class Directive(Sparse, frozen=True, kw_only=True):
    """``hp.directive.{cluster}.{node}``: eviction's instruction to the scheduler or provisioner."""

    id: str
    node_id: str
    cluster: str
    action: DirectiveAction
    message: str
    issued_at: datetime
    allocation_id: str | None = None
    cause_event_id: str | None = None


class TerminationResult(Sparse, frozen=True, kw_only=True):
    """``hp.provision.{cluster}.{node}``: the provisioner's answer to a ``terminate`` directive.
    A rejection (``accepted: false``) changes nothing and spends no replacement budget."""

    directive_id: str
    node_id: str
    cluster: str
    accepted: bool
    message: str
    at: datetime


class ProviderSetting(Sparse, frozen=True, kw_only=True):
    """``hp.provider.{cluster}.{node}``: how the simulated provisioner (the reference scheduler)
    answers a ``terminate`` for one node, set by ``sim provider reject|accept``. Development
    only; kept with the commands so that the answers replay the same way."""

    node_id: str
    cluster: str
    reject_terminations: bool
    message: str | None = None  # the provider's words on a rejection
    set_at: datetime
    actor: str


SimJobModel = Literal["job-killer", "slow-death"]


class SimJobFailures(Sparse, frozen=True, kw_only=True):
    """A simulated node that kills jobs while its counters stay clean (JOB-2's cases): with
    ``job-killer`` each user step it runs fails with probability ``rate``, within seconds of its
    start (a black hole); with ``slow-death`` the probability rises linearly from 0 at ``since``
    to ``rate`` over ``ramp_seconds``, and a step fails at its normal end."""

    model: SimJobModel
    rate: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
    since: datetime
    ramp_seconds: Annotated[float, msgspec.Meta(ge=0.0)] = 0.0


class SimHardware(Sparse, frozen=True, kw_only=True):
    """``hp.hardware.{cluster}.{node}``: the simulated node's hidden truth, which its reports do
    not show (``sim inject NODE --fault silent-gpu --gpu N``): the reference scheduler fails
    work and validation runs that touch those GPUs, so a validation run finds what counters
    cannot (VAL-3). Development only."""

    node_id: str
    cluster: str
    failing_gpus: Annotated[list[int], msgspec.Meta(max_length=GPUS_MAX)]
    set_at: datetime
    actor: str
    jobs: SimJobFailures | None = None  # `sim inject --fault job-killer | slow-death`


# ---------------------------------------------------------------------------- config, snapshots


class ConfigEnvelope(Record, frozen=True, kw_only=True):
    """``hp.config``: the whole validated cluster config, as applied."""

    version: int
    applied_at: datetime
    actor: str
    config: dict[str, Any]


class Snapshot(Record, frozen=True, kw_only=True):
    """``hp.snapshot.{service}.{partition}``: where a service stood, and where its folded state
    lies: ``chunks`` pieces of zlib-compressed JSON on ``hp.snapshot.{service}.{partition}.{slot}.{i}``.
    Two slots alternate, so a crash while writing one leaves the other intact."""

    service: str
    partition: int
    partitions: int = 1  # of how many (HA-4): another layout's snapshot is not this one's
    taken_at: datetime
    positions: dict[str, int]  # input stream -> last sequence folded into the state
    outputs: dict[str, int] = {}  # output stream -> its last sequence when this was taken
    # "input stream producer" -> the highest lease revision folded from that writer: a lower
    # one after it comes from a holder fenced off since (runtime/lease.py)
    lease_revisions: dict[str, int] = {}
    slot: int
    chunks: int
    size: int
    digest: str  # sha256 of the compressed state
    encoding: Literal["zlib+json"] = "zlib+json"


# ---------------------------------------------------------------------------- codec

R = TypeVar("R", bound=Record)


class WireError(ValueError):
    """A payload that does not decode; the message names the record and the field."""


_encoder: Final = msgspec.json.Encoder()
_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def encode(record: Record) -> bytes:
    return _encoder.encode(record)


def decoder(kind: type[R]) -> msgspec.json.Decoder[R]:
    """The one strict decoder for ``kind`` (built on first use, then shared)."""
    found = _decoders.get(kind)
    if found is None:
        found = _decoders[kind] = msgspec.json.Decoder(kind)
    return found


def decode(kind: type[R], data: bytes | str) -> R:
    try:
        return decoder(kind).decode(data)
    except msgspec.ValidationError as exc:
        raise WireError(f"invalid {kind.__name__}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise WireError(f"invalid {kind.__name__}: malformed JSON ({exc})") from exc


def to_builtins(record: Record) -> Any:
    """The record as plain JSON types, exactly as it is on the wire."""
    return msgspec.to_builtins(record)


# Every record on a subject, by subject kind: the contract proto/ is generated from.
RECORDS: Final[dict[str, type[Record]]] = {
    "report": HealthReport,
    "resource": ResourceReport,
    "assess": Assessment,
    "event": NodeEvent,
    "node": NodeView,
    "cmd": Command,
    "outcome": CommandOutcome,
    "alloc": Allocation,
    "jobend": JobOutcome,
    "job": Job,
    "directive": Directive,
    "provision": TerminationResult,
    "provider": ProviderSetting,
    "hardware": SimHardware,
    "remediate": RemediationRequest,
    "policy": PolicyCommand,
    "config": ConfigEnvelope,
    "snapshot": Snapshot,
}
