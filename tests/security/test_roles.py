"""SEC-10, played as the attacker: an admin who asks a node to reboot by hand, and a person
named like automation. The server refuses the first (only eviction may publish
``hp.remediate.>``); the keystore and ``healthplane creds`` refuse the second in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from healthplane.contracts import permissions, subjects
from healthplane.runtime.creds import CredsError
from healthplane.stack.keystore import Keystore
from healthplane.stack.natsserver import NatsServer
from tests.component.test_security import _as, _count, _refused
from tests.support.secure import creds_for

pytestmark = pytest.mark.nats


async def test_sec10_only_eviction_publishes_remediation_requests(nats_server: NatsServer,
                                                                   js: JetStreamContext) -> None:
    for role, name in (("admin", "alice"), ("viewer", "victor"), ("policy", None), ("api", None)):
        client = await _as(nats_server, creds_for(nats_server, role, name))
        try:
            assert await _refused(client, subjects.remediate("c1", "n1"), b'{"action": "reboot"}'), role
        finally:
            await client.close()
    assert await _count(js, "HP_REMEDIATION") == 0
    eviction = await _as(nats_server, creds_for(nats_server, "eviction"))
    try:
        await eviction.jetstream().publish(subjects.remediate("c1", "n1"), b"{}", timeout=5)
        assert await _count(js, "HP_REMEDIATION") == 1
    finally:
        await eviction.close()
    assert not any(p.startswith("hp.remediate") for p in permissions.of("admin").publish)


@pytest.mark.parametrize("name", sorted(permissions.reserved_names()))
def test_sec10_a_person_is_never_named_like_automation(keystore: Keystore, tmp_path: Path, name: str) -> None:
    with pytest.raises(CredsError, match="automation actor"):
        keystore.user(name, "admin", tmp_path / "x.creds")
    with pytest.raises(CredsError, match="automation actor"):
        keystore.token(name, "viewer")
    assert not (tmp_path / "x.creds").exists()


def test_sec10_creds_user_slurm_is_one_line_and_exit_1(keystore: Keystore, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "healthplane.cli", "creds", "user", "slurm", "--role", "admin",
                           "--keys", str(keystore.directory), "-o", str(tmp_path / "slurm.creds")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "'slurm' is an automation actor's" in lines[0] and "Traceback" not in done.stderr
