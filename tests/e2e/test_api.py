"""The HTTP API against a real ``healthplane up`` (API-1, API-2, API-4): the CLI's JSON, the
CLI's outcomes and messages, the identities of SEC; tokens checked by nats-server itself."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from healthplane.contracts import wire
from tests.support.stack import Stack, running

pytestmark = [pytest.mark.slow, pytest.mark.nats]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running(tmp_path_factory.mktemp("api")) as found:
        yield found


def _without_report_time(view: dict[str, Any]) -> dict[str, Any]:
    """A view is rewritten at every report: two reads a moment apart differ in that alone."""
    return {k: v for k, v in view.items() if k != "lastReportedAt"}


def test_api1_list_show_events_and_summary_are_the_clis_json(stack: Stack) -> None:
    listed = stack.get("/api/v1/nodes")
    assert listed.status_code == 200
    body = listed.json()
    assert body["total"] == 8 and body["nextPageToken"] is None
    cli = stack.cli_json("node", "list")
    assert [_without_report_time(v) for v in body["nodes"]] == [_without_report_time(v) for v in cli]

    shown = stack.get("/api/v1/nodes/sim-001").json()
    assert _without_report_time(shown) == _without_report_time(stack.cli_json("node", "show", "sim-001"))
    assert shown["automation"].startswith("nothing to do: score 100")  # API-4

    events = stack.get("/api/v1/nodes/sim-001/events", type="SCORE_CHANGED").json()
    assert events == stack.cli_json("node", "events", "sim-001", "--type", "SCORE_CHANGED")
    assert [e["type"] for e in events["events"]] == ["SCORE_CHANGED"]
    first = stack.get("/api/v1/nodes/sim-001/events", pageSize=1).json()
    assert first == stack.cli_json("node", "events", "sim-001", "--page-size", "1")
    following = stack.get("/api/v1/nodes/sim-001/events", pageSize=1, pageToken=first["nextPageToken"]).json()
    assert following == stack.cli_json("node", "events", "sim-001", "--page-size", "1", "--page-token",
                                       first["nextPageToken"])

    summary = stack.get("/api/v1/summary").json()
    assert summary == stack.cli_json("node", "summary")
    assert summary["clusters"][0]["label"] == "All healthy" and summary["fleet"]["healthy"] == 8


def test_api1_the_nodes_list_filters_sorts_and_pages(stack: Stack) -> None:
    pages, token = [], None
    while True:
        page = stack.get("/api/v1/nodes", pageSize=3, sort="-node", **({"pageToken": token} if token else {})).json()
        pages.append([v["nodeId"] for v in page["nodes"]])
        token = page["nextPageToken"]
        if token is None:
            break
    assert [len(p) for p in pages] == [3, 3, 2]
    assert [node for page in pages for node in page] == [f"sim-{i:03d}" for i in range(7, -1, -1)]
    assert stack.get("/api/v1/nodes", health="DEGRADED").json()["total"] == 0
    bad = stack.get("/api/v1/nodes", sort="colour")
    assert bad.status_code == 400 and "sort 'colour'" in bad.json()["error"]


def test_api2_no_token_is_401_a_viewers_command_403_an_unknown_node_404_a_refusal_409(stack: Stack) -> None:
    assert stack.get("/api/v1/nodes", role=None).status_code == 401
    forged = httpx.get(stack.api_url + "/api/v1/summary", headers={"Authorization": "Bearer not.a.jwt"}, timeout=30)
    assert forged.status_code == 401 and "token" in forged.json()["error"]
    assert stack.post("/api/v1/nodes/sim-002/cordon", role=None).status_code == 401

    assert stack.get("/api/v1/summary", role="viewer").status_code == 200
    denied = stack.post("/api/v1/nodes/sim-002/cordon", {"reason": "viewer tries"}, role="viewer")
    assert denied.status_code == 403
    assert "permission denied: viewer (role viewer) may not send cordon commands" in denied.json()["error"]

    missing = stack.post("/api/v1/nodes/no-such-node/cordon")
    assert missing.status_code == 404 and missing.json()["error"] == "node no-such-node not found"
    assert stack.get("/api/v1/nodes/no-such-node").status_code == 404

    cli = stack.cli("node", "deprovision", "sim-001")
    refused = stack.post("/api/v1/nodes/sim-001/deprovision")
    assert cli.returncode == 1 and refused.status_code == 409
    assert refused.json()["error"] == cli.stderr.strip().removeprefix("Error: ")

    usage = stack.post("/api/v1/nodes/sim-001/deprovision", {"force": True, "evict": True})
    assert usage.status_code == 400 and usage.json()["error"] == "--force cannot be combined with --all or --evict"
    assert stack.post("/api/v1/nodes/sim-001/cordon", {"colour": "red"}).status_code == 400


def test_api1_a_command_through_the_api_is_the_callers_and_node_show_says_so(stack: Stack) -> None:
    answer = stack.post("/api/v1/nodes/sim-003/cordon", {"reason": "from the API"})
    assert answer.status_code == 200, answer.text
    outcome = msgspec.convert(answer.json(), wire.CommandOutcome)
    assert outcome.result == "applied" and outcome.message.startswith("cordon hold created for sim-003")

    def held() -> dict[str, Any] | None:
        view = stack.cli_json("node", "show", "sim-003")
        return view if view["holds"] else None

    view = stack.wait_until(held, 20, "the cordon hold in node show")
    assert [(h["effect"], h["reason"], h["actor"]) for h in view["holds"]] == [("cordon", "from the API", "admin")]
    assert stack.post("/api/v1/nodes/sim-003/uncordon").json()["result"] == "applied"


def test_api2_a_revoked_token_is_refused_at_once(stack: Stack) -> None:
    issued = stack.cli("creds", "token", "carol", "--role", "admin", "--data-dir", str(stack.data_dir))
    assert issued.returncode == 0, issued.stderr
    token = issued.stdout.strip()
    headers = {"Authorization": f"Bearer {token}"}
    assert httpx.get(stack.api_url + "/api/v1/summary", headers=headers, timeout=30).status_code == 200
    revoked = subprocess.run([sys.executable, "-m", "healthplane.cli", "creds", "revoke", "carol", "--data-dir",
                              str(stack.data_dir)], capture_output=True, text=True, timeout=60, env=stack.env())
    assert revoked.returncode == 0, revoked.stderr

    def refused() -> bool:
        return httpx.get(stack.api_url + "/api/v1/summary", headers=headers, timeout=30).status_code == 401

    stack.wait_until(refused, 10, "the revoked token refused")
    cordon = httpx.post(stack.api_url + "/api/v1/nodes/sim-004/cordon", headers=headers, json={}, timeout=30)
    assert cordon.status_code == 401


def test_api1_the_openapi_document_describes_the_paths_with_the_wire_schemas(stack: Stack) -> None:
    document = stack.get("/api/openapi.json", role=None).json()
    assert document["openapi"].startswith("3.1")
    for path in ("/api/v1/nodes", "/api/v1/nodes/{nodeId}", "/api/v1/nodes/{nodeId}/events", "/api/v1/summary",
                 "/api/v1/nodes/{nodeId}/cordon", "/api/v1/nodes/{nodeId}/deprovision"):
        assert path in document["paths"], path
    _, components = msgspec.json.schema_components([wire.NodeView], ref_template="#/components/schemas/{name}")
    assert document["components"]["schemas"]["NodeView"] == components["NodeView"]


def test_sec6_no_token_reaches_a_log(stack: Stack) -> None:
    token = stack.token("admin")
    logs = "".join(p.read_text() for p in Path(stack.data_dir, "logs").glob("*.log"))
    assert token not in logs and token.split(".")[2] not in logs


def test_api3_a_decommissioned_node_leaves_the_summary(stack: Stack) -> None:
    """Last in this module: it takes a node away."""
    gone = stack.post("/api/v1/nodes/sim-007/deprovision", {"force": True, "reason": "retired"})
    assert gone.status_code == 200, gone.text

    def seven() -> bool:
        return bool(stack.get("/api/v1/summary").json()["fleet"]["nodes"] == 7)

    stack.wait_until(seven, 20, "the summary without sim-007")
    assert stack.cli_json("node", "summary")["fleet"]["nodes"] == 7
    assert stack.get("/api/v1/nodes/sim-007").status_code == 404


def test_breakfix_over_http_is_the_clis_json(stack: Stack) -> None:
    """Issue 41.5: GET /api/v1/breakfix through the real server is `healthplane breakfix -o json`
    (the figures; the read's own time aside); a bad since is a 400 naming it."""
    served = stack.get("/api/v1/breakfix", since="7d")
    assert served.status_code == 200
    cli = stack.cli_json("breakfix", "--since", "7d")
    assert served.json()["figures"] == cli["figures"] and served.json()["events"] == cli["events"]
    bad = stack.get("/api/v1/breakfix", since="a while")
    assert bad.status_code == 400 and "a while" in bad.json()["error"]


def test_job4_jobs_impact_over_http_is_the_clis_json_for_a_viewer_too(stack: Stack) -> None:
    """JOB-4 (issue 43.5): GET /api/v1/jobs/impact through the real server is `healthplane jobs
    impact -o json` (a failed job of a bad application, `sim submit --fails-everywhere`, with its
    node); a viewer reads it; another cluster has none; a bad since is a 400 in one line."""
    submitted = stack.cli("sim", "submit", "--user", "mallory", "--fails-everywhere", "--duration", "1")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    since = wire.rfc3339(datetime.now(UTC) - timedelta(hours=1))

    def failed() -> dict[str, Any] | None:
        found = stack.cli_json("jobs", "impact", "--since", since)
        return found if any(j["jobId"] == job for j in found["jobs"]) else None

    cli = stack.wait_until(failed, 60, f"job {job} failed")
    served = stack.get("/api/v1/jobs/impact", since=since)
    assert served.status_code == 200 and served.json() == cli
    [hit] = [j for j in served.json()["jobs"] if j["jobId"] == job]
    assert (hit["user"], hit["outcome"], len(hit["nodes"])) == ("mallory", "failed", 1)
    assert "simulated bad application" in hit["reason"]
    viewer = stack.get("/api/v1/jobs/impact", role="viewer", since=since, cluster="default")
    assert viewer.status_code == 200 and viewer.json() == cli
    assert stack.get("/api/v1/jobs/impact", since=since, cluster="elsewhere").json()["jobs"] == []
    assert stack.get("/api/v1/jobs/impact", role=None).status_code == 401
    bad = stack.get("/api/v1/jobs/impact", since="a while")
    assert bad.status_code == 400
    assert bad.json() == {"error": "since 'a while' is neither a duration (24h, 30m, 7d) nor an RFC 3339 time"}
