"""UI-5 end to end: a hub and one member cluster, each its own ``healthplane up``, the member's
leaf connection through a link the test cuts and mends (``tests.support.link``). The hub keeps
the member's reachability history — reachable, unreachable since its last word, reachable
again since it came back — and its lag trend, in the API and on the hub's members page, which
passes the accessibility check."""

from __future__ import annotations

import html
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.support.axe import assert_accessible
from tests.support.browser import chromium
from tests.support.link import Link
from tests.support.stack import Stack, launched, running, wait_for

pytestmark = pytest.mark.slow
UNREACHABLE_AFTER_S = 5


def _member(hub: Stack) -> dict[str, Any]:
    answer = hub.get("/api/v1/federation/members")
    assert answer.status_code == 200, answer.text
    [member] = answer.json()["members"]
    return dict(member)


def _accessible(hub: Stack) -> None:
    """The members page, with a history and a lag line, and the hub's dashboard in Chromium:
    axe-core finds no serious or critical violation (issue 44)."""
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        page.goto(hub.api_url + "/login?next=/federation")
        page.fill("textarea[name=token]", hub.token("viewer"))
        page.click("form.login button[type=submit]")
        expect(page.locator("#member-a")).to_be_visible()
        assert_accessible(page, "the hub's members page")
        page.goto(hub.api_url + "/")
        assert_accessible(page, "the hub's dashboard")


def test_ui5_the_hub_keeps_each_members_reachability_history_and_lag_through_an_outage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEALTHPLANE_FEDERATION_UNREACHABLE_AFTER_S", str(UNREACHABLE_AFTER_S))
    with ExitStack() as stack:
        hub = stack.enter_context(running(tmp_path / "hub", "--federation-hub", "--leaf-port", "0", nodes=0))
        link = Link(int(hub.stack["leafUrl"].rsplit(":", 1)[1]))
        stack.callback(link.close)
        creds = tmp_path / "a.member.creds"
        attach = hub.cli("federation", "attach", "a", "--data-dir", str(hub.data_dir), "-o", str(creds))
        assert attach.returncode == 0, attach.stderr
        config = tmp_path / "a.yaml"
        config.write_text("cluster: a\n", encoding="utf-8")
        a = stack.enter_context(launched(tmp_path / "a", "--attach", link.url, "--attach-creds", str(creds),
                                         "--config", str(config), nodes=2)).ready()

        first = wait_for(lambda: (m := _member(hub))["reachable"] and m, 60, "a reachable on the hub")
        # Newest first: reachable (perhaps after "not connected yet", when the hub saw it attached first).
        assert first["history"][0]["reachable"] is True and first["history"][-1]["first"] is True

        link.cut()
        down = wait_for(lambda: not (m := _member(hub))["reachable"] and m, UNREACHABLE_AFTER_S + 15,
                        "a unreachable on the hub")
        assert down["since"] == down["lastHeardAt"] and down["reason"] == f"cluster a unreachable since {down['since']}"
        assert (down["history"][0]["reachable"], down["history"][0]["at"]) == (False, down["since"])
        assert down["history"][0]["reason"] == down["reason"]
        assert f"unreachable since {down['since']}" in hub.get("/federation").text

        link.mend()
        back = wait_for(lambda: (m := _member(hub))["reachable"] and len(m["history"]) >= 3 and m, 60,
                        "a reachable again on the hub")
        assert [h["reachable"] for h in back["history"][:3]] == [True, False, True]
        assert back["since"] == back["history"][0]["at"] and back["since"] > down["since"]
        assert back["history"][1]["at"] == down["since"]  # the outage, as it was recorded
        assert back["lagTrend"] and all(s["lag"] >= 0 for s in back["lagTrend"])

        page = hub.get("/federation", role="viewer")
        assert page.status_code == 200
        assert f"reachable since {back['since']}" in page.text
        assert html.escape(f"cluster a unreachable since {down['since']}") in page.text
        assert '<a href="/federation">Members</a>' in page.text
        _accessible(hub)
        # A member's own api is no hub: it has no members to tell of.
        assert a.get("/api/v1/federation/members").status_code == 404
