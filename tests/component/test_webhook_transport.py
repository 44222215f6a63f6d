"""The webhook dispatcher's HTTP transport (transport.StreamTransport, h11 on asyncio) under
``httpx.AsyncClient`` and under the dispatcher's sender, against real servers on 127.0.0.1:
the webhook receiver the other tests use, and a deliberately awkward one whose every byte
the test scripts (chunked answers, ``Connection: close``, answers that never come, servers
that close idle connections, TLS with a private CA; and, for issue 16.1 "Webhook receivers
are untrusted", answers that trickle, never end, or never stop saying 100 Continue). Issue
#8: "HTTP via httpx (async, pooled, timeouts)"."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from healthplane.contracts.webhooks import signature_headers, verify
from healthplane.stack.natsserver import free_port
from healthplane_webhook_dispatcher.rules import Settings
from healthplane_webhook_dispatcher.send import MAX_BODY_BYTES, EndpointSender, endpoint_client
from healthplane_webhook_dispatcher.transport import MAX_HEAD_BYTES, StreamTransport
from tests.support.webhook_receiver import Receiver

SECRET = "whsec-transport"
NO_CONTENT = b"HTTP/1.1 204 No Content\r\n\r\n"


def signed(event_id: str) -> tuple[bytes, dict[str, str]]:
    """A minimal structured-mode CloudEvent and the headers of one signed attempt."""
    body = b'{"specversion": "1.0", "id": "%b", "source": "/test", "type": "io.healthplane.node.TEST"}' \
        % event_id.encode()
    headers = signature_headers(SECRET, event_id, int(time.time()), body)
    headers["Content-Type"] = "application/cloudevents+json; charset=utf-8"
    return body, headers


class Peer:
    """The server's side of one connection."""

    def __init__(self, server: Awkward, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 number: int) -> None:
        self.server, self.reader, self.writer, self.number = server, reader, writer, number

    async def request(self) -> bytes | None:
        """One request's body (Content-Length or chunked), or None when the client closed."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        headers = {line.split(b":", 1)[0].strip().lower(): line.split(b":", 1)[1].strip()
                   for line in head.split(b"\r\n")[1:] if b":" in line}
        if headers.get(b"transfer-encoding") == b"chunked":
            body = b""
            while size := int((await self.reader.readuntil(b"\r\n")).strip(), 16):
                body += (await self.reader.readexactly(size + 2))[:-2]
            await self.reader.readuntil(b"\r\n")
        else:
            body = await self.reader.readexactly(int(headers.get(b"content-length", b"0")))
        self.server.requests.append((self.number, head, body))
        return body

    async def send(self, *parts: bytes, pause_s: float = 0.0) -> None:
        """Write ``parts`` one by one, ``pause_s`` apart (each its own TCP segment)."""
        for i, part in enumerate(parts):
            if i and pause_s:
                await asyncio.sleep(pause_s)
            self.writer.write(part)
            await self.writer.drain()

    def close(self) -> None:
        self.writer.close()


Script = Callable[[Peer], Awaitable[None]]


async def answer_each(peer: Peer, answer: bytes = NO_CONTENT) -> None:
    while await peer.request() is not None:
        await peer.send(answer)


class Awkward:
    """A local server whose connections each run ``script``; counts connections and keeps
    every request it read as (connection number, head, body)."""

    def __init__(self, script: Script = answer_each) -> None:
        self.script = script
        self.connections = 0
        self.open_now = 0
        self.most_open = 0
        self.requests: list[tuple[int, bytes, bytes]] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, tls: ssl.SSLContext | None = None) -> Awkward:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=tls)
        return self

    def url(self, scheme: str = "http") -> str:
        assert self._server is not None
        return f"{scheme}://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/hooks"

    def connection_of(self, request: int) -> int:
        return self.requests[request][0]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            await self.script(Peer(self, reader, writer, self.connections))
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self.open_now -= 1
            self._tasks.discard(task)
            writer.close()


@pytest.fixture
async def servers() -> AsyncIterator[Callable[..., Awaitable[Awkward]]]:
    started: list[Awkward] = []

    async def start(script: Script = answer_each, tls: ssl.SSLContext | None = None) -> Awkward:
        started.append(await Awkward(script).start(tls))
        return started[-1]

    yield start
    for server in started:
        await server.close()


def client(*, connections: int = 4, timeout: httpx.Timeout | float = 2.0, keepalive_s: float = 5.0,
           tls: ssl.SSLContext | None = None) -> tuple[httpx.AsyncClient, StreamTransport]:
    transport = StreamTransport(ssl_context=tls, limits=httpx.Limits(
        max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=keepalive_s))
    return httpx.AsyncClient(transport=transport, timeout=timeout), transport


# ---------------------------------------------------------------------------- the real receiver


async def test_signed_deliveries_reach_the_receiver_over_kept_alive_connections() -> None:
    """WEB-3 through the transport: 200 signed posts, 8 at a time, verified by the receiver,
    over at most the pool's 4 connections."""
    receiver = await Receiver(SECRET).start()
    http, transport = client(connections=4)
    url = httpx.URL(receiver.url)

    async def deliver(i: int) -> int:
        body, headers = signed(f"e{i}")
        return (await http.post(url, content=body, headers=headers)).status_code

    try:
        for start in range(0, 200, 8):
            assert await asyncio.gather(*(deliver(i) for i in range(start, start + 8))) == [204] * 8
        assert len(receiver.received) == 200 and all(r.verified for r in receiver.received)
        assert sorted(receiver.ids()) == sorted(f"e{i}" for i in range(200))
        assert receiver.connections <= 4
        assert transport.open_connections == receiver.connections
    finally:
        await http.aclose()
        await receiver.close()
    assert transport.open_connections == 0


