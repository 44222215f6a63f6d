"""config apply / show on a real server: versions, optimistic concurrency, no secrets printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from healthplane.stack.natsserver import NatsServer

pytestmark = pytest.mark.nats


def _cli(server: NatsServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "healthplane.cli", *args, "--nats-url", server.url],
                          capture_output=True, text=True, timeout=60)


def test_apply_versions_and_show_masks_secrets(nats_server: NatsServer, js, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "cluster.yaml"
    config.write_text("cluster: prod\nnodeHealth:\n  mode: cordon\nnodeEventWebhooks:\n"
                      "  - url: https://hooks.example.com/hp\n    secretEnv: HP_HOOK_SECRET\n")
    first = _cli(nats_server, "config", "apply", "-f", str(config))
    assert first.returncode == 0, first.stderr
    assert "config version 1 applied" in first.stdout
    assert "version 2" in _cli(nats_server, "config", "apply", "-f", str(config)).stdout

    shown = _cli(nats_server, "config", "show", "-o", "json")
    document = json.loads(shown.stdout)
    assert document["version"] == 2 and document["config"]["nodeHealth"]["mode"] == "cordon"
    assert document["config"]["nodeHealth"]["cordonBelow"] == 60  # defaults filled in
    assert document["config"]["nodeEventWebhooks"][0]["secretEnv"] == "HP_HOOK_SECRET"


def test_sec9_a_secret_in_clear_is_refused_before_it_reaches_the_bus(nats_server: NatsServer, js,  # type: ignore[no-untyped-def]
                                                                     tmp_path: Path) -> None:
    """SEC-9: HP_CONFIG is read by every viewer, the api and every service; a webhook secret
    written into the config would be theirs. ``config apply`` refuses it in one line naming
    the fix, and nothing is appended."""
    config = tmp_path / "cluster.yaml"
    config.write_text("nodeEventWebhooks:\n  - url: https://hooks.example.com/hp\n    secret: s3cr3t-value\n")
    done = _cli(nats_server, "config", "apply", "-f", str(config))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "secret" in done.stderr and "secretFile" in done.stderr and "SEC-9" in done.stderr, done.stderr
    assert "s3cr3t-value" not in done.stderr
    shown = _cli(nats_server, "config", "show")
    assert shown.returncode != 0 and "no valid config" in (shown.stderr + shown.stdout), shown


def test_bad_config_is_refused_before_it_is_applied(nats_server: NatsServer, js, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "cluster.yaml"
    config.write_text("nodeHealth:\n  maxUnavailablePercent: 120\n")
    result = _cli(nats_server, "config", "apply", "-f", str(config))
    assert result.returncode == 1 and "nodeHealth.maxUnavailablePercent" in result.stderr
    assert _cli(nats_server, "config", "show").returncode == 1  # nothing was applied


def test_unreachable_server_is_retryable(tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text("cluster: prod\n")
    result = subprocess.run([sys.executable, "-m", "healthplane.cli", "config", "apply", "-f", str(config),
                             "--nats-url", "nats://127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 3 and "cannot connect to NATS" in result.stderr
