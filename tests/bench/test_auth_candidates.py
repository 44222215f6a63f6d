"""SEC-2's two NATS-native candidates for node identities, measured beside each other and beside
a server without auth, in one run (docs/security.md, "Candidates measured"):

A. decentralized JWT auth: operator → HP account with a scoped signing key whose template binds
   a user to its node's subjects (``{{tag(cluster)}}``, ``{{tag(node)}}``); node JWTs are issued
   offline; the nats-based ``full`` resolver (and, for revocation, the ``MEMORY`` resolver);
B. auth callout: the server asks a responder (tests/bench/auth_support.py, its own process) on
   ``$SYS.REQ.USER.AUTH``; it verifies the same offline-issued node JWT and answers with a user
   JWT carrying that node's permissions; revocation kicks the live connection by its cid.

What is measured: connect time (mean, p99); server RSS with 10,000 and 100,000 issued
identities and per connected identity; revocation latency (live connection closed, next
connect refused); what each needs at run time. What is asserted (SEC-1, SEC-2): a node cannot
publish another node's subject; issuing needs no restart or reload; issued identities cost
the server nothing; a revoked identity is refused within 10 s.

Run: ``.venv/bin/python -m pytest -q -p no:cacheprovider tests/bench/test_auth_candidates.py
-o addopts="" -o timeout=3600 -s``. Counts can be lowered with HP_BENCH_AUTH_CONNECTS,
HP_BENCH_AUTH_CONNECTIONS and HP_BENCH_AUTH_ISSUED (the last two comma-separated, ascending).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS

from tests.bench import harness

nkeys = pytest.importorskip(
    "nkeys", reason="nkeys is not installed: it is in the bench-only extra, pip install -e '.[bench]'")
from healthplane.stack.keystore import new_pair, public  # noqa: E402
from tests.bench.auth_support import (  # noqa: E402
    REVOKE_SUBJECT,
    CalloutProcess,
    CalloutSecrets,
    Creds,
    Server,
    Trust,
    callout_config,
    config_callout,
    config_jwt,
    config_none,
    node_inbox,
    print_summary,
)

CONNECTS = int(os.environ.get("HP_BENCH_AUTH_CONNECTS", "200"))  # per candidate, timed one by one
# held open at once, level by level (the last is what the machine holds cheaply: one client process)
CONNECTIONS = tuple(int(n) for n in os.environ.get("HP_BENCH_AUTH_CONNECTIONS", "1000,5000").split(","))
ISSUED = tuple(int(n) for n in os.environ.get("HP_BENCH_AUTH_ISSUED", "10000,100000").split(","))
CONNECT_BATCH = 50  # connects in flight at once when opening CONNECTIONS
REVOCATIONS = 5  # per candidate and method
REVOCATION_BOUND_S = 10.0  # SEC-2
CONNECT_TIMEOUT_S = 5.0
SETTLE_S = 1.0
ISSUED_RSS_SLACK_KIB = 4096  # an idle Go server's RSS wanders by a few hundred KiB
BULK_REVOCATIONS = 10_000  # entries in the account JWT when measuring its size and push
CLUSTER = "bench"

results: dict[str, str] = {}  # printed at the end, the figures docs/security.md quotes


async def _quiet(_: Exception) -> None:
    """nats-py's default error callback prints a traceback for every refused connect."""


async def connect(url: str, **options: Any) -> NATS:
    return await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0,
                              connect_timeout=CONNECT_TIMEOUT_S, error_cb=options.pop("error_cb", _quiet),
                              **options)


async def refused(url: str, **options: Any) -> bool:
    try:
        nc = await connect(url, **options)
    except Exception as exc:
        return "authorization violation" in str(exc).lower() or "authentication" in str(exc).lower()
    await nc.close()
    return False


def settled_rss(read: Callable[[], int]) -> int:
    time.sleep(SETTLE_S)
    samples = []
    for _ in range(3):
        samples.append(read())
        time.sleep(0.2)
    return int(statistics.median(samples))


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98] if len(samples) >= 2 else samples[0]


def note(key: str, value: str) -> None:
    results[key] = value
    print(f"  {key}: {value}", flush=True)


# ---------------------------------------------------------------------------- the candidates


