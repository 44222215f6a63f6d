"""Every service ``healthplane service NAME`` can run, and where its code lives.

Entry points are dotted strings so that this table imports no service: services live in
``services/<name>/`` as ``healthplane_<name>`` packages and never import each other.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Final

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
}
SERVICE_NAMES: Final = tuple(SERVICES)

# What `healthplane up` starts, in order (the collector runs on nodes; the simulator
# stands in for it).
CONTROL_PLANE: Final = tuple(
    name for name in SERVICE_NAMES if name != "collector" and SERVICES[name] is not None
)


def run(name: str, args: argparse.Namespace) -> int:
    target = SERVICES[name]
    if target is None:
        print(f"healthplane: service {name} is not part of this build yet", file=sys.stderr)
        return 2
    module_name, _, function = target.partition(":")
    module = importlib.import_module(module_name)
    result: int = getattr(module, function)(args)
    return result
