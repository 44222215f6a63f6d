"""The cluster config and the collector config, exactly as SPEC.md shows them.

pydantic models with the documented defaults. Unknown keys are refused (a typo such as
``cordonBelo`` must not silently fall back to a default), and every error names the field
path as written in the file (``nodeHealth.cordonBelow``).
"""

from __future__ import annotations

import fnmatch
import math
import re
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import yaml
from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from healthplane.contracts import domains as domains_spec
from healthplane.contracts import wire
from healthplane.contracts.streams import WEBHOOK_SLOTS

WEBHOOK_FILTER_VARIABLE: Final = "event"  # what a webhook's CEL filter reads (INT-3)

MIB = 1024 * 1024
GIB = 1024 * MIB
NODES_BUCKET_MIN_BYTES = 64 * MIB
LEASE_TTL_MIN_S = 2.0  # HA-8: a third of it between renewals, a second of margin before the fence
LEASE_TTL_MAX_S = 60.0
NODES_BUCKET_MAX_BYTES = 2 * GIB

Percent = Annotated[int, Field(ge=0, le=100)]
Score = Annotated[int, Field(ge=0, le=100)]


class _Camel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


_DURATION_RE = re.compile(r"^(\d+)(ms|s|m|h|d)$")
_DURATION_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``"5m"`` → 300.0 seconds; the reference's duration form."""
    match = _DURATION_RE.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a duration like 30s, 5m, 2h or 1d")
    return int(match.group(1)) * _DURATION_UNIT_S[match.group(2)]


class CircuitBreaker(_Camel):
    """Reference 004: a breaker on automated cordons (POL-6). ``percentage``/``maxNodes`` bound
    the cordons inside ``duration`` (a rate), ``maxCordonedNodes``/``maxCordonedPercentage``
    the nodes automation holds out of service at once; in each pair the lower one binds."""

    enabled: bool = True
    percentage: Percent = 50
    max_nodes: Annotated[int, Field(ge=0)] = 0
    max_cordoned_nodes: Annotated[int, Field(ge=0)] = 0
    max_cordoned_percentage: Percent = 0
    duration: str = "5m"

    @field_validator("duration")
    @classmethod
    def _duration(cls, value: str) -> str:
        if parse_duration(value) <= 0:
            raise ValueError("must be longer than zero")
        return value

    @model_validator(mode="after")
    def _can_trip(self) -> CircuitBreaker:
        # A breaker with every bound at 0 could never trip: refused rather than silently a
        # no-op while it says enabled (reference 004). enabled: false is how to turn it off.
        if self.enabled and not (self.percentage or self.max_nodes or self.max_cordoned_nodes
                                 or self.max_cordoned_percentage):
            raise ValueError(
                "an enabled breaker needs at least one of percentage, maxNodes, maxCordonedNodes, "
                "maxCordonedPercentage above 0 (it could never trip); use enabled: false to turn it off")
        return self

    @property
    def duration_seconds(self) -> float:
        return parse_duration(self.duration)


RuleKind = Literal["HealthEvent", "Node"]
TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
# Which variable an expression of each kind reads (reference 004: `event`, `node`).
RULE_VARIABLES: dict[str, str] = {"HealthEvent": "event", "Node": "node"}


class RuleExpression(_Camel):
    kind: RuleKind
    expression: str = Field(min_length=1)


class RuleMatch(_Camel):
    all: list[RuleExpression] = []
    any: list[RuleExpression] = []

    @model_validator(mode="after")
    def _not_empty(self) -> RuleMatch:
        if not self.all and not self.any:
            raise ValueError("match needs at least one expression under all or any")
        return self


class RuleCordon(_Camel):
    should_cordon: bool = False


class RuleTaint(_Camel):
    key: str = Field(min_length=1)
    value: str = ""
    effect: TaintEffect = "NoSchedule"


class RuleLabel(_Camel):
    key: str = Field(min_length=1)
    value: str = ""


class RuleSet(_Camel):
    """Reference 004's rule set: CEL over the health event and the node (POL-7)."""

    enabled: bool = True
    version: str = "1"
    name: str = Field(min_length=1)
    priority: int = 0
    match: RuleMatch
    cordon: RuleCordon = RuleCordon()
    taint: RuleTaint | None = None
    label: RuleLabel | None = None

    @model_validator(mode="after")
    def _expressions_compile(self) -> RuleSet:
        # Compiled here, at validate time, so a bad expression is refused naming its rule set
        # (the policy compiles the same text again and gets the cached program).
        from healthplane.contracts.expressions import ExpressionError, compile_expression

        for group in ("all", "any"):
            for index, rule in enumerate(getattr(self.match, group)):
                try:
                    compile_expression(rule.expression, [RULE_VARIABLES[rule.kind]])
                except ExpressionError as exc:
                    raise ValueError(f"rule set {self.name!r}, match.{group}[{index}] ({rule.kind}) "
                                     f"{rule.expression.strip()!r}: {exc}") from None
        return self


