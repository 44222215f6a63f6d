"""UI-4 against a real ``healthplane up`` (the api as uvicorn serves it, the reference
scheduler running validation jobs) and Debian's Chromium: ``validate``, ``isolate`` and
``remediate`` as API POSTs with the CLI's outcomes, visible in the node's events and refused
to a viewer; the node page's time axis, remediation and validation timeline, attributed
failures, Grafana links and the same three commands for an admin.

One stack for the module; the tests run in file order and the page test reads what the API
test left (a validated node, an isolated job)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import Browser, expect

from tests.support.browser import chromium
from tests.support.stack import Stack, running

pytestmark = [pytest.mark.slow, pytest.mark.nats]
GRAFANA = "https://grafana.example/"
CONFIG = """\
nodeHealth:
  mode: observe
validation:
  suites:
    gpu-diag: {command: [dcgmi, diag, -r, "2"], timeoutSeconds: 600, gpus: 8}
  defaultSuite: gpu-diag
  isolation: {maxConcurrent: 8}
"""
# Fast simulated validation runs and placement, the API's Grafana link (UI-4).
ENV = {"HEALTHPLANE_SCHEDULER_VALIDATION_SECONDS": "0.5", "HEALTHPLANE_SCHEDULER_TICK_SECONDS": "0.2",
       "HEALTHPLANE_API_GRAFANA_URL": GRAFANA}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("node-page")
    config = root / "cluster.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    with pytest.MonkeyPatch.context() as env:
        for name, value in ENV.items():
            env.setenv(name, value)
        with running(root, "--config", str(config)) as found:
            yield found


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as found:
        yield found


def _events(stack: Stack, node: str, *types: str) -> list[dict[str, Any]]:
    flags = [f for t in types for f in ("--type", t)]
    found: list[dict[str, Any]] = stack.cli_json("node", "events", node, *flags, "--page-size", "500")["events"]
    return found


def _failed_job(stack: Stack) -> str:
    """A job over every node that fails on the node with the silent GPU fault (sim-002)."""
    injected = stack.cli("sim", "inject", "sim-002", "--fault", "silent-gpu", "--gpu", "5")
    assert injected.returncode == 0, injected.stderr
    submitted = stack.cli("sim", "submit", "--steps", "8", "--duration", "2")
    assert submitted.returncode == 0, submitted.stderr
    [job] = submitted.stdout.split()

    def failed() -> bool:
        return any(j["jobId"] == job for j in stack.cli_json("jobs", "impact", "--since", "1h")["jobs"])

    stack.wait_until(failed, 60, f"job {job} failed")
    return job


@pytest.fixture(scope="module")
def isolation(stack: Stack) -> Callable[[], tuple[str, Any]]:
    """A failed multi-node job isolated through the API (VAL-3) and the API's answer, made on
    the first call (after what a test asserts of the fleet before it) and kept: what both tests
    read, whichever runs first or alone."""
    made: list[tuple[str, Any]] = []

    def isolated() -> tuple[str, Any]:
        if not made:
            job = _failed_job(stack)
            made.append((job, stack.post("/api/v1/nodes/sim-000/isolate", {"job": job, "timeout": 60})))
        return made[0]
    return isolated


def _refused_to_a_viewer(stack: Stack, node: str, verb: str, body: dict[str, Any]) -> None:
    denied = stack.post(f"/api/v1/nodes/{node}/{verb}", body, role="viewer")
    assert denied.status_code == 403, denied.text
    assert f"permission denied: viewer (role viewer) may not send {verb} commands" in denied.json()["error"]


def test_ui4_validate_isolate_and_remediate_through_the_api_as_the_cli_and_refused_to_a_viewer(
        stack: Stack, isolation: Callable[[], tuple[str, Any]]) -> None:
    for verb in ("validate", "remediate"):
        _refused_to_a_viewer(stack, "sim-001", verb, {})
    assert _events(stack, "sim-001", "VALIDATION_STARTED") == []

    validated = stack.post("/api/v1/nodes/sim-001/validate", {"timeout": 30})
    assert validated.status_code == 200, validated.text
    outcome = validated.json()
    assert (outcome["result"], outcome["passed"]) == ("applied", True)
    assert outcome["message"].startswith("sim-001: validation passed: suite gpu-diag in ")
    [passed] = _events(stack, "sim-001", "VALIDATION_PASSED")
    assert passed["commandId"] == outcome["commandId"] and passed["actor"] == "admin"
    assert passed["validation"]["suite"] == "gpu-diag"

    unknown = stack.post("/api/v1/nodes/sim-001/isolate", {"job": "no-such-job"})
    cli = stack.cli("isolate", "no-such-job", "--timeout", "10")
    assert unknown.status_code == 409 and cli.returncode == 1
    assert unknown.json()["error"] == cli.stderr.strip().removeprefix("healthplane: ")
    assert unknown.json()["error"] == "isolate no-such-job: no allocations of job no-such-job in cluster default"
    assert stack.post("/api/v1/nodes/sim-001/isolate").json()["error"].startswith("isolate: name the failed job")
    assert stack.post("/api/v1/nodes/sim-001/cordon", {"job": "x"}).status_code == 400

    job, isolated = isolation()
    _refused_to_a_viewer(stack, "sim-000", "isolate", {"job": job})
    assert isolated.status_code == 200, isolated.text
    assert isolated.json()["message"].startswith(f"isolated job {job} in ")
    # up's fleet shares NVLink domains of four: isolation keeps a domain together (DOM-4).
    faulty = isolated.json()["message"].split("faulty: ", 1)[1].split(";", 1)[0].split(", ")
    assert "sim-002" in faulty
    attributed = _events(stack, "sim-002", "JOB_FAILURE_ATTRIBUTED")
    assert [(e["faultClass"], e["allocationId"].split(".")[0]) for e in attributed] == [("VALIDATION_FAILED", job)]
    assert _events(stack, "sim-002", "VALIDATION_FAILED")

    remediated = stack.post("/api/v1/nodes/sim-003/remediate", {"reason": "UI-4"})
    assert remediated.status_code == 200, remediated.text
    said = remediated.json()
    assert said["result"] == "applied" and said["message"].startswith("no remediation ladder for the faults of sim-003")
    recorded = {e["id"] for e in _events(stack, "sim-003")}
    assert said["eventIds"] and set(said["eventIds"]) <= recorded
    holds = stack.cli_json("node", "show", "sim-003")["holds"]
    assert [(h["effect"], h["actor"]) for h in holds] == [("cordon", "admin")]


def test_ui4_the_node_page_has_a_time_axis_a_timeline_attributions_grafana_and_the_commands(
        stack: Stack, browser: Browser, isolation: Callable[[], tuple[str, Any]]) -> None:
    job, _ = isolation()  # its validation and attribution are what the page shows
    errors: list[str] = []
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(stack.api_url + "/login")
    page.fill("textarea[name=token]", stack.token("admin"))
    page.click("form.login button[type=submit]")

    page.goto(stack.api_url + "/nodes/sim-002")
    expect(page.locator("#trend .tick text").first).to_be_visible()
    labels = page.locator("#trend .tick text").evaluate_all("texts => texts.map(t => t.textContent)")
    assert len(labels) >= 2 and all(re.fullmatch(r"\d\d:\d\d(:\d\d)?|\d\d-\d\d", label) for label in labels), labels
    expect(page.locator("#timeline")).to_contain_text("Validation failed")
    expect(page.locator("#timeline")).to_contain_text("suite gpu-diag")
    expect(page.locator("#failures")).to_contain_text("Validation Failed")
    expect(page.locator("#failures")).to_contain_text(f"{job}.")
    links = page.locator("#grafana a").evaluate_all("links => links.map(a => a.href)")
    assert links[0].startswith(GRAFANA + "d/healthplane-node-reliability/node-reliability?")
    assert parse_qs(urlsplit(links[1]).query) == {"var-cluster": ["default"], "var-node": ["sim-002"],
                                                  "viewPanel": ["6"]}
    # The failed job is offered for isolation.
    assert job in page.locator("#failed-jobs option").evaluate_all("options => options.map(o => o.value)")

    page.goto(stack.api_url + "/nodes/sim-004")
    page.select_option("form[action$='/validate'] select[name=suite]", "gpu-diag")
    page.click("form[action$='/validate'] button")
    expect(page.locator(".notice")).to_contain_text("sim-004: validation passed: suite gpu-diag in ")
    expect(page.locator("#timeline")).to_contain_text("Validation passed")
    page.fill("form[action$='/isolate'] input[name=job]", "no-such-job")
    page.click("form[action$='/isolate'] button")
    expect(page.locator(".failed")).to_contain_text("isolate no-such-job: no allocations of job no-such-job")
    page.once("dialog", lambda dialog: dialog.dismiss())  # asked first; "no" sends nothing
    page.click("form[action$='/remediate'] button")
    assert stack.cli_json("node", "show", "sim-004")["holds"] == []
    assert errors == []
