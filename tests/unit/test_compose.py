"""docker-compose.yml and the Dockerfile, checked statically (no Docker engine here)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from healthplane.cli import registry
from healthplane.cli.main import build_parser
from healthplane.runtime import nats_internals

ROOT = Path(__file__).resolve().parents[2]
MONITORING = {"prometheus", "alertmanager", "grafana"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


def _healthplane_services(compose: dict[str, Any]) -> dict[str, Any]:
    return {name: svc for name, svc in compose["services"].items() if str(svc.get("image", "")).startswith("healthplane:dev")}


def _bus_clients(compose: dict[str, Any]) -> dict[str, Any]:
    """The Healthplane containers that run `healthplane` itself. The others replace the
    entry point: the credentials jobs, which test_deploy_secure.py checks."""
    return {name: svc for name, svc in _healthplane_services(compose).items() if "entrypoint" not in svc}


def test_every_command_is_a_real_healthplane_subcommand(compose: dict[str, Any]) -> None:
    services = _bus_clients(compose)
    assert services, "no Healthplane container in the compose file"
    parser = build_parser()
    for name, svc in services.items():
        command = [str(part) for part in svc["command"]]
        try:
            args = parser.parse_args(command)
        except SystemExit:
            pytest.fail(f"{name}: `healthplane {' '.join(command)}` is not a valid command")
        if args.command == "service":
            assert registry.SERVICES[args.name] is not None, f"{name}: service {args.name} is not built"


def test_every_control_plane_service_that_exists_has_a_container(compose: dict[str, Any]) -> None:
    commands = [svc["command"] for svc in _healthplane_services(compose).values()]
    running = {c[1] for c in commands if c[0] == "service"}
    assert set(registry.CONTROL_PLANE) <= running


def test_every_healthplane_container_has_the_nats_url(compose: dict[str, Any]) -> None:
    for name, svc in _bus_clients(compose).items():
        url = svc.get("environment", {}).get("HEALTHPLANE_NATS_URL", "")
        host = re.match(r"nats://([^:/]+)", url)
        assert host and host.group(1) in compose["services"], f"{name}: HEALTHPLANE_NATS_URL {url!r}"


def test_host_ports_do_not_collide(compose: dict[str, Any]) -> None:
    seen: dict[str, str] = {}
    for name, svc in compose["services"].items():
        for mapping in svc.get("ports", []):
            host_port = str(mapping).rsplit(":", 1)[0].rsplit(":", 1)[-1]
            assert host_port not in seen, f"host port {host_port} used by {seen.get(host_port)} and {name}"
            seen[host_port] = name


def test_monitoring_and_the_host_agent_are_off_by_default(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        if name in MONITORING:
            assert svc.get("profiles") == ["monitoring"], name
        elif name in ("collector", "collector-creds"):  # the host agent and its credentials
            assert svc.get("profiles") == ["node"], name
        elif name == "slurm-adapter":  # instead of the reference scheduler, beside a real Slurm
            assert svc.get("profiles") == ["slurm"], name
        else:
            assert "profiles" not in svc, f"{name} would not start with a plain `docker compose up`"


def test_host_agent_reads_the_host_read_only(compose: dict[str, Any]) -> None:
    # COL-13: the container reads the host's /sys, /proc and /dev/kmsg through --root.
    collector = compose["services"]["collector"]
    volumes = set(collector["volumes"])
    assert {"/sys:/host/sys:ro", "/proc:/host/proc:ro", "/dev/kmsg:/host/dev/kmsg:ro"} <= volumes
    assert collector["command"][:3] == ["collector", "--root", "/host"]


def test_systemd_unit_runs_the_collector() -> None:
    unit = (ROOT / "deploy" / "systemd" / "healthplane-collector.service").read_text()
    assert re.search(r"^ExecStart=\S*healthplane collector ", unit, re.M)
    assert re.search(r"^Restart=on-failure$", unit, re.M) and re.search(r"^User=root$", unit, re.M)


def test_mounted_files_exist(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        for volume in svc.get("volumes", []):
            source = str(volume).split(":", 1)[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"


def test_dockerfile_builds_one_image_with_healthplane_entry_point() -> None:
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    assert re.search(r'^ENTRYPOINT \["healthplane"\]$', text, re.M)
    for folder in ("libs", "services"):
        assert re.search(rf"^COPY {folder} ", text, re.M), f"Dockerfile does not copy {folder}/"
    assert "python:3.11" in text



# ---------------------------------------------------------------- the image is what CI tested (issue 16.4)

def _runtime_requirements() -> list[Requirement]:
    """What the image installs: the dependencies, and the optional OpenTelemetry export (the
    ``otel`` extra, INT-4), which tools/lock locks with them so a deployment can turn it on."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(line) for line in [*project["dependencies"], *project["optional-dependencies"]["otel"]]]