class Detector(_Camel):
    """POL-8: a named CEL expression over the node object; while it holds, the node carries
    ``condition`` with the detector's name as its reason (reference 003)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$")
    expression: str = Field(min_length=1)
    condition: wire.ConditionType
    severity: wire.Severity = "warning"
    message: str | None = None

    @model_validator(mode="after")
    def _expression_compiles(self) -> Detector:
        from healthplane.contracts.expressions import ExpressionError, compile_expression

        if self.condition in ("heartbeat_missed", "telemetry_stale", "collector_failed"):
            raise ValueError(f"detector {self.name!r}: {self.condition} is the control plane's own "
                             "condition, not a detector's")
        try:
            compile_expression(self.expression, ["node"])
        except ExpressionError as exc:
            raise ValueError(f"detector {self.name!r} {self.expression.strip()!r}: {exc}") from None
        return self


def _domain_kind(value: str) -> str:
    return domains_spec.check_kind(value)


def _unique_kinds(items: list[DomainLimit] | list[DomainFault], what: str) -> None:
    kinds = [item.kind for item in items]
    repeated = sorted({k for k in kinds if kinds.count(k) > 1})
    if repeated:
        raise ValueError(f"{what} for kind {repeated[0]!r} is given more than once; one entry per kind")


class DomainLimit(_Camel):
    """DOM-2: at most ``maxUnavailable`` nodes, and at most ``maxUnavailablePercent`` % (rounded
    down, as ``maxUnavailablePercent`` of a definition), of any one domain of ``kind`` out of
    service at once before automation takes another out; with both, the lower binds."""

    kind: str
    max_unavailable: Annotated[int, Field(ge=0)] | None = None
    max_unavailable_percent: Percent | None = None

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        return _domain_kind(value)

    @model_validator(mode="after")
    def _bounded(self) -> DomainLimit:
        if self.max_unavailable is None and self.max_unavailable_percent is None:
            raise ValueError(f"domain limit for kind {self.kind!r} needs maxUnavailable, maxUnavailablePercent "
                             "or both")
        return self


class DomainFault(_Camel):
    """DOM-3: when ``share`` % (rounded up, at least 2 nodes) of a domain of ``kind`` with at
    least ``minMembers`` members go silent or degraded within ``window``, the domain is one
    fault: one DOMAIN_DEGRADED, per-node automation on its members held, then ``action``
    (``needs-attention``: a person decides; ``drain``: every member drained passively at once).
    DOMAIN_RECOVERED once fewer than that have stayed failing for ``recoverAfter``."""

    kind: str
    share: Annotated[int, Field(ge=1, le=100)] = 50
    window: str = "10m"
    min_members: Annotated[int, Field(ge=2)] = 4
    recover_after: str = "5m"
    action: wire.DomainAction = "needs-attention"

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        return _domain_kind(value)

    @field_validator("window", "recover_after")
    @classmethod
    def _duration(cls, value: str) -> str:
        if parse_duration(value) <= 0:
            raise ValueError("must be longer than zero")
        return value

    @property
    def window_seconds(self) -> float:
        return parse_duration(self.window)

    @property
    def recover_after_seconds(self) -> float:
        return parse_duration(self.recover_after)


class JobOutcomeTest(_Camel):
    """JOB-2: the test that finds a node whose jobs fail improbably often against its peers'
    (cluster-wide; docs/jobs.md has the arithmetic)."""

    enabled: bool = True
    false_alarm_rate: Annotated[float, Field(gt=0, lt=1)] = 0.01  # per cluster and window
    window_hours: Annotated[int, Field(ge=1, le=168)] = 24  # at most the 7 days a history keeps
    min_runs: Annotated[float, Field(gt=0)] = 10
    min_peer_runs: Annotated[float, Field(gt=0)] = 20
    black_hole_seconds: Annotated[float, Field(gt=0)] = 60
    black_hole_min_failures: Annotated[float, Field(gt=0)] = 3
    user_failure_rate: Annotated[float, Field(gt=0, le=1)] = 0.5
    user_min_runs: Annotated[float, Field(gt=0)] = 5


class NodeHealth(_Camel):
    heartbeat_miss_threshold: Annotated[int, Field(ge=1)] = 3
    mode: wire.PolicyMode = "observe"
    cordon_below: Score = 60
    drain_below: Score = 45
    degraded_at_or_below: Score = 95
    max_unavailable_percent: Percent = 20
    cordon_suppression_minutes: Annotated[int, Field(ge=0)] = 30
    max_replacements_per_hour: Annotated[int, Field(ge=0)] = 3
    evict_on_fault_classes: list[str] = []
    max_eviction_restarts: Annotated[int, Field(ge=0)] = 3
    failure_tally_penalty: Annotated[int, Field(ge=0, le=100)] = 5
    failure_tally_half_life_hours: Annotated[float, Field(gt=0)] = 168
    penalties: dict[str, Annotated[int, Field(ge=0, le=100)]] = {}
    circuit_breaker: CircuitBreaker = CircuitBreaker()
    rule_sets: list[RuleSet] = []
    detectors: list[Detector] = []
    quiet_reports_to_clear: Annotated[int, Field(ge=1)] = 1
    ignore_read_only_mounts: list[str] = []
    # DOM-2, DOM-3: per domain kind, cluster-wide (a domain spans definitions).
    domain_limits: Annotated[list[DomainLimit], Field(max_length=64)] = []
    domain_faults: Annotated[list[DomainFault], Field(max_length=64)] = []
    job_outcomes: JobOutcomeTest = JobOutcomeTest()  # JOB-2, cluster-wide

    @field_validator("domain_limits", "domain_faults")
    @classmethod
    def _one_per_kind(cls, value: list[DomainLimit] | list[DomainFault],
                      info: ValidationInfo) -> list[Any]:
        _unique_kinds(value, "a domain limit" if info.field_name == "domain_limits" else "a domain fault rule")
        return value

    @model_validator(mode="after")
    def _thresholds(self) -> NodeHealth:
        if self.drain_below > self.cordon_below:
            raise ValueError(
                f"drainBelow ({self.drain_below}) must not be above cordonBelow "
                f"({self.cordon_below}): a node would be drained before it is cordoned"
            )
        return self

    @field_validator("rule_sets", "detectors")
    @classmethod
    def _unique_names(cls, value: list[RuleSet] | list[Detector], info: ValidationInfo) -> list[Any]:
        names = [item.name for item in value]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            what = "rule set" if info.field_name == "rule_sets" else "detector"
            raise ValueError(f"{what} name {repeated[0]!r} is used more than once; names must be unique")
        return value

    @field_validator("evict_on_fault_classes")
    @classmethod
    def _fault_classes(cls, value: list[str]) -> list[str]:
        known = {t.upper() for t in wire.CONDITION_TYPES}
        unknown = [v for v in value if v not in known]
        if unknown:
            raise ValueError(f"unknown fault class {unknown[0]!r}; known: {', '.join(sorted(known))}")
        return value

    @field_validator("ignore_read_only_mounts")
    @classmethod
    def _globs(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern.startswith("/") and not pattern.startswith("*"):
                raise ValueError(f"{pattern!r} is not an absolute mount point or glob")
            fnmatch.translate(pattern)
        return value


class NodeHealthOverride(_Camel):
    """A provisioner definition's nodeHealth: every field optional, merged over the cluster's."""

    heartbeat_miss_threshold: Annotated[int, Field(ge=1)] | None = None
    mode: wire.PolicyMode | None = None
    cordon_below: Score | None = None
    drain_below: Score | None = None
    degraded_at_or_below: Score | None = None
    max_unavailable_percent: Percent | None = None
    cordon_suppression_minutes: Annotated[int, Field(ge=0)] | None = None
    max_replacements_per_hour: Annotated[int, Field(ge=0)] | None = None
    evict_on_fault_classes: list[str] | None = None
    max_eviction_restarts: Annotated[int, Field(ge=0)] | None = None
    failure_tally_penalty: Annotated[int, Field(ge=0, le=100)] | None = None
    failure_tally_half_life_hours: Annotated[float, Field(gt=0)] | None = None
    penalties: dict[str, Annotated[int, Field(ge=0, le=100)]] | None = None
    quiet_reports_to_clear: Annotated[int, Field(ge=1)] | None = None
    ignore_read_only_mounts: list[str] | None = None


class ProvisionerDefinition(_Camel):
    node_health: NodeHealthOverride = NodeHealthOverride()
    validate_before_return: bool | None = None  # VAL-2: the cluster's `validation.validateBeforeReturn` when unset


class PassWhen(_Camel):
    """VAL-1: how a suite's run is read. The exit status always counts; the output may also have
    to match a regular expression, or be JSON whose field (a dotted path) equals a value."""

    exit_code: int = 0
    output_matches: str | None = None
    json_field: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
    json_equals: Any = None

    @model_validator(mode="after")
    def _readable(self) -> PassWhen:
        if self.output_matches is not None:
            try:
                re.compile(self.output_matches)
            except re.error as exc:
                raise ValueError(f"outputMatches {self.output_matches!r} is not a regular expression: {exc}") from None
        if self.json_field is not None and self.json_equals is None:
            raise ValueError(f"jsonField {self.json_field!r} needs jsonEquals: the value that passes")
        if self.json_field is None and self.json_equals is not None:
            raise ValueError("jsonEquals needs jsonField: which field of the output to compare")
        return self


class Suite(_Camel):
    """VAL-1: a diagnostic run on the nodes under test (``dcgmi diag -r 2``, an NCCL all-reduce,
    a burn test): the command (argv, no shell), how long it may take, the GPUs a node needs to
    take part (fewer: excluded, VAL-4), how to read the result."""

    command: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    timeout_seconds: Annotated[int, Field(ge=1, le=86400)] = 600
    gpus: Annotated[int, Field(ge=0, le=64)] = 0
    pass_when: PassWhen = PassWhen()
    # DOM-4: a suite that needs a domain's fabric (an NCCL all-reduce across the NVLink domain:
    # ``acrossDomain: nvlink``) runs on every member of the validated node's domain of that kind.
    across_domain: str | None = None

    @field_validator("across_domain")
    @classmethod
    def _across(cls, value: str | None) -> str | None:
        return None if value is None else domains_spec.check_kind(value)


class IsolationSettings(_Camel):
    """VAL-3: bisecting a failed multi-node job's suspects with validation runs."""

    auto: bool = False  # after a multi-node job failure with no single faulty node named
    max_concurrent: Annotated[int, Field(ge=1, le=64)] = 8
    timeout_seconds: Annotated[int, Field(ge=60, le=7 * 86400)] = 3600
    # DOM-4: domain kinds whose members among the suspects are validated as one and named as
    # one (an NVLink domain fails a job across it when any member's fabric does).
    keep_together: Annotated[list[str], Field(max_length=8)] = ["nvlink"]

    @field_validator("keep_together")
    @classmethod
    def _kinds(cls, value: list[str]) -> list[str]:
        return [domains_spec.check_kind(kind) for kind in value]