@dataclass
class Candidate:
    name: str
    server: Server
    issue: Callable[[str, str], Creds | None]  # (cluster, node) → credentials, offline
    options: Callable[[Creds | None], dict[str, Any]]  # → nats.connect options
    admin: dict[str, Any] = field(default_factory=dict)  # a user allowed everything

    def node_options(self, cluster: str, node: str) -> tuple[Creds | None, dict[str, Any]]:
        creds = self.issue(cluster, node)
        return creds, {**self.options(creds), "inbox_prefix": node_inbox(cluster, node)}


@dataclass
class Bench:
    none: Candidate
    jwt: Candidate
    callout: Candidate
    trust: Trust
    callout_trust: Trust
    callout_secrets: CalloutSecrets
    callout_process: CalloutProcess
    store: Path

    @property
    def all(self) -> tuple[Candidate, ...]:
        return (self.none, self.jwt, self.callout)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    store = tmp_path_factory.mktemp("auth")
    trust, callout_trust, secrets = Trust(), Trust(), CalloutSecrets()
    none = Server("none", store / "none", config_none).start()
    jwt = Server("jwt", store / "jwt", lambda port, s: config_jwt(port, s, trust, "full")).start()
    callout = Server("callout", store / "callout", lambda port, s: config_callout(port, s, secrets)).start()
    process = CalloutProcess(store / "callout-service", callout_config(callout.url, secrets, callout_trust))
    try:
        process.start()
        admin_a, admin_b = trust.service("bench-admin"), callout_trust.service("bench-admin")
        yield Bench(
            none=Candidate("none", none, lambda c, n: None, lambda creds: {}),
            jwt=Candidate("A jwt", jwt, trust.node, lambda creds: creds.connect_options() if creds else {},
                          admin=admin_a.connect_options()),
            callout=Candidate("B callout", callout, callout_trust.node,
                              lambda creds: creds.callout_connect_options() if creds else {},
                              admin=admin_b.callout_connect_options()),
            trust=trust, callout_trust=callout_trust, callout_secrets=secrets, callout_process=process,
            store=store)
    finally:
        process.stop()
        for server in (none, jwt, callout):
            server.stop()
        _print_summary()


def _print_summary() -> None:
    print_summary("SEC-2 candidates (tests/bench/test_auth_candidates.py)", results)


# ---------------------------------------------------------------------------- SEC-1: permissions


@pytest.mark.parametrize("which", ["jwt", "callout"])
async def test_a_node_cannot_publish_for_another_node(bench: Bench, which: str) -> None:
    candidate: Candidate = getattr(bench, which)
    url = candidate.server.url
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    admin = await connect(url, **candidate.admin)
    seen: list[str] = []

    async def on_report(msg: Any) -> None:
        seen.append(msg.subject)

    await admin.subscribe("hp.report.>", cb=on_report)
    await admin.flush(timeout=5)
    js = admin.jetstream()
    await js.add_stream(name="HP_REPORTS", subjects=["hp.report.>"])
    _, options = candidate.node_options(CLUSTER, "n1")
    node = await connect(url, error_cb=on_error, **options)
    try:
        await node.publish(f"hp.report.{CLUSTER}.n1", b"own")
        await node.publish(f"hp.resource.{CLUSTER}.n1", b"own")
        await node.publish(f"hp.report.{CLUSTER}.n2", b"forged")
        await node.publish(f"hp.cmd.{CLUSTER}.n2.drain", b"command")
        await node.subscribe("hp.report.>")
        await node.flush(timeout=5)
        ack = await node.jetstream().publish(f"hp.report.{CLUSTER}.n1", b"own, acked", timeout=5)
        assert ack.stream == "HP_REPORTS"
        deadline = time.monotonic() + 5
        while len(errors) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await admin.flush(timeout=5)
        await asyncio.sleep(0.2)
        violations = [e for e in errors if "permissions violation" in e.lower()]
        assert len(violations) == len(errors) == 3, errors
        assert any(f'publish to "hp.report.{CLUSTER}.n2"' in e for e in violations), errors
        assert any(f'publish to "hp.cmd.{CLUSTER}.n2.drain"' in e for e in violations), errors
        assert any('subscription to "hp.report.>"' in e for e in violations), errors
        assert f"hp.report.{CLUSTER}.n2" not in seen and f"hp.report.{CLUSTER}.n1" in seen
        note(f"{candidate.name}: node publishing another node's subject",
             "refused by the server (-ERR Permissions Violation), as are commands and wildcard reads; "
             "own subjects and the JetStream ack allowed")
    finally:
        await node.close()
        await js.delete_stream("HP_REPORTS")
        await admin.close()


