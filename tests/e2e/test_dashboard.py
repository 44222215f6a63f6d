"""UI-2, the fleet dashboard, in a real headless Chromium against ``healthplane up`` (one stack
for the module): a small simulated fleet, a GPU fault, a blind collector and an operator's
cordon; the tiles, the queue, the timeline and the heatmap say so without a reload; each
tile's link lands on a nodes table that lists as many nodes as the tile counted; the JSON
route says the same; the page logs no console error."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.browser import chromium
from tests.support.stack import Stack, running, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.nats]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running(tmp_path_factory.mktemp("dashboard"), nodes=8) as found:
        yield found


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as found:
        yield found


def _logged_in(browser: Browser, stack: Stack, errors: list[str]) -> Page:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(stack.api_url + "/login?next=/")
    page.fill("textarea[name=token]", stack.token("viewer"))
    page.click("form.login button[type=submit]")
    expect(page.locator("#fleet-tile")).to_be_visible()
    return page


def _figures(stack: Stack, **params: str) -> dict[str, Any]:
    answer = stack.get("/api/v1/dashboard", **params)
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def _lands_on(page: Page, stack: Stack, selector: str, count: int) -> None:
    """Follow the link at ``selector``: the nodes table it opens lists ``count`` nodes."""
    page.click(selector)
    expect(page).to_have_url(re.compile(r"/nodes\?"))
    expect(page.locator("#total")).to_have_text(str(count))
    page.go_back()
    expect(page.locator("#fleet-tile")).to_be_visible()


def test_ui2_the_dashboard_counts_live_and_every_tile_opens_the_nodes_it_counts(stack: Stack,
                                                                               browser: Browser) -> None:
    errors: list[str] = []
    page = _logged_in(browser, stack, errors)
    expect(page.locator("#fleet-tile")).to_contain_text("8 of 8")
    expect(page.locator("#fleet-tile")).to_contain_text("100 % of the fleet")
    expect(page.locator("#tile-status-ready")).to_have_attribute("data-count", "8")
    # The simulator puts every 4 nodes on one NVLink fabric (DOM-1): two healthy cells of 4.
    expect(page.locator(".heatmap[data-kind=nvlink] .cell.healthy")).to_have_count(2)
    expect(page.locator("body[data-live=open]")).to_be_attached(timeout=10_000)
    page.evaluate("window.__sameDocument = true")

    # Xid 79 takes sim-005's GPU off the bus: its collector failure is explained, not blindness
    # (XID-2). sim-002's EDAC read fails: blind; a corrected machine check sends its report now.
    for args in (("sim", "inject", "sim-005", "--fault", "xid:79", "--gpu", "0"),
                 ("sim", "inject", "sim-002", "--fault", "collector-failed:edac"),
                 ("sim", "inject", "sim-002", "--fault", "mce-corrected"),
                 ("node", "cordon", "sim-001", "--reason", "UI-2 test")):
        done = stack.cli(*args)
        assert done.returncode == 0, done.stderr

    expect(page.locator("#conditions a[data-condition=gpu_xid_errors]")).to_have_attribute(
        "data-count", "1", timeout=30_000)
    expect(page.locator("#attention li[data-kind=blind]")).to_contain_text("sim-002", timeout=30_000)
    expect(page.locator("#tile-status-cordoned")).to_have_attribute("data-count", "1", timeout=30_000)
    expect(page.locator("#timeline tr[data-action=cordon] td.total")).to_have_text("1", timeout=30_000)
    expect(page.locator(".heatmap[data-kind=nvlink] .cell.degraded, .heatmap[data-kind=nvlink] .cell.unknown")
           ).not_to_have_count(0)
    expect(page.locator("#guardrails")).to_contain_text("1 of 8 out of service")
    assert page.evaluate("window.__sameDocument") is True, "the dashboard reloaded instead of updating"

    figures = wait_for(lambda: (f := _figures(stack)) and f["conditions"]["top"] and f, 30, "the figures")
    health = {h["health"]: h["count"] for h in figures["health"]}
    assert sum(health.values()) == 8 and health["HEALTHY"] <= 6
    assert figures["outOfService"]["count"] == 1 and figures["timeline"]["totals"]["cordon"] == 1
    assert {i["nodeId"] for i in figures["needsAttention"]["items"] if i["kind"] == "blind"} == {"sim-002"}
    assert figures["healthyPercent"] == f"{100 * health['HEALTHY'] / 8:.1f} %"
    assert _figures(stack, cluster="default")["nodes"] == 8

    page.reload()  # the page and the JSON from the same moment: the counts below are the page's
    expect(page.locator("#tile-status-cordoned")).to_have_attribute("data-count", "1")
    degraded = int(page.get_attribute("#tile-health-degraded", "data-count") or "0")
    assert degraded >= 1
    _lands_on(page, stack, "#tile-health-degraded", degraded)
    _lands_on(page, stack, "#tile-status-cordoned", 1)
    _lands_on(page, stack, "#tile-out", 1)
    _lands_on(page, stack, "#conditions a[data-condition=gpu_xid_errors]", 1)
    cell = page.locator(".heatmap[data-kind=nvlink] .cell").first
    _lands_on(page, stack, ".heatmap[data-kind=nvlink] .cell >> nth=0", int(cell.get_attribute("data-nodes") or "0"))
    fifties = page.locator("#scores a.bin[data-bin='50-59']")
    _lands_on(page, stack, "#scores a.bin[data-bin='50-59']", int(fifties.get_attribute("data-count") or "0"))
    assert errors == []
