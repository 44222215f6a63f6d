"""SEC-12 for `healthplane up`: a stack's credentials and tokens are kept across starts (a
browser's session and the printed paths stay good), and one that would end within two weeks
is issued again at the next start."""

from __future__ import annotations

import time
from pathlib import Path

from healthplane.cli.up import _identities
from healthplane.runtime.creds import expires_at
from healthplane.stack.keystore import DAY_S


def test_sec12_up_keeps_what_lasts_and_renews_what_ends_soon(tmp_path: Path) -> None:
    first = _identities(tmp_path, "default")
    kept = {p: p.read_text() for p in (first.admin, first.viewer, first.admin_token, first.by_child["scorer"])}
    again = _identities(tmp_path, "default")
    assert {p: p.read_text() for p in kept} == kept  # nothing re-issued at a second start
    # An admin file that ends in an hour (issued by hand, say) is renewed at the next start.
    again.keystore.node("stand-in", "default", again.admin, lifetime_s=3600)
    assert (expires_at(again.admin) or 0) < time.time() + 2 * 3600
    renewed = _identities(tmp_path, "default")
    assert (expires_at(renewed.admin) or 0) > time.time() + 89 * DAY_S
    assert renewed.admin_token.read_text() == kept[first.admin_token]