def _lock() -> dict[str, tuple[Version, list[str]]]:
    """requirements.lock as ``{name: (version, hashes)}``."""
    text = re.sub(r"\\\n", " ", (ROOT / "requirements.lock").read_text())
    pins: dict[str, tuple[Version, list[str]]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})*)", line)
        assert match, f"requirements.lock: {line!r} is not an exact pin with hashes"
        pins[canonicalize_name(match.group(1))] = (Version(match.group(2)), re.findall(r"[0-9a-f]{64}", match.group(3)))
    return pins


def test_the_image_installs_the_lock_with_hashes_and_the_project_alone() -> None:
    """issue 16.4: the image holds the dependencies CI tested, not whatever is newest."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    assert re.search(r"^COPY requirements\.lock ", text, re.M)
    assert re.search(r"^RUN pip install [^\n]*--require-hashes -r \S*requirements\.lock", text, re.M)
    installs = re.findall(r"^RUN pip (?:install|wheel) [^\n]*", text, re.M)
    assert installs and all("--no-deps" in line or "requirements.lock" in line for line in installs), installs


def test_every_runtime_dependency_has_a_tested_range_and_a_hashed_pin_inside_it() -> None:
    """issue 16.4: each dependency in pyproject.toml is bounded both ways, below the next
    major (nats-py below its next minor), and requirements.lock pins a version inside it."""
    lock = _lock()
    for requirement in _runtime_requirements():
        operators = {spec.operator for spec in requirement.specifier}
        assert {">=", "<"} <= operators, f"{requirement}: needs a lower and an upper bound"
        name = canonicalize_name(requirement.name)
        assert name in lock, f"requirements.lock does not pin {requirement.name}"
        version, hashes = lock[name]
        assert requirement.specifier.contains(version), f"requirements.lock pins {name} {version}, outside {requirement}"
        assert hashes, f"requirements.lock has no hash for {name}"
        lower = min(Version(spec.version) for spec in requirement.specifier if spec.operator == ">=")
        upper = min(Version(spec.version) for spec in requirement.specifier if spec.operator == "<")
        assert upper <= Version(f"{lower.major + 1}"), f"{requirement}: the upper bound passes the next major"


def test_nats_py_is_pinned_to_the_releases_its_internals_are_tested_on() -> None:
    """issue 16.4: pyproject.toml's nats-py range is exactly runtime/nats_internals.py's
    tested minors, and the lock and this environment hold one of them."""
    [nats] = [r for r in _runtime_requirements() if canonicalize_name(r.name) == "nats-py"]
    minors = sorted(Version(minor) for minor in nats_internals.TESTED_NATS_PY)
    assert nats.specifier == SpecifierSet(f">={minors[0]},<{minors[-1].major}.{minors[-1].minor + 1}")
    assert nats_internals.version_tested(str(_lock()["nats-py"][0]))
    assert nats_internals.version_tested(nats_internals.installed_version())

# ---------------------------------------------------------------- monitoring profile (OBS-3)

def _prometheus_config() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())  # type: ignore[no-any-return]


def _container_path(svc: dict[str, Any], host_path: str) -> str:
    for volume in svc.get("volumes", []):
        source, target = str(volume).split(":")[:2]
        if source == host_path:
            return target
    raise AssertionError(f"{host_path} is not mounted")


def test_obs3_prometheus_scrapes_every_healthplane_process_by_compose_name(compose: dict[str, Any]) -> None:
    targets = {target for job in _prometheus_config()["scrape_configs"]
               for static in job["static_configs"] for target in static["targets"]}
    for name, svc in _healthplane_services(compose).items():
        command = [str(part) for part in svc["command"]]
        if "--metrics-port" in command:
            assert f"{name}:{command[command.index('--metrics-port') + 1]}" in targets, name
    # Services still being built are listed ahead of their containers, by their SPEC name.
    for name in registry.SERVICE_NAMES:
        assert f"{name}:9464" in targets, name


def test_obs3_prometheus_loads_the_rules_and_keeps_data_as_configured(compose: dict[str, Any]) -> None:
    prometheus = compose["services"]["prometheus"]
    config = _prometheus_config()
    rules_dir = _container_path(prometheus, "./deploy/prometheus/rules")
    assert config["rule_files"] == [f"{rules_dir}/*.yml"]
    config_file = _container_path(prometheus, "./deploy/prometheus/prometheus.yml")
    assert f"--config.file={config_file}" in prometheus["command"]
    assert "--storage.tsdb.retention.time=${HEALTHPLANE_PROMETHEUS_RETENTION:-15d}" in prometheus["command"]
    [alertmanagers] = config["alerting"]["alertmanagers"]
    [target] = alertmanagers["static_configs"][0]["targets"]
    host, port = target.split(":")
    assert host in compose["services"] and f"{port}:{port}" in compose["services"][host]["ports"]


def test_obs3_alertmanager_starts_through_the_entrypoint_with_the_webhook_url(compose: dict[str, Any]) -> None:
    alertmanager = compose["services"]["alertmanager"]
    config_dir = _container_path(alertmanager, "./deploy/alertmanager")
    assert alertmanager["entrypoint"] == ["/bin/sh", f"{config_dir}/entrypoint.sh"]
    assert alertmanager["environment"]["HEALTHPLANE_ALERT_WEBHOOK_URL"] == "${HEALTHPLANE_ALERT_WEBHOOK_URL:-}"
    # The entrypoint writes the URL file into the storage path that alertmanager-webhook.yml reads.
    webhook = yaml.safe_load((ROOT / "deploy" / "alertmanager" / "alertmanager-webhook.yml").read_text())
    url_file = webhook["receivers"][0]["webhook_configs"][0]["url_file"]
    assert any(str(v).endswith(f":{url_file.rsplit('/', 1)[0]}") for v in alertmanager["volumes"])


def test_obs3_grafana_provisions_the_datasource_and_the_dashboard(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    assert _container_path(grafana, "./deploy/grafana/provisioning") == "/etc/grafana/provisioning"
    provider = yaml.safe_load((ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "healthplane.yml")
                              .read_text())["providers"][0]
    assert _container_path(grafana, "./deploy/grafana/dashboards") == provider["options"]["path"]
    source = yaml.safe_load((ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
                            .read_text())["datasources"][0]
    assert source["url"] == "http://prometheus:9090" and "9090:9090" in compose["services"]["prometheus"]["ports"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/node-reliability.json"


def test_slu_the_slurm_adapter_runs_in_its_profile_on_the_hosts_slurm(compose: dict[str, Any]) -> None:
    """SLU-1, SLU-7 (compose profile): the adapter runs only with `--profile slurm`, from the
    image stage that adds Slurm's client commands, with the host's slurm.conf and munge socket
    read-only; every other container builds the default (last) stage; the reference scheduler
    can be scaled to 0 so that only one scheduler obeys the directives."""
    adapter = compose["services"]["slurm-adapter"]
    assert adapter["profiles"] == ["slurm"]
    assert adapter["build"]["target"] == "slurm"
    assert {"/etc/slurm:/etc/slurm:ro", "/run/munge:/run/munge:ro"} <= set(adapter["volumes"])
    assert adapter["environment"]["HEALTHPLANE_NATS_CREDS"] == "/creds/slurm-adapter.creds"
    assert "issue slurm-adapter service slurm-adapter" in (ROOT / "deploy" / "creds" / "issue-creds.sh").read_text()
    stages = re.findall(r"^FROM (\S+)(?: AS (\S+))?", (ROOT / "deploy" / "Dockerfile").read_text(), re.MULTILINE)
    assert ("runtime", "slurm") in stages and stages[-1][1] != "slurm"
    assert compose["services"]["scheduler"]["scale"] == "${HEALTHPLANE_REFERENCE_SCHEDULER:-1}"
    for name, svc in _healthplane_services(compose).items():
        if name != "slurm-adapter":
            assert "target" not in svc.get("build", {}), name
