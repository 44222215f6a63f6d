"""SEC-1, SEC-10, SEC-11: docs/permissions.md says exactly what each identity may do, because
it is drawn from the templates nats-server enforces; and the table's own claims hold."""

from __future__ import annotations

from healthplane.contracts import permissions
from tests.support import permission_table


def test_sec1_the_permission_page_is_what_the_templates_say() -> None:
    page = permission_table.ROOT / "docs" / "permissions.md"
    assert page.read_text(encoding="utf-8") == permission_table.render(), (
        "docs/permissions.md is stale: run `python -m tests.support.permission_table docs/permissions.md`")


def test_sec10_sec11_what_the_table_promises() -> None:
    writers = [role for role in permissions.ROLES
               if any(p.startswith("hp.remediate.") for p in permissions.of(role).publish)]
    assert writers == ["eviction"]
    node = permissions.of(permissions.NODE)
    assert (node.payload, node.subs) == (256 * 1024, 16)
    assert node.template()["payload"] == 256 * 1024
