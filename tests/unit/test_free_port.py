"""A port picked free is handed out once (issue 15.6's supervision, HA-1): `up` gave eviction
and the scheduler one metrics port in a CI run, and the scheduler never ran; a test cluster's
two servers were given one route port in a full run, and the cluster never elected a leader."""

from __future__ import annotations

import pytest

from healthplane.stack import natsserver


def test_a_port_picked_free_twice_is_handed_out_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel's answer to "is it free?" is the same for both picks until a server binds it.
    picks = iter([31001, 31001, 31001, 31002])
    monkeypatch.setattr(natsserver.random, "randrange", lambda low, high: next(picks))
    monkeypatch.setattr(natsserver, "_ephemeral_low", lambda: 32768)
    monkeypatch.setattr(natsserver, "port_in_use", lambda port, host: False)
    monkeypatch.setattr(natsserver, "_HANDED_OUT", natsserver.deque(maxlen=8))
    assert [natsserver.free_port(), natsserver.free_port()] == [31001, 31002]


def test_the_kernels_pick_is_handed_out_once_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # No room below the ephemeral range: the kernel's pick, which may name a port just handed out.
    monkeypatch.setattr(natsserver, "_ephemeral_low", lambda: 1024)
    monkeypatch.setattr(natsserver, "_HANDED_OUT", natsserver.deque(maxlen=4096))
    picked = [natsserver.free_port() for _ in range(200)]
    assert len(set(picked)) == 200
