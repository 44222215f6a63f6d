"""The webhook dispatcher's pure rules: filter, envelope, verdicts, backoff, bounded queue,
label and log hygiene (WEB-1..WEB-4)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from cloudevents.v1.http import from_http
from hypothesis import given
from hypothesis import strategies as st

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import parse_cluster_config
from healthplane.runtime.logs import LogBudget
from healthplane_webhook_dispatcher.rules import (
    CONTENT_TYPE,
    SOURCE_SERVICE,
    BoundedQueue,
    Endpoint,
    Settings,
    after_attempt,
    backoff_delay,
    cloud_event,
    endpoint_label,
    endpoints_from_config,
    envelope,
    event_type_of_subject,
    judge,
    plan_reload,
    proxy_for,
    retry_after_seconds,
    scrub,
    secret_reader,
)

ACTED = wire.NodeEvent(id="0f7c5e4a-3b21-4d8e-9c17-2a6b8e5d1f40", node_id="10.0.0.42/9100", cluster="default",
                       type="POLICY_ACTED", occurred_at=datetime(2026, 8, 11, 17, 4, 22, tzinfo=UTC),
                       message="drain: score 30", actor="policy", action="ACTION_DRAIN", score=30,
                       policy_mode="drain")


def _endpoints(*hooks: dict[str, object]) -> list[Endpoint]:
    environ = {f"HOOK_SECRET_{i}": h["secret"] for i, h in enumerate(hooks) if "secret" in h}
    referenced = [{**{k: v for k, v in h.items() if k != "secret"}, "secretEnv": f"HOOK_SECRET_{i}"}
                  for i, h in enumerate(hooks)]
    found, left_out = endpoints_from_config(parse_cluster_config({"nodeEventWebhooks": referenced}),
                                            secret_reader(lambda path, limit: b"", environ))
    assert left_out == []
    return found


# ---------------------------------------------------------------------------- WEB-1 filter


def test_web1_filter_lists_types_and_omitted_means_all() -> None:
    filtered, everything = _endpoints(
        {"url": "https://alerts.example.com/a", "secret": "s", "events": ["POLICY_ACTED", "NODE_REPLACED"]},
        {"url": "https://alerts.example.com/b", "secret": "s"})
    assert filtered.wants("POLICY_ACTED") and filtered.wants("NODE_REPLACED")
    assert not filtered.wants("SCORE_CHANGED")
    assert all(everything.wants(t) for t in wire.EVENT_TYPES)
    assert filtered.max_attempts == 5  # the documented default


def test_web1_reload_plan_keeps_endpoints_by_url() -> None:
    old = {e.key: e for e in _endpoints({"url": "https://a.example.com/h", "secret": "one"},
                                        {"url": "https://gone.example.com/h", "secret": "x"})}
    new = _endpoints({"url": "https://a.example.com/h", "secret": "two"},
                     {"url": "https://b.example.com/h", "secret": "y"})
    plan = plan_reload(old, new)
    assert [e.label for e in plan.added] == ["https://b.example.com/h"]
    assert [(e.label, e.secret) for e in plan.updated] == [("https://a.example.com/h", "two")]
    assert [old[k].label for k in plan.removed] == ["https://gone.example.com/h"]
    assert plan_reload({e.key: e for e in new}, new).updated == ()


def test_web1_same_url_twice_stays_two_endpoints_with_distinct_labels() -> None:
    first, second, third = _endpoints({"url": "https://h.example.com/x", "secret": "s", "events": ["POLICY_ACTED"]},
                                      {"url": "https://h.example.com/x", "secret": "s"},
                                      {"url": "https://h.example.com/x?token=abc", "secret": "s"})
    assert len({first.key, second.key, third.key}) == 3
    assert [first.label, second.label, third.label] == [
        "https://h.example.com/x", "https://h.example.com/x#2", "https://h.example.com/x#3"]


@pytest.mark.parametrize(("subject", "expected"), [
    (subjects.event("default", "10.0.0.42/9100", "POLICY_ACTED"), "POLICY_ACTED"),
    ("hp.event.default.cn-1.SCORE_CHANGED", "SCORE_CHANGED"),
    ("hp.event.default.SCORE_CHANGED", None),
    ("hp.report.default.cn-1", None),
    ("hp.event.default.cn-1.BAD=ZZ", None),
])
def test_event_type_comes_from_the_subject(subject: str, expected: str | None) -> None:
    assert event_type_of_subject(subject) == expected


# ---------------------------------------------------------------------------- WEB-2 envelope


def test_web2_every_event_type_has_the_service_that_owns_it_as_source() -> None:
    assert set(SOURCE_SERVICE) == set(wire.EVENT_TYPES)
    assert SOURCE_SERVICE["POLICY_ACTED"] == "policy"
    assert SOURCE_SERVICE["NODE_CORDONED"] == "eviction"  # whoever ran `node cordon`


def test_web2_envelope_is_structured_cloudevent_with_the_cli_json_as_data() -> None:
    body = envelope(ACTED)
    parsed = from_http({"content-type": CONTENT_TYPE}, body)
    assert parsed["specversion"] == "1.0"
    assert parsed["type"] == "io.healthplane.node.POLICY_ACTED"
    assert parsed["source"] == "/healthplane/policy"
    assert parsed["subject"] == "10.0.0.42/9100"
    assert parsed["id"] == ACTED.id
    assert parsed["time"] == "2026-08-11T17:04:22Z"
    assert parsed["datacontenttype"] == "application/json"
    # The same rendering `healthplane node events -o json` prints (EVT-2).
    assert parsed.data == json.loads(json.dumps(wire.to_builtins(ACTED)))
    assert parsed.data["occurredAt"] == "2026-08-11T17:04:22Z" and parsed.data["policyMode"] == "drain"
    assert cloud_event(ACTED).get_time() == ACTED.occurred_at


# ---------------------------------------------------------------------------- WEB-4 verdicts and backoff


@pytest.mark.parametrize(("status", "verdict"), [
    (200, "delivered"), (201, "delivered"), (204, "delivered"), (299, "delivered"),
    (400, "rejected"), (401, "rejected"), (403, "rejected"), (404, "rejected"), (410, "rejected"),
    (413, "rejected"), (422, "rejected"),
    (408, "retry"), (429, "retry"), (500, "retry"), (502, "retry"), (503, "retry"), (504, "retry"),
    (301, "retry"), (100, "retry"),
])
def test_web4_which_answers_are_retried(status: int, verdict: str) -> None:
    assert judge(status) == verdict


@pytest.mark.parametrize(("status", "attempt", "max_attempts", "then"), [
    (200, 1, 5, "delivered"),
    (204, 5, 5, "delivered"),
    (404, 1, 5, "rejected"),     # a 4xx: sending it again cannot help
    (400, 5, 5, "rejected"),
    (429, 1, 5, "retry"),
    (408, 4, 5, "retry"),
    (503, 5, 5, "max_attempts"),
    (None, 1, 5, "retry"),       # no HTTP answer at all
    (None, 1, 1, "max_attempts"),
])
def test_web4_what_follows_an_attempt(status: int | None, attempt: int, max_attempts: int, then: str) -> None:
    assert after_attempt(status, attempt, max_attempts) == then


@given(attempt=st.integers(min_value=1, max_value=200), draw=st.floats(min_value=0, max_value=1, exclude_max=True),
       base=st.floats(min_value=0.01, max_value=5), cap=st.floats(min_value=0.01, max_value=120))
def test_web4_backoff_doubles_with_jitter_and_never_exceeds_the_cap(attempt: int, draw: float, base: float,
                                                                    cap: float) -> None:
    ceiling = min(cap, base * 2 ** (attempt - 1))
    delay = backoff_delay(attempt, draw, base_s=base, cap_s=cap)
    assert ceiling / 2 <= delay <= ceiling
    assert delay <= cap


def test_web4_backoff_schedule_and_retry_after() -> None:
    ceilings = [backoff_delay(n, 0.999999, base_s=0.5, cap_s=30) for n in range(1, 9)]
    assert [round(c, 2) for c in ceilings] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff_delay(1, 0.0, base_s=0.5, cap_s=30) == 0.25
    assert backoff_delay(1, 0.0, base_s=0.5, cap_s=30, retry_after_s=7) == 7
    assert backoff_delay(1, 0.0, base_s=0.5, cap_s=30, retry_after_s=3600) == 30
    assert retry_after_seconds("12") == 12 and retry_after_seconds(" 3 ") == 3
    assert retry_after_seconds("Wed, 21 Oct 2026 07:28:00 GMT") is None
    assert retry_after_seconds(None) is None and retry_after_seconds("-1") is None


# ---------------------------------------------------------------------------- WEB-4 bounded queue


@given(capacity=st.integers(min_value=1, max_value=50),
       operations=st.lists(st.sampled_from(["offer", "take"]), max_size=300))
def test_web4_queue_never_holds_more_than_its_bound_and_keeps_order(capacity: int, operations: list[str]) -> None:
    queue: BoundedQueue[int] = BoundedQueue(capacity)
    model: list[int] = []
    for n, operation in enumerate(operations):
        if operation == "offer":
            accepted = queue.offer(n)
            assert accepted == (len(model) < capacity)
            if accepted:
                model.append(n)
        else:
            assert queue.take() == (model.pop(0) if model else None)
        assert len(queue) == len(model) <= capacity
    assert queue.high_water <= capacity
    assert queue.drain() == model and len(queue) == 0


def test_web4_full_queue_refuses_the_newcomer() -> None:
    queue: BoundedQueue[str] = BoundedQueue(2)
    assert queue.offer("a") and queue.offer("b")
    assert not queue.offer("c")
    assert queue.take() == "a" and queue.offer("d")
    assert queue.drain() == ["b", "d"]


def test_web4_log_budget_is_one_line_per_interval_with_the_count() -> None:
    budget = LogBudget(interval_s=10)
    assert budget.allow(0.0)
    assert not any(budget.allow(t / 10) for t in range(1, 100))
    assert budget.allow(10.0) and budget.take_suppressed() == 99 and budget.take_suppressed() == 0


# ---------------------------------------------------------------------------- secrets


@pytest.mark.parametrize(("url", "label"), [
    ("https://user:pw@hooks.example.com/x?token=abc#frag", "https://hooks.example.com/x"),
    ("http://127.0.0.1:8080/hooks/healthplane", "http://127.0.0.1:8080/hooks/healthplane"),
    ("https://alerts.example.com", "https://alerts.example.com"),
    ("http://[::1]:9000/h?k=v", "http://[::1]:9000/h"),
])
def test_endpoint_label_drops_userinfo_query_and_fragment(url: str, label: str) -> None:
    assert endpoint_label(url) == label


_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


@given(user=st.text(_ALNUM[:26], min_size=8, max_size=12), password=st.text(_ALNUM, min_size=8, max_size=16),
       token=st.text(_ALNUM, min_size=8, max_size=16))
def test_label_and_scrubbed_errors_never_carry_credentials(user: str, password: str, token: str) -> None:
    url = f"https://{user}:{password}@hooks.example.com/in?token={token}"
    [endpoint] = _endpoints({"url": url, "secret": f"sec-{token}"})
    assert user not in endpoint.label and password not in endpoint.label and token not in endpoint.label
    message = f"ConnectError: failed to reach {url} (auth {user}:{password}, secret sec-{token})"
    cleaned = scrub(message, endpoint)
    for leaked in (password, token, f"sec-{token}", f"{user}:"):
        assert leaked not in cleaned
    assert f"sec-{token}" not in repr(endpoint) and password not in repr(endpoint)


def test_settings_from_environment() -> None:
    assert Settings.from_env({}) == Settings()
    tuned = Settings.from_env({"HEALTHPLANE_WEBHOOK_QUEUE_SIZE": "64", "HEALTHPLANE_WEBHOOK_CONCURRENCY": "0",
                               "HEALTHPLANE_WEBHOOK_BACKOFF_BASE_SECONDS": "0.05"})
    assert tuned.queue_size == 64 and tuned.concurrency == 1 and tuned.backoff_base_s == 0.05


@pytest.mark.parametrize(("url", "environ", "proxy"), [
    ("http://hooks.example.com/x", {}, None),
    ("http://hooks.example.com/x", {"HTTP_PROXY": "proxy.corp:3128"}, "http://proxy.corp:3128"),
    ("http://hooks.example.com/x", {"HTTPS_PROXY": "http://p:1"}, None),  # by the URL's scheme
    ("https://hooks.example.com/x", {"HTTPS_PROXY": "http://p:1", "HTTP_PROXY": "http://q:1"}, "http://p:1"),
    ("https://hooks.example.com/x", {"ALL_PROXY": "http://all:1"}, "http://all:1"),
    ("https://hooks.example.com/x", {"https_proxy": "http://lower:1", "HTTPS_PROXY": "http://upper:1"},
     "http://lower:1"),  # the lower-case spelling first, as curl reads them
    # NO_PROXY: names cover their subdomains, with or without the leading dot
    ("https://hooks.example.com/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "example.com"}, None),
    ("https://hooks.example.com/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": ".example.com"}, None),
    ("https://example.com/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": ".example.com"}, None),
    ("https://badexample.com/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "example.com"}, "http://p:1"),
    ("https://HOOKS.example.com/x", {"HTTPS_PROXY": "http://p:1", "no_proxy": "other.org, Example.COM"}, None),
    ("https://hooks.example.com/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*"}, None),
    # addresses and CIDR ranges, the way fleets write NO_PROXY
    ("http://10.2.3.4:8080/x", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8"}, None),
    ("http://192.168.1.1/x", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8"}, "http://p:1"),
    ("http://127.0.0.1:9/x", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "127.0.0.1"}, None),
    ("http://[::1]:9/x", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "::1"}, None),
    ("http://[fd00::5]/x", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "fd00::/8"}, None),
    # an entry with a port covers that port only
    ("http://hooks.example.com:8080/x", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "example.com:8080"}, None),
    ("http://hooks.example.com/x", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "example.com:8080"}, "http://p:1"),
    ("https://hooks.example.com/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "hooks.example.com:443"}, None),
    ("http://[::1]:9/x", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "[::1]:9"}, None),
    ("http://[::1]:10/x", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "[::1]:9"}, "http://p:1"),
])
def test_proxy_for_reads_the_environment_as_curl_does(url: str, environ: dict[str, str], proxy: str | None) -> None:
    """Deliveries honour the operator's proxy variables (docs/webhooks.md)."""
    assert proxy_for(url, environ) == proxy
