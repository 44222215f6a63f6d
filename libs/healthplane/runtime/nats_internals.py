"""Every use of nats-py's private internals, fenced in one module.

Two fast paths make the bus cheap enough for the 2-core machines, and both reach past
nats-py's public API:

- ``frames``: ready-made ``PUB``/``HPUB`` frames queued on the connection as one command
  (``Client._send_command``, ``_flush_pending``, ``_flush_queue``), a batch of records or of
  acks in one write instead of one ``nc.publish`` each (:func:`write_frames`);
- ``parser``: one wrapper around the connection's protocol parser (``Client._ps``, the
  parser's ``buf``, ``state`` and ``reset``) that cuts the deliveries of chosen subscriptions
  (by ``Subscription._id``) out of the socket buffer before nats-py matches them with regular
  expressions and builds a ``Msg``, a queue entry and a task for each: a publisher's acks
  (:func:`route_acks`) and a bulk read's direct-get answers (:func:`tap_direct`), on one connection
  at once. Everything else goes, whole and in order, to nats-py's own parser.

A nats-py release that kept these names but changed what they mean would lose acks without
an error. So neither path is taken on trust: the installed nats-py must be a tested release
(:data:`TESTED_NATS_PY`, the range pyproject.toml pins), and :func:`engage` runs a self-test
on the real connection before it enables either: a frame written through the fast path must
come back through a subscription, and messages routed by the parser wrapper must reach their
route with subject, reply, headers and payload intact, and nowhere else. Where a path fails,
its callers take nats-py's public path at nats-py's speed, and say so once, loudly: one
warning naming the path and why, and ``healthplane_fast_path_enabled{path}`` at 0.

Why there is a publisher of our own at all (nats-py's ``publish_async`` loses JetStream's
errors) is in docs/upstream.md, with the reproduction to send upstream.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Final, Literal, TypeVar

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import ConnectionClosedError
from nats.js import JetStreamContext
from nats.protocol.parser import AWAITING_CONTROL_LINE, Parser

from healthplane.runtime import logs, metrics

# The nats-py minor releases the fast paths were written against and tested on; pyproject.toml
# pins the same range (tests/unit/test_compose.py holds them together).
TESTED_NATS_PY: Final = ("2.16",)
SELF_TEST_TIMEOUT_S: Final = 5  # seconds; an int, as nc.flush() takes
# A parser caught mid-message cannot be wrapped; a self-test that finds it so tries again
# after this long, instead of deciding that the path does not work.
BUSY_RETRY_S: Final = 1.0

Path = Literal["frames", "parser"]
PATHS: Final[tuple[Path, ...]] = ("frames", "parser")
_BUSY: Final = "parser busy"  # not an outcome: the parser test could not start


@dataclass(frozen=True, slots=True)
class FastPaths:
    """Which fast paths passed their self-test on one connection."""

    frames: bool = False
    parser: bool = False


def installed_version() -> str:
    try:
        return metadata.version("nats-py")
    except metadata.PackageNotFoundError:
        return "unknown"


def version_tested(version: str) -> bool:
    return ".".join(version.split(".")[:2]) in TESTED_NATS_PY


# ---------------------------------------------------------------------------- engagement


@dataclass(slots=True)
class _Engagement:
    """One connection's fast paths: True/False once decided, None until then."""

    frames: bool | None = None
    parser: bool | None = None
    testing: asyncio.Future[None] | None = None
    retry_at: float = 0.0

    def paths(self) -> FastPaths:
        return FastPaths(frames=bool(self.frames), parser=bool(self.parser))


_ENGAGEMENTS: weakref.WeakKeyDictionary[NATS, _Engagement] = weakref.WeakKeyDictionary()


def fast_paths(nc: NATS) -> FastPaths:
    """What :func:`engage` decided for ``nc`` so far (nothing enabled before it ran)."""
    engagement = _ENGAGEMENTS.get(nc)
    return FastPaths() if engagement is None else engagement.paths()


async def engage(nc: NATS) -> FastPaths:
    """Run the self-test on ``nc`` once (concurrent callers share it) and return which fast
    paths it enabled; afterwards a dictionary look-up. While the connection is down, or its
    parser was busy a moment ago, nothing is decided and a later call tests again."""
    engagement = _ENGAGEMENTS.get(nc)
    if engagement is None:
        engagement = _ENGAGEMENTS[nc] = _Engagement()
    elif engagement.frames is not None and engagement.parser is not None:
        return engagement.paths()
    testing = engagement.testing or _start_self_test(nc, engagement)
    if testing is not None:
        await asyncio.shield(testing)
    return engagement.paths()


