"""The three-host deployment files (HA-1, HA-3, docs/operations.md), checked statically: there
is no systemd here. The cluster member's config is checked by nats-server itself."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from healthplane.cli import registry
from healthplane.cli.main import build_parser
from healthplane.stack.keystore import Keystore
from healthplane.stack.natsserver import find_binary

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_CONF = ROOT / "deploy" / "nats" / "nats-server-cluster.conf"
NATS_UNIT = ROOT / "deploy" / "systemd" / "nats-server.service"
SERVICE_UNIT = ROOT / "deploy" / "systemd" / "healthplane@.service"
HOST_ENV = {"NATS_SERVER_NAME": "hp-a", "NATS_ROUTE_1": "nats-route://10.0.0.1:6222",
            "NATS_ROUTE_2": "nats-route://10.0.0.2:6222", "NATS_ROUTE_3": "nats-route://10.0.0.3:6222"}


def _check(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([find_binary(), "-t", "-c", str(config)], capture_output=True, text=True, timeout=30,
                          env={**os.environ, **env})


def test_ha1_the_cluster_member_config_is_valid_with_a_hosts_values_and_the_auth_part(tmp_path: Path) -> None:
    """HA-1: the member config, its host's values from the unit's environment file and the
    operator part beside it: nats-server accepts it; without the host's name it does not."""
    store = Keystore.init(tmp_path / "keys")
    (tmp_path / "nats").mkdir()
    config = shutil.copy(CLUSTER_CONF, tmp_path / "nats" / "nats-server-cluster.conf")
    (tmp_path / "nats" / "nats-auth.conf").write_text(store.server_config(tmp_path / "jwt"))
    checked = _check(Path(config), HOST_ENV)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    unnamed = _check(Path(config), {k: v for k, v in HOST_ENV.items() if k != "NATS_SERVER_NAME"})
    assert unnamed.returncode != 0, "a member without its own name would join a cluster that never elects"


def test_ha1_the_nats_unit_reads_the_hosts_values_and_stops_with_sigterm() -> None:
    """HA-1: the unit names every variable the config uses, and stops the server with SIGTERM
    (leaderships handed over: 0.05 s of failover instead of an election)."""
    unit = NATS_UNIT.read_text()
    used = set(re.findall(r"\$([A-Z_0-9]+)", CLUSTER_CONF.read_text()))
    assert used == set(HOST_ENV)
    for name in used:
        assert re.search(rf"^#\s+{name}=", unit, re.M), f"the unit says how to set {name}"
    assert re.search(r"^EnvironmentFile=/etc/healthplane/nats-cluster.env$", unit, re.M)
    assert re.search(r"^ExecStart=\S+nats-server -c /etc/nats/nats-server-cluster.conf$", unit, re.M)
    assert re.search(r"^KillSignal=SIGTERM$", unit, re.M)


def test_ha3_the_service_unit_runs_any_service_with_its_own_credentials() -> None:
    """HA-3: `healthplane@NAME` runs `healthplane service NAME` (a name the CLI takes), with
    NAME's credentials through LoadCredential and every member's URL from the environment."""
    unit = SERVICE_UNIT.read_text()
    [exec_start] = re.findall(r"^ExecStart=(.+)$", unit, re.M)
    argv = exec_start.split()
    assert argv[1:4] == ["service", "%i", "--metrics-port"] and argv[4] == "${METRICS_PORT}"
    for name in registry.CONTROL_PLANE:
        build_parser().parse_args(["service", name, "--metrics-port", "9465"])  # exits 2 on a name it lacks
    [load] = re.findall(r"^LoadCredential=(.+)$", unit, re.M)
    credential_id, source = load.split(":", 1)
    assert source == "/etc/healthplane/creds/%i.creds"
    assert re.search(rf"^Environment=HEALTHPLANE_NATS_CREDS=%d/{re.escape(credential_id)}$", unit, re.M)
    assert re.search(r"^#\s+HEALTHPLANE_NATS_URL=nats://\S+,nats://\S+,nats://\S+$", unit, re.M)
    assert re.search(r"^Environment=HEALTHPLANE_INSTANCE=%H$", unit, re.M), "a restarted replica takes its lease back"
    assert set(re.findall(r"^EnvironmentFile=(.+)$", unit, re.M)) == {
        "/etc/healthplane/healthplane.env", "/etc/healthplane/%i.env"}
