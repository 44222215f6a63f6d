"""``healthplane service api``: the HTTP API and the web UI (API-1..5), wiring only.

The routes are ``app``, the live index ``live``/``fold``, who may do what ``auth``. The
process reads with its own identity (the ``api`` service: read-only, every stream) and
commands only as the caller. uvicorn serves the app on this service's event loop; the
signals stay ``runtime.lifecycle``'s, so a stop is the same as every service's.
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from datetime import UTC, datetime

import pydantic
import uvicorn

from healthplane.client import federation
from healthplane.runtime.lifecycle import ServiceContext
from healthplane.runtime.settings import EnvSettings
from healthplane_api import auth, members
from healthplane_api.metrics import FEDERATION_DATA_AGE, FEDERATION_LAG, FEDERATION_REACHABLE

SERVICE = "api"


class Settings(EnvSettings):
    host: str = pydantic.Field("127.0.0.1", alias="API_HOST")
    port: int = pydantic.Field(8780, ge=0, le=65535, alias="API_PORT")
    federation_hub: bool = pydantic.Field(False, alias="FEDERATION_HUB")  # `up --federation-hub` sets it
    # UI-4: Grafana's base URL (e.g. https://grafana.example/); the node page links to the
    # node's panels of the Node Reliability dashboard there. Unset: no links.
    grafana_url: str | None = pydantic.Field(None, alias="API_GRAFANA_URL")

    @pydantic.field_validator("grafana_url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("an http:// or https:// URL")
        return value


class _Embedded(uvicorn.Server):
    """uvicorn on a loop it does not own: the process's signals are lifecycle's."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield




def _listen(host: str, port: int) -> socket.socket:
    listening = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart takes its port back at once
    listening.bind((host, port))
    listening.listen(1024)
    listening.setblocking(False)
    return listening


async def _sweep(callers: auth.Callers, stopping: asyncio.Event) -> None:
    while not stopping.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), 30.0)
        await callers.sweep()


MEMBERS_EVERY_S = 2.0


class MembersWatched:
    """The hub's member history (UI-5) as the last look left it (the watch's or a reader's)."""

    def __init__(self) -> None:
        self.history = members.History()


async def _watch_members(ctx: ServiceContext, threshold: float, watched: MembersWatched | None = None) -> None:
    """A hub's view of its members, as series, as a log line when one comes or goes (FED-2),
    and as each member's reachability history (UI-5)."""
    reachable: dict[str, bool] = {}
    while not ctx.stopping.is_set():
        try:
            found = await federation.members(ctx.nc)
        except (federation.FederationError, TimeoutError, ConnectionError) as exc:
            ctx.log.warning("federation members not read", error=str(exc))
            found = None
        if found is not None:
            now = datetime.now(UTC)
            if watched is not None:
                watched.history = members.observe(watched.history, found, now, threshold)
            for gone in set(reachable) - {m.name for m in found}:
                for gauge in (FEDERATION_REACHABLE, FEDERATION_DATA_AGE, FEDERATION_LAG):
                    gauge.remove(gone)
                del reachable[gone]
            for member in found:
                now_reachable = member.reachable(now, threshold)
                if reachable.get(member.name) != now_reachable:
                    if now_reachable:
                        ctx.log.info("federation member reachable", cluster=member.name)
                    else:
                        ctx.log.warning("federation member unreachable", cluster=member.name,
                                        reason=member.why_no_health())
                reachable[member.name] = now_reachable
                FEDERATION_REACHABLE.labels(member.name).set(1 if now_reachable else 0)
                FEDERATION_LAG.labels(member.name).set(member.lag)
                age = member.data_age_s(now)
                FEDERATION_DATA_AGE.labels(member.name).set(float("inf") if age is None else age)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ctx.stopping.wait(), MEMBERS_EVERY_S)