def _start_self_test(nc: NATS, engagement: _Engagement) -> asyncio.Future[None] | None:
    loop = asyncio.get_running_loop()
    if not nc.is_connected or loop.time() < engagement.retry_at:
        return None
    testing = engagement.testing = loop.create_task(_self_test(nc, engagement))

    def finished(_: asyncio.Future[None]) -> None:
        engagement.testing = None  # the task holds the connection: let it go

    testing.add_done_callback(finished)
    return testing


async def _self_test(nc: NATS, engagement: _Engagement) -> None:
    version = installed_version()
    outcomes: dict[Path, str] = {}  # path -> "" (works) or why not, for the undecided paths
    if not version_tested(version):
        reason = f"nats-py {version} is not a tested release ({', '.join(TESTED_NATS_PY)}.x)"
        outcomes = {path: reason for path in PATHS if getattr(engagement, path) is None}
    else:
        missing = _missing_internals(nc)
        try:
            if engagement.frames is None:
                outcomes["frames"] = missing or await _test_frames(nc)
            if engagement.parser is None:
                outcomes["parser"] = missing or await _test_parser(nc)
        except Exception as exc:  # the connection went away mid-test: decide nothing yet
            engagement.retry_at = asyncio.get_running_loop().time() + BUSY_RETRY_S
            logs.get(component="nats_internals").info(
                "nats-py fast path self-test interrupted, will retry", error=str(exc) or type(exc).__name__)
            return
    if outcomes.get("parser") == _BUSY:
        del outcomes["parser"]
        engagement.retry_at = asyncio.get_running_loop().time() + BUSY_RETRY_S
    for path, reason in outcomes.items():
        setattr(engagement, path, not reason)
        metrics.FAST_PATH_ENABLED.labels(path).set(0 if reason else 1)
    failed = {path: reason for path, reason in outcomes.items() if reason}
    if failed:
        logs.get(component="nats_internals").warning(
            "nats-py fast path disabled, using nats-py's public path (slower)",
            disabled=failed, nats_py=version, tested=list(TESTED_NATS_PY))


def _missing_internals(nc: NATS) -> str:
    """The first private name the fast paths need that this client lacks, as a reason."""
    for name in ("_send_command", "_flush_pending"):
        if not callable(getattr(nc, name, None)):
            return f"nats-py has no Client.{name}"
    if not hasattr(nc, "_flush_queue"):
        return "nats-py has no Client._flush_queue"
    if not isinstance(getattr(nc, "_subs", None), dict):
        return "nats-py has no Client._subs"
    parser = getattr(nc, "_ps", None)
    if not isinstance(parser, _Router) and type(parser) is not Parser:
        return f"the connection's parser is a {type(parser).__name__}, not nats-py's Parser"
    if not all(hasattr(parser, name) for name in ("buf", "state", "reset", "parse")):
        return "nats-py's Parser has no buf, state, reset or parse"
    return ""


def pub_frame(subject: str, payload: bytes, reply: str = "", header_section: bytes = b"") -> bytes:
    """One ``PUB`` (or, with a header section, ``HPUB``) protocol frame: the one place a frame
    is spelled out, for the publisher's batches, the pull loop's acks and the self-test."""
    reply_part = f" {reply}" if reply else ""
    if header_section:
        size = len(header_section)
        return b"".join((f"HPUB {subject}{reply_part} {size} {size + len(payload)}\r\n".encode(),
                         header_section, payload, b"\r\n"))
    return b"".join((f"PUB {subject}{reply_part} {len(payload)}\r\n".encode(), payload, b"\r\n"))


async def _listening(nc: NATS) -> tuple[str, asyncio.Queue[Msg], Subscription]:
    """A fresh inbox, subscribed, whose messages queue up for a self-test to read."""
    inbox = nc.new_inbox()
    heard: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_msg(msg: Msg) -> None:
        heard.put_nowait(msg)

    return inbox, heard, await nc.subscribe(inbox, cb=on_msg)


