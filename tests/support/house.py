"""The house drawn from the code (issue 39): which module imports which, read from the source
with ``ast`` (module-level and function-level imports alike, ``TYPE_CHECKING`` ones too), and
``docs/architecture.md`` rendered from it.

``python -m tests.support.house docs/architecture.md`` writes the page;
``tests/unit/test_house.py`` fails when the committed page differs from what the code draws,
when an import closes a cycle, when a layer imports one above it, and when a fold imports I/O.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBS = ROOT / "libs" / "healthplane"
SERVICES = ROOT / "services"

# The shared library's groups, bottom up, and what each may import (besides itself).
LAYERS: dict[str, tuple[str, ...]] = {
    "contracts": (),
    "runtime": ("contracts",),
    "client": ("contracts", "runtime"),
    "stack": ("contracts", "runtime"),
    "cli": ("contracts", "runtime", "client", "stack"),
}
LAYER_ROLES = {
    "contracts": "what crosses the bus: wire records, subjects, streams, permissions, config",
    "runtime": "how a service runs: the fold contract, processor, pull loop, publish, leases, snapshots",
    "client": "typed reads and commands: what the CLI, the api, federation and the simulator call",
    "stack": "what `up` starts and issues: nats-server, supervision, TLS, the keystore",
    "cli": "argparse and printing only, over client/",
}
# What a service package may import from the shared library. The collector's own commands
# (``healthplane collector``, ``healthplane sim``) are CLI command groups: they may use cli/.
SERVICE_MAY_IMPORT = ("contracts", "runtime", "client")
SERVICE_CLI_MODULES = {"healthplane_collector.cli", "healthplane_collector.sim_cli", "healthplane_collector.sim_work"}
# Third-party packages that do I/O: a fold (fold.py, rules.py and what they import of ours)
# imports none of them, so it is tested by calling it.
IO_PACKAGES = ("nats", "httpx", "prometheus_client", "structlog", "uvicorn", "starlette", "h11", "socket",
               "subprocess", "asyncio")
# ...except the server's own config data classes, which the stream table is written in.
IO_ALLOWED = ("nats.js.api",)
FLOOR_PLAN = ("fold.py", "rules.py", "main.py", "metrics.py")


@dataclass
class Module:
    name: str
    path: Path
    doc: str
    imports: set[str] = field(default_factory=set)  # our modules
    external: set[str] = field(default_factory=set)  # top-level names of everything else

    @property
    def group(self) -> str:
        """``contracts`` … ``cli`` for the shared library, the package for a service."""
        parts = self.name.split(".")
        if parts[0] == "healthplane":
            return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "healthplane"
        return parts[0]


def _module_name(path: Path) -> str:
    if path.is_relative_to(LIBS):
        rel = path.relative_to(LIBS.parent)
        parts = list(rel.with_suffix("").parts)
    else:
        rel = path.relative_to(SERVICES)
        parts = [f"healthplane_{rel.parts[0]}", *rel.with_suffix("").parts[1:]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _ours(name: str) -> bool:
    return name == "healthplane" or name.startswith(("healthplane.", "healthplane_"))


def modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    paths = sorted(LIBS.rglob("*.py")) + sorted(p for p in SERVICES.rglob("*.py") if "templates" not in p.parts)
    trees: dict[str, ast.Module] = {}
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        name = _module_name(path)
        doc = (ast.get_docstring(tree) or "").strip().split("\n\n")[0].replace("\n", " ")
        found[name], trees[name] = Module(name, path, doc), tree
    for module in found.values():
        tree = trees[module.name]
        package = module.name if module.path.name == "__init__.py" else module.name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    _add(module, alias.name, found)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                for alias in node.names:
                    candidate = f"{base}.{alias.name}"
                    _add(module, candidate if candidate in found else base, found)
    return found


def _add(module: Module, name: str, found: dict[str, Module]) -> None:
    if not _ours(name):
        module.external.add(name)
        return
    while name not in found and "." in name:
        name = name.rpartition(".")[0]
    if name in found and name != module.name:
        module.imports.add(name)


def cycles(found: dict[str, Module]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(name: str) -> None:
        index[name] = low[name] = counter[0]
        counter[0] += 1
        stack.append(name)
        on_stack.add(name)
        for target in sorted(found[name].imports):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in on_stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            members = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                members.append(top)
                if top == name:
                    break
            if len(members) > 1:
                out.append(sorted(members))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for name in sorted(found):
        if name not in index:
            visit(name)
    return out


def layer_breaches(found: dict[str, Module]) -> list[str]:
    """Imports that go up a layer, across services, or from a service into the stack or cli."""
    breaches = []
    for module in found.values():
        for target in sorted(module.imports):
            mine, theirs = module.group, found[target].group
            if mine == theirs or theirs == "healthplane":
                continue
            if mine in LAYERS:
                allowed: Iterable[str] = LAYERS[mine]
            elif mine == "healthplane":
                allowed = ()
            elif module.name in SERVICE_CLI_MODULES:
                allowed = (*SERVICE_MAY_IMPORT, "cli")
            else:
                allowed = SERVICE_MAY_IMPORT
            if theirs not in allowed:
                breaches.append(f"{module.name} imports {target} ({mine} may import {', '.join(allowed) or 'nothing else'})")
    return breaches


def closure(found: dict[str, Module], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(found[name].imports)
    return seen


def fold_io(found: dict[str, Module]) -> dict[str, list[str]]:
    """Per fold module (a service's fold.py and rules.py), the I/O packages it reaches."""
    out = {}
    for module in found.values():
        if module.group in LAYERS or module.group == "healthplane" or module.path.name not in ("fold.py", "rules.py"):
            continue
        reached = sorted({pkg.split(".")[0] for name in closure(found, module.name) for pkg in found[name].external
                          if pkg.split(".")[0] in IO_PACKAGES and pkg not in IO_ALLOWED})
        if reached:
            out[module.name] = reached
    return out


def render(found: dict[str, Module]) -> str:
    lines = [
        "# The house (generated)",
        "",
        "Drawn from the code by `python -m tests.support.house docs/architecture.md`;",
        "`tests/unit/test_house.py` fails when this page and the code disagree, when an import",
        "closes a cycle, when a layer imports one above it, and when a fold reaches I/O.",
        "",
        "## The shared library, bottom up",
        "",
        "| group | what it holds | imports |",
        "|---|---|---|",
    ]
    for layer, allowed in LAYERS.items():
        used = sorted({found[t].group for m in found.values() if m.group == layer for t in m.imports} - {layer, "healthplane"})
        lines.append(f"| `{layer}/` | {LAYER_ROLES[layer]} | {', '.join(used) or '—'} (may: {', '.join(allowed) or 'none'}) |")
    for layer in LAYERS:
        lines += ["", f"### `{layer}/`", ""]
        for module in sorted((m for m in found.values() if m.group == layer), key=lambda m: m.name):
            short = module.name.removeprefix(f"healthplane.{layer}.").removeprefix(f"healthplane.{layer}")
            if not short:
                continue
            lines.append(f"- `{short}` — {_first_sentence(module.doc)}")
    lines += [
        "",
        "## One floor plan per service",
        "",
        "Every stateful service: `fold.py` (its state and `step`, nats-free), `rules.py` (pure",
        "decisions), `main.py` (wiring only), `metrics.py` (its series). A service imports",
        "`contracts/`, `runtime/` and `client/`, never another service.",
        "",
        "| service | floor plan | other modules | imports of the library |",
        "|---|---|---|---|",
    ]
    for service in sorted(p.name for p in SERVICES.iterdir() if (p / "__init__.py").is_file()):
        package = f"healthplane_{service}"
        members = sorted((m for m in found.values() if m.group == package and m.name != package), key=lambda m: m.name)
        files = {m.path.name for m in members}
        plan = " ".join(f"`{f}`" if f in files else f"~~{f}~~" for f in FLOOR_PLAN)
        others = ", ".join(f"`{m.path.name}`" for m in members if m.path.name not in FLOOR_PLAN) or "—"
        used = sorted({found[t].group for m in members for t in m.imports} - {package, "healthplane"})
        lines.append(f"| {service} | {plan} | {others} | {', '.join(used)} |")
    for service in sorted(p.name for p in SERVICES.iterdir() if (p / "__init__.py").is_file()):
        package = f"healthplane_{service}"
        lines += ["", f"### {service}", ""]
        for module in sorted((m for m in found.values() if m.group == package and m.name != package),
                             key=lambda m: (m.path.name not in FLOOR_PLAN, m.name)):
            lines.append(f"- `{module.path.name}` — {_first_sentence(module.doc)}")
    lines += ["", f"{len(found)} modules, {sum(len(m.imports) for m in found.values())} imports between them, "
                  f"{len(cycles(found))} cycles.", ""]
    return "\n".join(lines)


def _first_sentence(doc: str) -> str:
    if not doc:
        return "(no docstring)"
    cut = doc.find(". ")
    sentence = doc if cut < 0 else doc[: cut + 1]
    return sentence.replace("|", "\\|")


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "architecture.md"
    target.write_text(render(modules()), encoding="utf-8")
    print(f"wrote {target}")
