"""Shared fixtures: a real nats-server per test on a free loopback port with a temporary
store, stopped by pid. Never a mocked bus.

Every server runs secure (SEC-1, issue 18): operator mode with the keys of a fresh
``creds`` keystore. The CLI and services a test starts connect as an admin
(``HEALTHPLANE_NATS_CREDS``) unless the test gives them their own identity with
``tests.support.secure``; the test's own ``nc`` is a maintainer's (it makes the streams and
puts the records a test plays), its ``admin`` fixture an admin's (config, commands).
``@pytest.mark.insecure`` runs a test without auth.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.runtime import converge, heap
from healthplane.runtime.connect import connect
from healthplane.stack.keystore import Keystore
from healthplane.stack.natsserver import NatsCluster, NatsServer
from tests.support.secure import creds_for
from tests.support.slurm import slurm  # noqa: F401  (fixture)

# Hypothesis's per-example deadline is a timing test: on a 2-core machine shared by four workers an
# example that takes 0.35 ms alone once took 345 ms (UI-3's paging property, a full run). Figures
# are for benchmarks; here an example may take what it takes.
settings.register_profile("healthplane", deadline=None)
settings.load_profile("healthplane")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "insecure: the test's nats-server runs without authentication")


@pytest.fixture(autouse=True)
def _shared_empty_stays_empty() -> Iterator[None]:
    """heap.EMPTY is the empty field of every record in every fold's state that has nothing
    there: a fold that changed it in place would have changed all of them at once."""
    yield
    leaked = dict(heap.EMPTY)
    heap.EMPTY.clear()  # so that one such fold fails its own tests, not every later one
    assert not leaked, f"a fold changed heap.EMPTY, every record's shared empty field, in place: {leaked!r}"


@pytest.fixture
def keystore(tmp_path: Path) -> Keystore:
    return Keystore.init(tmp_path / "creds")


@pytest.fixture
def nats_server(tmp_path: Path, keystore: Keystore, monkeypatch: pytest.MonkeyPatch,
                request: pytest.FixtureRequest) -> Iterator[NatsServer]:
    secure = request.node.get_closest_marker("insecure") is None
    monkeypatch.delenv("HEALTHPLANE_NATS_CREDS", raising=False)
    if secure:
        monkeypatch.setenv("HEALTHPLANE_NATS_CREDS", str(keystore.user("test", "admin", tmp_path / "test-admin.creds")))
    server = NatsServer(tmp_path / "nats", keystore=keystore if secure else None).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def cluster(tmp_path: Path, keystore: Keystore, monkeypatch: pytest.MonkeyPatch) -> Iterator[NatsCluster]:
    """Three secure nats-servers routed to each other (HA: every stream R3), the test's
    processes an admin of them."""
    monkeypatch.setenv("HEALTHPLANE_NATS_CREDS", str(keystore.user("test", "admin", tmp_path / "test-admin.creds")))
    servers = NatsCluster(tmp_path / "nats", keystore=keystore).start()
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[NATS]:
    """The test's hands on the bus: the maintainer's (SEC-10: it makes the streams and may put
    any record a test plays, as a dead-letter replay would). What only the admin may do (apply
    config, command as a person) goes through ``admin``."""
    client = await connect(nats_server.url, name="test", creds=creds_for(nats_server, "maintainer", "test"),
                           give_up_after=5)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def js(nc: NATS) -> JetStreamContext:
    context = nc.jetstream()
    await converge.ensure(context)
    return context


@pytest.fixture
async def admin(nats_server: NatsServer) -> AsyncIterator[JetStreamContext]:
    """An admin's JetStream (``test``, the identity the CLI this test starts inherits): config
    and commands."""
    client = await connect(nats_server.url, name="test-admin", give_up_after=5)
    try:
        yield client.jetstream()
    finally:
        await client.close()