async def _test_frames(nc: NATS) -> str:
    """A frame written by :func:`write_frames` must reach a subscription, as nc.publish's would."""
    inbox, heard, sub = await _listening(nc)
    try:
        await nc.flush(timeout=SELF_TEST_TIMEOUT_S)
        await write_frames(nc, pub_frame(inbox, b"self-test"), 1, 9)
        try:
            msg = await asyncio.wait_for(heard.get(), SELF_TEST_TIMEOUT_S)
        except TimeoutError:
            return f"a frame written to the connection did not come back within {SELF_TEST_TIMEOUT_S:g}s"
        if (msg.subject, msg.data, msg.reply) != (inbox, b"self-test", ""):
            return f"a frame written to the connection came back as {msg.subject!r} {msg.data!r}"
        return ""
    finally:
        await sub.unsubscribe()


async def _test_parser(nc: NATS) -> str:
    """Messages to a routed subscription must reach the route, intact and in order, and not
    the subscription; once the route is gone they reach the subscription again."""
    inbox, heard, sub = await _listening(nc)
    try:
        sid = subscription_id(nc, sub)
        if sid is None:
            return "Subscription._id does not name the subscription in Client._subs"
        router = None
        for _ in range(20):  # between two socket reads the parser is usually idle
            await nc.flush(timeout=SELF_TEST_TIMEOUT_S)
            router = _Router.install(nc)
            if router is not None:
                break
        if router is None:
            return _BUSY
        seen: list[tuple[bytes, bytes | None, bytes | None, bytes]] = []
        last = asyncio.get_running_loop().create_future()
        recorder = _Recorder(seen, last)
        router.add(sid, recorder)
        try:
            # nc.flush() is no barrier here (its PING overtakes queued publishes): the last
            # message is.
            await nc.publish(inbox, b"plain")
            await nc.publish(inbox, b"with\r\nheaders", reply=inbox + ".reply", headers={"Self-Test": "1"})
            await nc.publish(inbox, b"last")
            try:
                await asyncio.wait_for(last, SELF_TEST_TIMEOUT_S)
            except TimeoutError:
                return f"the parser wrapper read {len(seen)} of 3 messages within {SELF_TEST_TIMEOUT_S}s"
        finally:
            router.discard(sid, recorder)
        await nc.publish(inbox, b"after")
        try:
            msg = await asyncio.wait_for(heard.get(), SELF_TEST_TIMEOUT_S)
        except TimeoutError:
            return f"the subscription heard nothing within {SELF_TEST_TIMEOUT_S}s once its route was gone"
        subject = inbox.encode()
        expected = [(subject, None, None, b"plain"),
                    (subject, subject + b".reply", b"NATS/1.0\r\nSelf-Test: 1\r\n\r\n", b"with\r\nheaders"),
                    (subject, None, None, b"last")]
        if seen != expected:
            return f"the parser wrapper read {seen!r}, not {expected!r}"
        if msg.data != b"after":
            return "a routed message also reached nats-py's own parser"
        return ""
    finally:
        await sub.unsubscribe()


# ---------------------------------------------------------------------------- frames


def writes_frames(nc: NATS) -> bool:
    """Whether :func:`write_frames` passed its self-test on ``nc``. Before the self-test has
    run, False, and the self-test is started: the next batch may take the fast path."""
    engagement = _ENGAGEMENTS.get(nc)
    if engagement is not None and engagement.frames is not None:
        return engagement.frames
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    if engagement is None:
        engagement = _ENGAGEMENTS[nc] = _Engagement()
    if engagement.testing is None:
        _start_self_test(nc, engagement)
    return False


async def write_frames(nc: NATS, frames: bytes, messages: int, payload_bytes: int = 0) -> None:
    """Queue ready-made ``PUB``/``HPUB`` frames on the connection, as nats-py 2.16's
    ``Client._send_publish`` queues one, and wake its flusher: many messages for the price of
    one call. While disconnected they wait in the client's reconnect buffer like any publish."""
    if nc.is_closed:
        raise ConnectionClosedError
    nc.stats["out_msgs"] += messages
    nc.stats["out_bytes"] += payload_bytes
    await nc._send_command(frames)
    if nc._flush_queue is not None and nc._flush_queue.empty():  # one wake-up is enough
        await nc._flush_pending()


