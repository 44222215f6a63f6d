"""XID-2: the remediation ladder starts where NVIDIA's catalog says (the fault's recommended
action), with or without a ladder configured for the fault; RUL-1's rules ride on it (a rule
that asks a human carries CONTACT_SUPPORT)."""

from __future__ import annotations

import pytest

from healthplane.contracts.config import parse_cluster_config
from healthplane_eviction import remediating as rem

CONFIGURED = parse_cluster_config({"remediation": {"ladders": [{"faultClass": "GPU_XID_ERRORS", "steps": [
    {"action": "gpu-reset"}, {"action": "reboot"}, {"action": "replace"}]}]}})


def _ladder(action: str | None, configured: bool = True) -> list[str] | None:
    policy = rem.policy_of(CONFIGURED if configured else parse_cluster_config({}))
    fault = rem.Fault("critical", "GpuXidHardware", "GPU 0000:18:00.0: Xid 79", action)
    found = rem.ladder_for(policy.ladders, {"gpu_xid_errors": fault}, ["gpu_xid_errors"])
    return None if found is None else [rung.action for rung in found.rungs]


@pytest.mark.parametrize(("action", "configured", "expected"), [
    ("RESET_GPU", True, ["gpu-reset", "reboot", "replace"]),          # as configured
    ("RESTART_BM", True, ["reboot", "replace"]),                      # a reset would not do
    ("CONTACT_SUPPORT", True, ["needs-attention"]),                   # a human at once
    ("CHECK_MECHANICALS", True, ["needs-attention"]),
    (None, True, ["gpu-reset", "reboot", "replace"]),                 # no action: as configured
    ("RESET_GPU", False, ["gpu-reset", "reboot", "needs-attention"]),  # the catalog's own ladder
    ("RESTART_BM", False, ["reboot", "needs-attention"]),
    ("CONTACT_SUPPORT", False, ["needs-attention"]),
    ("RESTART_APP", False, None),                                     # the application's: no ladder
    (None, False, None),
])
def test_xid2_the_ladder_starts_where_the_catalog_says(action: str | None, configured: bool,
                                                       expected: list[str] | None) -> None:
    assert _ladder(action, configured) == expected


def test_xid2_a_fault_kept_in_a_snapshot_from_before_actions_decodes() -> None:
    import msgspec

    old = msgspec.json.encode(["critical", "GpuXidHardware", "Xid 79"])
    assert msgspec.json.decode(old, type=rem.Fault) == rem.Fault("critical", "GpuXidHardware", "Xid 79", None)