# ---------------------------------------------------------------------------- SEC-2: issuing


@pytest.mark.parametrize("which", ["jwt", "callout"])
async def test_issuing_needs_no_restart_or_reload(bench: Bench, which: str) -> None:
    candidate: Candidate = getattr(bench, which)
    pid = candidate.server.pid
    started = time.perf_counter()
    _, options = candidate.node_options(CLUSTER, f"late-{which}")
    issued_us = (time.perf_counter() - started) * 1e6
    node = await connect(candidate.server.url, **options)
    await node.flush(timeout=5)
    await node.close()
    assert candidate.server.pid == pid and candidate.server.process is not None
    assert candidate.server.process.poll() is None
    assert "Reloaded" not in candidate.server.log.read_text(errors="replace")
    note(f"{candidate.name}: node issued after the server started",
         f"connects; no restart, no reload, server not contacted to issue ({issued_us:,.0f} µs to issue)")


# ---------------------------------------------------------------------------- connect time


async def test_connect_time(bench: Bench) -> None:
    """One connect at a time (TCP, INFO, CONNECT, PING/PONG: nats.connect returns after the
    server accepted), the three candidates taking turns so that load on the machine falls on all."""
    samples: dict[str, list[float]] = {c.name: [] for c in bench.all}
    options = {c.name: c.node_options(CLUSTER, "timing")[1] for c in bench.all}
    for round_number in range(CONNECTS + 10):
        for candidate in bench.all:
            started = time.perf_counter()
            nc = await connect(candidate.server.url, **options[candidate.name])
            elapsed = time.perf_counter() - started
            await nc.close()
            if round_number >= 10:  # warm-up
                samples[candidate.name].append(elapsed * 1e3)
    base = statistics.fmean(samples["none"])
    for candidate in bench.all:
        mean, tail = statistics.fmean(samples[candidate.name]), p99(samples[candidate.name])
        harness.record(f"auth connect mean, {candidate.name}", mean, "ms", baseline=base)
        note(f"{candidate.name}: connect mean / p99 ({CONNECTS} connects)", f"{mean:.2f} / {tail:.2f} ms")


# ---------------------------------------------------------------------------- issued identities


def test_issued_identities_cost_the_server_nothing(bench: Bench) -> None:
    """Issuing is offline: the server (and B's callout) are never told. RSS read before and
    after issuing; the resolver's directory is not touched either."""
    jwt_dir = bench.jwt.server.store / "jwt"
    files_before = sorted(p.name for p in jwt_dir.iterdir())
    readers = {"A jwt server": bench.jwt.server.rss_kib, "B callout server": bench.callout.server.rss_kib,
               "B callout service": bench.callout_process.rss_kib}
    before = {name: settled_rss(read) for name, read in readers.items()}
    issued, jwt_bytes, started = 0, 0, time.perf_counter()
    for target in ISSUED:
        while issued < target:
            jwt_bytes += len(bench.trust.node(CLUSTER, f"n{issued:06d}").jwt)
            issued += 1
        elapsed = time.perf_counter() - started
        after = {name: settled_rss(read) for name, read in readers.items()}
        for name in readers:
            delta = after[name] - before[name]
            harness.record(f"auth RSS delta, {issued:,} issued, {name}", delta, "KiB",
                           target=f"value <= {ISSUED_RSS_SLACK_KIB}")
            note(f"{name}: RSS with {issued:,} issued identities",
                 f"{after[name] / 1024:.1f} MiB (before {before[name] / 1024:.1f} MiB, Δ {delta:+,} KiB)")
            assert delta <= ISSUED_RSS_SLACK_KIB, f"{name}: {delta} KiB after issuing {issued}"
        note(f"issuing {issued:,} node credentials (one process, offline)",
             f"{elapsed:.1f} s, {elapsed / issued * 1e6:.0f} µs each, JWT {jwt_bytes / issued:.0f} B each")
    assert sorted(p.name for p in jwt_dir.iterdir()) == files_before


# ---------------------------------------------------------------------------- connected identities


