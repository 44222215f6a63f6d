"""The webhook dispatcher's pure rules: filter, envelope, verdicts, backoff, bounded queue,
label and log hygiene (WEB-1..WEB-4)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from cloudevents.v1.http import from_http
from hypothesis import given
from hypothesis import strategies as st
from nats.js.api import AckPolicy, DeliverPolicy

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import ConfigError, parse_cluster_config
from healthplane.runtime.logs import LogBudget
from healthplane_webhook_dispatcher.dispatch import consumer_config
from healthplane_webhook_dispatcher.rules import (
    CONTENT_TYPE,
    SOURCE_SERVICE,
    Endpoint,
    Reachability,
    Settings,
    after_attempt,
    after_result,
    assign_slots,
    backoff_delay,
    cloud_event,
    endpoint_label,
    endpoints_from_config,
    envelope,
    event_type_of_subject,
    fails_the_endpoint,
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


def test_web1_int2_reload_plan_keeps_endpoints_by_label() -> None:
    """An endpoint is its label: a new secret, or a credential rotated in its URL, keeps its
    consumer (its backlog and position)."""
    old = {e.label: e for e in _endpoints({"url": "https://a.example.com/h", "secret": "one"},
                                          {"url": "https://u:old@c.example.com/h", "secret": "c"},
                                          {"url": "https://gone.example.com/h", "secret": "x"})}
    new = _endpoints({"url": "https://a.example.com/h", "secret": "two"},
                     {"url": "https://u:new@c.example.com/h", "secret": "c"},
                     {"url": "https://b.example.com/h", "secret": "y"})
    plan = plan_reload(old, new)
    assert [e.label for e in plan.added] == ["https://b.example.com/h"]
    assert [(e.label, e.secret) for e in plan.updated] == [("https://a.example.com/h", "two"),
                                                             ("https://c.example.com/h", "c")]
    assert plan.removed == ("https://gone.example.com/h",)
    assert plan_reload({e.label: e for e in new}, new).updated == ()


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


# ---------------------------------------------------------------------------- INT-2 outage


@pytest.mark.parametrize(("status", "fails"), [
    (None, True), (500, True), (503, True), (408, True), (429, True), (307, True),
    (200, False), (204, False), (400, False), (404, False), (422, False),
])
def test_int2_which_results_speak_against_the_endpoint(status: int | None, fails: bool) -> None:
    """INT-2: no answer or a retried status fails the endpoint; a 2xx or a refusal answers."""
    assert fails_the_endpoint(status) is fails


def _results(*results: tuple[int, int | None] | tuple[int, int | None, bool]) -> list[Reachability]:
    state, seen = Reachability(), []
    for result in results:
        event, status, *rest = result
        state = after_result(state, event, status, connected=rest[0] if rest else True)
        seen.append(state)
    return seen


def test_int2_one_event_failing_alone_never_puts_the_endpoint_down() -> None:
    """INT-2: one event that keeps failing (a payload the receiver chokes on) is that event's
    failure: its attempts are spent, the endpoint stays up."""
    assert not any(s.down for s in _results((7, 500), (7, 500), (7, None), (7, 503), (7, 500)))


def test_int2_two_events_failing_in_a_row_put_it_down_and_an_answer_brings_it_up() -> None:
    """INT-2: attempts of two different events failing with no answer between: down; it
    stays down through more failures; the first answer (a 2xx, or a refusal) is up again."""
    states = _results((1, 503), (2, None), (3, 500), (2, 503), (3, 404), (4, 500))
    assert [s.down for s in states] == [False, True, True, True, False, False]
    assert [s.answers for s in states] == [0, 0, 0, 0, 1, 1]
    assert len(states[3].failing) <= 2  # bounded, however long the outage


def test_int2_an_answer_between_failures_keeps_it_up() -> None:
    """INT-2: failures of different events with answers between them are each event's own."""
    states = _results((1, 500), (2, 204), (3, 500), (4, 200), (1, 500), (5, 400), (3, 500))
    assert not any(s.down for s in states)
    assert states[-1].answers == 3


def test_int2_a_refused_connection_puts_it_down_at_once() -> None:
    """INT-2: an attempt that could not connect reached no receiver: it says nothing about the
    event, so the endpoint is down even with one event in flight."""
    assert _results((1, None, False))[-1].down
    assert not _results((1, None, True))[-1].down


# ---------------------------------------------------------------------------- WEB-4 bounded queue


# ---------------------------------------------------------------------------- INT-2 slots


_LABELS = st.sampled_from([f"https://h{i}.example.com/in" for i in range(12)])


@given(held=st.dictionaries(st.integers(min_value=0, max_value=9), st.one_of(st.none(), _LABELS), max_size=10),
       wanted=st.lists(_LABELS, max_size=14, unique=True), slots=st.integers(min_value=1, max_value=10))