# ---------------------------------------------------------------------------- framing


async def test_chunked_answer_is_read_whole_and_the_connection_reused(servers: Callable[..., Awaitable[Awkward]]) -> None:
    async def chunked(peer: Peer) -> None:
        while await peer.request() is not None:
            await peer.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nRetry-After: 3\r\n\r\n",
                            b"4;ext=1\r\nWiki\r\n", b"5\r\npe", b"dia\r\n", b"0\r\nX-Sum: 1\r\n\r\n", pause_s=0.02)

    server = await servers(chunked)
    http, transport = client()
    async with http:
        first = await http.post(server.url(), content=b"one")
        second = await http.post(server.url(), content=b"two")
        assert first.text == second.text == "Wikipedia"
        assert first.headers["retry-after"] == "3" and first.http_version == "HTTP/1.1"
        assert server.connections == 1 and [b for _, _, b in server.requests] == [b"one", b"two"]
        assert transport.open_connections == 1  # read to its end: back in the pool


async def test_connection_close_answer_is_not_reused(servers: Callable[..., Awaitable[Awkward]]) -> None:
    """The server says ``Connection: close`` but leaves the socket open: the client must
    still not send the next request on it."""
    async def says_close(peer: Peer) -> None:
        while await peer.request() is not None:
            await peer.send(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")

    server = await servers(says_close)
    http, transport = client()
    async with http:
        assert (await http.post(server.url(), content=b"a")).text == "ok"
        assert transport.open_connections == 0
        assert (await http.post(server.url(), content=b"b")).text == "ok"
        assert [server.connection_of(i) for i in range(2)] == [1, 2]


async def test_body_ended_by_close_and_http10_answers(servers: Callable[..., Awaitable[Awkward]]) -> None:
    async def until_close(peer: Peer) -> None:
        if await peer.request() is not None:
            await peer.send(b"HTTP/1.0 200 OK\r\n\r\nhello ", b"world", pause_s=0.05)
            peer.close()

    server = await servers(until_close)
    http, transport = client()
    async with http:
        for _ in range(2):
            response = await http.post(server.url(), content=b"x")
            assert response.text == "hello world" and response.http_version == "HTTP/1.0"
        assert server.connections == 2 and transport.open_connections == 0


async def test_interim_1xx_answers_are_skipped(servers: Callable[..., Awaitable[Awkward]]) -> None:
    server = await servers(lambda peer: answer_each(
        peer, b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + NO_CONTENT))
    http, _ = client()
    async with http:
        assert [(await http.post(server.url(), content=b"x")).status_code for _ in range(3)] == [204] * 3
        assert server.connections == 1


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 2OO OK\r\n\r\n",                                          # not a status line
    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",                 # then the server closes
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"",                                                                 # closes without a byte
])
async def test_malformed_or_truncated_answers_are_protocol_errors(
        servers: Callable[..., Awaitable[Awkward]], answer: bytes) -> None:
    async def broken(peer: Peer) -> None:
        if await peer.request() is not None:
            await peer.send(answer)
            peer.close()

    server = await servers(broken)
    http, transport = client()
    async with http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.post(server.url(), content=b"x")
        assert transport.open_connections == 0


