"""The api service's routes (API-1..3): the HTTP API under ``/api/v1``, the UI's pages, the
live feed. Reads go through ``healthplane.client.reads`` and commands through the CLI's own
``node_actions``, so the answers, the outcomes and the messages are the CLI's.

Node ids (``10.0.0.42/9100``, ``%``, ``+``, spaces, UTF-8) travel percent-encoded as one path
segment (UI-1). The server's decoded path has already turned ``%2F`` into a separator, so the
routes that take a node id match on the raw path (``NodeRoute``) and decode that one segment
once (``NodeIdConvertor``); every link to a node is built by ``pages.node_path``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import parse_qs, quote, unquote_to_bytes, urlencode

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Match, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from healthplane.client import breakfix, commands, federation, jobs, reads
from healthplane.client import events as tails  # `events` is a route below
from healthplane.client.config import in_force
from healthplane.client.connection import Identity
from healthplane.client.errors import (
    EXIT_RETRY,
    EXIT_USAGE,
    CommandFailed,
    NodeNotFound,
    PermissionDenied,
)
from healthplane.client.nodes import find_node
from healthplane.contracts import joboutcomes, wire
from healthplane.runtime import configstore, replay
from healthplane_api import auth, fold, live, members, openapi, pages
from healthplane_api.metrics import COMMANDS, REQUESTS
from healthplane_api.server import MembersWatched

VERBS: Final = openapi.VERBS
MAX_BODY: Final = 16 * 1024
COMMAND_TIMEOUT_S: Final = 10.0
LIVE_MIN_INTERVAL_S: Final = 1.0  # a page re-reads at most once a second, however busy the fleet
LIVE_TICK_S: Final = 15.0  # and at least this often: a view turns stale without being written
TREND_EVENTS: Final = 500
NODE_PAGE_EVENTS: Final = 100  # the node page's timeline and attributions: the newest this many of their types
# The node page reads its node's newest this many events once, and picks its history, trend and
# timeline from them: a node with no more (most) costs one count and one read, not a binary
# search per event type (at 100,000 nodes under the pipeline those searches took over 60 s).
NODE_PAGE_READ: Final = 600  # at least TREND_EVENTS: a busy node's trend comes from the one read
TABLE_PAGE_MAX: Final = 1000  # rows on one page of the table, and nodes in one bulk command
COMMAND_FIELDS: Final = ("reason", "active", "evict", "force", "cluster", "timeout", "suite", "job")
EVENTS_KEEPALIVE_S: Final = 15.0  # an idle event stream still says something this often (proxies, Last-Event-ID)
EVENTS_BUFFER: Final = 256  # events read ahead of a slow event-stream client, at most (see _event_messages)


class BadRequest(Exception):
    """400: ``str()`` names the parameter and what was wrong."""


@dataclass
class Backend:
    """What the routes work with: the service's own connection (reads), the live index,
    who may do what, and the callers' own connections (commands)."""

    nc: NATS
    js: JetStreamContext
    feed: live.Feed
    callers: auth.Callers
    log: Any
    hub: bool = False  # a federation hub: the dashboard is one row per attached cluster (FED-1)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)  # the service stops: event streams end
    grafana_url: str | None = None  # UI-4: the node page links to its Grafana panels there
    members: MembersWatched | None = None  # UI-5: a hub's member history, kept by its watch
    boards: live.Dashboards | None = None  # UI-2: the dashboard's figures (None: the summary only)


class NodeIdConvertor(Convertor[str]):
    """A node id: one segment of the raw path, percent-decoded once as UTF-8 (UI-1)."""

    regex = "[^/]+"

    def convert(self, value: str) -> str:
        # ``value`` is raw bytes read as latin-1 (NodeRoute): back to bytes, then %XX, then UTF-8.
        return unquote_to_bytes(value.encode("latin-1")).decode("utf-8", "replace")

    def to_string(self, value: str) -> str:
        return pages.quote_id(value)


register_url_convertor("node_id", NodeIdConvertor())