async def _open(candidate: Candidate, first: int, count: int) -> tuple[list[NATS], float]:
    """``count`` more distinct node identities connected, CONNECT_BATCH in flight."""
    options = [candidate.node_options(CLUSTER, f"c{i:06d}")[1] for i in range(first, first + count)]
    clients: list[NATS] = []
    started = time.perf_counter()
    for at in range(0, count, CONNECT_BATCH):
        batch = options[at:at + CONNECT_BATCH]
        clients += await asyncio.gather(*(connect(candidate.server.url, **o) for o in batch))
    return clients, time.perf_counter() - started


async def _close_all(clients: list[NATS]) -> None:
    for at in range(0, len(clients), CONNECT_BATCH):
        await asyncio.gather(*(c.close() for c in clients[at:at + CONNECT_BATCH]))


async def test_connected_identities(bench: Bench) -> None:
    """Each candidate in turn holds CONNECTIONS (each level in turn) distinct node identities
    open: server RSS per connection, server CPU per connect (and B's callout's), connects/s."""
    per_conn: dict[str, float] = {}
    for candidate in bench.all:
        before = settled_rss(candidate.server.rss_kib)
        callout_before = settled_rss(bench.callout_process.rss_kib)
        clients: list[NATS] = []
        opening_s = 0.0
        cpu_before = candidate.server.cpu_s(), bench.callout_process.cpu_s()
        try:
            for level in CONNECTIONS:
                more, elapsed = await _open(candidate, len(clients), level - len(clients))
                clients += more
                opening_s += elapsed
                after = settled_rss(candidate.server.rss_kib)
                per_conn[candidate.name] = (after - before) / level
                note(f"{candidate.name}: server RSS, {level:,} node identities connected",
                     f"{after / 1024:.1f} MiB (idle {before / 1024:.1f} MiB), "
                     f"{per_conn[candidate.name]:.1f} KiB per connection")
                if candidate is bench.callout:
                    note(f"B callout service: RSS with {level:,} connected",
                         f"{settled_rss(bench.callout_process.rss_kib) / 1024:.1f} MiB "
                         f"(idle {callout_before / 1024:.1f} MiB; holds the live cids it may have to kick)")
            total = len(clients)
            server_cpu = (candidate.server.cpu_s() - cpu_before[0]) / total * 1e6
            note(f"{candidate.name}: opening {total:,} connections, {CONNECT_BATCH} in flight",
                 f"{total / opening_s:,.0f} connects/s; server CPU {server_cpu:,.0f} µs per connect")
            harness.record(f"auth server CPU per connect, {candidate.name}", server_cpu, "µs")
            harness.record(f"auth connects/s ({CONNECT_BATCH} in flight), {candidate.name}",
                           total / opening_s, "conn/s")
            if candidate is bench.callout:
                callout_cpu = (bench.callout_process.cpu_s() - cpu_before[1]) / total * 1e6
                note("B callout service: CPU per connect", f"{callout_cpu:,.0f} µs (Python, one process)")
                harness.record("auth callout service CPU per connect", callout_cpu, "µs")
        finally:
            await _close_all(clients)
    for name, value in per_conn.items():
        harness.record(f"auth server RSS per connection at {CONNECTIONS[-1]:,}, {name}", value, "KiB",
                       baseline=per_conn["none"])


# ---------------------------------------------------------------------------- revocation


async def _revocation_round(url: str, options: dict[str, Any],
                            revoke: Callable[[], Awaitable[None]]) -> tuple[float, float, bool]:
    """(s until the live connection is closed, s until a new connect has been refused, refused)."""
    closed_at: list[float] = []

    async def on_closed() -> None:
        closed_at.append(time.perf_counter())

    node = await connect(url, closed_cb=on_closed, **options)
    await node.flush(timeout=5)
    started = time.perf_counter()
    await revoke()
    deadline = started + REVOCATION_BOUND_S
    while not closed_at and time.perf_counter() < deadline:
        await asyncio.sleep(0.005)
    kicked = (closed_at[0] if closed_at else time.perf_counter()) - started
    if not closed_at:
        await node.close()
        kicked = float("inf")
    was_refused = await refused(url, **options)
    return kicked, time.perf_counter() - started, was_refused


