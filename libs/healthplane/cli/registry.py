"""Every service ``healthplane service NAME`` can run, the commands a service package adds to
``healthplane``, and where their code lives.

Entry points are dotted strings so that this table imports no service: services live in
``services/<name>/`` as ``healthplane_<name>`` packages and never import each other.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import TYPE_CHECKING, Any, Final

from healthplane.contracts import streams

if TYPE_CHECKING:
    from healthplane.cli.common import CommandGroup

# Name (SPEC.md) -> "module:function"; the function takes the parsed arguments and returns
# an exit code. A name without an entry point is part of the contract but not built yet.
SERVICES: Final[dict[str, str | None]] = {
    "collector": "healthplane_collector.main:main",
    "health-ingest": "healthplane_health_ingest.main:main",
    "scorer": "healthplane_scorer.main:main",
    "policy": "healthplane_policy.main:main",
    "eviction": "healthplane_eviction.main:main",
    "webhook-dispatcher": "healthplane_webhook_dispatcher.main:main",
    "substrate-bridge": "healthplane_substrate_bridge.main:main",
    "scheduler": "healthplane_scheduler.main:main",
    "slurm-adapter": "healthplane_slurm_adapter.main:main",
    "api": "healthplane_api.main:main",
}
SERVICE_NAMES: Final = tuple(SERVICES)

# Service -> "module:attribute", the ``healthplane.cli.common.CommandGroup``s its package adds
# to ``healthplane`` (the collector's ``collector`` and ``sim``), listed after the library's.
COMMAND_GROUPS: Final[dict[str, str]] = {
    "collector": "healthplane_collector.cli:COMMAND_GROUPS",
}

# Every service of the control plane (the collector runs on nodes; the simulator stands in
# for it), with every scheduler integration.
CONTROL_PLANE: Final = tuple(
    name for name in SERVICE_NAMES if name != "collector" and SERVICES[name] is not None
)
# `healthplane up --scheduler NAME`: which scheduler integration runs (EVI-8); one at a time,
# since each obeys the directives and writes the allocations.
SCHEDULERS: Final[dict[str, str]] = {"reference": "scheduler", "slurm": "slurm-adapter"}
# The per-node folds that run as partitions of the node space (HA-4, ``--partitions P``); the
# others decide over the whole fleet at once (policy's guardrails and breaker, eviction's holds
# and directives, the schedulers' placement) and run as one holder with standbys.
PARTITIONED: Final = streams.PARTITIONED


def control_plane(scheduler: str = "reference") -> tuple[str, ...]:
    """What `healthplane up` starts, in order, with ``scheduler``'s integration."""
    others = set(SCHEDULERS.values()) - {SCHEDULERS[scheduler]}
    return tuple(name for name in CONTROL_PLANE if name not in others)


def load(target: str) -> Any:
    """The attribute a "module:attribute" target names, its module imported now."""
    module_name, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def run(name: str, args: argparse.Namespace) -> int:
    target = SERVICES[name]
    if target is None:
        print(f"healthplane: service {name} is not part of this build yet", file=sys.stderr)
        return 2
    result: int = load(target)(args)
    return result


def command_groups() -> list[CommandGroup]:
    """Every service package's command groups, its package imported by name now."""
    return [group for target in COMMAND_GROUPS.values() for group in load(target)]
