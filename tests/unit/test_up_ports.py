"""`up` never hands two of its children one port (issue 15.6's supervision; a CI run gave
eviction and the scheduler one metrics port, and the scheduler never ran)."""

from __future__ import annotations

import pytest

from healthplane.cli import up


def test_a_port_picked_free_twice_is_handed_to_one_child_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel's answer to "is it free?" is the same for both picks until a child binds it.
    picks = iter([31001, 31001, 31001, 31002])
    monkeypatch.setattr(up, "free_port", lambda: next(picks))
    monkeypatch.setattr(up, "_HANDED_OUT", set())
    assert [up._pick_port(), up._pick_port()] == [31001, 31002]
