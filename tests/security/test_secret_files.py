"""SEC-12, played as an attacker with a shell on the control-plane host: a symlink planted at
a secret's old temporary path (``FILE.new``) or at the secret itself must not make the next
write land in the symlink's target."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from healthplane.stack.keystore import write_secret


def test_sec12_a_symlink_at_the_temporary_path_is_never_followed(tmp_path: Path) -> None:
    secret = tmp_path / "creds" / "admin.token"
    secret.parent.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")
    (secret.parent / "admin.token.new").symlink_to(victim)
    write_secret(secret, "s3cret\n")
    assert secret.read_text() == "s3cret\n" and not secret.is_symlink()
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert victim.read_text() == "untouched\n"
    # A symlink at the secret itself is replaced, its target left alone.
    secret.unlink()
    secret.symlink_to(victim)
    write_secret(secret, "again\n")
    assert not secret.is_symlink() and secret.read_text() == "again\n" and victim.read_text() == "untouched\n"
    # Nothing staged is left behind.
    assert sorted(p.name for p in secret.parent.iterdir()) == ["admin.token", "admin.token.new"]
    assert os.readlink(secret.parent / "admin.token.new") == str(victim)
