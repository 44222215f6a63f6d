"""INT-1: docs/subscribing.md is true. Its Python subscriber is taken from the page and run as it
is against a real, secure nats-server with a viewer's credentials and the inbox prefix that
``healthplane creds user`` printed; the default inbox is refused, as the page says; the page's
encodings are the control plane's."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import nats
import pytest
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.runtime import creds
from healthplane.stack.keystore import Keystore
from healthplane.stack.natsserver import NatsServer

pytestmark = pytest.mark.nats

PAGE = Path(__file__).resolve().parents[2] / "docs" / "subscribing.md"
ISSUED = re.compile(r"^credentials for alice \(role viewer\) in (\S+), inbox prefix (\S+)$")


def example() -> str:
    """The page's ``subscriber.py``: the first Python block after its name."""
    text = PAGE.read_text(encoding="utf-8")
    found = re.search(r"`subscriber\.py`.*?```python\n(.*?)```", text, re.S)
    assert found, "docs/subscribing.md has no subscriber.py block"
    return found.group(1)


def issue_viewer(keystore: Keystore, out: Path) -> tuple[str, str]:
    """``healthplane creds user alice --role viewer``: the file and the inbox prefix it printed."""
    done = subprocess.run([sys.executable, "-m", "healthplane.cli", "creds", "user", "alice", "--role", "viewer",
                           "--keys", str(keystore.directory), "-o", str(out)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    printed = ISSUED.match(done.stdout.strip())
    assert printed, done.stdout
    return printed.group(1), printed.group(2)


def test_int1_creds_user_prints_the_inbox_prefix_of_the_file_it_wrote(keystore: Keystore, tmp_path: Path) -> None:
    path, prefix = issue_viewer(keystore, tmp_path / "alice.creds")
    assert path == str(tmp_path / "alice.creds")
    assert prefix == creds.inbox_prefix(path) == "_INBOX.viewer.alice"


async def test_int1_the_pages_python_subscriber_runs_as_written_with_a_viewers_credentials(
        nats_server: NatsServer, keystore: Keystore, js: JetStreamContext, tmp_path: Path) -> None:
    path, prefix = issue_viewer(keystore, tmp_path / "alice.creds")
    script = tmp_path / "subscriber.py"
    script.write_text(example(), encoding="utf-8")
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={"PATH": "/usr/bin:/bin", "NATS_URL": nats_server.url,
                                               "NATS_CREDS": path, "NATS_INBOX_PREFIX": prefix,
                                               "NODE": "10.0.0.42/9100"})
    lines: list[str] = []
    assert process.stdout is not None
    threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in process.stdout),  # type: ignore[union-attr]
                     daemon=True).start()

    async def printed(count: int) -> list[str]:
        for _ in range(400):
            if len(lines) >= count or process.poll() is not None:
                break
            await asyncio.sleep(0.05)
        assert len(lines) >= count, (lines, process.poll(), process.stderr.read() if process.poll() else "")  # type: ignore[union-attr]
        return lines

    try:
        assert (await printed(1))[0] == ("HP_NODE_EVENTS keeps 0 events; listening on "
                                         "hp.event.*.10=2E0=2E0=2E42=2F9100.*")
        at = datetime(2026, 8, 5, 13, 41, 2, tzinfo=UTC)
        for node_id in ("10.0.0.42/9100", "10.0.0.43/9100"):
            record = wire.NodeEvent(id=f"e-{node_id}", node_id=node_id, cluster="lab", type="CONDITION_RAISED",
                                    occurred_at=at, message=f"GPU Xid 79 on {node_id}", actor="health-ingest")
            await js.publish(subjects.event("lab", node_id, "CONDITION_RAISED"), wire.encode(record))
        assert (await printed(2))[1] == ("2026-08-05T13:41:02Z lab/10.0.0.42/9100 CONDITION_RAISED: "
                                         "GPU Xid 79 on 10.0.0.42/9100")
        await asyncio.sleep(0.5)
        assert len(lines) == 2  # not the other node's
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0, process.stderr.read()  # type: ignore[union-attr]


