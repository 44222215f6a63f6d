"""Identities for what a test starts (SEC-1): each service its own credentials, so the
suite runs every service with exactly the permissions it ships with."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from nats.js import JetStreamContext

from healthplane.contracts.config import ClusterConfig
from healthplane.runtime import configstore, nats_internals
from healthplane.runtime.connect import connect
from healthplane.stack.natsserver import NatsCluster, NatsServer


def creds_for(server: NatsServer | NatsCluster, role: str, name: str | None = None) -> str | None:
    """The credentials file of ``role`` on ``server`` (issued once per test); ``None`` on an
    insecure server. ``name`` names a person (roles admin, viewer) or the cluster (sim)."""
    keystore = server.keystore
    if keystore is None:
        return None
    path = server.store_dir.parent / f"{role}-{(name or 'default').replace('/', '_')}.creds"
    if not path.exists():
        if role in ("admin", "viewer", "maintainer", "subscriber"):
            keystore.user(name or role, role, path)
        elif role == "sim":
            keystore.sim(name or "default", path)
        elif role == "collector":  # name: "cluster/node"
            cluster, _, node = (name or "default/node").partition("/")
            keystore.node(node, cluster, path)
        else:
            keystore.service(role, path)
    return str(path)


def env_for(server: NatsServer | NatsCluster, role: str, name: str | None = None, **extra: str) -> dict[str, str]:
    """A child process's environment: this server, this identity, nothing of the test's own."""
    # One instance name per role: a service a test kills and starts again takes its lease
    # back at once (runtime.lease); a second replica alongside passes its own.
    env = {**os.environ, "HEALTHPLANE_NATS_URL": server.url, "HEALTHPLANE_LOG_FORMAT": "json",
           "HEALTHPLANE_INSTANCE": f"test-{role}", **extra}
    env.pop("HEALTHPLANE_NATS_CREDS", None)
    creds = creds_for(server, role, name)
    if creds is not None:
        env["HEALTHPLANE_NATS_CREDS"] = creds
    return env


@asynccontextmanager
async def as_admin(js: JetStreamContext) -> AsyncIterator[JetStreamContext]:
    """The same server as ``js``, as the test's admin (``HEALTHPLANE_NATS_CREDS``): what only
    an admin may do, apply config or command as a person (SEC-10: the test's own connection
    is a maintainer's). On an open server, ``js`` itself."""
    creds = os.environ.get("HEALTHPLANE_NATS_CREDS")
    if not creds:
        yield js
        return
    nc = nats_internals.connection_of(js)
    admin = await connect(nc.connected_url.geturl() if nc.connected_url else None, name="test-admin", creds=creds,
                          give_up_after=5)
    try:
        yield admin.jetstream()
    finally:
        await admin.close()


async def apply_config(js: JetStreamContext, config: ClusterConfig, actor: str = "test") -> int:
    """``configstore.apply`` as the test's admin (applying config is the admin's, SEC-10)."""
    async with as_admin(js) as admin:
        return await configstore.apply(admin, config, actor=actor)


async def publish_as_admin(js: JetStreamContext, subject: str, payload: bytes) -> None:
    """One record only an admin may put (a config, a command as a person, SEC-10)."""
    async with as_admin(js) as admin:
        await admin.publish(subject, payload, timeout=5)
