"""Shared fixtures: a real nats-server per test on a free loopback port with a temporary
store, stopped by pid. Never a mocked bus."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane import streams
from healthplane.natsserver import NatsServer
from healthplane.runtime.connect import connect


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "nats").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[NATS]:
    client = await connect(nats_server.url, name="test", give_up_after=5)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def js(nc: NATS) -> JetStreamContext:
    context = nc.jetstream()
    await streams.ensure(context)
    return context