async def test_int1_the_default_inbox_is_refused_at_the_first_request(nats_server: NatsServer, keystore: Keystore,
                                                                      js: JetStreamContext, tmp_path: Path) -> None:
    """Section 1's "why": a viewer on nats-py's default prefix may subscribe, but no reply reaches it."""
    path, _prefix = issue_viewer(keystore, tmp_path / "alice.creds")
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(nats_server.url, user_credentials=path, error_cb=on_error, max_reconnect_attempts=0)
    try:
        await nc.subscribe("hp.event.>")
        with pytest.raises((nats.errors.TimeoutError, nats.errors.Error)):
            await nc.jetstream(timeout=2).stream_info("HP_NODE_EVENTS")
        assert any("permissions violation for subscription to \"_inbox." in e.lower() for e in errors), errors
    finally:
        await nc.close()


def test_int1_the_pages_encodings_are_the_control_planes() -> None:
    namespace: dict[str, object] = {}
    exec(compile(example(), "subscriber.py", "exec"), namespace)  # defines; runs nothing (no __main__)
    token = namespace["token"]
    for value in ("10.0.0.42/9100", "gpu/07", "node.gpu_14", "cn-042", "gpu-ü-01", "a b*>", "=7E"):
        assert token(value) == subjects.encode_token(value), value  # type: ignore[operator]
    text = PAGE.read_text(encoding="utf-8")
    for value in ("10.0.0.42/9100", "gpu/07", "node.gpu_14", "cn-042"):
        assert f"`{value}`" in text and f"`{subjects.encode_token(value)}`" in text, value
    assert f"`{subjects.event('lab', '10.0.0.42/9100', '*')}`".replace("=2A", "*") in text
    assert set(re.findall(r"`(CONDITION_RAISED|NODE_\w+|HOLD_\w+|SCORE_CHANGED)`", text)) <= set(wire.EVENT_TYPES)


def test_int1_the_pages_nats_cli_lines_name_what_the_python_example_uses() -> None:
    """The ``nats`` CLI is in none of the registries this project installs from (PyPI, Debian,
    npm), so its lines are checked, not run: the credentials, the prefix and the subjects."""
    text = PAGE.read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.startswith("nats --")]
    assert len(lines) >= 2
    for line in lines:
        assert "--creds alice.creds --inbox-prefix _INBOX.viewer.alice" in line, line
    subscribed = [re.search(r"sub '([^']+)'", line) for line in lines]
    patterns = [m.group(1) for m in subscribed if m]
    assert "hp.event.>" in patterns
    for pattern in patterns:
        assert subjects.matches(pattern, subjects.event("lab", "gpu/07", "CONDITION_RAISED")), pattern


async def test_int1_the_readmes_subscriber_runs_as_written(nats_server: NatsServer, keystore: Keystore,
                                                           js: JetStreamContext, tmp_path: Path) -> None:
    """Issue 45: the README's five-minute subscriber, verbatim but for the server's address."""
    readme = (PAGE.parents[1] / "README.md").read_text(encoding="utf-8")
    found = re.search(r"## Subscribing to events\n.*?```python\n(.*?)```", readme, re.S)
    assert found and '"nats://127.0.0.1:4222"' in found.group(1)
    issue_viewer(keystore, tmp_path / "alice.creds")  # the README's own command, in the README's folder
    script = tmp_path / "readme.py"
    script.write_text(found.group(1).replace("nats://127.0.0.1:4222", nats_server.url), encoding="utf-8")
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=tmp_path)
    try:
        record = wire.NodeEvent(id="e1", node_id="gpu/07", cluster="lab", type="NODE_CORDONED",
                                occurred_at=datetime(2026, 8, 5, 13, 41, 2, tzinfo=UTC), message="cordoned: disk",
                                actor="alice")
        lines: list[str] = []
        assert process.stdout is not None
        threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True).start()  # type: ignore[arg-type]
        for _ in range(200):  # subscribed once a publish shows; each try is a new event
            await js.publish(subjects.event("lab", "gpu/07", "NODE_CORDONED"), wire.encode(record))
            await asyncio.sleep(0.1)
            if lines or process.poll() is not None:
                break
        assert lines, process.stderr.read() if process.poll() is not None else "nothing printed"  # type: ignore[union-attr]
        subject, _, payload = lines[0].rstrip("\n").partition(" ")
        assert subject == "hp.event.lab.gpu=2F07.NODE_CORDONED" and wire.decode(wire.NodeEvent, payload.encode()) == record
    finally:
        process.kill()
        process.wait(timeout=20)
