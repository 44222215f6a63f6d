"""Alertmanager (OBS-3): a webhook receiver when HEALTHPLANE_ALERT_WEBHOOK_URL is set, and
alerts collected in the UI when it is not. Checked by the real amtool; the entrypoint runs
for real with a stand-in binary that records how it was started."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.monitoring import ALERTMANAGER, tool

PLAIN = ALERTMANAGER / "alertmanager.yml"
WEBHOOK = ALERTMANAGER / "alertmanager-webhook.yml"
ENTRYPOINT = ALERTMANAGER / "entrypoint.sh"


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())  # type: ignore[no-any-return]


def _amtool_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("amtool"), "check-config", str(path)], capture_output=True, text=True, timeout=30)


def test_obs3_without_a_webhook_alerts_collect_in_the_ui() -> None:
    result = _amtool_check(PLAIN)
    assert result.returncode == 0, result.stdout + result.stderr
    config = _load(PLAIN)
    [receiver] = config["receivers"]
    assert config["route"]["receiver"] == receiver["name"]
    assert not [key for key in receiver if key.endswith("_configs")], "the UI-only receiver must notify nobody"


def test_obs3_the_webhook_config_is_valid_and_reads_its_url_from_a_file(tmp_path: Path) -> None:
    config = _load(WEBHOOK)
    [receiver] = config["receivers"]
    assert config["route"]["receiver"] == receiver["name"]
    [webhook] = receiver["webhook_configs"]
    assert webhook["url_file"] == "/alertmanager/webhook-url" and webhook["send_resolved"] is True
    # Debian's amtool (0.25) predates url_file (Alertmanager 0.26, the compose image is
    # 0.28): check everything else with the URL inline.
    webhook.pop("url_file")
    webhook["url"] = "https://alerts.example.com/hook"
    inline = tmp_path / "alertmanager-webhook.yml"
    inline.write_text(yaml.safe_dump(config))
    result = _amtool_check(inline)
    assert result.returncode == 0, result.stdout + result.stderr


def test_obs3_both_configs_route_and_inhibit_alike() -> None:
    plain, webhook = _load(PLAIN), _load(WEBHOOK)
    assert {**plain["route"], "receiver": None} == {**webhook["route"], "receiver": None}
    assert plain["inhibit_rules"] == webhook["inhibit_rules"]
    [rule] = plain["inhibit_rules"]
    assert rule["equal"] == ["cluster", "node_id"]


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    """An "alertmanager" that writes the arguments it was started with, one per line."""
    binary = tmp_path / "alertmanager"
    binary.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "argv"}\n')
    binary.chmod(0o755)
    return binary


def _start(stand_in: Path, storage: Path, url: str | None) -> list[str]:
    env = {key: value for key, value in os.environ.items() if key != "HEALTHPLANE_ALERT_WEBHOOK_URL"}
    env |= {"ALERTMANAGER_BIN": str(stand_in), "ALERTMANAGER_CONFIG_DIR": str(ALERTMANAGER),
            "ALERTMANAGER_STORAGE": str(storage)}
    if url is not None:
        env["HEALTHPLANE_ALERT_WEBHOOK_URL"] = url
    result = subprocess.run(["sh", str(ENTRYPOINT), "--log.level=info"], env=env, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return (stand_in.parent / "argv").read_text().splitlines()


def test_obs3_entrypoint_without_a_url_starts_the_ui_only_config(stand_in: Path, tmp_path: Path) -> None:
    storage = tmp_path / "data"
    storage.mkdir()
    for url in (None, ""):
        argv = _start(stand_in, storage, url)
        assert argv == [f"--config.file={PLAIN}", f"--storage.path={storage}", "--log.level=info"]
        assert not (storage / "webhook-url").exists()


def test_obs3_entrypoint_with_a_url_writes_it_verbatim_for_url_file(stand_in: Path, tmp_path: Path) -> None:
    storage = tmp_path / "data"
    storage.mkdir()
    url = "https://alerts.example.com/hook?token=a&b='c\"d' $HOME"
    argv = _start(stand_in, storage, url)
    assert argv[0] == f"--config.file={WEBHOOK}"
    written = storage / "webhook-url"
    assert written.read_text() == url
    assert stat.S_IMODE(written.stat().st_mode) == 0o600, "the URL is often a secret"
