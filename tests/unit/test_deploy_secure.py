"""The deployment files run with credentials (SEC-3, SEC-5), checked statically: there is no
Docker engine or systemd here. docker-compose.yml's credentials jobs run
deploy/creds/issue-creds.sh; what the script issues is read from it, line by line."""

from __future__ import annotations

import posixpath
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from healthplane.cli.main import build_parser
from healthplane.contracts.config import CollectorConfig
from healthplane.stack.keystore import Keystore
from healthplane.stack.natsserver import find_binary

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "./deploy/creds/issue-creds.sh"
NATS_CONF = "./deploy/nats/nats-server.conf"
UNIT = ROOT / "deploy" / "systemd" / "healthplane-collector.service"
KEYS_VOLUME, CREDS_VOLUME = "creds-keys", "creds"
COMPLETED = {"condition": "service_completed_successfully"}
# nkey seeds (operator, account, user, server, cluster) and JWTs (base64url of '{"').
SECRET_RE = re.compile(r"\bS[OAUNC][A-Z2-7]{50,}|eyJ")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


def _mounts(svc: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """``source -> (target, read_only)`` of a service's short-syntax volumes."""
    out = {}
    for volume in svc.get("volumes", []):
        source, target, *mode = str(volume).split(":")
        out[source] = (target, mode == ["ro"])
    return out


def _jobs(compose: dict[str, Any]) -> dict[str, Any]:
    """The credentials jobs: the containers that run the script instead of `healthplane`."""
    out = {}
    for name, svc in compose["services"].items():
        if str(svc.get("image", "")).startswith("healthplane:dev") and "entrypoint" in svc:
            assert svc["entrypoint"] == ["/bin/sh", _mounts(svc)[SCRIPT][0]], f"{name}: {svc['entrypoint']}"
            out[name] = svc
    return out


def _bus_clients(compose: dict[str, Any]) -> dict[str, Any]:
    return {name: svc for name, svc in compose["services"].items()
            if str(svc.get("image", "")).startswith("healthplane:dev") and name not in _jobs(compose)}


class Script:
    """deploy/creds/issue-creds.sh as data: its variables and, per `case` branch, the
    `healthplane` commands it runs, `issue NAME ARGS...` lines expanded to theirs."""

    ISSUE_BODY = 'healthplane creds "$@" --keys "$keys" -o "$out/$name.creds"'

    def __init__(self, text: str) -> None:
        self.text = text
        self.variables = dict(re.findall(r"^(\w+)=(/\S*)$", text, re.M))
        self.branches: dict[str, list[list[str]]] = {}
        self.issued: dict[str, dict[str, list[str]]] = {}  # branch -> NAME -> `creds` args
        for branch, body in re.findall(r"^(\w+)\)\n(.*?)^\s*;;$", text, re.M | re.S):
            commands, issued = [], {}
            for line in re.sub(r"\\\n\s*", " ", body).splitlines():
                line = line.strip()
                if line.startswith("healthplane "):
                    commands.append(self._words(line)[1:])
                elif line.startswith("issue "):
                    name, *args = self._words(line)[1:]
                    assert name not in issued, f"{branch}: {name} issued twice"
                    issued[name] = args
                    commands.append(["creds", *args, "--keys", self.variables["keys"], "-o", self.out(name)])
            self.branches[branch], self.issued[branch] = commands, issued

    def _words(self, line: str) -> list[str]:
        expanded = re.sub(r"\$(\w+)", lambda m: self.variables.get(m.group(1), m.group(0)), line)
        return shlex.split(expanded, comments=True)

    def out(self, name: str) -> str:
        return f"{self.variables['out']}/{name}.creds"

    def command(self, branch: str, action: str) -> list[str]:
        [found] = [c for c in self.branches[branch] if c[:2] == ["creds", action]]
        return found

    @staticmethod
    def option(command: list[str], flag: str) -> str:
        return command[command.index(flag) + 1]


@pytest.fixture(scope="module")
def script() -> Script:
    return Script((ROOT / SCRIPT).read_text())


def _issuer(compose: dict[str, Any], script: Script, name: str) -> str:
    """The job whose branch issues ``name``'s credentials."""
    [job] = [job for job, svc in _jobs(compose).items() if name in script.issued[svc["command"][0]]]
    return job


# ---------------------------------------------------------------- compose (SEC-3)

def test_sec3_every_bus_client_in_compose_has_its_own_credentials_file(compose: dict[str, Any],
                                                                       script: Script) -> None:
    """SEC-3: each container that connects names its own file, mounts the credentials
    read-only, and starts only after the job that issued that file has finished."""
    clients = _bus_clients(compose)
    assert {"config-apply", "scorer", "sim", "collector"} <= set(clients)
    for name, svc in clients.items():
        assert svc["environment"].get("HEALTHPLANE_NATS_CREDS") == script.out(name), name
        assert _mounts(svc).get(CREDS_VOLUME) == (script.variables["out"], True), f"{name}: {svc.get('volumes')}"
        assert KEYS_VOLUME not in _mounts(svc), f"{name} could mint identities with the signing keys"
        assert svc["depends_on"].get(_issuer(compose, script, name)) == COMPLETED, name


def test_sec3_the_creds_jobs_issue_exactly_the_containers_compose_runs(compose: dict[str, Any],
                                                                       script: Script) -> None:
    """SEC-3: one identity per container plus the admin's and the maintainer's (for the
    operator, SEC-10), none left over; each job runs a
    branch of the script and writes where the containers read."""
    jobs = _jobs(compose)
    assert set(jobs) == {"creds", "collector-creds"}
    issued: list[str] = []
    for name, svc in jobs.items():
        [branch] = svc["command"]
        assert branch in script.branches, f"{name}: the script has no branch {branch!r}"
        issued += script.issued[branch]
        assert svc["restart"] == "no", f"{name} is a one-shot job"
        mounts = _mounts(svc)
        assert mounts[KEYS_VOLUME] == (script.variables["keys"], False), name
        assert mounts[CREDS_VOLUME] == (script.variables["out"], False), name
    assert sorted(issued) == sorted({*_bus_clients(compose), "admin", "maintainer"})
    assert "depends_on" not in jobs["creds"], "the first job waits for nothing: nats-server waits for it"
    assert jobs["collector-creds"]["depends_on"] == {"creds": COMPLETED}  # the keys exist
    assert re.search(rf"^\s+{re.escape(Script.ISSUE_BODY)}$", script.text, re.M), \
        "issue() no longer runs what this test expands its lines to"


def test_sec3_each_container_gets_the_role_its_command_needs(compose: dict[str, Any], script: Script) -> None:
    """SEC-1/SEC-3: a service its own service identity, the simulator and the host agent
    theirs in the cluster they report for, config-apply an admin's (it applies config)."""
    parser = build_parser()
    issued = {name: args for branch in script.issued.values() for name, args in branch.items()}
    cluster = yaml.safe_load((ROOT / "deploy" / "config" / "cluster.yaml").read_text())["cluster"]
    for name, svc in _bus_clients(compose).items():
        args = parser.parse_args([str(part) for part in svc["command"]])
        if args.command == "service":
            assert issued[name] == ["service", args.name], name
        elif args.command == "sim":
            assert issued[name] == ["sim", "--cluster", args.cluster] and args.cluster == cluster, issued[name]
        elif args.command == "collector":
            node_cluster = args.cluster or CollectorConfig().config.cluster
            role, _node, *rest = issued[name]
            assert role == "node" and rest == ["--cluster", node_cluster] and node_cluster == cluster, issued[name]
        elif args.command == "config":
            assert issued[name] == ["user", name, "--role", "admin"], issued[name]
        elif args.command == "streams":  # stream administration is the maintainer's (SEC-10)
            assert issued[name] == ["user", name, "--role", "maintainer"], issued[name]
        else:
            pytest.fail(f"{name}: no identity rule for `healthplane {args.command}`")
    assert issued["admin"] == ["user", "admin", "--role", "admin"]
    assert issued["maintainer"] == ["user", "maintainer", "--role", "maintainer"]


def test_sec3_every_command_of_the_creds_script_is_a_real_subcommand(script: Script) -> None:
    parser = build_parser()
    assert set(script.branches) == {"stack", "collector"}
    for branch, commands in script.branches.items():
        assert commands, branch
        for command in commands:
            try:
                parser.parse_args(command)
            except SystemExit:
                pytest.fail(f"{branch}: `healthplane {shlex.join(command)}` is not a valid command")
    assert script.branches["stack"][0] == ["creds", "init", "--keys", script.variables["keys"]]


def test_sec3_the_collector_credentials_are_for_the_host_name_it_reports_under(compose: dict[str, Any],
                                                                            script: Script) -> None:
    """The collector (--root /host) takes its node id from the host's /etc/hostname; its
    job reads the same file, mounted at the same place."""
    collector, job = compose["services"]["collector"], compose["services"]["collector-creds"]
    assert "--node-id" not in collector["command"] and collector["command"][:3] == ["collector", "--root", "/host"]
    assert _mounts(collector)["/etc/hostname"] == _mounts(job)["/etc/hostname"] == ("/host/etc/hostname", True)
    assert script.issued["collector"]["collector"][1] == "$node"
    joined = re.sub(r"\\\n\s*", " ", script.text)
    assert re.search(r"^\s*node=\$\(sed [^\n]* /host/etc/hostname\)$", joined, re.M)


def test_sec3_nats_runs_in_operator_mode_with_the_generated_auth_part(compose: dict[str, Any],
                                                                      script: Script) -> None:
    """SEC-3: nats-server includes what `creds server-config` wrote, and sees it (and the
    operator JWT it names) at the paths the job wrote them under."""
    nats = compose["services"]["nats"]
    mounts = _mounts(nats)
    assert mounts[KEYS_VOLUME] == (script.variables["keys"], True)
    assert CREDS_VOLUME not in mounts, "the server needs no identity's credentials"
    assert nats["depends_on"] == {"creds": COMPLETED}
    config_path = mounts[NATS_CONF][0]
    assert nats["command"] == ["-c", config_path]
    conf = (ROOT / NATS_CONF).read_text()
    [include] = re.findall(r'^include "([^"]+)"$', conf, re.M)
    server_config = script.command("stack", "server-config")
    # nats-server joins an include to the including file's folder, even an absolute one (Go's
    # filepath.Join, unlike posixpath.join, keeps both parts).
    assert posixpath.normpath(f"{posixpath.dirname(config_path)}/{include}") == Script.option(server_config, "-o")
    assert Script.option(server_config, "--keys") == script.variables["keys"]
    resolver_dir = Script.option(server_config, "--resolver-dir")
    data_dir = mounts["nats-data"][0]
    assert resolver_dir.startswith(f"{data_dir}/"), "pushed account JWTs (revocations) must outlive the container"
    for open_door in ("authorization", "no_auth_user", "accounts", "allow_non_tls"):
        assert not re.search(rf"^\s*{open_door}\b", conf, re.M), f"{NATS_CONF} sets {open_door}"


def test_sec3_the_nats_config_with_a_real_auth_part_is_valid(tmp_path: Path) -> None:
    """The compose layout rebuilt under tmp_path: the key directory beside etc/nats, the
    auth part `Keystore.server_config` writes, and `nats-server -t` on the committed config.
    The operator JWT is named by its path in the key directory, which is why nats-server
    mounts the keys where the job wrote them."""
    store = Keystore.init(tmp_path / "keys")
    text = store.server_config(tmp_path / "data" / "jwt")
    assert f'operator: "{tmp_path / "keys" / "operator.jwt"}"' in text
    (tmp_path / "keys" / "nats-auth.conf").write_text(text)
    (tmp_path / "etc" / "nats").mkdir(parents=True)
    config = shutil.copy(ROOT / NATS_CONF, tmp_path / "etc" / "nats" / "nats-server.conf")
    checked = subprocess.run([find_binary(), "-t", "-c", str(config)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (tmp_path / "keys" / "nats-auth.conf").unlink()
    missing = subprocess.run([find_binary(), "-t", "-c", str(config)], capture_output=True, text=True, timeout=30)
    assert missing.returncode != 0, "without the auth part the server must not start (it would start open)"


# ---------------------------------------------------------------- systemd (SEC-5)

def test_sec5_the_collector_unit_reads_its_credentials_through_load_credential() -> None:
    """SEC-5: the node's credentials come from a root-only file that systemd hands to the
    service alone (LoadCredential, %d), and the unit says how to issue it."""
    unit = UNIT.read_text()
    [load] = re.findall(r"^LoadCredential=(.+)$", unit, re.M)
    credential_id, source = load.split(":", 1)
    assert source == "/etc/healthplane/nats.creds"
    assert re.search(rf"^Environment=HEALTHPLANE_NATS_CREDS=%d/{re.escape(credential_id)}$", unit, re.M)
    [exec_start] = re.findall(r"^ExecStart=(.+)$", unit, re.M)
    assert "--creds" not in exec_start, "the environment names the credential; a path here would bypass it"
    assert re.search(r"^User=root$", unit, re.M)
    how = re.search(r"^#\s+healthplane creds node NODE --cluster C --keys DIR -o \S+$", unit, re.M)
    assert how and re.search(rf"^#.*-m 0600 \S+ {re.escape(source)}$", unit, re.M), "the unit says how to issue it"


# ---------------------------------------------------------------- no secret committed (SEC-3, SEC-6)

def _deploy_files() -> list[Path]:
    files = [ROOT / "docker-compose.yml", *(p for p in (ROOT / "deploy").rglob("*") if p.is_file())]
    assert len(files) > 10
    return files


def test_sec3_no_seed_or_jwt_is_committed_in_a_deploy_file() -> None:
    """Keys are made at deploy time (`creds init`), never shipped: no nkey seed and no JWT
    appears in docker-compose.yml or under deploy/."""
    for path in _deploy_files():
        found = SECRET_RE.search(path.read_text(errors="replace"))
        assert not found, f"{path.relative_to(ROOT)}: {found.group(0)[:6]}... looks like a seed or a JWT"


def test_the_secret_pattern_finds_what_creds_writes(tmp_path: Path) -> None:
    """The pattern above matches real output: a user seed and a JWT as `creds` writes them."""
    store = Keystore.init(tmp_path / "keys")
    text = store.service("scorer", tmp_path / "scorer.creds").read_text()
    assert {found.group(0)[:2] for found in SECRET_RE.finditer(text)} == {"ey", "SU"}