class Validation(_Camel):
    suites: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")], Suite] = {}
    default_suite: str | None = None
    validate_before_return: bool = False
    isolation: IsolationSettings = IsolationSettings()

    @model_validator(mode="after")
    def _suites_named(self) -> Validation:
        if self.default_suite is not None and self.default_suite not in self.suites:
            known = ", ".join(sorted(self.suites)) or "none defined"
            raise ValueError(f"defaultSuite {self.default_suite!r} is not a suite ({known})")
        if self.validate_before_return and self.default_suite is None:
            raise ValueError("validateBeforeReturn needs defaultSuite: the suite a node must pass to return")
        return self


class RemediationStep(_Camel):
    """REM-1: one rung of a ladder. ``gpu-reset`` and ``reboot`` are run by the node's agent and
    must show their effect within ``timeoutSeconds`` (the fault's condition clears); ``replace``
    hands the node to the provisioner; ``needs-attention`` stops there for a person."""

    action: wire.RemediationAction
    timeout_seconds: Annotated[int, Field(ge=10, le=86400)] = 600
    # A step the host or provider refused (the agent could not run it) runs again after
    # retryBackoffSeconds, doubling, up to `retries` times, before the next step.
    retries: Annotated[int, Field(ge=0, le=5)] = 2
    retry_backoff_seconds: Annotated[int, Field(ge=1, le=3600)] = 30