class NodeRoute(Route):
    """A route with a ``{node_id:node_id}`` segment, matched on the raw path (ASGI
    ``raw_path``): ``%2F`` in an id stays inside its segment, so ``GET /nodes/a%2Fb`` is
    node ``a/b``, never the ``/nodes/{id}/{verb}`` POST route (405)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw is None:  # a server that does not say: the decoded path, as Route would
            return super().matches(scope)
        # Some clients (httpx's ASGI transport) leave the query on raw_path; latin-1 keeps every byte.
        path = raw.split(b"?", 1)[0].decode("latin-1")
        return super().matches({**scope, "path": path, "root_path": ""})


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status)


def _bool(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes", "on")


def _int(request: Request, name: str, default: int) -> int:
    found = _optional_int(request.query_params, name)
    return default if found is None else found


def _optional_int(query: QueryParams, name: str) -> int | None:
    text = query.get(name)
    if text is None or text.strip() == "":
        return None
    if not text.strip().lstrip("-").isdigit():
        raise BadRequest(f"{name} {text!r} is not a number")
    return int(text)


def _table_query(query: QueryParams, default_sort: str) -> dict[str, Any]:
    """The table's filter and sort from a query (UI-3), the same for the API, the page and
    its "all matching" bulk commands: ``cluster``, ``status``, ``health``, ``condition``,
    ``hold``, ``domain`` (each repeatable but ``cluster``), ``q``, ``scoreMin``, ``scoreMax``,
    ``sort``. An empty value is no filter."""

    def given(name: str) -> list[str]:
        return [v for v in query.getlist(name) if v.strip()]

    return {"cluster": query.get("cluster") or None, "status": given("status"), "health": given("health"),
            "condition": given("condition"), "hold": given("hold"), "domain": given("domain"),
            "text": query.get("q", ""), "score_min": _optional_int(query, "scoreMin"),
            "score_max": _optional_int(query, "scoreMax"), "sort": query.get("sort") or default_sort}


def _with(query: Any, **changed: str | None) -> str:
    """``query`` as a URL query with ``changed`` set (``None``: left out), without what only
    one response is for (``fragment``, ``notice``, ``failed``)."""
    kept = [(k, v) for k, v in query.multi_items() if k not in changed and k not in ("fragment", "notice", "failed")]
    return urlencode(kept + [(k, v) for k, v in changed.items() if v is not None])


# ---------------------------------------------------------------------------- the app


def build(backend: Backend) -> Starlette:
    env = pages.environment()

    async def caller_of(request: Request) -> auth.Caller | None:
        token = auth.bearer(request.headers.get("authorization")) or request.cookies.get(auth.COOKIE)
        return await backend.callers.caller(token)

    def api(handler: Callable[[Request, auth.Caller | None], Awaitable[Response]]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            started = time.perf_counter()
            try:
                response = await handler(request, await caller_of(request))
            except auth.Unauthorized as exc:
                response = _error(401, str(exc))
            except BadRequest as exc:
                response = _error(400, str(exc))
            except NodeNotFound as exc:
                response = _error(404, str(exc))
            except PermissionDenied as exc:
                response = _error(403, str(exc))
            except CommandFailed as exc:
                status = {EXIT_USAGE: 400, EXIT_RETRY: 503}.get(exc.code, 409)
                response = _error(status, str(exc))
            except (fold.PageError, wire.WireError) as exc:
                response = _error(400, str(exc))
            except (ConnectionError, TimeoutError, OSError, replay.ReadError) as exc:
                response = _error(503, f"cannot read the control plane's data now: {exc or type(exc).__name__}; retry")
            REQUESTS.labels(route=handler.__name__, code=str(response.status_code)).observe(
                time.perf_counter() - started)
            return response
        return endpoint

    # -- reads

    async def nodes(request: Request, caller: auth.Caller | None) -> Response:
        """A page: its order from the live index, its views in one multi-subject direct get. The
        whole list (no ``pageSize``), or a page before the index is loaded: the stream read as
        ``node list``."""
        query = request.query_params
        if _bool(query.get("federation")):  # FED-1: every attached cluster's nodes, the whole list
            found = await federated(query.get("cluster"))
            body = (b'{"nodes":' + found.json() + b',"total":' + str(len(found.rows())).encode()
                    + b',"nextPageToken":null}')
            return Response(body, media_type="application/json")
        size = _int(request, "pageSize", 0) if query.get("pageSize") else None
        table = _table_query(request.query_params, "node")

        def select(index: fold.ViewIndex) -> fold.Page:
            return index.page(**table, page_size=size, token=query.get("pageToken"))

        feed = backend.feed
        if size is not None and feed.loaded.is_set() and feed.readable:
            page = select(feed.index)
            views = b"[" + b",".join(await reads.latest_views(backend.js, [(r.cluster, r.node_id)
                                                                          for r in page.rows])) + b"]"
        else:
            listing = await reads.read_listing(backend.nc, backend.js, query.get("cluster"))
            page = select(fold.ViewIndex({fold.key_of(r.cluster, r.node_id): r for r in listing.rows}))
            position = {fold.key_of(r.cluster, r.node_id): i for i, r in enumerate(listing.rows)}
            views = listing.json(position[fold.key_of(r.cluster, r.node_id)] for r in page.rows)
        body = (b'{"nodes":' + views + b',"total":' + str(page.total).encode()
                + b',"nextPageToken":' + json.dumps(page.next_page_token).encode()
                + b',"prevPageToken":' + json.dumps(page.prev_page_token).encode() + b"}")
        return Response(body, media_type="application/json")

    def cluster_of(node_id: str, cluster: str | None) -> str | None:
        """The node's cluster when the request names none and the index knows exactly one:
        a view read by its own subject, not looked for under every cluster (a wildcard read
        the server answers by walking the subjects: 20 s and more at 100,000 nodes under load)."""
        if cluster or backend.hub:
            return cluster or None
        index = backend.feed.index
        found = [name for name in index.nodes_by_cluster if fold.key_of(name, node_id) in index.rows]
        return found[0] if len(found) == 1 else None

    async def node(request: Request, caller: auth.Caller | None) -> Response:
        node_id = request.path_params["node_id"]
        view = await find_node(backend.nc, backend.js, node_id, cluster_of(node_id, request.query_params.get("cluster")))
        why = await reads.automation_status(backend.js, view, datetime.now(UTC), config=backend.feed.config)
        return JSONResponse(reads.shown(view, why))

    async def events(request: Request, caller: auth.Caller | None) -> Response:
        node_id, query = request.path_params["node_id"], request.query_params
        page = await reads.event_page(backend.nc, backend.js, node_id, cluster_of(node_id, query.get("cluster")),
                                      types=[t.upper() for t in query.getlist("type")], since=query.get("since"),
                                      latest=_bool(query.get("latest")),
                                      page_size=_int(request, "pageSize", reads.DEFAULT_PAGE_SIZE),
                                      token=query.get("pageToken"))
        return JSONResponse(page.to_builtins())

    async def event_stream(request: Request, caller: auth.Caller | None) -> Response:
        """INT-1: ``events watch`` as server-sent events; ``Last-Event-ID`` (a browser's
        EventSource sends it when it reconnects) resumes right after that position."""
        query = request.query_params
        selection = tails.select(query.get("cluster") or None, query.get("node") or None, query.getlist("type"))
        resume = (request.headers.get("last-event-id") or "").strip()
        if resume:
            if not resume.isdigit():
                raise BadRequest(f"Last-Event-ID {resume!r} is not a position this stream sent")
            begun = await tails.start(backend.nc, backend.js, selection, from_position=int(resume) + 1)
        else:
            since = query.get("since")
            begun = await tails.start(backend.nc, backend.js, selection,
                                       since=reads.parse_since(since, datetime.now(UTC)) if since else None)
        return StreamingResponse(_event_messages(backend.nc, selection, begun, backend.stopping),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def summary(request: Request, caller: auth.Caller | None) -> Response:
        if backend.hub or _bool(request.query_params.get("federation")):
            return JSONResponse(federation.summary(await federated(None)))
        return JSONResponse(current_summary())

    async def breakfix_figures(request: Request, caller: auth.Caller | None) -> Response:
        """Issue 41.5: ``healthplane breakfix -o json`` over HTTP (``since``, ``cluster``)."""
        query = request.query_params
        since = reads.parse_since(query.get("since") or "30d", datetime.now(UTC))
        return JSONResponse(await breakfix.figures(backend.nc, backend.js, since, query.get("cluster") or None))

    async def jobs_impact(request: Request, caller: auth.Caller | None) -> Response:
        """JOB-4's "who was hit": ``healthplane jobs impact -o json`` over HTTP (``since``, ``cluster``)."""
        query = request.query_params
        try:
            since = reads.parse_since(query.get("since") or "24h", datetime.now(UTC))
        except CommandFailed as exc:
            raise BadRequest(str(exc).removeprefix("--")) from None
        found = await jobs.impact(backend.nc, backend.js, since, query.get("cluster") or None)
        return JSONResponse(found.to_json())

    async def federation_members(request: Request, caller: auth.Caller | None) -> Response:
        """UI-5: each member's reachability now (``federation list``), since when, its last
        transitions and its lag trend."""
        found = await member_history()
        if found is None:
            return _error(404, "this api is not a federation hub (up --federation-hub)")
        return JSONResponse(found)

    async def member_history() -> dict[str, Any] | None:
        if not backend.hub or backend.members is None:
            return None
        threshold = federation.unreachable_after_s()
        found, now = await federation.members(backend.nc), datetime.now(UTC)
        # A reader's look is one more look: kept, so an outage a reader saw is in the history
        # even when it ended between two of the watch's looks, and the answer agrees with itself.
        history = backend.members.history = members.observe(backend.members.history, found, now, threshold)
        return {"watchedSince": wire.rfc3339(history.watched_since) if history.watched_since else None,
                "unreachableAfterSeconds": threshold, "transitionsKept": members.TRANSITIONS_KEPT,
                "members": [members.to_builtins(history, m, now, threshold) for m in found]}

    async def federated(cluster: str | None) -> federation.FederatedListing:
        return await federation.read_federated(backend.nc, backend.js, cluster, federation.unreachable_after_s())

    async def config(request: Request, caller: auth.Caller | None) -> Response:
        found = await configstore.read(backend.js)
        if found.in_force is None:
            return _error(404, "no valid config applied yet; services use the built-in defaults")
        return JSONResponse(in_force(found.in_force))

    def current_summary() -> dict[str, Any]:
        feed = backend.feed
        if not feed.readable and feed.unreadable_since is not None:
            return reads.unreadable(feed.index.clusters() or ["default"], feed.unreadable_reason,
                                    feed.unreadable_since)
        if backend.boards is not None:
            return backend.boards.summary(datetime.now(UTC))
        return reads.summarize(feed.index.rows.values(), datetime.now(UTC))

    # -- commands

    async def command(request: Request, caller: auth.Caller | None) -> Response:
        node_id, verb = request.path_params["node_id"], request.path_params["verb"]
        if verb not in VERBS:
            return _error(404, f"no command {verb!r}: one of {', '.join(VERBS)}")
        refused = _cookie_refused(request)
        if refused is not None:
            return _error(403, refused)
        body = await request.body()
        if len(body) > MAX_BODY:
            raise BadRequest(f"body over {MAX_BODY} bytes")
        try:
            fields = json.loads(body) if body.strip() else {}
        except ValueError as exc:
            raise BadRequest(f"body is not JSON: {exc}") from None
        if not isinstance(fields, dict):
            raise BadRequest("body must be a JSON object (reason, active, evict, force)")
        outcome, status = await run_command(caller, node_id, verb, fields)
        return JSONResponse(outcome, status)

    async def run_command(caller: auth.Caller | None, node_id: str, verb: str,
                          fields: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """The CLI's command for one node, sent as the caller; (JSON, HTTP status)."""
        if caller is None or caller.client is None:
            raise PermissionDenied("permission denied: this API runs on an open bus (up --insecure) and takes no "
                                   "commands: nobody could say who sent them; use the CLI")
        unknown = set(fields) - set(COMMAND_FIELDS)
        if unknown:
            raise BadRequest(f"unknown field {sorted(unknown)[0]!r}: {', '.join(COMMAND_FIELDS)}")
        reason, suite, job = fields.get("reason"), fields.get("suite") or None, fields.get("job") or None
        for name, value in (("reason", reason), ("suite", suite), ("job", job)):
            if value is not None and not isinstance(value, str):
                raise BadRequest(f"{name} must be a string")
        if verb == "isolate" and job is None:
            raise BadRequest("isolate: name the failed job (job), as `healthplane isolate JOB` does")
        if job is not None and verb != "isolate":
            raise BadRequest(f"{verb} takes no job")
        if suite is not None and verb not in ("validate", "isolate"):
            raise BadRequest(f"{verb} takes no suite")
        timeout = fields.get("timeout", COMMAND_TIMEOUT_S)
        if not isinstance(timeout, int | float) or not 0 < timeout <= 60:
            raise BadRequest("timeout must be a number of seconds from 0 to 60")
        # The CLI's own checks, command and wait (healthplane.client), acting as the caller.
        cluster = fields.get("cluster")
        commands.check(verb, node=node_id, reason=reason or None, evict=bool(fields.get("evict")),
                       force=bool(fields.get("force")))
        view = await find_node(backend.nc, backend.js, node_id, cluster_of(node_id, cluster))
        if verb == "isolate" and job is not None:  # the CLI's check first: the job ran here
            ran_on = await jobs.job_nodes(backend.nc, backend.js, view.cluster, job)
            if not ran_on:
                raise jobs.no_allocations(view.cluster, job)
            if view.node_id not in ran_on:
                raise CommandFailed(f"isolate {job}: job {job} did not run on {view.node_id} (it ran on "
                                    f"{', '.join(ran_on[:5])}{', …' if len(ran_on) > 5 else ''})")
        sent = commands.command(commands.verb_of(verb), view.node_id, view.cluster, Identity(caller.role, caller.name),
                                reason=reason or None, active=bool(fields.get("active")),
                                evict=bool(fields.get("evict")), force=bool(fields.get("force")), suite=suite,
                                job_id=job)
        outcomes = await commands.send_and_wait(caller.client, Identity(caller.role, caller.name), [sent],
                                                float(timeout))
        outcome = outcomes.get(sent.id)
        backend.log.info("command", actor=caller.name, verb=verb, node=view.node_id, cluster=view.cluster,
                         command_id=sent.id, result=outcome.result if outcome else "pending")
        COMMANDS.labels(verb=verb, result=outcome.result if outcome else "pending").inc()
        if outcome is None:
            return {"commandId": sent.id, "nodeId": sent.node_id, "result": "pending"}, 202
        answer = wire.to_builtins(outcome)
        if outcome.result == "refused":
            return {"error": outcome.message, **answer}, 409
        if outcome.result == "retry":
            return {"error": outcome.message, **answer}, 503
        return answer, 200

    async def openapi_document(request: Request) -> Response:
        return JSONResponse(openapi.document())

    # -- pages

    def render(name: str, request: Request, caller: auth.Caller | None, status: int = 200,
               **values: Any) -> HTMLResponse:
        feed = backend.feed
        values |= {"caller": caller, "open_bus": backend.callers.open, "csrf": backend.callers.csrf(caller),
                   "readable": feed.readable, "unreadable_since": feed.unreadable_since,
                   "unreadable_reason": feed.unreadable_reason, "now": datetime.now(UTC),
                   "fragment": request.query_params.get("fragment") == "1", "node_path": pages.node_path,
                   "notice": request.query_params.get("notice"), "failed": request.query_params.get("failed"),
                   "is_hub": backend.hub}
        return HTMLResponse(env.get_template(name).render(**values), status,
                            headers={"Cache-Control": "no-store", "X-Frame-Options": "DENY",
                                     "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'"})

    def page(handler: Callable[[Request, auth.Caller | None], Awaitable[Response]]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request, await caller_of(request))
            except auth.Unauthorized:
                return RedirectResponse(f"/login?next={quote(_raw_path(request))}", 303)
            except NodeNotFound as exc:
                return render("missing.html", request, None, 404, message=str(exc))
        return endpoint

    async def dashboard(request: Request, caller: auth.Caller | None) -> Response:
        found = federation.summary(await federated(None)) if backend.hub else current_summary()
        cluster = request.query_params.get("cluster") or None
        board = await backend.boards.board(backend.js, cluster) if backend.boards and not backend.hub else None
        return render("dashboard.html", request, caller, summary=found, hub=backend.hub, board=board)

    async def dashboard_figures(request: Request, caller: auth.Caller | None) -> Response:
        """UI-2: the dashboard's figures (``?cluster=``: one cluster's; else the fleet's)."""
        if backend.hub or backend.boards is None:
            return _error(404, "a federation hub has no fleet dashboard of its own: GET /api/v1/summary has a row "
                               "per attached cluster")
        return JSONResponse(await backend.boards.board(backend.js, request.query_params.get("cluster") or None))

    def may_command(caller: auth.Caller | None) -> bool:
        return caller is not None and caller.is_admin and caller.client is not None

    def table_page(request: Request) -> fold.Page:
        size = _int(request, "pageSize", 100)
        if size > TABLE_PAGE_MAX:
            raise BadRequest(f"pageSize {size}: at most {TABLE_PAGE_MAX}")
        return backend.feed.index.page(**_table_query(request.query_params, "score"), page_size=size,
                                       token=request.query_params.get("pageToken"))

    async def nodes_page(request: Request, caller: auth.Caller | None) -> Response:
        """UI-3: the table, its filter in the URL; each page a keyset page of the live index."""
        query = request.query_params
        shown: dict[str, Any] = {"query": query, "clusters": backend.feed.index.clusters(), "statuses": fold.STATUSES,
                 "healths": fold.HEALTHS, "conditions": fold.CONDITIONS, "holds": fold.HOLDS,
                 "bulk_verbs": pages.BULK_VERBS if may_command(caller) else (), "back": _with(query)}
        try:
            found = table_page(request)
        except (fold.PageError, BadRequest) as exc:
            return render("nodes.html", request, caller, page=None, problem=str(exc), links={}, rows_url=None,
                          **shown)
        links = {"next": _with(query, pageToken=found.next_page_token) if found.next_page_token else None,
                 "prev": _with(query, pageToken=found.prev_page_token) if found.prev_page_token else None,
                 "first": _with(query, pageToken=None) if query.get("pageToken") else None}
        return render("nodes.html", request, caller, page=found, problem=None, links=links,
                      rows_url="/nodes/rows?" + _with(query), **shown)

    async def nodes_rows(request: Request) -> Response:
        """UI-3's live update: the rows a table shows, as they are now, to update in place, and
        how many rows a re-read of the page would add, drop or move (``changed``): the reader
        is told, the rows are not moved under them. Body: ``{"shown": [row key…]}``."""
        try:
            await caller_of(request)
        except auth.Unauthorized as exc:
            return _error(401, str(exc))
        if not backend.feed.readable:
            return JSONResponse({"readable": False})
        try:
            body = json.loads((await request.body())[:MAX_BODY * 16] or b"{}")
            keys = [k for k in body.get("shown", []) if isinstance(k, str)][:TABLE_PAGE_MAX]
            found = table_page(request)
        except (ValueError, AttributeError, fold.PageError, BadRequest) as exc:
            return _error(400, str(exc))
        row = env.get_template("nodes_rows.html").module.row  # type: ignore[attr-defined]
        index, rows = backend.feed.index.rows, {}
        for key in keys:
            named = pages.parse_row_key(key)
            current = index.get(fold.key_of(*named)) if named else None
            if current is not None:
                rows[key] = str(row(current, False))  # the checkbox cell stays the page's
        fresh = [pages.row_key(r.cluster, r.node_id) for r in found.rows]
        return JSONResponse({"readable": True, "total": found.total, "changed": fold.page_changes(keys, fresh),
                             "rows": rows})

    async def nodes_command(request: Request) -> Response:
        """UI-3's bulk commands: the table's selected nodes, one verb. The first post asks (the
        verb, how many nodes, which); the second, confirmed, sends one command per node as
        the caller (one batch, as the CLI's ``--all`` forms) and shows each node's outcome."""
        try:
            caller = await caller_of(request)
        except auth.Unauthorized:
            return RedirectResponse("/login?next=/nodes", 303)
        form = parse_qs((await request.body())[:MAX_BODY * 16].decode("utf-8", "replace"))

        def one(name: str) -> str | None:
            return form.get(name, [None])[-1]

        back_query = one("back") or ""
        back = "/nodes?" + back_query
        if not _same_origin(request) or not backend.callers.csrf_ok(caller, one("csrf")):
            return _error(403, "this form did not come from this page (CSRF check failed); reload the page")
        verb = one("verb") or ""
        if verb not in pages.BULK_VERBS:
            return _error(400, f"no bulk command {verb!r}: one of {', '.join(pages.BULK_VERBS)}")
        chosen = list(dict.fromkeys(k for k in form.get("node", []) if pages.parse_row_key(k)))
        if _bool(one("matching")) and one("confirm") != "yes":
            # Every node the table's filter matches, on any page: resolved once, here, into the
            # keys the question lists and the confirmation sends — what was asked is what is done.
            try:
                matching = backend.feed.index.page(**_table_query(QueryParams(back_query), "score"), page_size=None)
            except (fold.PageError, BadRequest) as exc:
                return _error(400, str(exc))
            if matching.total > TABLE_PAGE_MAX:
                return _error(400, f"{matching.total} nodes match this filter: at most {TABLE_PAGE_MAX} in one "
                                   "command; narrow the filter")
            chosen = [pages.row_key(r.cluster, r.node_id) for r in matching.rows]
        if not chosen:
            return RedirectResponse(f"{back}&{urlencode({'failed': 'Nothing changed: no node was selected.'})}", 303)
        if len(chosen) > TABLE_PAGE_MAX:
            return _error(400, f"{len(chosen)} nodes: at most {TABLE_PAGE_MAX} in one command")
        active = _bool(one("active"))
        values: dict[str, Any] = {"verb": verb, "keys": chosen, "back": back, "back_query": back_query, "reason": one("reason") or "",
                  "active": active,
                  "question": pages.bulk_question(verb, len(chosen), active), "outcomes": None, "summary": None,
                  "problem": None}
        if one("confirm") != "yes":
            values["nodes"] = [pages.parse_row_key(k) for k in chosen]
            return render("bulk.html", request, caller, **values)
        try:
            values |= await run_bulk(caller, verb, chosen, reason=one("reason") or None, active=active)
        except (PermissionDenied, CommandFailed) as exc:
            values["problem"] = str(exc)
        return render("bulk.html", request, caller, **values)

    async def run_bulk(caller: auth.Caller | None, verb: str, keys: list[str], *, reason: str | None,
                       active: bool) -> dict[str, Any]:
        """One command per node, sent as the caller in one batch; each node's outcome."""
        if caller is None or caller.client is None:
            raise PermissionDenied("permission denied: this API runs on an open bus (up --insecure) and takes no "
                                   "commands: nobody could say who sent them; use the CLI")
        who = Identity(caller.role, caller.name)
        commands.check(verb, node="(selected)", reason=reason)
        batch = str(uuid.uuid4()) if len(keys) > 1 else None
        sent: list[wire.Command] = []
        outcomes: list[dict[str, Any]] = []
        for key in keys:
            cluster, node_id = pages.parse_row_key(key) or ("", "")
            if fold.key_of(cluster, node_id) not in backend.feed.index.rows:
                outcomes.append({"nodeId": node_id, "cluster": cluster, "result": "refused",
                                 "message": f"node {node_id} not found"})
                continue
            sent.append(commands.command(commands.verb_of(verb), node_id, cluster, who, reason=reason,
                                         active=active and verb == "drain", batch_id=batch))
        answered = await commands.send_and_wait(caller.client, who, sent, COMMAND_TIMEOUT_S) if sent else {}
        for command in sent:
            outcome = answered.get(command.id)
            result: str = outcome.result if outcome else "pending"
            if outcome is not None and outcome.result == "applied" and outcome.passed is False:
                result = "failed"  # a validation that ran and failed: applied, and bad news
            COMMANDS.labels(verb=verb, result=outcome.result if outcome else "pending").inc()
            outcomes.append({"nodeId": command.node_id, "cluster": command.cluster, "result": result,
                             "message": outcome.message if outcome else
                             (f"{verb} {command.node_id}: command {command.id} accepted; eviction has not answered "
                              "yet, it will act on it when it runs (pending)")})
        backend.log.info("bulk command", actor=caller.name, verb=verb, nodes=len(keys), batch_id=batch,
                         results={r: sum(1 for o in outcomes if o["result"] == r)
                                  for r in sorted({o["result"] for o in outcomes})})
        return {"outcomes": outcomes, "summary": pages.bulk_summary(verb, outcomes, active)}

    async def federation_page(request: Request, caller: auth.Caller | None) -> Response:
        """UI-5: the hub's members, each with its reachability history and lag trend."""
        found = await member_history()
        if found is None or backend.members is None:
            return render("missing.html", request, caller, 404,
                          message="this api is not a federation hub: it has no member clusters")
        kept = backend.members.history.members
        lines: dict[str, dict[str, Any]] = {m["cluster"]: members.sparkline(kept[m["cluster"]].lag) if m["cluster"] in kept
                 else members.sparkline([]) for m in found["members"]}
        return render("federation.html", request, caller, found=found, lines=lines)

    async def node_page(request: Request, caller: auth.Caller | None) -> Response:
        node_id = request.path_params["node_id"]
        cluster = request.query_params.get("cluster")
        nothing: dict[str, Any] = {"timeline": [], "attributions": [], "grafana": [], "suites": [],
                                   "default_suite": None, "failed_jobs": []}
        if not backend.feed.readable:
            return render("node.html", request, caller, view=None, node_id=node_id, history=[], trend=None,
                          automation=None, stale=None, verbs=VERBS, **nothing)
        view = await find_node(backend.nc, backend.js, node_id, cluster_of(node_id, cluster))
        read = await _node_events(backend.nc, backend.js, view)
        shown = {**nothing, "timeline": pages.timeline(read.recorded), "attributions": pages.attributions(read.recorded),
                 "grafana": pages.grafana_links(backend.grafana_url, view.cluster, view.node_id)}
        if may_command(caller):
            shown |= await command_choices(view)
        now = datetime.now(UTC)
        # API-4 from the events just read: only its domains' events (and an input older than
        # the read) cost a request, one for all of them.
        automation = await reads.automation_status(backend.js, view, now, known=read.newest, complete=read.complete,
                                                   config=backend.feed.config)
        return render("node.html", request, caller, view=view, node_id=view.node_id, history=read.history,
                      trend=pages.trend(read.scores, now), automation=automation,
                      stale=reads.staleness(view, datetime.now(UTC)), verbs=VERBS, **shown)

    async def command_choices(view: wire.NodeView) -> dict[str, Any]:
        """What the node page offers an admin to validate with (the config's suites) and to
        isolate (the node's newest failed multi-node jobs, JOB-1)."""
        applied = (backend.feed.config or await configstore.read(backend.js)).in_force
        validation = applied.config.validation if applied is not None else None
        outcomes = await jobs.node_outcomes(backend.nc, backend.js, view.cluster, view.node_id)
        failed = {o.job_id: o for o in reversed(outcomes) if o.outcome in joboutcomes.FAILURES and o.size > 1}
        return {"suites": sorted(validation.suites) if validation else [],
                "default_suite": validation.default_suite if validation else None,
                "failed_jobs": sorted(failed.values(), key=lambda o: o.ended_at, reverse=True)}

    async def node_form(request: Request) -> Response:
        """A command from the node page: a form with the page's CSRF value, from this origin."""
        node_id, verb = request.path_params["node_id"], request.path_params["verb"]
        back = pages.node_path(node_id)
        try:
            caller = await caller_of(request)
        except auth.Unauthorized:
            return RedirectResponse(f"/login?next={quote(back)}", 303)
        body = await request.body()
        form = {k: v[-1] for k, v in parse_qs(body[:MAX_BODY].decode("utf-8", "replace")).items()}
        if not _same_origin(request) or not backend.callers.csrf_ok(caller, form.get("csrf")):
            return _error(403, "this form did not come from this page (CSRF check failed); reload the page")
        fields = {"reason": form.get("reason") or None, "active": _bool(form.get("active")),
                  "evict": _bool(form.get("evict")), "force": _bool(form.get("force")),
                  "suite": form.get("suite") or None, "job": (form.get("job") or "").strip() or None}
        if verb not in VERBS:
            return RedirectResponse(f"{back}?{urlencode({'failed': f'no command {verb!r}'})}", 303)
        try:
            answer, status = await run_command(caller, node_id, verb, fields)
        except (CommandFailed, BadRequest) as exc:
            return RedirectResponse(f"{back}?{urlencode({'failed': str(exc)})}", 303)
        message = answer.get("error") or answer.get("message") or f"{verb} {node_id}: pending"
        key = "notice" if status < 300 else "failed"
        return RedirectResponse(f"{back}?{urlencode({key: message})}", 303)

    async def login(request: Request) -> Response:
        if request.method == "GET":
            return render("login.html", request, None, next=request.query_params.get("next", "/"), problem=None)
        form = {k: v[-1] for k, v in parse_qs((await request.body())[:MAX_BODY].decode("utf-8", "replace")).items()}
        target = form.get("next", "/")
        if not target.startswith("/") or target.startswith("//"):
            target = "/"
        token = (form.get("token") or "").strip()
        try:
            caller = await backend.callers.caller(token)
        except auth.Unauthorized as exc:
            return render("login.html", request, None, next=target, problem=str(exc))
        response = RedirectResponse(target, 303)
        if caller is not None:
            response.set_cookie(auth.COOKIE, token, httponly=True, samesite="strict", path="/",
                                secure=request.url.scheme == "https")
        return response

    async def logout(request: Request) -> Response:
        response = RedirectResponse("/login", 303)
        response.delete_cookie(auth.COOKIE, path="/")
        return response

    async def live_feed(request: Request) -> Response:
        """Server-sent events: "changed" when what this page shows may have changed."""
        try:
            await caller_of(request)
        except auth.Unauthorized as exc:
            return _error(401, str(exc))
        wanted = request.query_params.get("node")
        wanted_key = fold.key_of(request.query_params.get("cluster", ""), wanted) if wanted else None
        return StreamingResponse(_changes(backend.feed, wanted_key, request), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    routes = [
        Route("/api/openapi.json", openapi_document),
        Route("/api/v1/nodes", api(nodes)),
        Route("/api/v1/summary", api(summary)),
        Route("/api/v1/dashboard", api(dashboard_figures)),
        Route("/api/v1/breakfix", api(breakfix_figures)),
        Route("/api/v1/jobs/impact", api(jobs_impact)),
        Route("/api/v1/config", api(config)),
        Route("/api/v1/events/stream", api(event_stream)),
        Route("/api/v1/federation/members", api(federation_members)),
        NodeRoute("/api/v1/nodes/{node_id:node_id}/events", api(events)),
        NodeRoute("/api/v1/nodes/{node_id:node_id}/{verb}", api(command), methods=["POST"]),
        NodeRoute("/api/v1/nodes/{node_id:node_id}", api(node)),
        Route("/", page(dashboard)),
        Route("/nodes", page(nodes_page)),
        # Before the node routes: a POST here is the table's; a GET of /nodes/rows is node "rows".
        Route("/nodes/rows", nodes_rows, methods=["POST"]),
        Route("/nodes/command", nodes_command, methods=["POST"]),
        Route("/federation", page(federation_page)),
        NodeRoute("/nodes/{node_id:node_id}/{verb}", node_form, methods=["POST"]),
        NodeRoute("/nodes/{node_id:node_id}", page(node_page)),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/live", live_feed),
        Mount("/static", StaticFiles(directory=pages.STATIC), name="static"),
    ]
    return Starlette(routes=routes)


def _raw_path(request: Request) -> str:
    """The path as the client sent it (a node id still one encoded segment), for ``?next=``."""
    raw = request.scope.get("raw_path")
    return raw.split(b"?", 1)[0].decode("latin-1") if raw else quote(request.url.path)


def _cookie_refused(request: Request) -> str | None:
    """SEC-12 / API-2: why a JSON API command authenticated by the UI's cookie alone is not
    taken (``None``: it is). A browser sends the cookie with any site's request, so the cookie
    counts only from this origin (``Origin``, ``Sec-Fetch-Site``) with a JSON body, which another
    site cannot send without a CORS preflight this server never grants. A bearer header is
    the API's own credential: no browser attaches it by itself."""
    if auth.bearer(request.headers.get("authorization")) or auth.COOKIE not in request.cookies:
        return None
    fetch_site = request.headers.get("sec-fetch-site")
    if not _same_origin(request) or fetch_site not in (None, "same-origin"):
        return (f"cross-origin command refused: the session cookie counts only from "
                f"{request.url.scheme}://{request.url.netloc} (send Authorization: Bearer TOKEN instead)")
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        return (f"a command with the session cookie must be Content-Type: application/json "
                f"(got {content_type or 'none'}); or send Authorization: Bearer TOKEN")
    return None


def _same_origin(request: Request) -> bool:
    origin = request.headers.get("origin")
    return origin is None or origin == f"{request.url.scheme}://{request.url.netloc}"


@dataclass(frozen=True, slots=True)
class NodeEvents:
    """The node page's events, picked from one read of the node's newest NODE_PAGE_READ."""

    newest: list[wire.NodeEvent]  # that read, oldest first: also the automation line's inputs (API-4)
    complete: bool  # the read holds every event the node has: an input not in it has none
    history: list[wire.NodeEvent]  # the newest page, newest first
    scores: list[wire.NodeEvent]  # the score trend: the newest TREND_EVENTS score changes
    recorded: list[wire.NodeEvent]  # timeline and attributions (UI-4): the newest NODE_PAGE_EVENTS of their types


async def _node_events(nc: NATS, js: JetStreamContext, view: wire.NodeView) -> NodeEvents:
    """The node page's events from one read of its newest NODE_PAGE_READ events. A node with
    more events than that, whose read came up short of a kind, has that kind read on its own."""
    newest = (await reads.event_page(nc, js, view.node_id, view.cluster, latest=True, page_size=NODE_PAGE_READ,
                                     viewed=True)).events
    complete = len(newest) < NODE_PAGE_READ  # else the read may not reach back far enough
    chosen = {"scores": (("SCORE_CHANGED",), TREND_EVENTS),
              "recorded": ((*pages.TIMELINE_EVENTS, *pages.ATTRIBUTION_EVENTS), NODE_PAGE_EVENTS)}
    picked: dict[str, list[wire.NodeEvent]] = {}
    for name, (types, count) in chosen.items():
        found = [e for e in newest if e.type in types][-count:]
        if len(found) < count and not complete:
            found = (await reads.event_page(nc, js, view.node_id, view.cluster, types=list(types), latest=True,
                                            page_size=count, viewed=True)).events
        picked[name] = found
    return NodeEvents(newest, complete, list(reversed(newest[-reads.DEFAULT_PAGE_SIZE:])), picked["scores"],
                      picked["recorded"])


async def _event_messages(nc: NATS, selection: tails.Selection, begun: tails.Start,
                          stopping: asyncio.Event) -> AsyncIterator[bytes]:
    """One server-sent event per node event: ``id`` its position, ``event`` its type, ``data``
    the stored event (EVT-2). An idle stream sends, every EVENTS_KEEPALIVE_S, a comment and an
    ``id`` with no data: a browser takes it as its Last-Event-ID without an event, so one that
    reconnects after a quiet spell (or after records of other types) starts past them.

    A slow client is neither dropped nor skipped: it is held back. This generator reads the
    next event only when the server has taken the previous one (uvicorn's send waits while the
    socket's buffer is full), and the tail reads at most EVENTS_BUFFER events ahead of it, then
    pauses until half are taken and reads on from its exact position. A slow client costs that
    much memory and lags; it loses nothing, and a client that went away ends the stream (the
    disconnect cancels it). When the service stops, the stream ends: the client reconnects
    with its Last-Event-ID to whichever api answers next."""
    tail = tails.Tail(nc, selection, begun.position, buffer=EVENTS_BUFFER)
    ending = asyncio.ensure_future(stopping.wait())
    ending.add_done_callback(lambda _: tail.stop())
    try:
        yield b"retry: 2000\n\n"
        if begun.note:
            yield b"event: notice\ndata: " + json.dumps({"notice": begun.note}).encode() + b"\n\n"
        while True:
            watched = await tail.next(EVENTS_KEEPALIVE_S)
            if watched is None and stopping.is_set():
                return
            if watched is None:
                yield b": keepalive\nid: %d\n\n" % (tail.position - 1)
                continue
            yield b"id: %d\nevent: %s\ndata: %s\n\n" % (watched.position, watched.event.type.encode(),
                                                           wire.encode(watched.event))
    finally:
        ending.cancel()
        tail.stop()  # no await: a cancelled request may not wait for anything


async def _changes(feed: live.Feed, wanted: str | None, request: Request) -> AsyncIterator[bytes]:
    """Notices for one page, at most one a second: a node page hears of its own node, the
    dashboard and the table of any node; every page of readability and of time passing."""
    loop = asyncio.get_running_loop()
    last_tick = loop.time()
    yield b"retry: 2000\n\n"
    async with feed.watch() as queue:
        while True:
            with contextlib.suppress(TimeoutError):
                key = await asyncio.wait_for(queue.get(), LIVE_TICK_S)
                relevant = wanted is None or key in (wanted, live.ALL)
                while not queue.empty():  # everything that piled up is one re-read
                    other = queue.get_nowait()
                    relevant = relevant or other in (wanted, live.ALL)
                if relevant:
                    yield b"event: changed\ndata: {}\n\n"
                    await asyncio.sleep(LIVE_MIN_INTERVAL_S)
                    continue
            if await request.is_disconnected():
                return
            if loop.time() - last_tick >= LIVE_TICK_S:
                last_tick = loop.time()
                yield b": tick\n\n"
                yield b"event: changed\ndata: {}\n\n"

