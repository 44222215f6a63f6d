"""UI-3 against a real ``healthplane up`` (the api as uvicorn serves it) and Debian's Chromium:
the nodes table's server-side filters, in the URL and in the form; pages by key while nodes
join; bulk commands asked first in the CLI's manner and answered per node; live updates that
change the cells of the rows shown and never move a row under the reader."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.e2e.test_node_ids import _report_as_itself
from tests.support.browser import chromium
from tests.support.stack import Stack, running

pytestmark = [pytest.mark.slow, pytest.mark.nats]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running(tmp_path_factory.mktemp("nodes-table")) as found:
        yield found


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as found:
        yield found


def _ids(body: dict[str, Any]) -> list[str]:
    return [view["nodeId"] for view in body["nodes"]]


def _join(stack: Stack, root: Path, node_id: str) -> None:
    """A node that was not there: its own credentials, its first reports, as its collector."""
    creds = root / f"{node_id}.creds"
    issued = stack.cli("creds", "node", node_id, "--data-dir", str(stack.data_dir), "-o", str(creds))
    assert issued.returncode == 0, issued.stderr
    asyncio.run(_report_as_itself(str(stack.stack["natsUrl"]), creds, node_id))


def test_ui3_the_api_filters_by_condition_and_hold_and_pages_by_key_while_nodes_join(stack: Stack,
                                                                                     tmp_path: Path) -> None:
    injected = stack.cli("sim", "inject", "sim-005", "--fault", "xid:79", "--gpu", "0")
    assert injected.returncode == 0, injected.stderr
    stack.wait_until(lambda: _ids(stack.get("/api/v1/nodes", condition="gpu_xid_errors").json()) == ["sim-005"],
                     30, "the Xid node by its condition")
    assert stack.get("/api/v1/nodes", condition="GPU_XID_ERRORS", health="degraded").json()["total"] == 1
    assert stack.post("/api/v1/nodes/sim-002/cordon", {"reason": "UI-3"}).status_code == 200
    stack.wait_until(lambda: _ids(stack.get("/api/v1/nodes", hold="cordon").json()) == ["sim-002"], 20,
                     "the cordoned node by its hold")
    unheld = stack.get("/api/v1/nodes", hold="none").json()
    assert unheld["total"] == 7 and "sim-002" not in _ids(unheld)
    bad = stack.get("/api/v1/nodes", condition="gpu_on_fire")
    assert bad.status_code == 400 and bad.json()["error"].startswith("condition 'gpu_on_fire': one of ")

    # Keyset pages: a node joining behind the reader's place is not on a later page, one
    # joining ahead of it is; no node of the first page comes again, none is skipped.
    first = stack.get("/api/v1/nodes", pageSize=3, sort="node").json()
    assert _ids(first) == ["sim-000", "sim-001", "sim-002"] and first["total"] == 8
    assert first["prevPageToken"] is None
    _join(stack, tmp_path, "aaa-joined")  # sorts before the reader's place
    _join(stack, tmp_path, "zzz-joined")  # and after it
    # Listed from the api's live index, which pages read (the whole list reads the stream).
    stack.wait_until(lambda: stack.get("/api/v1/nodes", pageSize=1).json()["total"] == 10, 60, "both new nodes listed")
    seen, token = _ids(first), first["nextPageToken"]
    while token is not None:
        page = stack.get("/api/v1/nodes", pageSize=3, sort="node", pageToken=token).json()
        assert page["total"] == 10 and page["prevPageToken"] is not None
        seen += _ids(page)
        token = page["nextPageToken"]
    assert seen == [f"sim-{i:03d}" for i in range(8)] + ["zzz-joined"]
    wrong = stack.get("/api/v1/nodes", pageSize=3, sort="-node", pageToken=first["nextPageToken"])
    assert wrong.status_code == 400 and "pageToken is for sort 'node'" in wrong.json()["error"]


def _logged_in(browser: Browser, stack: Stack, role: str, errors: list[str]) -> Page:
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(stack.api_url + "/login")
    page.fill("textarea[name=token]", stack.token(role))
    page.click("form.login button[type=submit]")
    expect(page.locator("header .who")).to_contain_text(f"({role})")
    return page


def _query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


def _order(page: Page) -> list[str]:
    found: list[str] = page.locator("#nodes tbody tr").evaluate_all("rows => rows.map(r => r.dataset.key)")
    return found


def test_ui3_in_chromium_the_filter_is_the_url_rows_update_in_place_and_bulk_commands_ask_first(
        stack: Stack, browser: Browser) -> None:
    errors: list[str] = []
    page = _logged_in(browser, stack, "admin", errors)
    page.goto(stack.api_url + "/nodes?cluster=default&health=HEALTHY&sort=node&hold=none&q=sim-")
    expect(page.locator("input[name=health][value=HEALTHY]")).to_be_checked()
    expect(page.locator("input[name=hold][value=none]")).to_be_checked()
    expect(page.locator("select[name=sort]")).to_have_value("node")
    page.check("input[name=status][value=READY]")
    page.click("#filters button[type=submit]")
    expect(page.locator("input[name=status][value=READY]")).to_be_checked()
    shared = page.url
    assert _query(shared) == {"cluster": ["default"], "status": ["READY"], "health": ["HEALTHY"], "hold": ["none"],
                              "q": ["sim-"], "sort": ["node"], "pageSize": ["100"]}
    expect(page.locator("#count")).to_contain_text("of 6 node(s)")  # sim-002 is cordoned, sim-005 degraded
    expect(page.locator("body[data-live=open]")).to_be_attached(timeout=10_000)
    page.evaluate("window.__sameDocument = true")
    before = _order(page)

    # Live: sim-004 turns degraded. Its row says so where it stands; the page says a re-read
    # would change it (sim-004 no longer matches) instead of dropping the row.
    injected = stack.cli("sim", "inject", "sim-004", "--fault", "xid:79", "--gpu", "0")
    assert injected.returncode == 0, injected.stderr
    row = page.locator("#nodes tr[data-key='default/sim-004']")
    expect(row.locator("td.health")).to_have_text("Degraded", timeout=20_000)
    expect(row.locator("td.score")).to_have_text("55")
    expect(page.locator("#changed")).to_be_visible()
    expect(page.locator("#changed")).to_contain_text("1 changed")
    assert _order(page) == before and page.evaluate("window.__sameDocument") is True
    expect(page.locator("#total")).to_have_text("5")

    # Bulk: two nodes, drain asked and declined: nothing changes.
    page.check("#nodes tr[data-key='default/sim-006'] input[name=node]")
    page.check("#nodes tr[data-key='default/sim-007'] input[name=node]")
    expect(page.locator("#selected-count")).to_have_text("2")
    page.click("#bulk button[value=drain]")
    expect(page.locator("#question")).to_have_text("Drain 2 node(s): cordon them and let their running work finish?")
    expect(page.locator("#chosen")).to_contain_text("sim-006")
    expect(page.locator("#chosen")).to_contain_text("sim-007")
    page.click("#cancel")
    expect(page.locator(".notice")).to_have_text("Nothing changed.")
    assert stack.cli_json("node", "show", "sim-006")["holds"] == []

    # Asked and answered: each node's outcome, and the caller's hold on each.
    page.goto(shared)
    page.check("#nodes tr[data-key='default/sim-006'] input[name=node]")
    page.check("#nodes tr[data-key='default/sim-007'] input[name=node]")
    page.click("#bulk button[value=cordon]")
    expect(page.locator("#question")).to_have_text("Cordon 2 node(s): stop new work reaching them?")
    page.fill("#confirm input[name=reason]", "bulk from the table")
    page.click("#confirm button[type=submit]")
    expect(page.locator("#summary")).to_have_text("cordon 2 node(s): 2 applied")
    for node in ("sim-006", "sim-007"):
        expect(page.locator("#outcomes")).to_contain_text(f"cordon hold created for {node}")
        holds = stack.cli_json("node", "show", node)["holds"]
        assert [(h["effect"], h["reason"], h["actor"]) for h in holds] == [("cordon", "bulk from the table", "admin")]
    page.click("#back")
    expect(page.locator("#nodes")).to_be_visible()
    assert _query(page.url) == _query(shared)

    # Select-all takes every row of this page, and only those.
    page.check("#select-all")
    shown = page.locator("#nodes tbody input[name=node]").count()
    expect(page.locator("#selected-count")).to_have_text(str(shown))
    assert errors == []


def test_ui3_a_viewer_gets_no_bulk_commands_and_a_forged_one_changes_nothing(stack: Stack, browser: Browser) -> None:
    errors: list[str] = []
    page = _logged_in(browser, stack, "viewer", errors)
    page.goto(stack.api_url + "/nodes?sort=node")
    expect(page.locator("#nodes tbody tr").first).to_be_visible()
    expect(page.locator("#nodes input[type=checkbox]")).to_have_count(0)
    expect(page.locator("#bulk button")).to_have_count(0)
    answer = page.request.post(stack.api_url + "/nodes/command", headers={"Origin": "http://evil.example"},
                               form={"verb": "cordon", "node": "default/sim-001", "confirm": "yes"})
    assert answer.status == 403 and "CSRF" in answer.text()
    assert stack.cli_json("node", "show", "sim-001")["holds"] == []
    assert errors == []


def test_ui3_a_bulk_command_takes_every_node_the_filter_matches_on_every_page(stack: Stack,
                                                                              browser: Browser) -> None:
    """UI-3 (issue 44): "every one of the N nodes this filter matches" on a page of two rows
    asks about, and then commands, exactly the nodes the filter matches on all pages — the
    nodes the question listed, not a re-read — and leaves every other node alone."""
    query = {"q": "sim-", "hold": "none", "sort": "node"}
    matching = _ids(stack.get("/api/v1/nodes", **query, pageSize=1000).json())
    assert len(matching) > 2, matching
    errors: list[str] = []
    page = _logged_in(browser, stack, "admin", errors)
    page.goto(stack.api_url + "/nodes?q=sim-&hold=none&sort=node&pageSize=2")
    expect(page.locator("#nodes tbody input[name=node]")).to_have_count(2)
    page.check("#select-matching")
    expect(page.locator("#selected-count")).to_have_text(str(len(matching)))
    page.click("#bulk button[value=cordon]")
    expect(page.locator("#question")).to_have_text(f"Cordon {len(matching)} node(s): stop new work reaching them?")
    assert sorted(page.locator("#chosen li").all_inner_texts()) == sorted(f"{n} cluster default" for n in matching)
    page.fill("#confirm input[name=reason]", "every matching node")
    page.click("#confirm button[type=submit]")
    expect(page.locator("#summary")).to_have_text(f"cordon {len(matching)} node(s): {len(matching)} applied")

    def held() -> set[str]:  # each hold reaches the node's view as the scorer rewrites it
        return {v["nodeId"] for v in stack.get("/api/v1/nodes", hold="cordon", pageSize=1000).json()["nodes"]}

    stack.wait_until(lambda: set(matching) <= held(), 20, "every matching node's cordon in its view")
    assert held() - set(matching) == {"sim-002", "sim-006", "sim-007"}  # held before, by the tests above
    assert errors == []
