"""INT-1: ``GET /api/v1/events/stream`` through the real api process of a ``healthplane up``: a new
event within 2 s as a server-sent event whose id is its position, whose event is its type and
whose data is the stored event; ``Last-Event-ID`` resumes right after it."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.support.stack import Stack, running, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.nats]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running(tmp_path_factory.mktemp("events"), nodes=2) as found:
        yield found


class Stream:
    """One event stream read on a thread: each message with the wall time it came in."""

    def __init__(self, stack: Stack, params: dict[str, Any], last_event_id: str | None = None) -> None:
        self.headers = {"Authorization": f"Bearer {stack.token('viewer')}"}
        if last_event_id is not None:
            self.headers["Last-Event-ID"] = last_event_id
        self.url, self.params = stack.api_url + "/api/v1/events/stream", params
        self.status: int | None = None
        self.messages: list[tuple[float, dict[str, str]]] = []
        threading.Thread(target=self._read, daemon=True).start()  # ends with the test process
        wait_for(lambda: self.messages, 30, "the stream's first message (retry)")

    def _read(self) -> None:
        with contextlib.suppress(httpx.HTTPError):  # the stack stopping under a stream still open
            self._read_messages()

    def _read_messages(self) -> None:
        with httpx.stream("GET", self.url, params=self.params, headers=self.headers, timeout=60) as answer:
            self.status = answer.status_code
            fields: dict[str, str] = {}
            for line in answer.iter_lines():
                if not line:
                    if fields:
                        self.messages.append((time.time(), fields))
                    fields = {}
                elif not line.startswith(":"):
                    name, _, value = line.partition(":")
                    fields[name] = value.removeprefix(" ")

    def events(self) -> list[tuple[float, dict[str, str]]]:
        return [(at, m) for at, m in self.messages if "event" in m]


def _cli(stack: Stack, *args: str) -> None:
    done = stack.cli(*args)
    assert done.returncode == 0, done.stderr


def test_int1_the_event_stream_delivers_a_new_event_within_2s_and_resumes_from_last_event_id(stack: Stack) -> None:
    assert httpx.get(stack.api_url + "/api/v1/events/stream", timeout=30).status_code == 401
    bad = stack.get("/api/v1/events/stream", role="viewer", type="bogus")
    assert bad.status_code == 400 and "'bogus' is not an event type" in bad.json()["error"]

    wanted = {"node": "sim-001", "type": "node_cordoned"}  # any case, as the CLI takes it
    first = Stream(stack, wanted)
    assert first.status == 200 and first.messages[0][1] == {"retry": "2000"}
    _cli(stack, "node", "cordon", "sim-001", "--reason", "INT-1 stream")
    at, message = wait_for(lambda: first.events()[:1], 10, "NODE_CORDONED on the stream")[0]
    event = json.loads(message["data"])
    assert message["event"] == "NODE_CORDONED" and event["type"] == "NODE_CORDONED"
    assert event["nodeId"] == "sim-001" and event["message"] == "cordoned: INT-1 stream"
    late_s = at - datetime.fromisoformat(event["occurredAt"].replace("Z", "+00:00")).timestamp()
    print(f"INT-1: the cordon was on the event stream {late_s:.2f} s after it occurred")
    assert late_s < 2.0
    stored = stack.cli_json("node", "events", "sim-001", "--type", "NODE_CORDONED")["events"]
    assert event == stored[-1]  # EVT-2: the stored event as it is

    # The id is the event's position: the CLI's tail says the same.
    watch = subprocess.Popen([sys.executable, "-m", "healthplane.cli", "events", "watch", "--since", "1h", "--node",
                              "sim-001", "--type", "NODE_CORDONED", "-o", "json"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=stack.env("viewer"))
    assert watch.stdout is not None
    line = json.loads(watch.stdout.readline())
    watch.send_signal(signal.SIGINT)
    assert watch.wait(timeout=20) == 0
    assert line == {**event, "position": int(message["id"])}

    # Away while the node is uncordoned (another type) and cordoned again: resumed right after.
    _cli(stack, "node", "uncordon", "sim-001")
    _cli(stack, "node", "cordon", "sim-001", "--reason", "again")
    resumed = Stream(stack, wanted, last_event_id=message["id"])
    _, again = wait_for(lambda: resumed.events()[:1], 10, "the second NODE_CORDONED on the resumed stream")[0]
    assert int(again["id"]) > int(message["id"])
    assert json.loads(again["data"])["message"] == "cordoned: again"
    time.sleep(1)
    assert len(resumed.events()) == 1  # not the first cordon again
    assert [json.loads(m["data"])["message"] for _, m in first.events()] == ["cordoned: INT-1 stream", "cordoned: again"]
