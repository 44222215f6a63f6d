"""Identities for what a test starts (SEC-1): each service its own credentials, so the
suite runs every service with exactly the permissions it ships with."""

from __future__ import annotations

import os

from healthplane.stack.natsserver import NatsCluster, NatsServer


def creds_for(server: NatsServer | NatsCluster, role: str, name: str | None = None) -> str | None:
    """The credentials file of ``role`` on ``server`` (issued once per test); ``None`` on an
    insecure server. ``name`` names a person (roles admin, viewer) or the cluster (sim)."""
    keystore = server.keystore
    if keystore is None:
        return None
    path = server.store_dir.parent / f"{role}-{(name or 'default').replace('/', '_')}.creds"
    if not path.exists():
        if role in ("admin", "viewer"):
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
