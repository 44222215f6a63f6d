"""``healthplane.contracts.webhooks``: the signature a receiver checks (WEB-3)."""

from __future__ import annotations

import hashlib
import hmac

import httpx
from hypothesis import given
from hypothesis import strategies as st

from healthplane.contracts.webhooks import sign, signature_headers, verify

SECRET = "whsec-4f1c9a7e2b"
NOW = 1_786_460_662
BODY = b'{"specversion":"1.0","id":"evt-1","data":{"nodeId":"node-gpu-14"}}'


def _headers(timestamp: int = NOW, body: bytes = BODY, secret: str = SECRET) -> dict[str, str]:
    return signature_headers(secret, "evt-1", timestamp, body)


def test_web3_signature_is_hex_hmac_sha256_of_timestamp_dot_body() -> None:
    """WEB-3: lower-case hex HMAC-SHA256(secret, timestamp + "." + body), no prefix."""
    expected = hmac.new(SECRET.encode(), f"{NOW}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert sign(SECRET, NOW, BODY) == expected
    headers = _headers()
    assert headers == {"X-Healthplane-Event-Id": "evt-1", "X-Healthplane-Timestamp": str(NOW),
                       "X-Healthplane-Signature": expected}
    assert expected == expected.lower() and len(expected) == 64


def test_web3_verify_accepts_a_fresh_genuine_delivery() -> None:
    assert verify(SECRET, _headers(), BODY, now=NOW)
    assert verify(SECRET, _headers(), BODY, now=NOW + 300)   # the edge of the tolerance
    assert verify(SECRET, _headers(), BODY, now=NOW - 300)   # a sender clock slightly ahead


def test_web3_verify_refuses_stale_or_future_timestamps() -> None:
    """A captured delivery replayed later does not verify (the timestamp is signed)."""
    assert not verify(SECRET, _headers(), BODY, now=NOW + 301)
    assert not verify(SECRET, _headers(), BODY, now=NOW - 301)
    assert verify(SECRET, _headers(), BODY, tolerance=3600, now=NOW + 3000)


def test_web3_verify_refuses_wrong_secret_and_missing_or_garbled_headers() -> None:
    assert not verify("another-secret", _headers(), BODY, now=NOW)
    for missing in ("X-Healthplane-Timestamp", "X-Healthplane-Signature"):
        headers = _headers()
        del headers[missing]
        assert not verify(SECRET, headers, BODY, now=NOW)
    for timestamp in ("", "-5", "1e9", " 1786460662", "١٧٨٦٤٦٠٦٦٢", "9" * 40):
        headers = {**_headers(), "X-Healthplane-Timestamp": timestamp}
        assert not verify(SECRET, headers, BODY, now=NOW)
    for signature in ("", "sha256=" + sign(SECRET, NOW, BODY), sign(SECRET, NOW, BODY).upper(), "é" * 64):
        headers = {**_headers(), "X-Healthplane-Signature": signature}
        assert not verify(SECRET, headers, BODY, now=NOW)


def test_web3_verify_takes_framework_headers_in_any_case() -> None:
    lower = {k.lower(): v for k, v in _headers().items()}
    upper = {k.upper(): v for k, v in _headers().items()}
    assert verify(SECRET, lower, BODY, now=NOW)
    assert verify(SECRET, upper, BODY, now=NOW)
    assert verify(SECRET, httpx.Headers(_headers()), BODY, now=NOW)


@given(body=st.binary(max_size=512), tampered=st.binary(max_size=512))
def test_web3_a_tampered_body_never_verifies(body: bytes, tampered: bytes) -> None:
    headers = _headers(body=body)
    assert verify(SECRET, headers, body, now=NOW)
    if tampered != body:
        assert not verify(SECRET, headers, tampered, now=NOW)


@given(timestamp=st.integers(min_value=NOW - 300, max_value=NOW + 300))
def test_web3_a_tampered_timestamp_never_verifies(timestamp: int) -> None:
    """Moving the timestamp inside the tolerance window (the replay an attacker would try)
    breaks the signature."""
    headers = _headers()
    headers["X-Healthplane-Timestamp"] = str(timestamp)
    assert verify(SECRET, headers, BODY, now=NOW) == (timestamp == NOW)


@given(timestamp=st.text(max_size=24), signature=st.text(max_size=80), body=st.binary(max_size=64))
def test_web3_verify_never_raises_on_hostile_headers(timestamp: str, signature: str, body: bytes) -> None:
    headers = {"X-Healthplane-Timestamp": timestamp, "X-Healthplane-Signature": signature}
    assert verify(SECRET, headers, body, now=NOW) in (True, False)


@given(casing=st.lists(st.booleans(), min_size=23, max_size=23))
def test_web3_header_names_are_case_insensitive(casing: list[bool]) -> None:
    def recase(name: str) -> str:
        return "".join(c.upper() if up else c.lower() for c, up in zip(name, casing * 2, strict=False))

    headers = {recase(k): v for k, v in _headers().items()}
    assert verify(SECRET, headers, BODY, now=NOW)
