"""UI-5 (issue 44 item 6): the templates and static files ship as package data. The wheel is
built as a user would (``pip wheel``, the build backend ``pyproject.toml`` pins, in pip's
isolated build env) from a copy of the sources, so the build writes nothing into the working
tree; setuptools says nothing about them; the wheel goes into a fresh venv outside the repo;
that venv's ``healthplane service api`` serves every page and static file."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.stack.keystore import Keystore
from healthplane.stack.natsserver import NatsServer, free_port
from healthplane_api.pages import node_path
from tests.support.secure import env_for

pytestmark = [pytest.mark.slow, pytest.mark.nats]

REPO = Path(__file__).resolve().parents[2]
NODE = "10.0.0.42/9100"
STATIC = sorted(p.name for p in (REPO / "services/api/static").iterdir())


def _run(*argv: str | Path, cwd: Path) -> str:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def _wheel(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for tree in ("libs", "services"):
        shutil.copytree(REPO / tree, source / tree, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    said = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", tmp_path / "dist", source, cwd=tmp_path)
    assert "absent from the `packages` configuration" not in said, "setuptools warns about the api's data"
    return next((tmp_path / "dist").glob("healthplane-*.whl"))


def _install(wheel: Path, venv: Path, tmp_path: Path) -> None:
    """A bare venv, filled by this interpreter's pip at the versions of requirements.lock."""
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    lock = (REPO / "requirements.lock").read_text(encoding="utf-8")
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("\n".join(re.findall(r"^([A-Za-z0-9_.-]+==[^ ;\\]+)", lock, re.M)) + "\n")
    _run(sys.executable, "-m", "pip", "--python", venv / "bin/python", "install", "--quiet", "-c", constraints,
         wheel, cwd=tmp_path)


async def test_ui5_a_wheel_installed_outside_the_repo_serves_every_page(
        nats_server: NatsServer, js: JetStreamContext, keystore: Keystore, tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    venv = tmp_path / "venv"
    _install(wheel, venv, tmp_path)
    where = _run(venv / "bin/python", "-c", "import healthplane_api.pages as p; print(p.TEMPLATES, p.STATIC)",
                 cwd=tmp_path)
    assert str(REPO) not in where and where.startswith(str(venv)), where

    view = wire.NodeView(node_id=NODE, cluster="default", hostname="gpu-42", status="READY", health="HEALTHY",
                         last_reported_at=datetime.now(UTC), score=100, score_explanation=None, conditions=[],
                         attributed_failures=wire.AttributedFailures(), holds=[], report_interval_seconds=30)
    await js.publish(subjects.node_view(view.cluster, view.node_id), wire.encode(view), timeout=5)

    port = free_port()
    env = {k: v for k, v in env_for(nats_server, "api", HEALTHPLANE_API_PORT=str(port)).items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    with open(tmp_path / "api.log", "wb") as log:
        api = subprocess.Popen([venv / "bin/healthplane", "service", "api", "--metrics-port", "0"], cwd=tmp_path,
                               env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {keystore.token('packager', 'viewer')}"}
    try:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
            deadline = time.monotonic() + 60
            while True:
                assert api.poll() is None and time.monotonic() < deadline, (tmp_path / "api.log").read_text()
                try:
                    if (await client.get("/api/v1/summary")).json()["fleet"]["nodes"] == 1:
                        break
                except (httpx.HTTPError, KeyError, TypeError, ValueError):
                    pass
                await asyncio.sleep(0.2)
            pages = {"/": "Healthplane", "/nodes": node_path(NODE), node_path(NODE): "gpu-42",
                     "/login": "Log in", "/api/openapi.json": "/api/v1/nodes/{nodeId}"}
            for path, shows in pages.items():
                answer = await client.get(path)
                assert answer.status_code == 200 and shows in answer.text, (path, answer.status_code, answer.text)
            for name in STATIC:
                answer = await client.get(f"/static/{name}")
                assert answer.status_code == 200, name
                assert answer.content == (REPO / "services/api/static" / name).read_bytes(), name
    finally:
        api.terminate()
        api.wait(30)