# ---------------------------------------------------------------------------- the parser


def subscription_id(nc: NATS, sub: Subscription) -> int | None:
    """The protocol id of ``sub`` (what ``MSG`` lines name), checked against the client's own
    table; None where nats-py's ``_id`` does not mean that."""
    sid = getattr(sub, "_id", None)
    subs = getattr(nc, "_subs", None)
    if not isinstance(sid, int) or not isinstance(subs, dict) or subs.get(sid) is not sub:
        return None
    return sid


class _Route:
    """What the parser wrapper does with one subscription's deliveries."""

    __slots__ = ()

    def take(self, line: list[bytes], data: bytes, start: int, end: int) -> bool:
        """Consume the message whose control line is ``line`` and whose body (headers and
        payload) is ``data[start:end]``; False hands it to nats-py's parser instead."""
        raise NotImplementedError

    def after_read(self) -> None:
        """Called once per socket read, after its messages were taken."""


class _Router(Parser):
    """The connection's protocol parser, wrapped: ``MSG``/``HMSG`` operations addressed to a
    routed subscription are cut out of the buffer and handed to its route; every other
    operation (other subscriptions' deliveries, PING, PONG, INFO, -ERR, and what a route
    declines) goes, whole and in order, to the parser this one wraps, so the connection
    behaves as before. One per connection, shared by every route; it gives the connection
    its own parser back when the last route goes."""

    def __init__(self, nc: NATS, inner: Parser) -> None:
        super().__init__(nc)
        self._inner = inner
        self._routes: dict[bytes, _Route] = {}
        self._parsing = False

    @classmethod
    def install(cls, nc: NATS) -> _Router | None:
        """The connection's router, put in place if need be; None where the parser is not
        nats-py's own or is in the middle of an operation (taking it over would lose it)."""
        current = getattr(nc, "_ps", None)
        if isinstance(current, _Router):
            return current
        if (type(current) is not Parser or getattr(current, "buf", None) != bytearray()
                or getattr(current, "state", None) != AWAITING_CONTROL_LINE):
            return None
        router = cls(nc, current)
        nc._ps = router
        return router

    def add(self, sid: int, route: _Route) -> None:
        self._routes[str(sid).encode()] = route

    def routes(self, sid: int) -> _Route | None:
        return self._routes.get(str(sid).encode())

    def discard(self, sid: int, route: _Route) -> None:
        key = str(sid).encode()
        if self._routes.get(key) is route:
            del self._routes[key]
        if not self._routes and not self._parsing:  # else parse() does it when it returns
            self._detach()

    def _detach(self) -> None:
        """Give the connection its own parser back, with the bytes not yet parsed (at most
        one operation's beginning)."""
        if self.nc._ps is self:
            self.nc._ps = self._inner
            self._inner.buf.extend(self.buf)
            self.buf.clear()

    def reset(self) -> None:  # a reconnect starts the protocol afresh, for both parsers
        super().reset()
        inner = getattr(self, "_inner", None)
        if inner is not None:
            inner.reset()

    async def parse(self, data: bytes = b"") -> None:
        self.buf.extend(data)
        self._parsing = True
        try:
            await self._route()
        finally:
            self._parsing = False
            if not self._routes:
                self._detach()

    async def _route(self) -> None:
        buffered = bytes(self.buf)  # one copy a read: the bodies are slices of it
        size = len(buffered)
        routes = self._routes
        pos = passed = 0  # passed: where the run of operations for the inner parser starts
        while pos < size:
            eol = buffered.find(b"\r\n", pos)
            if eol < 0:
                break
            if buffered.startswith(b"MSG", pos) or buffered.startswith(b"HMSG", pos):
                # MSG subject sid [reply] size | HMSG subject sid [reply] header-size size
                line = buffered[pos:eol].split()
                end = eol + 2 + int(line[-1])
                if end + 2 > size:
                    break  # the rest of this message is still on its way
                route = routes.get(line[2])
                if route is not None:
                    if passed < pos:
                        await self._inner.parse(buffered[passed:pos])
                        passed = pos
                        route = routes.get(line[2])  # the await may have removed it
                    if route is not None and route.take(line, buffered, eol + 2, end):
                        passed = end + 2
                pos = end + 2
            else:
                pos = eol + 2  # PING, PONG, +OK, -ERR, INFO: the line alone
        if passed < pos:
            await self._inner.parse(buffered[passed:pos])
        del self.buf[:pos]
        for route in tuple(routes.values()):
            route.after_read()