TERMINAL_STEPS: Final = ("replace", "needs-attention")


class Ladder(_Camel):
    """REM-1: the steps for one fault class (a condition type in upper case), optionally only
    for some Xids (``gpu_xid_errors``) or condition reasons; the most specific ladder wins."""

    fault_class: str = Field(pattern=r"^[A-Z][A-Z0-9_]*$")
    xids: list[Annotated[int, Field(ge=1, le=1023)]] = []
    reasons: list[Annotated[str, Field(min_length=1)]] = []
    steps: list[RemediationStep] = Field(min_length=1, max_length=8)
    validate_suite: str | None = None  # success also needs this suite to pass (VAL)

    @model_validator(mode="after")
    def _ends_with_a_person_or_a_new_node(self) -> Ladder:
        if self.steps[-1].action not in TERMINAL_STEPS:
            raise ValueError(f"a ladder must end in replace or needs-attention (this one ends in "
                             f"{self.steps[-1].action}): after its last step nothing automatic may touch the node")
        for i, step in enumerate(self.steps[:-1]):
            if step.action in TERMINAL_STEPS:
                raise ValueError(f"steps.{i}: {step.action} can only be the last step")
        if self.xids and self.fault_class != "GPU_XID_ERRORS":
            raise ValueError("xids narrows a GPU_XID_ERRORS ladder only")
        known = {c.upper() for c in wire.CONDITION_TYPES}
        if self.fault_class not in known:
            raise ValueError(f"faultClass {self.fault_class!r} is not a condition type in upper case "
                             f"({', '.join(sorted(known))})")
        return self