def _report_revocation(name: str, rounds: list[tuple[float, float, bool]], assert_bound: bool) -> None:
    kicked = [r[0] for r in rounds]
    refused_after = [r[1] for r in rounds]
    all_refused = all(r[2] for r in rounds)
    worst = max(kicked)
    shown = "never (within 10 s)" if worst == float("inf") else f"max {worst * 1e3:.1f} ms (mean {statistics.fmean(kicked) * 1e3:.1f})"
    note(f"{name}: revocation → live connection closed ({len(rounds)} rounds)", shown)
    note(f"{name}: revocation → next connect refused",
         f"{'yes' if all_refused else 'NO'}, max {max(refused_after) * 1e3:.1f} ms")
    if worst != float("inf"):
        harness.record(f"auth revocation to disconnect, {name}", worst * 1e3, "ms",
                       target=f"value <= {REVOCATION_BOUND_S * 1e3:.0f}")
    if assert_bound:
        assert worst <= REVOCATION_BOUND_S, f"{name}: live connection not closed within 10 s"
        assert all_refused, f"{name}: a revoked identity connected again"


async def test_revocation_jwt_full_resolver(bench: Bench) -> None:
    """A: re-sign the account JWT with the user's key in ``revocations`` and push it with the
    system account (``$SYS.REQ.CLAIMS.UPDATE``); the full resolver stores it, the server
    closes the live connection. Then: still refused after a restart with the same config."""
    server, trust = bench.jwt.server, bench.trust
    system = await connect(server.url, **trust.system_user().connect_options())
    revoked: list[tuple[Creds, dict[str, Any]]] = []
    try:
        rounds = []
        for i in range(REVOCATIONS):
            creds, options = bench.jwt.node_options(CLUSTER, f"revoked-{i}")
            assert creds is not None

            async def revoke(creds: Creds = creds) -> None:
                reply = await system.request("$SYS.REQ.CLAIMS.UPDATE", trust.revoke(creds.public_key).encode(), timeout=5)
                assert b'"code":200' in reply.data.replace(b" ", b""), reply.data

            rounds.append(await _revocation_round(server.url, options, revoke))
            revoked.append((creds, options))
        _report_revocation("A jwt, full resolver, $SYS.REQ.CLAIMS.UPDATE", rounds, assert_bound=True)

        bulk = Trust(operator=trust.operator, system=trust.system, account=trust.account,
                     service_signer=trust.service_signer, node_signer=trust.node_signer,
                     revocations={**trust.revocations})
        now = int(time.time())
        for _ in range(BULK_REVOCATIONS):
            bulk.revocations[public(new_pair(nkeys.PREFIX_BYTE_USER))] = now
        big = bulk.account_jwt()
        started = time.perf_counter()
        reply = await system.request("$SYS.REQ.CLAIMS.UPDATE", big.encode(), timeout=10)
        pushed_ms = (time.perf_counter() - started) * 1e3
        assert b'"code":200' in reply.data.replace(b" ", b""), reply.data
        trust.revocations = bulk.revocations
        note(f"A jwt: account JWT with {len(bulk.revocations):,} revocations",
             f"{len(big) / 1024:.0f} KiB ({len(big) / len(bulk.revocations):.0f} B per revocation), "
             f"pushed and applied in {pushed_ms:.0f} ms")
    finally:
        await system.close()

    # the config still preloads the first account JWT: the stored, newer one must win
    server.stop()
    server.start(write_config=False)
    still_refused = all([await refused(server.url, **o) for _, o in revoked])
    note("A jwt, full resolver: revoked identity after a restart (config unchanged, first JWT preloaded)",
         "still refused: the resolver directory keeps the newer account JWT" if still_refused else "ADMITTED")
    assert still_refused


