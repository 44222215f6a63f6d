"""The web UI in a real headless Chromium against ``healthplane up`` (API-3, API-5): an
operator logs in with the token, sees the fleet turn degraded without a reload, finds out
why on the node page, and cordons the node."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.browser import chromium
from tests.support.stack import Stack, running

pytestmark = [pytest.mark.slow, pytest.mark.nats]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as found:
        yield found


def _logged_in(browser: Browser, stack: Stack, errors: list[str]) -> Page:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(stack.api_url + "/")
    expect(page).to_have_url(stack.api_url + "/login?next=/")
    page.fill("textarea[name=token]", stack.token("admin"))
    page.click("form.login button[type=submit]")
    expect(page.locator("#clusters")).to_be_visible()
    return page


def _live(page: Page) -> None:
    """The page's event stream is open, and a marker that only a reload would clear is set."""
    expect(page.locator("body[data-live=open]")).to_be_attached(timeout=10_000)
    page.evaluate("window.__sameDocument = true")


def test_api5_a_fault_turns_the_dashboard_degraded_live_and_the_node_page_explains_and_cordons(
        tmp_path: Path, browser: Browser) -> None:
    errors: list[str] = []
    with running(tmp_path) as stack:
        page = _logged_in(browser, stack, errors)
        expect(page.locator("#clusters")).to_contain_text("All healthy")
        expect(page.locator("#fleet-tile")).to_contain_text("8 of 8")
        _live(page)

        injected = stack.cli("sim", "inject", "sim-005", "--fault", "xid:79", "--gpu", "0")
        assert injected.returncode == 0, injected.stderr
        expect(page.locator("#clusters")).to_contain_text("1 degraded, worst 55", timeout=20_000)
        expect(page.locator("#fleet-tile")).to_contain_text("7 of 8")
        assert page.evaluate("window.__sameDocument") is True, "the dashboard reloaded instead of updating"

        page.click("#clusters a")
        expect(page.locator("#nodes tbody tr").first).to_contain_text("sim-005")  # lowest score first
        page.click("#nodes a:text-is('sim-005')")
        expect(page.locator("#conditions")).to_contain_text("GPU Xid Errors")
        # XID-3: what NVIDIA's catalog says to do about Xid 79, and XID-2: the lost GPU is explained.
        expect(page.locator("#conditions")).to_contain_text("Recommended action (NVIDIA's Xid catalog): RESTART_BM")
        expect(page.locator("#automation")).to_contain_text("not blind")
        expect(page.locator("#explanation")).to_contain_text("-45")
        expect(page.locator("#trend circle")).to_have_count(2)
        expect(page.locator("#automation")).to_contain_text("Why is automation not acting?")
        assert stack.cli_json("node", "show", "sim-005")["automation"] in page.inner_text("#automation")

        page.fill("form[action$='/cordon'] input[name=reason]", "from the UI")
        page.click("form[action$='/cordon'] button")
        expect(page.locator(".notice")).to_contain_text("cordon hold created for sim-005")
        holds = stack.cli_json("node", "show", "sim-005")["holds"]
        assert [(h["effect"], h["reason"], h["actor"]) for h in holds] == [("cordon", "from the UI", "admin")]
        expect(page.locator("#holds")).to_contain_text("from the UI", timeout=10_000)
    assert errors == []


def test_api3_a_cluster_whose_data_cannot_be_read_shows_no_health(tmp_path: Path, browser: Browser) -> None:
    errors: list[str] = []
    with running(tmp_path, nodes=4) as stack:
        page = _logged_in(browser, stack, errors)
        expect(page.locator("#clusters")).to_contain_text("All healthy")
        _live(page)
        os.kill(int(stack.stack["natsServerPid"]), signal.SIGKILL)
        expect(page.locator("#clusters")).to_contain_text("No health: cannot read its data since", timeout=15_000)
        expect(page.locator("#fleet-tile")).to_contain_text("No health")
        expect(page.locator("#clusters")).not_to_contain_text("All healthy")
        assert page.evaluate("window.__sameDocument") is True


def test_api2_a_viewer_sees_no_commands_and_a_forged_form_is_refused(tmp_path: Path, browser: Browser) -> None:
    with running(tmp_path, nodes=2) as stack:
        page = browser.new_page()
        page.goto(stack.api_url + "/login")
        page.fill("textarea[name=token]", stack.token("viewer"))
        page.click("form.login button[type=submit]")
        page.goto(stack.api_url + "/nodes/sim-000")
        expect(page.locator("#actions")).to_contain_text("viewer is a viewer: commands need an admin's token")
        expect(page.locator("#actions form")).to_have_count(0)
        # A form posted from another page (no CSRF value, another origin) changes nothing.
        answer = page.request.post(stack.api_url + "/nodes/sim-000/cordon", form={"reason": "forged"},
                                   headers={"Origin": "http://evil.example"})
        assert answer.status == 403 and "CSRF" in answer.text()
        assert stack.cli_json("node", "show", "sim-000")["holds"] == []
