"""The measurement behind the CEL library choice (docs/policy.md): one 20-rule set (40
expressions, as the policy evaluates them for one health event) in each candidate that is
installed. Not part of the test suite; run it in a scratch virtualenv with the candidates:

    python -m venv /tmp/cel && /tmp/cel/bin/pip install common-expression-language cel-python cel-expr-python
    /tmp/cel/bin/python tests/bench/cel_compare.py
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from typing import Any

RULES = [[
    f"event.type == 'CONDITION_RAISED' && event.condition.type == 'gpu_xid_errors' && "
    f"event.condition.severity == 'critical' && event.score < {40 + i}",
    f"!('healthplane.dev/managed' in node.labels && node.labels['healthplane.dev/managed'] == 'false') && "
    f"node.allocatable.gpu >= {i % 9}",
] for i in range(20)]
EVENT = {"id": "e1", "nodeId": "gpu-14", "cluster": "lab", "type": "CONDITION_RAISED",
         "occurredAt": "2026-08-11T11:37:41Z", "message": "Xid 79 on GPU 0", "actor": "health-ingest", "score": 55,
         "condition": {"type": "gpu_xid_errors", "reason": "GpuXidHardware", "severity": "critical", "message": "Xid 79"}}
NODE = {"id": "gpu-14", "labels": {"a": "b", "healthplane.dev/managed": "true"},
        "annotations": {f"k{i}": "v" * 30 for i in range(10)}, "definition": "gpu-pool",
        "allocatable": {"cpu": 192, "memory": 2164663517184, "gpu": 8},
        "conditions": {"gpu_xid_errors": {"severity": "critical", "reason": "GpuXidHardware"}}}


def measure(name: str, compile_one: Callable[[str], Any], bind: Callable[[], Any],
            run: Callable[[Any, Any], Any], seconds: float = 2.0) -> None:
    started = time.perf_counter()
    programs = [[compile_one(e) for e in pair] for pair in RULES]
    compile_ms = (time.perf_counter() - started) * 1000
    rounds, matched, started = 0, 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        bound = bind()  # the variables converted once per health event, shared by all 20 rules
        matched = sum(all(run(p, bound) is True for p in pair) for pair in programs)
        rounds += 1
    rate = rounds / (time.perf_counter() - started)
    print(f"{name:28s} compile 40: {compile_ms:7.1f} ms   20-rule sets/s: {rate:9.1f}   "
          f"rule evaluations/s: {rate * 20:10.0f}   matched {matched}")


if importlib.util.find_spec("cel") is not None:
    import cel

    measure("common-expression-language", cel.compile, lambda: cel.Context(variables={"event": EVENT, "node": NODE}),
            lambda p, c: p.execute(c))
if importlib.util.find_spec("celpy") is not None:
    import celpy

    env = celpy.Environment()
    measure("cel-python", lambda e: env.program(env.compile(e)),
            lambda: {"event": celpy.json_to_cel(EVENT), "node": celpy.json_to_cel(NODE)},
            lambda p, c: bool(p.evaluate(c)))
if importlib.util.find_spec("cel_expr_python") is not None:
    from cel_expr_python import cel as cxp

    dyn_map = cxp.Type.Map(cxp.Type.STRING, cxp.Type.DYN)
    cenv = cxp.NewEnv(variables={"event": dyn_map, "node": dyn_map})
    measure("cel-expr-python", cenv.compile, lambda: cenv.Activation({"event": EVENT, "node": NODE}),
            lambda p, a: p.eval(a).value())