def test_int2_slots_are_kept_distinct_and_bounded(held: dict[int, str | None], wanted: list[str], slots: int) -> None:
    plan = assign_slots(held, wanted, slots)
    assigned = list(plan.slots.values())
    assert len(set(assigned)) == len(assigned) and all(0 <= s < slots for s in assigned)
    assert set(plan.slots) | set(plan.left_out) == set(wanted) and not set(plan.slots) & set(plan.left_out)
    assert len(plan.slots) == min(len(wanted), slots)
    # An endpoint that holds a slot keeps it (the first, if a stale copy holds another).
    for label, slot in plan.slots.items():
        mine = sorted(s for s, owner in held.items() if owner == label and s < slots)
        if mine:
            assert slot == mine[0]
    # Whatever is not kept is freed (deleted); nothing kept is freed; the plan is the state's.
    assert set(plan.freed) == {s for s, owner in held.items() if owner is None or plan.slots.get(owner) != s}
    assert assign_slots(held, wanted, slots) == plan


def test_int2_a_new_endpoint_takes_the_lowest_free_slot_and_others_never_move() -> None:
    held = {0: "https://a/", 2: "https://c/", 3: "https://gone/"}
    plan = assign_slots(held, ["https://new/", "https://c/", "https://a/", "https://newer/"], 64)
    assert dict(plan.slots) == {"https://new/": 1, "https://c/": 2, "https://a/": 0, "https://newer/": 3}
    assert plan.freed == (3,) and plan.left_out == ()
    full = assign_slots({0: "https://a/"}, ["https://b/", "https://a/"], 1)
    assert dict(full.slots) == {"https://a/": 0} and full.left_out == ("https://b/",)


def test_int2_consumer_of_an_endpoint_filters_its_types_and_records_its_label() -> None:
    listed, everything = _endpoints(
        {"url": "https://u:pw@alerts.example.com/a?token=t", "secret": "s", "events": ["POLICY_ACTED", "NODE_REPLACED"]},
        {"url": "https://alerts.example.com/b", "secret": "s"})
    config = consumer_config(listed, 7, Settings(queue_size=300, ack_wait_s=12))
    assert config.durable_name == "webhook-dispatcher_7-HP_NODE_EVENTS"
    assert sorted(config.filter_subjects or []) == [
        "hp.event.*.*.NODE_REPLACED", "hp.event.*.*.NODE_REPLACED.*",  # a partitioned install's form too
        "hp.event.*.*.POLICY_ACTED", "hp.event.*.*.POLICY_ACTED.*"]
    assert config.deliver_policy == DeliverPolicy.NEW and config.ack_policy == AckPolicy.EXPLICIT
    assert (config.max_ack_pending, config.ack_wait) == (300, 12)
    assert config.metadata == {"healthplane-webhook-endpoint": "https://alerts.example.com/a"}
    assert "pw" not in repr(config) and "token" not in repr(config)  # viewers read consumer configs (SEC-6)
    assert consumer_config(everything, 0, Settings()).filter_subject == "hp.event.>"


# ---------------------------------------------------------------------------- INT-3 CEL filter


@pytest.mark.parametrize(("expression", "selected"), [
    (None, True),
    ("event.type == 'POLICY_ACTED'", True),
    ("event.type == 'POLICY_ACTED' && event.score < 40 && event.policyMode == 'drain'", True),
    ("event.nodeId.startsWith('10.0.0.') && event.cluster == 'default'", True),
    ("event.score > 40", False),
    ("event.condition.severity == 'critical'", False),  # no condition on this event: not selected
])
def test_int3_cel_filter_over_the_event_as_json(expression: str | None, selected: bool) -> None:
    [endpoint] = _endpoints({"url": "https://a.example.com/h", "secret": "s",
                             **({"filter": expression} if expression else {})})
    assert endpoint.selects(ACTED) is selected


def test_int3_a_filter_that_does_not_compile_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_cluster_config({"nodeEventWebhooks": [
            {"url": "https://a.example.com/h", "secretEnv": "S"},
            {"url": "https://b.example.com/h", "secretEnv": "S", "filter": "node.score < 40"}]})
    [line] = str(refused.value).splitlines()
    assert line.startswith("config: nodeEventWebhooks[1].filter: 'node.score < 40' is not a usable CEL filter")
    assert "unknown variable 'node'; this expression can read event" in line


def test_int2_at_most_one_endpoint_per_slot() -> None:
    hooks = [{"url": f"https://h.example.com/{i}", "secretEnv": "S"} for i in range(65)]
    with pytest.raises(ConfigError, match=r"^config: nodeEventWebhooks: List should have at most 64 items"):
        parse_cluster_config({"nodeEventWebhooks": hooks})


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