class Remediation(_Camel):
    """REM-1: ladders per fault class, and the bounds that keep them from looping."""

    ladders: list[Ladder] = []
    max_attempts_per_node: Annotated[int, Field(ge=1, le=50)] = 4
    window_minutes: Annotated[int, Field(ge=1, le=7 * 24 * 60)] = 24 * 60


class Webhook(_Camel):
    """One endpoint. Its HMAC secret is a reference the webhook dispatcher resolves on its own
    host (SEC-9): ``secretFile`` (a path) or ``secretEnv`` (a variable), never the secret
    itself — the config is a record on the bus that every viewer, the api and every service
    read, and whoever holds the secret signs CloudEvents as this control plane."""

    url: AnyHttpUrl
    secret: str | None = Field(None, repr=False)  # refused: see _referenced
    secret_file: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    secret_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=256)] | None = None
    events: list[wire.EventType] | None = None
    # INT-3: a CEL expression over the event as JSON (``event.nodeId``, ``event.type``,
    # ``event.condition.severity``...); only the events it is true for are delivered.
    filter: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    max_attempts: Annotated[int, Field(ge=1, le=100)] = 5

    @field_validator("filter")
    @classmethod
    def _filter_compiles(cls, expression: str | None) -> str | None:
        from healthplane.contracts.expressions import ExpressionError, compile_expression

        if expression is not None:
            try:
                compile_expression(expression, [WEBHOOK_FILTER_VARIABLE])
            except ExpressionError as exc:
                raise ValueError(f"{expression.strip()!r} is not a usable CEL filter: {exc}") from None
        return expression

    @model_validator(mode="after")
    def _referenced(self) -> Webhook:
        if self.secret is not None:
            raise ValueError("secret: a webhook secret in the config is readable by every viewer (SEC-9); "
                             "name a file (secretFile) or an environment variable (secretEnv) the webhook "
                             "dispatcher reads")
        if (self.secret_file is None) == (self.secret_env is None):
            raise ValueError("name the secret with exactly one of secretFile or secretEnv")
        if self.secret_file is not None and not self.secret_file.startswith("/"):
            raise ValueError("secretFile must be an absolute path on the webhook dispatcher's host")
        return self


class Substrate(_Camel):
    # Unset (None) changes nothing: an existing bucket keeps its cap, a new one gets 64 MiB
    # (BRG-1). Set, it must lie in 64 MiB..2 GiB; stream administration resizes the bucket at the
    # next `healthplane up` or `healthplane streams converge` (the bridge may not, SEC-10).
    nodes_bucket_max_bytes: Annotated[
        int, Field(ge=NODES_BUCKET_MIN_BYTES, le=NODES_BUCKET_MAX_BYTES)
    ] | None = None


class Leases(_Camel):
    # HA-8: the leases bucket's TTL, which bounds a standby's takeover after its holder dies.
    # Unset (None) keeps the bucket's (a new one gets streams.LEASE_TTL_S); set, stream
    # administration changes it at the next `healthplane up` or `streams converge`, and each
    # service times its lease by the bucket's at its start (restart them after a change).
    # 2 s at least: a holder renews at a third of it and fences itself a second before it.
    ttl_seconds: Annotated[float, Field(ge=LEASE_TTL_MIN_S, le=LEASE_TTL_MAX_S)] | None = None


class DomainRule(_Camel):
    """DOM-1: node ids matching ``match`` (a glob) or ``regex`` (whole id) are in the ``kind``
    domain ``value`` (with regex, ``{group}`` names a group; no value: the group named after
    the kind). Forms and precedence: ``healthplane.contracts.domains``, docs/domains.md."""

    kind: str
    match: Annotated[str, Field(max_length=1024)] | None = None
    regex: Annotated[str, Field(max_length=1024)] | None = None
    value: str | None = None

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        return domains_spec.check_kind(value)

    @field_validator("regex")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _usable(self) -> DomainRule:
        domains_spec.compile_rule(self.spec())
        return self

    def spec(self) -> domains_spec.Rule:
        return domains_spec.Rule(kind=self.kind, match=self.match, regex=self.regex, value=self.value)