class _Recorder(_Route):
    """The self-test's route: every message as (subject, reply, header block, payload);
    ``last`` is set when the payload ``last`` arrives."""

    __slots__ = ("_last", "_seen")

    def __init__(self, seen: list[tuple[bytes, bytes | None, bytes | None, bytes]],
                 last: asyncio.Future[None]) -> None:
        self._seen = seen
        self._last = last

    def take(self, line: list[bytes], data: bytes, start: int, end: int) -> bool:
        if line[0] == b"MSG":
            self._seen.append((line[1], line[3] if len(line) == 5 else None, None, data[start:end]))
        else:
            header_end = start + int(line[-2])
            self._seen.append((line[1], line[3] if len(line) == 6 else None, data[start:header_end],
                               data[header_end:end]))
        if self._seen[-1][3] == b"last" and not self._last.done():
            self._last.set_result(None)
        return True


# ---------------------------------------------------------------------------- the two routes


AckHandler = Callable[[bytes, bytes], None]


class _AckRoute(_Route):
    """A publisher's acks: replies without headers (``MSG subject sid size``) go to the handler
    as ``(token, body)``, the token being the subject after the reply prefix. Replies with
    headers (a 503 when no stream stores the subject) take nats-py's path to the same
    subscription."""

    __slots__ = ("_handler", "_prefix_len")

    def __init__(self, handler: AckHandler, prefix_len: int) -> None:
        self._handler = handler
        self._prefix_len = prefix_len

    def take(self, line: list[bytes], data: bytes, start: int, end: int) -> bool:
        if len(line) != 4 or line[0] != b"MSG":
            return False
        self._handler(line[1][self._prefix_len:], data[start:end])
        return True


def _router_for(nc: NATS, sub: Subscription) -> tuple[_Router, int] | None:
    """The connection's parser router and ``sub``'s id, where the parser path passed its
    self-test and the router can be put in place now."""
    engagement = _ENGAGEMENTS.get(nc)
    sid = subscription_id(nc, sub)
    if engagement is None or not engagement.parser or sid is None:
        return None
    router = _Router.install(nc)
    return None if router is None else (router, sid)


def route_acks(nc: NATS, sub: Subscription, prefix_len: int, handler: AckHandler) -> bool:
    """Route the acks that reach ``sub`` (tokens after ``prefix_len`` bytes of their subject)
    to ``handler``; False where the parser path is off or cannot be put in place now (then
    they keep coming through the subscription)."""
    found = _router_for(nc, sub)
    if found is None:
        return False
    router, sid = found
    router.add(sid, _AckRoute(handler, prefix_len))
    return True


def routes_acks(nc: NATS, sub: Subscription) -> bool:
    """Whether the acks reaching ``sub`` take the parser path now."""
    router = getattr(nc, "_ps", None)
    sid = subscription_id(nc, sub)
    return isinstance(router, _Router) and sid is not None and isinstance(router.routes(sid), _AckRoute)


class DirectTap(_Route):
    """A direct get's answers (``runtime.replay``): each stored record (headers, no reply
    subject) goes to ``on_record`` as (its ``Nats-Sequence``, its ``Nats-Subject``, its
    payload), sliced out of the socket buffer; the closing status (``204 EOB``, ``404``) goes to
    ``on_status`` as its code."""

    __slots__ = ("_on_record", "_on_status", "_router", "_sid")

    def __init__(self, router: _Router, sid: int, on_record: Callable[[int, bytes, bytes], None],
                 on_status: Callable[[str], None]) -> None:
        self._router = router
        self._sid = sid
        self._on_record = on_record
        self._on_status = on_status

    def take(self, line: list[bytes], data: bytes, start: int, end: int) -> bool:
        if line[0] != b"HMSG" or len(line) != 5:
            return False  # not an answer of this shape: nats-py's path
        body = start + int(line[-2])
        if data.startswith(b"NATS/1.0\r\n", start):
            at = data.find(b"Nats-Sequence: ", start, body)
            named = data.find(b"Nats-Subject: ", start, body)
            if at < 0 or named < 0:
                return False
            at, named = at + 15, named + 14
            self._on_record(int(data[at:data.index(b"\r\n", at)]), data[named:data.index(b"\r\n", named)],
                            data[body:end])
        else:
            self._on_status(data[start + 9:start + 12].decode())
        return True

    def remove(self) -> None:
        self._router.discard(self._sid, self)


