"""The permission table (SEC-1, SEC-7..12) drawn from ``healthplane.contracts.permissions``:
what each identity may publish and subscribe to, and its bounds, exactly as its signing key's
template tells nats-server. ``python -m tests.support.permission_table docs/permissions.md``
writes it; ``tests/unit/test_permission_table.py`` fails when the committed page differs."""

from __future__ import annotations

import sys
from pathlib import Path

from healthplane.contracts import permissions

ROOT = Path(__file__).resolve().parents[2]
WHO = {
    permissions.NODE: "a compute node's collector (one identity per node)",
    permissions.SIM: "the simulated fleet of one cluster",
    permissions.VIEWER: "a person who reads",
    permissions.ADMIN: "a person who commands and applies config",
    permissions.MEMBER: "a federation member's leaf link, on the hub",
}


def _limit(value: int) -> str:
    return "none" if value < 0 else f"{value:,}"


def render() -> str:
    lines = [
        "# What each identity may do (generated)",
        "",
        "Drawn from `healthplane.contracts.permissions` (the templates of the account's scoped signing",
        "keys, which nats-server enforces) by `python -m tests.support.permission_table docs/permissions.md`;",
        "`tests/unit/test_permission_table.py` fails when this page and the code disagree. `{{tag(...)}}` is",
        "filled in by the server from the identity's own JWT (its cluster, node, user). Beyond this, the",
        "folds believe a per-node record only on its own node's subject (SEC-7), and reserved names",
        f"({', '.join(sorted(permissions.reserved_names()))}) are never given to a person (SEC-10).",
        "",
        "| identity | who | max message | subscriptions | publish | subscribe |",
        "|---|---|---|---|---|---|",
    ]
    for role in permissions.ROLES:
        rules = permissions.of(role)
        who = WHO.get(role, f"the {role} service")
        lines.append(f"| `{role}` | {who} | {_limit(rules.payload)} | {_limit(rules.subs)} | "
                     f"{len(rules.publish)} subjects | {len(rules.subscribe)} subjects |")
    for role in permissions.ROLES:
        rules = permissions.of(role)
        lines += ["", f"## `{role}`", "", "Publish:", ""]
        lines += [f"- `{subject}`" for subject in rules.publish] or ["- nothing"]
        lines += ["", "Subscribe:", ""]
        lines += [f"- `{subject}`" for subject in rules.subscribe] or ["- nothing"]
        if rules.responds:
            lines += ["", "May answer a request it received (one reply)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "permissions.md"
    target.write_text(render(), encoding="utf-8")
    print(f"wrote {target}")
