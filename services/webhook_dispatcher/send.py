"""How one endpoint's deliveries leave the process (docs/webhooks.md, "The HTTP transport").

Where no proxy applies (the usual case), each request is built as ``httpx.Request`` and
handed straight to the endpoint's ``transport.StreamTransport``: HTTP/1.1 over asyncio,
pooled, with httpx's timeouts and exceptions. What ``httpx.AsyncClient.send`` adds on top
(default-header merging, the auth and redirect generators, cookies, event hooks: most of a
delivery's CPU, docs/benchmarks.md) a delivery needs three things of, and
they are done here the way the client does them (a test compares the bytes): the
``User-Agent``, userinfo in the URL as Basic auth (last header, as httpx's auth flow puts
it), and the attempt's timeouts. Redirects are never followed.

Where the environment names a proxy for the endpoint (``rules.proxy_for``: ``HTTPS_PROXY``,
``HTTP_PROXY``, ``ALL_PROXY``, ``NO_PROXY`` with names, addresses and CIDR ranges), the
endpoint gets an ``httpx.AsyncClient`` with httpx's own transport and that proxy instead.

Either way a receiver is a peer we do not control, and an attempt is bounded: one deadline
(``asyncio.timeout``, the settings' ``timeout_s``) over connecting, sending and the whole
answer, whatever pace its bytes come at; at most ``MAX_BODY_BYTES`` of the answer's body
read (only its status and ``Retry-After`` matter), past which the connection is closed
rather than read to the end. The transport bounds the head and the 1xx answers.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import http.cookiejar
import os
import ssl
from collections.abc import AsyncGenerator, AsyncIterable, Mapping
from typing import Any

import httpx

from healthplane import __version__
from healthplane_webhook_dispatcher.rules import Settings, proxy_for
from healthplane_webhook_dispatcher.transport import StreamTransport

MAX_BODY_BYTES = 64 * 1024  # of an answer's body read; beyond it the connection is closed
KEEPALIVE_S = 5.0  # an idle connection older than this is not reused (httpx's default too)
USER_AGENT = f"healthplane-webhook-dispatcher/{__version__}"


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default verification (certifi, or SSL_CERT_FILE/SSL_CERT_DIR), built once:
    building one costs ~50 ms of blocked event loop."""
    return httpx.create_ssl_context()


class _NoCookies(http.cookiejar.CookieJar):
    """Deliveries are stateless: a receiver's Set-Cookie never changes what later deliveries
    carry (and httpx's cookie jar cost ~25 us on every answer)."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None


def pool_limits(settings: Settings) -> httpx.Limits:
    """One kept-alive connection per worker."""
    return httpx.Limits(max_connections=settings.concurrency, max_keepalive_connections=settings.concurrency,
                        keepalive_expiry=KEEPALIVE_S)


def endpoint_client(settings: Settings, *, transport: httpx.AsyncBaseTransport | None = None,
                    proxy: str | None = None) -> httpx.AsyncClient:
    """An httpx client with the dispatcher's settings: over ``transport``, or httpx's own
    transport through ``proxy``. The proxy is the caller's decision (``proxy_for``), never
    httpx's reading of the environment."""
    client = httpx.AsyncClient(
        transport=transport, proxy=proxy, trust_env=False, verify=tls_context(), limits=pool_limits(settings),
        timeout=httpx.Timeout(settings.timeout_s, connect=settings.connect_timeout_s),
        follow_redirects=False,  # a signed POST is not re-sent somewhere else
        headers={"User-Agent": USER_AGENT},
        cookies=_NoCookies(),
    )
    # httpx's Accept, Accept-Encoding and Connection defaults say what HTTP/1.1 assumes
    # anyway, and the answer's body is never used.
    for name in ("Accept", "Accept-Encoding", "Connection"):
        del client.headers[name]
    return client


def basic_auth(url: httpx.URL) -> str | None:
    """``Authorization`` for userinfo in the URL, as httpx's client sends it; None without."""
    if not url.username and not url.password:
        return None
    credentials = f"{url.username}:{url.password}".encode()
    return "Basic " + base64.b64encode(credentials).decode("ascii")


class EndpointSender:
    """POSTs to one endpoint URL, shared by the endpoint's workers; ``aclose`` at the end."""

    def __init__(self, url: str, settings: Settings, *, environ: Mapping[str, str] = os.environ) -> None:
        self.url = httpx.URL(url)  # parsed once: the URL is the endpoint's identity
        self.proxy = proxy_for(url, environ)
        self.transport: StreamTransport | None = None
        self.client: httpx.AsyncClient | None = None
        if self.proxy is None:
            self.transport = StreamTransport(ssl_context=tls_context(), limits=pool_limits(settings))
        else:
            self.client = endpoint_client(settings, proxy=self.proxy)
        self._timeouts = httpx.Timeout(settings.timeout_s, connect=settings.connect_timeout_s).as_dict()
        self._auth = basic_auth(self.url)
        self._deadline_s = settings.timeout_s

    async def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, str | None]:
        """(status, its ``Retry-After``); httpx's exceptions when there is no answer, and
        ``httpx.TimeoutException`` when the attempt's deadline passes first."""
        try:
            async with asyncio.timeout(self._deadline_s) as deadline:
                if self.transport is None:
                    return await self._post_via_client(body, headers)
                return await self._post_direct(body, headers)
        except TimeoutError:
            if not deadline.expired():
                raise
            raise httpx.TimeoutException(f"no complete answer within the attempt's deadline of "
                                         f"{self._deadline_s:g} s") from None

    async def _post_direct(self, body: bytes, headers: dict[str, str]) -> tuple[int, str | None]:
        assert self.transport is not None
        request = httpx.Request("POST", self.url, headers=[("User-Agent", USER_AGENT), *headers.items()],
                                content=body, extensions={"timeout": self._timeouts})
        if self._auth is not None:
            request.headers["Authorization"] = self._auth
        response = await self.transport.handle_async_request(request)
        try:
            assert isinstance(response.stream, httpx.AsyncByteStream)
            await _read_at_most(response.stream, MAX_BODY_BYTES)
        finally:
            await response.aclose()  # not read to its end: the transport closes the connection
        return response.status_code, response.headers.get("retry-after")

    async def _post_via_client(self, body: bytes, headers: dict[str, str]) -> tuple[int, str | None]:
        assert self.client is not None
        async with self.client.stream("POST", self.url, content=body, headers=headers) as response:
            await _read_at_most(response.aiter_raw(), MAX_BODY_BYTES)
        return response.status_code, response.headers.get("retry-after")

    async def aclose(self) -> None:
        if self.transport is not None:
            await self.transport.aclose()
        if self.client is not None:
            await self.client.aclose()


async def _read_at_most(body: AsyncIterable[bytes], limit: int) -> bool:
    """Read and discard ``body`` up to ``limit`` bytes: True when it ended within them."""
    read = 0
    chunks = aiter(body)
    try:
        async for chunk in chunks:
            read += len(chunk)
            if read > limit:
                return False
        return True
    finally:
        if isinstance(chunks, AsyncGenerator):  # left at once, not whenever it is collected
            await chunks.aclose()