class Domains(_Camel):
    """DOM-1: each node's failure domains where its hardware does not tell them: ``rules`` by
    node id pattern and ``nodes``, an explicit ``node id -> {kind: value}`` that wins over them;
    ``fromReports``, the kinds a node's own resource report may tell where neither gives one
    (its agent's ``domain.healthplane.io/KIND`` annotations; the simulator's ``--rack-size``)."""

    rules: list[DomainRule] = []
    nodes: dict[Annotated[str, Field(min_length=1, max_length=1024)], dict[str, str]] = {}
    from_reports: Annotated[list[str], Field(max_length=32)] = []

    @field_validator("from_reports")
    @classmethod
    def _reported(cls, value: list[str]) -> list[str]:
        for kind in value:
            if domains_spec.check_kind(kind) in domains_spec.HARDWARE_KINDS:
                raise ValueError(f"kind {kind!r} is told by the hardware, not by a report's annotations")
        return value

    @field_validator("nodes")
    @classmethod
    def _labels(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        for node_id, labels in value.items():
            for kind, label in labels.items():
                try:
                    domains_spec.check_kind(kind)
                    domains_spec.check_value(label)
                except domains_spec.DomainError as exc:
                    raise ValueError(f"node {node_id!r}: {exc}") from None
        return value

    def spec(self) -> domains_spec.Spec:
        """What the folds keep and resolve with (``healthplane.contracts.domains``)."""
        return domains_spec.Spec(rules=tuple(rule.spec() for rule in self.rules),
                                 nodes={node: dict(labels) for node, labels in self.nodes.items()},
                                 reported=tuple(self.from_reports))


def clamp_nodes_bucket_cap(configured: int) -> int:
    """A cap that reached the bridge without validation (environment, an old config) is
    clamped into range rather than stopping the bridge (BRG-1)."""
    return min(max(configured, NODES_BUCKET_MIN_BYTES), NODES_BUCKET_MAX_BYTES)


class PromotionRule(_Camel):
    """RUL-1: a count-in-window rule (``healthplane.contracts.promotion``): which occurrences
    count, how they group, how many within which window, then a condition and an action."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$")
    kind: Literal["xid", "sxid", "mce", "edac", "nic", "condition", "remediation", "reboot"]
    codes: Annotated[list[str], Field(max_length=256)] = []  # empty: any code of the kind
    buckets: Annotated[list[str], Field(max_length=16)] = []  # Xid catalog immediate buckets
    fatal: bool = False
    group_by: Literal["gpu", "gpu-and-code", "node", "across-gpus"] = "node"
    count: Annotated[int, Field(ge=1, le=1000)]
    window: str
    burst: str | None = None  # occurrences this close to the last counted one merge into it
    after_reboots: Annotated[int, Field(ge=0, le=16)] = 0
    condition: wire.ConditionType | None = None  # default: the kind's (xid -> gpu_xid_errors ...)
    action: Literal["validate", "remediate", "needs-attention", "none"] = "needs-attention"
    mode: Literal["act", "record"] = "act"

    @model_validator(mode="after")
    def _consistent(self) -> PromotionRule:
        from healthplane.contracts import promotion, xid

        for field in ("window", "burst"):
            value = getattr(self, field)
            if value is not None:
                try:
                    if parse_duration(value) < 1:
                        raise ValueError(f"{value!r} is shorter than a second")
                except ValueError as exc:
                    raise ValueError(f"rule {self.name!r} {field}: {exc}") from None
        if self.kind in ("xid", "sxid", "mce") and any(not c.isdigit() for c in self.codes) and self.kind != "mce":
            bad = next(c for c in self.codes if not c.isdigit())
            raise ValueError(f"rule {self.name!r} codes: {bad!r} is not a{'n Xid' if self.kind == 'xid' else 'n SXid'} "
                             "number")
        if self.kind == "condition":
            unknown = sorted(set(self.codes) - set(wire.CONDITION_TYPES))
            if unknown:
                raise ValueError(f"rule {self.name!r} codes: {unknown[0]!r} is not a condition type "
                                 f"({', '.join(wire.CONDITION_TYPES)})")
        unknown = sorted(set(self.buckets) - set(xid.IMMEDIATE_BUCKETS))
        if unknown:
            raise ValueError(f"rule {self.name!r} buckets: {unknown[0]!r} is not an Xid catalog bucket "
                             f"({', '.join(xid.IMMEDIATE_BUCKETS)})")
        if self.group_by in ("gpu", "gpu-and-code", "across-gpus") and self.kind not in promotion.DEVICE_KINDS:
            raise ValueError(f"rule {self.name!r} groupBy: {self.group_by} needs a kind with devices "
                             f"({', '.join(sorted(promotion.DEVICE_KINDS))}), not {self.kind}")
        return self

    @property
    def condition_type(self) -> str:
        return self.condition or DEFAULT_RULE_CONDITIONS[self.kind]

    def compiled(self) -> Any:
        """The fold's form (``promotion.Rule``)."""
        from healthplane.contracts import promotion

        return promotion.Rule(
            name=self.name, kind=self.kind, codes=frozenset(self.codes), buckets=frozenset(self.buckets),
            fatal=self.fatal, group=self.group_by, count=self.count, window_s=int(parse_duration(self.window)),
            burst_s=int(parse_duration(self.burst)) if self.burst else 0, after_reboots=self.after_reboots,
            condition=self.condition_type, action=self.action, mode=self.mode)


# The condition a firing raises when its rule names none: the kind's own.
DEFAULT_RULE_CONDITIONS: Final[dict[str, str]] = {
    "xid": "gpu_xid_errors", "sxid": "gpu_xid_errors", "mce": "machine_check_errors", "edac": "memory_errors",
    "nic": "repeated_faults", "condition": "repeated_faults", "remediation": "repeated_faults",
    "reboot": "repeated_faults",
}
# RUL-1's defaults, after NVSentinel's analyzer and gpud (docs/rules.md): the published ones.
DEFAULT_PROMOTION_RULES: Final[tuple[dict[str, Any], ...]] = (
    {"name": "fatal-xid-repeated", "kind": "xid", "fatal": True, "groupBy": "gpu", "count": 5, "window": "24h",
     "action": "needs-attention"},
    {"name": "xid31-repeated-on-gpu", "kind": "xid", "codes": ["31"], "groupBy": "gpu", "count": 2, "window": "24h",
     "action": "validate"},
    {"name": "xid31-across-gpus", "kind": "xid", "codes": ["31"], "groupBy": "across-gpus", "count": 2,
     "window": "24h", "action": "none"},
    {"name": "remediations-repeated", "kind": "remediation", "groupBy": "node", "count": 5, "window": "7d",
     "action": "needs-attention"},
    {"name": "reboot-did-not-fix-xid", "kind": "xid", "buckets": ["RESTART_BM"], "groupBy": "gpu-and-code",
     "count": 1, "window": "7d", "afterReboots": 2, "action": "needs-attention"},
)


class ClusterConfig(_Camel):
    cluster: str = Field(default="default", min_length=1)
    node_health: NodeHealth = NodeHealth()
    # INT-2: each endpoint holds one of the dispatcher's consumer slots (streams.WEBHOOK_SLOTS).
    node_event_webhooks: Annotated[list[Webhook], Field(max_length=WEBHOOK_SLOTS)] = []
    substrate: Substrate = Substrate()
    provisioner_definitions: dict[str, ProvisionerDefinition] = {}
    validation: Validation = Validation()
    remediation: Remediation = Remediation()
    domains: Domains = Domains()  # DOM-1
    leases: Leases = Leases()  # HA-8
    # RUL-1: count-in-window promotion rules; the defaults unless given ([] turns them off).
    promotion_rules: Annotated[list[PromotionRule], Field(max_length=256)] = Field(
        default_factory=lambda: [PromotionRule.model_validate(rule) for rule in DEFAULT_PROMOTION_RULES])

    @model_validator(mode="after")
    def _rule_names_unique(self) -> ClusterConfig:
        seen: set[str] = set()
        for i, rule in enumerate(self.promotion_rules):
            if rule.name in seen:
                raise ValueError(f"promotionRules.{i}.name {rule.name!r} is used by another rule")
            seen.add(rule.name)
        return self

    @model_validator(mode="after")
    def _ladder_suites(self) -> ClusterConfig:
        for i, ladder in enumerate(self.remediation.ladders):
            if ladder.validate_suite is not None and ladder.validate_suite not in self.validation.suites:
                known = ", ".join(sorted(self.validation.suites)) or "none defined"
                raise ValueError(f"remediation.ladders.{i}.validateSuite {ladder.validate_suite!r} is not a "
                                 f"validation suite ({known})")
        return self

    @model_validator(mode="after")
    def _validation_before_return(self) -> ClusterConfig:
        for name, definition in self.provisioner_definitions.items():
            if definition.validate_before_return and self.validation.default_suite is None:
                raise ValueError(f"provisionerDefinitions.{name}.validateBeforeReturn needs validation.defaultSuite: "
                                 "the suite a node must pass to return")
        return self

    def validate_before_return_for(self, definition: str | None) -> bool:
        """VAL-2: whether a node of ``definition`` is validated before its last hold is released."""
        found = self.provisioner_definitions.get(definition or "")
        if found is not None and found.validate_before_return is not None:
            return found.validate_before_return
        return self.validation.validate_before_return

    def node_health_for(self, definition: str | None) -> NodeHealth:
        """The effective nodeHealth for a definition. Its penalties table replaces the
        cluster's: built-in defaults plus the definition's own (SCO-2)."""
        found = self.provisioner_definitions.get(definition or "")
        if found is None:
            return self.node_health
        override = found.node_health.model_dump(exclude_none=True)
        return self.node_health.model_copy(update=override)

    def to_wire(self) -> dict[str, Any]:
        """The config as applied: camelCase, defaults filled in, secrets included (the
        stream is the config store; it is never printed)."""
        return self.model_dump(mode="json", by_alias=True)


# ---------------------------------------------------------------------------- collector config


class _Kebab(BaseModel):
    model_config = ConfigDict(
        alias_generator=lambda name: name.replace("_", "-"),
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


class CollectorHealth(_Kebab):
    disabled: bool = False
    report_interval_seconds: Annotated[int, Field(ge=1, le=86400)] = 30


class CollectorSettings(_Kebab):
    node_id: str | None = None
    cluster: str = "default"
    definition: str | None = None
    provisioned: bool = False
    maintenance: bool = False
    nats_url: str | None = None
    health: CollectorHealth = CollectorHealth()
    annotations: dict[str, str] = {}
    smartctl_timeout_seconds: Annotated[float, Field(gt=0)] = 10.0
    signal_timeout_seconds: Annotated[float, Field(gt=0)] = 15.0
    read_only_mounts_expected: list[str] = []


class CollectorConfig(_Kebab):
    """The node agent's config, shaped like the reference's extension config."""

    binary: str = "healthplane-collector"
    enabled: bool = True
    config: CollectorSettings = CollectorSettings()


# ---------------------------------------------------------------------------- loading


class ConfigError(ValueError):
    """A config that cannot be applied; ``str()`` is the message to show, naming the field."""


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "(top level)"


def describe(error: ValidationError) -> str:
    """One line per problem: ``nodeHealth.cordonBelow: Input should be ≤ 100 (got 140)``."""
    lines = []
    for item in error.errors():
        # pydantic reports the alias path; strip the wrappers it adds for Annotated/unions.
        loc = tuple(p for p in item["loc"] if p not in ("function-after", "constrained-int"))
        # A mapping or a list is the config's own text, too long to echo: the path names it.
        got = f" (got {item['input']!r})" if "input" in item and not isinstance(item["input"], dict | list) else ""
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"{_field_path(loc)}: {message}{got}")
    return "\n".join(lines)


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from exc
    return {} if data is None else data


def parse_cluster_config(data: Any, origin: str = "config") -> ClusterConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: the top level must be a mapping, not {type(data).__name__}")
    try:
        return ClusterConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{origin}: {describe(exc)}") from exc


def load_cluster_config(path: Path | str) -> ClusterConfig:
    path = Path(path)
    return parse_cluster_config(_read_yaml(path), str(path))


def load_promotion_rules(path: Path | str) -> list[PromotionRule]:
    """RUL-3: the rules of a file, either a list of rules or a cluster config (its
    ``promotionRules``, the defaults when it has none), each validated as ``config apply`` does."""
    path = Path(path)
    data = _read_yaml(path)
    if isinstance(data, list):
        data = {"promotionRules": data}
    return parse_cluster_config(data, str(path)).promotion_rules


def load_collector_config(path: Path | str) -> CollectorConfig:
    path = Path(path)
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    try:
        return CollectorConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {describe(exc)}") from exc


def decode_config(envelope: wire.ConfigEnvelope) -> ClusterConfig:
    """The config one ``hp.config`` record carries; ``ConfigError`` names what is wrong."""
    return parse_cluster_config(envelope.config, f"hp.config version {envelope.version}")


NODES_BUCKET_ENV: Final = "HEALTHPLANE_NODES_BUCKET_MAX_BYTES"
LEASE_TTL_ENV: Final = "HEALTHPLANE_LEASE_TTL_SECONDS"


def nodes_bucket_cap(config: ClusterConfig | None, from_environment: str | None) -> int | None:
    """The nodes bucket's size stream administration puts in force (BRG-1): the environment's
    (``NODES_BUCKET_ENV``, an unvalidated path: clamped), else the config's; ``None`` keeps the
    bucket's size."""
    configured = (from_environment or "").strip()
    if configured.isdigit() and int(configured) > 0:
        return clamp_nodes_bucket_cap(int(configured))
    return config.substrate.nodes_bucket_max_bytes if config is not None else None


def lease_ttl(config: ClusterConfig | None, from_environment: str | None) -> float | None:
    """The leases bucket's TTL stream administration puts in force (HA-8): the environment's
    (``LEASE_TTL_ENV``, clamped into range), else the config's; ``None`` keeps the bucket's."""
    try:
        configured = float((from_environment or "").strip() or "nan")
    except ValueError:
        configured = math.nan
    if math.isfinite(configured) and configured > 0:
        return min(max(configured, LEASE_TTL_MIN_S), LEASE_TTL_MAX_S)
    return config.leases.ttl_seconds if config is not None else None