def tap_direct(nc: NATS, sub: Subscription, on_record: Callable[[int, bytes, bytes], None],
               on_status: Callable[[str], None]) -> DirectTap | None:
    """Tap the direct get answers reaching ``sub`` (see :class:`DirectTap`); None where the
    parser path is off or cannot be put in place now."""
    return _tap(nc, sub, lambda router, sid: DirectTap(router, sid, on_record, on_status))


_T = TypeVar("_T", bound=_Route)


def _tap(nc: NATS, sub: Subscription, build: Callable[[_Router, int], _T]) -> _T | None:
    """``build``'s route on ``sub``'s deliveries, where the parser path is on and the router
    can be put in place now."""
    found = _router_for(nc, sub)
    if found is None:
        return None
    router, sid = found
    tap = build(router, sid)
    router.add(sid, tap)
    return tap


# What ``str.isspace`` calls a space among the characters an ASCII name can hold.
_ASCII_SPACES: Final = bytes(c for c in range(128) if chr(c).isspace())


def header_lines(raw: bytes) -> dict[str, str]:
    """A header block's lines (after ``NATS/1.0``) as nats-py 2.16 reads them
    (``Client._parse_header_lines``: a name that is not ASCII or holds a space is passed over,
    both sides stripped, a value decoded with replacement), in C-level string calls rather than
    a generator per name: 2.6 µs for a record of ours against 6.3 (tests/unit/test_header_lines.py
    holds them equal on any input)."""
    out: dict[str, str] = {}
    for line in raw.split(b"\r\n"):
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        name = name.strip()
        if not name.isascii() or len(name.translate(None, _ASCII_SPACES)) != len(name):
            continue
        out[name.decode("ascii")] = value.strip().decode("utf-8", "replace")
    return out


class PullTap(_Route):
    """A pull consumer's deliveries (``runtime.pull``): each record (``HMSG``/``MSG`` with a
    ``$JS.ACK`` reply) goes to ``on_delivery`` as the ``Msg`` nats-py would have built (its
    headers as nats-py reads them: :func:`header_lines`), cut out of the socket buffer here: no
    regular expression per control line, no queue entry and task per record (a fifth of the
    scorer's CPU at 100,000 nodes; docs/benchmarks.md, "Fleet"). Status messages (no reply:
    heartbeats, the end of a pull request) take nats-py's path to the subscription."""

    __slots__ = ("_nc", "_on_delivery", "_router", "_sid")

    def __init__(self, nc: NATS, router: _Router, sid: int, on_delivery: Callable[[Msg], None]) -> None:
        self._nc = nc
        self._router = router
        self._sid = sid
        self._on_delivery = on_delivery

    def take(self, line: list[bytes], data: bytes, start: int, end: int) -> bool:
        if line[0] == b"HMSG" and len(line) == 6:  # HMSG subject sid reply header-size size
            body = start + int(line[4])
            if not data.startswith(b"NATS/1.0\r\n", start):
                return False  # an inline status: nats-py's path
            headers = header_lines(data[start + 10:body]) or None
        elif line[0] == b"MSG" and len(line) == 5:  # MSG subject sid reply size
            body, headers = start, None
        else:
            return False
        self._on_delivery(Msg(_client=self._nc, subject=line[1].decode(), reply=line[3].decode(),
                              data=data[body:end], headers=headers, _sid=self._sid))
        return True

    def remove(self) -> None:
        self._router.discard(self._sid, self)


def tap_pull(nc: NATS, sub: Subscription, on_delivery: Callable[[Msg], None]) -> PullTap | None:
    """Tap the deliveries reaching ``sub`` (see :class:`PullTap`); None where the parser path is
    off or cannot be put in place now."""
    return _tap(nc, sub, lambda router, sid: PullTap(nc, router, sid, on_delivery))


def connection_of(js: JetStreamContext) -> NATS:
    """The connection a JetStream context was made from (nats-py keeps it private)."""
    nc: NATS = js._nc
    return nc