async def test_an_unread_body_closes_its_connection(servers: Callable[..., Awaitable[Awkward]]) -> None:
    """A caller that stops reading leaves bytes on the wire that would be taken for the next
    answer: that connection is closed, the next request gets a new one."""
    async def big_answer(peer: Peer) -> None:
        while await peer.request() is not None:
            await peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 1_000_000)

    server = await servers(big_answer)
    http, transport = client()
    async with http:
        async with http.stream("POST", server.url(), content=b"a") as response:
            async for _ in response.aiter_raw():
                break
        assert transport.open_connections == 0
        assert len((await http.post(server.url(), content=b"b")).content) == 1_000_000
        assert server.connections == 2


async def test_a_streamed_request_body_goes_out_chunked(servers: Callable[..., Awaitable[Awkward]]) -> None:
    server = await servers()

    async def parts() -> AsyncIterator[bytes]:
        for part in (b"first ", b"", b"second"):
            yield part

    http, _ = client()
    async with http:
        assert (await http.post(server.url(), content=parts())).status_code == 204
        [(_, head, body)] = server.requests
        assert b"transfer-encoding: chunked" in head.lower() and body == b"first second"


async def test_header_injection_is_refused_before_anything_is_sent(servers: Callable[..., Awaitable[Awkward]]) -> None:
    """An event id is data from the stream; a CR LF in it must not become a second header
    (httpx passes it through; h11 under httpx's default transport refuses it, and so must
    this transport)."""
    server = await servers()
    http, _ = client()
    async with http:
        with pytest.raises(httpx.LocalProtocolError):
            await http.post(server.url(), content=b"x", headers={"X-Healthplane-Event-Id": "e1\r\nX-Evil: 1"})
        assert (await http.post(server.url(), content=b"x")).status_code == 204
        assert len(server.requests) == 1 and b"x-evil" not in server.requests[0][1].lower()


# ---------------------------------------------------------------------------- timeouts


async def test_web4_slow_answer_hits_the_read_timeout_and_the_connection_is_dropped(
        servers: Callable[..., Awaitable[Awkward]]) -> None:
    """WEB-4: an answer slower than the read timeout is a failed attempt, on time; the
    connection it was on (an answer may still come on it) is not reused."""
    slow_once = asyncio.Event()

    async def slow_first(peer: Peer) -> None:
        while await peer.request() is not None:
            if not slow_once.is_set():
                slow_once.set()
                await asyncio.sleep(30)
            await peer.send(NO_CONTENT)

    server = await servers(slow_first)
    http, transport = client(timeout=httpx.Timeout(2.0, read=0.3))
    async with http:
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            await http.post(server.url(), content=b"a")
        assert 0.25 <= time.monotonic() - started < 2
        assert transport.open_connections == 0
        assert (await http.post(server.url(), content=b"b")).status_code == 204
        assert server.connections == 2


async def test_read_timeout_is_between_bytes_not_for_the_whole_answer(
        servers: Callable[..., Awaitable[Awkward]]) -> None:
    async def trickle(peer: Peer) -> None:
        while await peer.request() is not None:
            await peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n", *(b"%d" % i for i in range(6)),
                            pause_s=0.1)

    server = await servers(trickle)
    http, _ = client(timeout=httpx.Timeout(2.0, read=0.3))
    async with http:
        assert (await http.post(server.url(), content=b"a")).text == "012345"  # 0.6 s in all