async def test_revocation_jwt_memory_resolver(bench: Bench) -> None:
    """A with ``resolver: MEMORY``: a pushed account JWT (``$SYS.REQ.ACCOUNT.<id>.CLAIMS.UPDATE``)
    applies at once but is lost at restart; the lasting way is the config's preload and a reload."""
    trust = Trust()
    server = Server("jwt-memory", bench.store / "jwt-memory", lambda port, s: config_jwt(port, s, trust, "memory")).start()
    try:
        system = await connect(server.url, **trust.system_user().connect_options())
        subject = f"$SYS.REQ.ACCOUNT.{public(trust.account)}.CLAIMS.UPDATE"
        pushed, pushed_options = [], []
        for i in range(REVOCATIONS):
            creds = trust.node(CLUSTER, f"mem-push-{i}")
            options = {**creds.connect_options(), "inbox_prefix": node_inbox(CLUSTER, f"mem-push-{i}")}

            async def push(creds: Creds = creds) -> None:
                # the config is left alone: this change lives in memory only
                jwt = trust.revoke(creds.public_key)
                reply = await system.request(subject, jwt.encode(), timeout=5)
                assert b'"code":200' in reply.data.replace(b" ", b""), reply.data

            pushed.append(await _revocation_round(server.url, options, push))
            pushed_options.append(options)
        _report_revocation("A jwt, MEMORY resolver, pushed (not persisted)", pushed, assert_bound=True)
        await system.close()

        # a restart with the config as it is: the pushes never reached it
        server.stop()
        server.start(write_config=False)
        admitted = [not await refused(server.url, **o) for o in pushed_options]
        note("A jwt, MEMORY resolver: pushed revocation after a restart",
             "lost: the revoked identity connects again" if all(admitted) else f"kept ({admitted})")

        # lasting: rewrite the preload and reload (Server.reload writes the config from trust)
        reloaded = []
        for i in range(REVOCATIONS):
            creds = trust.node(CLUSTER, f"mem-reload-{i}")
            options = {**creds.connect_options(), "inbox_prefix": node_inbox(CLUSTER, f"mem-reload-{i}")}

            async def reload(creds: Creds = creds) -> None:
                trust.revoke(creds.public_key)
                server.reload()

            reloaded.append(await _revocation_round(server.url, options, reload))
        _report_revocation("A jwt, MEMORY resolver, preload rewritten + config reload", reloaded, assert_bound=True)
    finally:
        server.stop()


async def test_revocation_callout(bench: Bench) -> None:
    """B: the callout refuses the next connect at once; the live connection is kicked through
    the system account (``$SYS.REQ.SERVER.<id>.KICK`` with the cid the callout saw)."""
    control = await connect(bench.callout.server.url,
                            nkeys_seed_str=bytes(bench.callout_secrets.auth_user.seed).decode())
    try:
        rounds = []
        for i in range(REVOCATIONS):
            creds, options = bench.callout.node_options(CLUSTER, f"revoked-{i}")
            assert creds is not None

            async def revoke(creds: Creds = creds) -> None:
                reply = await control.request(REVOKE_SUBJECT, creds.public_key.encode(), timeout=5)
                assert b'"kicked": 1' in reply.data, reply.data

            rounds.append(await _revocation_round(bench.callout.server.url, options, revoke))
        _report_revocation("B callout, refuse + KICK", rounds, assert_bound=True)
    finally:
        await control.close()


# ---------------------------------------------------------------------------- run-time dependencies


async def test_run_time_dependencies(bench: Bench) -> None:
    """A needs the server alone (the resolver is inside it). B needs the callout for every
    connect: with it down, a connected node stays connected, a new connect is refused once
    the server's callout timeout passes."""
    _, a_options = bench.jwt.node_options(CLUSTER, "dep-a")
    a_node = await connect(bench.jwt.server.url, **a_options)
    await a_node.close()
    note("A jwt: run-time dependencies", "nats-server only (full resolver: its own directory; "
         "revocation: any holder of the operator key + a system-account user)")

    _, live_options = bench.callout.node_options(CLUSTER, "dep-live")
    live = await connect(bench.callout.server.url, **live_options)
    bench.callout_process.stop()
    try:
        _, new_options = bench.callout.node_options(CLUSTER, "dep-new")
        started = time.perf_counter()
        was_refused = await refused(bench.callout.server.url, **new_options)
        waited = time.perf_counter() - started
        await live.publish(f"hp.report.{CLUSTER}.dep-live", b"still here")
        await live.flush(timeout=5)
        note("B callout: callout service down",
             f"new connect {'refused' if was_refused else 'ADMITTED'} after {waited:.2f} s "
             "(the server's callout timeout); connected nodes stay connected")
        assert was_refused
    finally:
        await live.close()
        bench.callout_process.start()
    _, again = bench.callout.node_options(CLUSTER, "dep-again")
    nc = await connect(bench.callout.server.url, **again)
    await nc.close()
    note("B callout: run-time dependencies",
         "nats-server + the callout service (up for every connect, its keys online) + system account for kicks")