async def test_connect_refused_and_tls_handshake_that_never_ends() -> None:
    http, _ = client(timeout=httpx.Timeout(2.0, connect=0.3))
    async with http:
        with pytest.raises(httpx.ConnectError):
            await http.post(f"http://127.0.0.1:{free_port()}/hooks", content=b"x")
    silent = await asyncio.start_server(lambda r, w: asyncio.sleep(30), "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    http, transport = client(timeout=httpx.Timeout(2.0, connect=0.3))
    try:
        async with http:
            started = time.monotonic()
            with pytest.raises(httpx.ConnectTimeout):
                await http.post(f"https://127.0.0.1:{port}/hooks", content=b"x")
            assert time.monotonic() - started < 2 and transport.open_connections == 0
    finally:
        silent.close()


async def test_write_timeout_when_the_server_stops_reading(servers: Callable[..., Awaitable[Awkward]]) -> None:
    async def never_reads(peer: Peer) -> None:
        await asyncio.sleep(30)

    server = await servers(never_reads)
    http, transport = client(timeout=httpx.Timeout(2.0, write=0.3))
    async with http:
        with pytest.raises(httpx.WriteTimeout):
            await http.post(server.url(), content=b"x" * (64 << 20))
        assert transport.open_connections == 0


# ---------------------------------------------------------------------------- the pool


async def test_pool_bounds_connections_and_times_out_waiting(servers: Callable[..., Awaitable[Awkward]]) -> None:
    release = asyncio.Event()

    async def slow(peer: Peer) -> None:
        while await peer.request() is not None:
            await asyncio.sleep(0.05)
            await release.wait()
            await peer.send(NO_CONTENT)

    server = await servers(slow)
    http, transport = client(connections=2, timeout=httpx.Timeout(5.0, pool=0.2))
    async with http:
        busy = [asyncio.create_task(http.post(server.url(), content=b"%d" % i)) for i in range(2)]
        await asyncio.sleep(0.1)
        with pytest.raises(httpx.PoolTimeout):
            await http.post(server.url(), content=b"waits")
        release.set()
        assert [r.status_code for r in await asyncio.gather(*busy)] == [204, 204]
        http.timeout = httpx.Timeout(5.0)
        answers = await asyncio.gather(*(http.post(server.url(), content=b"%d" % i) for i in range(20)))
        assert {r.status_code for r in answers} == {204}
        assert server.most_open == 2 and server.connections == 2 and transport.open_connections == 2


async def test_server_closing_an_idle_connection_means_a_fresh_one(servers: Callable[..., Awaitable[Awkward]]) -> None:
    """The server's idle timeout closed the kept-alive connection: the next request goes out
    on a new connection, without an error."""
    async def idle_timeout(peer: Peer) -> None:
        if await peer.request() is not None:
            await peer.send(NO_CONTENT)
            await asyncio.sleep(0.05)  # idle this long: closed
        peer.close()

    server = await servers(idle_timeout)
    http, _ = client()
    async with http:
        for body in (b"a", b"b", b"c"):
            assert (await http.post(server.url(), content=body)).status_code == 204
            await asyncio.sleep(0.2)
        assert [server.connection_of(i) for i in range(3)] == [1, 2, 3]
        assert len(server.requests) == 3  # each sent once: none went out on a closed connection


async def test_close_racing_the_next_request_is_retried_once_on_a_new_connection(
        servers: Callable[..., Awaitable[Awkward]]) -> None:
    """The server closes a kept-alive connection just as the next request arrives on it (it
    reads it, answers nothing): the request goes once more on a new connection. A server that
    does that on a new connection too gets an error, not a loop."""
    async def drops_second_request(peer: Peer) -> None:
        if await peer.request() is not None:
            await peer.send(NO_CONTENT)
        await peer.request()
        peer.close()

    server = await servers(drops_second_request)
    http, _ = client(connections=1)
    async with http:
        assert (await http.post(server.url(), content=b"a")).status_code == 204
        assert (await http.post(server.url(), content=b"b")).status_code == 204
        assert [(n, body) for n, _, body in server.requests] == [(1, b"a"), (1, b"b"), (2, b"b")]

    async def never_answers(peer: Peer) -> None:
        await peer.request()
        peer.close()

    server = await servers(never_answers)
    http, _ = client(connections=1)
    async with http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.post(server.url(), content=b"c")
        assert len(server.requests) == 1  # a new connection: not stale, so not sent again


async def test_idle_connections_expire(servers: Callable[..., Awaitable[Awkward]]) -> None:
    server = await servers()
    http, _ = client(keepalive_s=0.1)
    async with http:
        await http.post(server.url(), content=b"a")
        await http.post(server.url(), content=b"b")
        await asyncio.sleep(0.3)
        await http.post(server.url(), content=b"c")
        assert [server.connection_of(i) for i in range(3)] == [1, 1, 2]


# ---------------------------------------------------------------------------- TLS


@pytest.fixture
def private_ca(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context trusting only this CA) for a certificate of
    127.0.0.1 signed by a throwaway CA, made with the openssl command."""
    # openssl is in every Debian base image; missing, the TLS path would go untested, so fail.
    assert shutil.which("openssl"), "the TLS tests need the openssl command (Debian package openssl)"

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp_path, check=True, capture_output=True)

    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=healthplane test CA", "-days", "1")
    openssl("req", *curve, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (tmp_path / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                                      "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "1", "-extfile", "ext.cnf")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(tmp_path / "server.pem", tmp_path / "server.key")
    return server, ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))


async def test_https_with_a_private_ca_and_kept_alive(
        servers: Callable[..., Awaitable[Awkward]], private_ca: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server_tls, client_tls = private_ca
    server = await servers(tls=server_tls)
    http, _ = client(tls=client_tls)
    async with http:
        for body in (b"a", b"b", b"c"):
            assert (await http.post(server.url("https"), content=body)).status_code == 204
        assert server.connections == 1 and [b for _, _, b in server.requests] == [b"a", b"b", b"c"]
    # Default verification (httpx's: certifi or SSL_CERT_FILE) does not know this CA.
    http, transport = client()
    async with http:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await http.post(server.url("https"), content=b"d")
        assert transport.open_connections == 0


async def test_basic_auth_from_userinfo_and_verify_on_the_receiver() -> None:
    """httpx's client features still apply above the transport: userinfo becomes Basic auth."""
    receiver = await Receiver(SECRET).start()
    http, _ = client()
    try:
        async with http:
            body, headers = signed("e1")
            url = receiver.url.replace("http://", "http://hook:pw@")
            response = await http.post(url, content=body, headers=headers)
            assert response.status_code == 204
        [received] = receiver.received
        assert received.headers["authorization"] == "Basic aG9vazpwdw=="  # hook:pw
        assert verify(SECRET, received.headers, received.body)
    finally:
        await receiver.close()


# ---------------------------------------------------------------------------- the dispatcher's sender

NO_PROXY_ENV: dict[str, str] = {}


async def test_direct_sends_byte_for_byte_what_the_client_would(servers: Callable[..., Awaitable[Awkward]]) -> None:
    """WEB-2: with no proxy in the way, the dispatcher skips AsyncClient's per-request layer;
    the receiver sees exactly the request AsyncClient sends over the same transport: Host,
    User-Agent, userinfo as Basic auth, the signed headers, the body."""
    server = await servers()
    sender = EndpointSender(server.url().replace("http://", "http://hook:pw@"), Settings(), environ=NO_PROXY_ENV)
    assert sender.transport is not None and sender.proxy is None
    body, headers = signed("e1")
    http = endpoint_client(Settings(), transport=sender.transport)
    try:
        assert await sender.post(body, headers) == (204, None)
        assert (await http.post(sender.url, content=body, headers=headers)).status_code == 204
    finally:
        await sender.aclose()
    (_, direct_head, direct_body), (_, client_head, client_body) = server.requests
    assert direct_head == client_head and direct_body == client_body == body
    assert b"\r\nAuthorization: Basic aG9vazpwdw==\r\n" in direct_head  # hook:pw
    assert b"\r\nUser-Agent: healthplane-webhook-dispatcher/" in direct_head
    assert server.connections == 1  # both went over the one pooled connection


async def test_direct_keeps_the_timeout_and_answers_come_with_retry_after(
        servers: Callable[..., Awaitable[Awkward]]) -> None:
    """WEB-4 on the direct path: the attempt's timeout holds, and Retry-After reaches the
    backoff."""

    async def never_answers(peer: Peer) -> None:
        await peer.request()
        await asyncio.sleep(30)

    slow = await servers(never_answers)
    busy = await servers(lambda peer: answer_each(peer, b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\n"
                                                  b"Content-Length: 4\r\n\r\nbusy"))
    sender = EndpointSender(slow.url(), Settings(timeout_s=0.3), environ=NO_PROXY_ENV)
    try:
        started = time.monotonic()
        with pytest.raises(httpx.TimeoutException):
            await sender.post(*signed("e2"))
        assert 0.25 <= time.monotonic() - started < 2
    finally:
        await sender.aclose()
    sender = EndpointSender(busy.url(), Settings(), environ=NO_PROXY_ENV)
    try:
        assert await sender.post(*signed("e3")) == (503, "7")
        assert await sender.post(*signed("e4")) == (503, "7")
        assert busy.connections == 1  # the body was read to the end: the connection is reused
    finally:
        await sender.aclose()


async def test_a_proxy_from_the_environment_carries_the_deliveries(
        servers: Callable[..., Awaitable[Awkward]]) -> None:
    """An operator's HTTP_PROXY applies to deliveries (and NO_PROXY exempts): the request goes
    to the proxy in absolute form, never straight to the endpoint."""
    proxy, endpoint = await servers(), await servers()
    environ = {"HTTP_PROXY": proxy.url().removesuffix("/hooks")}
    sender = EndpointSender(endpoint.url(), Settings(), environ=environ)
    try:
        assert sender.transport is None and sender.proxy == environ["HTTP_PROXY"]
        body, headers = signed("e5")
        assert await sender.post(body, headers) == (204, None)
    finally:
        await sender.aclose()
    [(_, head, received)] = proxy.requests
    assert head.startswith(b"POST %b HTTP/1.1\r\n" % endpoint.url().encode()) and received == body
    assert endpoint.requests == []

    sender = EndpointSender(endpoint.url(), Settings(), environ={**environ, "NO_PROXY": "10.0.0.0/8,127.0.0.0/8"})
    try:
        assert sender.transport is not None
        assert await sender.post(*signed("e6")) == (204, None)
    finally:
        await sender.aclose()
    assert len(endpoint.requests) == 1 and len(proxy.requests) == 1


# ---------------------------------------------------------------------------- untrusted receivers (issue 16.1)

GIB = 1 << 30


class Flood:
    """A script that answers every request with ``head`` and then ``body_bytes`` of body
    streamed lazily, 64 KiB a write, until done or the client goes; counts what it wrote."""

    def __init__(self, head: bytes, body_bytes: int) -> None:
        self.head, self.body_bytes = head, body_bytes
        self.sent = 0
        self.ended = asyncio.Event()  # a connection's script is over (the client closed it)

    async def __call__(self, peer: Peer) -> None:
        piece = b"x" * 65536
        try:
            while await peer.request() is not None:
                await peer.send(self.head)
                left = self.body_bytes
                while left > 0:
                    chunk = piece[:left]
                    peer.writer.write(chunk)
                    await peer.writer.drain()
                    self.sent += len(chunk)
                    left -= len(chunk)
        finally:
            self.ended.set()


async def trickle(peer: Peer) -> None:
    """An answer within every per-read timeout and never done: 1 byte each 0.2 s."""
    if await peer.request() is not None:
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100:
            await peer.send(bytes([byte]))
            await asyncio.sleep(0.2)


async def test_issue16_1_the_sender_reads_at_most_64_kib_of_a_body_then_closes(
        servers: Callable[..., Awaitable[Awkward]]) -> None:
    """WEB-4, issue 16.1: a 1 GiB answer body is not read: the status is what counts, the
    sender stops after 64 KiB and closes the connection (never pooled: its unread bytes
    would be taken for the next answer). A body within 64 KiB is read to its end and the
    connection kept."""
    flood = Flood(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % GIB, GIB)
    server = await servers(flood)
    sender = EndpointSender(server.url(), Settings(timeout_s=5.0), environ=NO_PROXY_ENV)
    try:
        assert sender.transport is not None
        started = time.monotonic()
        assert await sender.post(*signed("e1")) == (200, None)
        assert time.monotonic() - started < 2
        assert sender.transport.open_connections == 0
        async with asyncio.timeout(5):
            await flood.ended.wait()
        assert flood.sent < 32 << 20  # the client went long before 1 GiB (loopback buffers hold a few MiB)
    finally:
        await sender.aclose()

    fits = Flood(b"HTTP/1.1 503 Busy\r\nContent-Length: %d\r\n\r\n" % MAX_BODY_BYTES, MAX_BODY_BYTES)
    server = await servers(fits)
    sender = EndpointSender(server.url(), Settings(), environ=NO_PROXY_ENV)
    try:
        assert await sender.post(*signed("e2")) == (503, None)
        assert await sender.post(*signed("e3")) == (503, None)
        assert server.connections == 1
    finally:
        await sender.aclose()


async def test_issue16_1_one_deadline_covers_the_whole_attempt(servers: Callable[..., Awaitable[Awkward]]) -> None:
    """WEB-4, issue 16.1: a read timeout restarts with every byte, so an answer trickled a
    byte each 0.2 s would hold a worker for ever; the attempt's one deadline (the settings'
    timeout) ends it, and it covers connecting too (a TLS handshake that never finishes,
    under a longer connect timeout)."""
    server = await servers(trickle)
    sender = EndpointSender(server.url(), Settings(timeout_s=1.0), environ=NO_PROXY_ENV)
    try:
        assert sender.transport is not None
        started = time.monotonic()
        with pytest.raises(httpx.TimeoutException, match="deadline"):
            await sender.post(*signed("e1"))
        assert 0.9 <= time.monotonic() - started < 1.8
        assert sender.transport.open_connections == 0
    finally:
        await sender.aclose()

    silent = await asyncio.start_server(lambda r, w: asyncio.sleep(30), "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    sender = EndpointSender(f"https://127.0.0.1:{port}/hooks", Settings(timeout_s=0.5, connect_timeout_s=5.0),
                            environ=NO_PROXY_ENV)
    try:
        started = time.monotonic()
        with pytest.raises(httpx.TimeoutException, match="deadline"):
            await sender.post(*signed("e2"))
        assert time.monotonic() - started < 1.5
    finally:
        await sender.aclose()
        silent.close()


async def test_issue16_1_the_bounds_hold_through_a_proxy(servers: Callable[..., Awaitable[Awkward]]) -> None:
    """WEB-4, issue 16.1: behind a proxy (httpx's own transport) the deadline and the 64 KiB
    body bound are the sender's, so they hold there too."""
    endpoint = "http://hooks.example.invalid/in"
    proxy = await servers(trickle)
    sender = EndpointSender(endpoint, Settings(timeout_s=1.0), environ={"HTTP_PROXY": proxy.url().removesuffix("/hooks")})
    try:
        assert sender.client is not None
        started = time.monotonic()
        with pytest.raises(httpx.TimeoutException, match="deadline"):
            await sender.post(*signed("e1"))
        assert time.monotonic() - started < 1.8
    finally:
        await sender.aclose()

    flood = Flood(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % GIB, GIB)
    proxy = await servers(flood)
    sender = EndpointSender(endpoint, Settings(timeout_s=5.0), environ={"HTTP_PROXY": proxy.url().removesuffix("/hooks")})
    try:
        assert await sender.post(*signed("e2")) == (200, None)
        async with asyncio.timeout(5):
            await flood.ended.wait()
        assert flood.sent < 32 << 20
    finally:
        await sender.aclose()


async def test_issue16_1_endless_interim_answers_and_heads_fail_the_attempt(
        servers: Callable[..., Awaitable[Awkward]]) -> None:
    """WEB-4, issue 16.1: 10,000 ``100 Continue`` answers, or header lines without end, fail
    the attempt at once (the ninth interim answer; 64 KiB of head), and the connection is
    closed: the server's writes stop."""
    continues = Flood(b"HTTP/1.1 100 Continue\r\n\r\n" * 10_000 + NO_CONTENT, 0)
    endless_head = Flood(b"HTTP/1.1 200 OK\r\n", 0)

    async def header_lines(peer: Peer) -> None:
        if await peer.request() is not None:
            await peer.send(b"HTTP/1.1 200 OK\r\n")
            while True:
                await peer.send(b"X-Pad: " + b"a" * 1000 + b"\r\n")
                endless_head.sent += 1009

    for script, found in ((continues, "interim"), (header_lines, "too long")):
        server = await servers(script)
        http, transport = client()
        async with http:
            started = time.monotonic()
            with pytest.raises(httpx.RemoteProtocolError, match=found):
                await http.post(server.url(), content=b"x")
            assert time.monotonic() - started < 1 and transport.open_connections == 0
        async with asyncio.timeout(5):
            while server.open_now:
                await asyncio.sleep(0.01)
    assert MAX_HEAD_BYTES < endless_head.sent < 32 << 20
