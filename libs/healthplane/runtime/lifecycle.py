"""Running one service process: logs, metrics endpoint, connection, streams, signals.

``run_service`` is the one entry point every ``healthplane service NAME`` goes through.
SIGTERM/SIGINT set ``ctx.stopping``; the service finishes the batch in hand, acks,
snapshots and returns, and the process exits 0.

``serve_replicated`` is how every service runs twice safely (HA-3): each replica competes
for the service's lease (``runtime.lease``); the holder builds its runners (a Processor
restored from the latest snapshot, a consumer loop) and runs them, the others wait as warm
standbys, retrying every half second so that a holder killed with -9 is replaced as soon as
its lease expires. A holder whose lease lapses, or whose write the server's fence refuses
(``runtime.fencing``), stops its runners, writes nothing more, and waits to lead again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from nats import errors as nats_errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import APIError, ServiceUnavailableError
from prometheus_client.registry import Collector

from healthplane.contracts import streams, subjects
from healthplane.runtime import connect, converge, gzipped, logs, metrics, telemetry
from healthplane.runtime.fold import Core, Input
from healthplane.runtime.lease import ROUND_TIMEOUT_S, Lease, Presence, instance_name, ttl_in_force
from healthplane.runtime.processor import LeaseLost, Processor
from healthplane.runtime.settings import EnvSettings, SettingsError

S = TypeVar("S")


@dataclass
class ServiceContext:
    name: str
    nc: NATS
    js: JetStreamContext
    log: Any
    metrics_url: str
    stopping: asyncio.Event
    settings: Any = None  # the service's EnvSettings, read once at start (``run_service(settings=)``)


ServiceMain = Callable[[ServiceContext], Awaitable[None]]

# A service exits with this when a port it was told to listen on is taken (EADDRINUSE): a
# supervisor that picked the port itself (``healthplane up``) picks another and starts it again.
EXIT_PORT_IN_USE = 98


def port_in_use(exc: OSError) -> int:
    """The exit status for a failed listen: EXIT_PORT_IN_USE for a port taken, else 1."""
    return EXIT_PORT_IN_USE if exc.errno == errno.EADDRINUSE else 1


async def _run(name: str, main: ServiceMain, nats_url: str | None, creds: str | None,
               metrics_port: int, settings: EnvSettings | None) -> int:
    log = logs.configure(name)
    if settings is not None:
        log.info("settings", **settings.model_dump())
    telemetry.start(name, log)  # INT-4: nothing unless HEALTHPLANE_OTEL=1; before any Processor is built
    # Not ready until the service says what it waits for: /readyz answers from the moment the
    # endpoint listens, before the connection and any replay.
    metrics.readiness(name, lambda: (False, "starting"))
    try:
        endpoint = metrics.serve(metrics_port)
    except OSError as exc:
        log.error("metrics endpoint cannot listen", port=metrics_port, error=str(exc))
        return port_in_use(exc)
    log.info("metrics endpoint", url=endpoint.url)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    closed = asyncio.Event()
    nc = await connect.connect(nats_url, name=f"healthplane-{name}", creds=creds, log=log, closed=closed)
    js = nc.jetstream(publish_async_max_pending=8192)
    lost = asyncio.create_task(_closed_for_good(closed, stopping))
    alive = asyncio.create_task(metrics.keep_alive())  # /healthz: the loop turns
    try:
        # Existing streams keep the replicas their operator chose; missing ones get R3 on a
        # cluster, R1 on one server (HA-1).
        await converge.ensure(js, servers=len(nc.servers))
        ctx = ServiceContext(name, nc, js, log, endpoint.url, stopping, settings)
        log.info("service started", nats_url=nats_url or connect.default_url())
        await main(ctx)
    finally:
        lost.cancel()
        alive.cancel()
        await let_go(nc)
        await asyncio.to_thread(telemetry.shutdown)  # the last spans and node events, flushed
    if nc.is_closed and lost.done() and not lost.cancelled() and lost.result():
        # The server closed it and nats-py will not reconnect (a revoked identity): exit so
        # the supervisor says so, instead of running on with no bus.
        log.error("service stopped: the server closed the connection", error=str(nc.last_error or ""))
        return 1
    log.info("service stopped")
    return 0


DRAIN_TIMEOUT_S = 2.0


async def let_go(nc: NATS) -> None:
    """Drain the connection (what was published is flushed, subscriptions end cleanly) when
    there is a server to drain to; with none (it went away, we are reconnecting) close it:
    a stop must not wait for a bus that may never come back."""
    if nc.is_closed:
        return
    try:
        if nc.is_connected:
            await asyncio.wait_for(nc.drain(), DRAIN_TIMEOUT_S)
            return
    except (TimeoutError, nats_errors.Error):
        pass
    try:
        await nc.close()
    except OSError:
        pass  # the transport is gone already: nothing left to close cleanly


async def _closed_for_good(closed: asyncio.Event, stopping: asyncio.Event) -> bool:
    await closed.wait()
    stopping.set()
    return True


def run_service(name: str, main: ServiceMain, *, nats_url: str | None = None,
                creds: str | None = None, metrics_port: int = 0,
                settings: type[EnvSettings] | None = None) -> int:
    """``healthplane service NAME``: its ``settings`` read from the environment first (a bad
    variable is one line naming it, exit 2, before anything starts), then ``main`` on a
    connection with the streams ensured, until a signal."""
    try:
        given = settings.from_env(os.environ) if settings is not None else None
    except SettingsError as exc:
        print(f"healthplane service {name}: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(name, main, nats_url, creds, metrics_port, given))
    except converge.StreamConflict as exc:
        logs.get(service=name).error("cannot start", reason=str(exc))
        return 1
    except (nats_errors.Error, APIError) as exc:
        # The bus went away or refused what the service needs (no answer past every retry):
        # one line, and the supervisor (systemd, `up`) starts it again.
        logs.get(service=name).error("stopped: the bus did not answer", reason=str(exc) or type(exc).__name__)
        return 1


async def until_stopped(ctx: ServiceContext, *runners: Any) -> None:
    """Run processors (anything with ``run()``/``stop()``) until a signal arrives."""
    tasks = [asyncio.create_task(r.run()) for r in runners]
    waiter = asyncio.create_task(ctx.stopping.wait())
    await asyncio.wait([*tasks, waiter], return_when=asyncio.FIRST_COMPLETED)
    for runner in runners:
        runner.stop()
    await asyncio.gather(*tasks)
    waiter.cancel()


class Runner(Protocol):
    async def run(self) -> None: ...

    def stop(self) -> None: ...


async def serve_replicated(ctx: ServiceContext, lease_name: str,
                           lead: Callable[[Lease], Awaitable[Sequence[Runner]]], *,
                           wanted: Callable[[], bool] | None = None,
                           disowned: Callable[[], Coroutine[Any, Any, None]] | None = None,
                           rides_out: bool = False) -> None:
    """Run what ``lead`` builds while this replica holds ``lease_name``; stand by otherwise.
    ``lead`` gets the lease to fence its writes with (``Processor(fence=lease.fence)``) and
    returns its runners, already started; they are stopped when the lease is lost
    (``rides_out``: runners that wait on the fence themselves are not stopped while it is only
    closed, runtime.lease).

    ``wanted`` (a partition's owner, HA-4): the lease is taken only while it says so; once it
    stops saying so (``disowned`` returns) the runners are stopped first (their last snapshot goes out under the
    lease) and then the lease is released, so the replica it now belongs to takes it at once."""
    leading, lost = asyncio.Event(), asyncio.Event()

    def on_change(leader: bool) -> None:
        (leading if leader else lost).set()

    rounds = ctx.nc.jetstream(timeout=ROUND_TIMEOUT_S)
    while True:
        try:
            ttl_s = await ttl_in_force(rounds)
            break
        except Exception as exc:  # the bucket's raft group electing at start: no TTL to guess
            ctx.log.warning("lease bucket not answering, trying again", lease=lease_name, error=str(exc) or type(exc).__name__)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ctx.stopping.wait(), 1.0)
            if ctx.stopping.is_set():
                return
    lease = Lease(rounds, lease_name, instance_name(), ttl_s=ttl_s, on_change=on_change,
                  log=ctx.log, wanted=wanted, rides_out=rides_out, nc=ctx.nc)
    # The lease is renewed until the runners have stopped: their last snapshot goes out under
    # it (a lease released at the signal, before the snapshot, would fence the snapshot off).
    released = asyncio.Event()
    holder = asyncio.create_task(lease.run(released))
    try:
        while not ctx.stopping.is_set():
            if not lease.is_leader and not await _first(leading, ctx.stopping):
                break
            leading.clear()
            lost.clear()
            try:
                runners = await lead(lease)
                tasks = [asyncio.create_task(r.run()) for r in runners]
                waiters: list[asyncio.Task[Any]] = [asyncio.create_task(lost.wait()),
                                                    asyncio.create_task(ctx.stopping.wait())]
                if disowned is not None:
                    waiters.append(asyncio.create_task(disowned()))
                await asyncio.wait([*tasks, *waiters], return_when=asyncio.FIRST_COMPLETED)
                for runner in runners:
                    runner.stop()
                for waiter in waiters:
                    waiter.cancel()
                results = await asyncio.gather(*tasks, return_exceptions=True)
                if wanted is not None and not wanted() and not ctx.stopping.is_set():
                    ctx.log.info("partition handed over", lease=lease_name)
                    await lease.release()
                for result in results:
                    if isinstance(result, _BUS_BUSY):
                        raise result  # handled below: lead again while the lease holds
                    if isinstance(result, BaseException) and not isinstance(result, LeaseLost):
                        raise result
            except LeaseLost:
                pass
            except _BUS_BUSY as exc:
                # JetStream busy electing leaders after a server loss (a takeover, or a runner's
                # snapshot): tried again while the lease holds, not given up with the process.
                ctx.log.warning("taking over failed, trying again", lease=lease_name, error=str(exc) or type(exc).__name__)
                await _first(lost, ctx.stopping, timeout_s=1.0)
                continue
            if not ctx.stopping.is_set() and (wanted is None or wanted()):
                ctx.log.warning("not leading: stopped writing, standing by", lease=lease_name)
                await _first(lost, ctx.stopping, timeout_s=lease.ttl_s)  # the lapse, if it has not come
    finally:
        if not ctx.stopping.is_set():  # leaving on an error: nothing else would stop the holder
            holder.cancel()
            await lease.release()
        released.set()
        with contextlib.suppress(asyncio.CancelledError):
            await holder


MEMBERS_EVERY_S = 1.0


def owner(partition: int, live: Sequence[str]) -> str:
    """Which of the ``live`` replicas (in name order) owns ``partition``: every replica that
    sees the same members computes the same owner, and the shares differ by one at most."""
    return live[partition % len(live)]


class Members:
    """The live replicas of a partitioned service (HA-4), and which partitions are whose.

    Each replica puts a key in the leases bucket every ``MEMBERS_EVERY_S`` (``{service}.members.
    {instance}``, its value the P it runs with); the bucket's TTL removes the key of one that
    died. Partition ``k`` belongs to the ``k mod M``-th of the ``M`` live replicas in name order:
    every replica computes the same answer from the same keys, a joining one takes its share
    from the others and a dead one's share goes to the rest, each move through the partition's
    own lease. A replica that sees another run with a different P owns nothing until it is
    gone: two layouts at once would fold one node twice.

    A replica killed with -9 leaves its key until the TTL; each member answers on its key's
    presence subject (runtime.lease.Presence) and asks after the others' every round, so one
    gone from the bus for ``lease.ABSENT_FOR_S`` is no longer counted (HA-8): its partitions
    go to the rest within seconds, each through its lease's own presence check."""

    def __init__(self, js: JetStreamContext, service: str, instance: str, partitions: int, log: Any,
                 nc: NATS | None = None) -> None:
        self._js, self._service, self._partitions, self._log = js, service, partitions, log
        self._prefix = f"{service}.members"
        self._key = f"{self._prefix}.{subjects.encode_token(instance)}"
        self._nc = nc
        self._presence: dict[str, Presence] = {}  # by member key: our own answers, the others' asked
        self._live: list[str] = []
        self._layouts_agree = False
        self._layouts: set[str] = set()  # the Ps the live replicas run with
        self._changed = asyncio.Event()  # set (and replaced) whenever ownership may have moved

    def owns(self, partition: int) -> bool:
        if not self._layouts_agree or self._key not in self._live:
            return False
        return owner(partition, self._live) == self._key

    async def disowned(self, partition: int) -> None:
        while self.owns(partition):
            await self._changed.wait()

    async def round(self) -> None:
        try:
            kv = await self._js.key_value(streams.LEASES_BUCKET)
            await kv.put(self._key, str(self._partitions).encode())
            found: dict[str, tuple[int, str]] = {}  # key: (revision, the P it runs with)
            # nats-py's keys(filters=) matches substrings of every key; a watch of the members'
            # subject reads only theirs (and ends, with None, once it has the current ones).
            watcher = await kv.watch(f"{self._prefix}.*", ignore_deletes=True)
            try:
                while (entry := await watcher.updates(timeout=MEMBERS_EVERY_S * 2)) is not None:  # type: ignore[no-untyped-call]
                    found[entry.key] = (entry.revision or 0, (entry.value or b"").decode())
            finally:
                await watcher.stop()  # type: ignore[no-untyped-call]
            for key in await self._gone(found):
                del found[key]
                if key in self._live:
                    self._log.warning("partition member gone from the bus: not counted before its TTL", member=key)
            live, layouts = list(found), {layout for _, layout in found.values()}
        except (nats_errors.Error, APIError) as exc:
            # No answer: keep what we knew (a lease we hold stays fenced by its own TTL).
            self._log.warning("partition members unknown this round", error=str(exc) or type(exc).__name__)
            return
        if self._key not in live:
            # A read that does not show our own key, just written, is not the membership (a
            # degraded cluster answering from a lagging replica): keep what we knew.
            return
        agree = layouts == {str(self._partitions)}
        if not agree and layouts != self._layouts:
            self._log.error("another layout of this service is running: owning no partition until it stops",
                            partitions=self._partitions, running=sorted(layouts))
        live.sort()
        if live != self._live and live:
            self._log.info("partition members", members=len(live),
                           owned=[k for k in range(self._partitions) if owner(k, live) == self._key])
        if (live, agree) != (self._live, self._layouts_agree):
            self._changed.set()
            self._changed = asyncio.Event()
        self._live, self._layouts_agree, self._layouts = live, agree, layouts

    async def _gone(self, found: dict[str, tuple[int, str]]) -> list[str]:
        """Answer for our own key; the other members' keys whose replica is gone from the bus
        (none known without a connection to ask on: the TTL alone then)."""
        if self._nc is None:
            return []
        for key in {*found, self._key} - self._presence.keys():
            self._presence[key] = Presence(self._nc, key, key.encode(), self._log)
        for key in self._presence.keys() - {*found, self._key}:
            del self._presence[key]  # its key deleted or lapsed: nothing left to ask after
        await self._presence[self._key].hold(True)
        others = [key for key in found if key != self._key]
        gone = await asyncio.gather(*(self._presence[key].gone(found[key][0]) for key in others))
        return [key for key, dead in zip(others, gone, strict=True) if dead]

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            await self.round()
            await _first(stopping, stopping, timeout_s=MEMBERS_EVERY_S)
        try:
            kv = await self._js.key_value(streams.LEASES_BUCKET)
            await kv.delete(self._key)  # the others take our share now, not at the TTL
        except (nats_errors.Error, APIError):
            pass


async def serve_partitioned(ctx: ServiceContext, partitions: int,
                            lead: Callable[[Lease, int], Awaitable[Sequence[Runner]]]) -> None:
    """HA-4: run partition ``k`` of ``partitions`` (what ``lead(lease, k)`` builds) for each
    ``k`` this replica owns among the live ones, each behind its own lease."""
    members = Members(ctx.js, ctx.name, instance_name(), partitions, ctx.log, nc=ctx.nc)
    await members.round()
    tasks = [asyncio.create_task(members.run(ctx.stopping))]
    for k in range(partitions):
        async def lead_k(lease: Lease, k: int = k) -> Sequence[Runner]:
            return await lead(lease, k)

        tasks.append(asyncio.create_task(serve_replicated(
            ctx, f"{ctx.name}.{subjects.partition_label(k, partitions)}", lead_k,
            wanted=lambda k=k: members.owns(k), disowned=lambda k=k: members.disowned(k),  # type: ignore[misc]
            rides_out=True)))
    await asyncio.gather(*tasks)


_BUS_BUSY = (nats_errors.TimeoutError, nats_errors.NoRespondersError, ServiceUnavailableError)


async def _first(event: asyncio.Event, stopping: asyncio.Event, timeout_s: float | None = None) -> bool:
    """Wait for ``event`` or ``stopping`` (at most ``timeout_s``); True when ``event`` came first."""
    waiters = [asyncio.create_task(event.wait()), asyncio.create_task(stopping.wait())]
    await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    for waiter in waiters:
        waiter.cancel()
    return event.is_set() and not stopping.is_set()


def run_processor_service(args: Any, service: str, core: Callable[[ServiceContext], Core[S]], state_type: type[S],
                          inputs: Sequence[Input], outputs: Sequence[str], *,
                          series: Callable[[Callable[[], list[S]]], Collector | metrics.Rendered] | None = None,
                          partitionable: bool = False, settings: type[EnvSettings] | None = None,
                          tick_every_s: Callable[[Any], float] | None = None,
                          also_run: Callable[[ServiceContext, Processor[S], Core[S]], Sequence[Runner]] | None = None,
                          rides_out: bool = True) -> int:
    """``healthplane service NAME`` for a service that is one Processor (or, with
    ``--partitions P``, one per partition it owns): build it, register its state-derived
    metrics (``series``, over the states this replica leads), run it until a signal arrives.

    The hooks a service may need: ``settings`` (read from the environment before anything
    starts, ``ctx.settings`` to ``core``), ``tick_every_s`` (from the settings: how often a
    ticking core ticks), ``also_run`` (runners beside the Processor while this replica leads,
    the Slurm adapter's reconciler), ``rides_out`` (``serve_replicated``'s). ``/readyz`` says
    ready only once every input the leader folds is caught up."""
    partitions = getattr(args, "partitions", 1) or 1
    if partitions > 1 and not partitionable:
        logs.configure(service).error(
            "cannot start", reason=f"{service} decides over the whole fleet at once (guardrails, the breaker): "
                                   f"it runs as one partition with standbys, not --partitions {partitions}")
        return 1

    async def serve(ctx: ServiceContext) -> None:
        active: dict[int, tuple[Processor[S], Lease]] = {}  # per partition, this replica's last lead

        def led() -> list[S]:  # a standby's metrics are empty, not the state it held last
            return [proc.state for proc, lease in list(active.values()) if lease.is_leader]

        if series is not None:
            exported = series(led)
            metrics.register_series(exported)
            if isinstance(exported, metrics.Rendered) and gzipped.NOT_JOINABLE is not None:
                ctx.log.warning("node series are sent uncompressed: a large fleet's scrape is its whole text",
                                reason=gzipped.NOT_JOINABLE)

        def caught_up() -> tuple[bool, str]:  # /readyz
            leading = [(k, proc) for k, (proc, lease) in sorted(active.items()) if lease.is_leader]
            if not leading:
                return True, "standby"
            behind = [subjects.partition_label(k, partitions) for k, proc in leading if not proc.caught_up]
            if behind:
                return False, f"replaying (partition {', '.join(behind)})" if partitions > 1 else "replaying"
            return True, "caught up"

        metrics.readiness(service, caught_up)

        async def lead(lease: Lease, partition: int = 0) -> list[Runner]:
            built = core(ctx)
            proc = Processor(nc=ctx.nc, js=ctx.js, service=service, core=built, state_type=state_type,
                             inputs=inputs, outputs=outputs, batch=512, log=ctx.log, fence=lease.fence,
                             partition=partition, partitions=partitions)
            if tick_every_s is not None:
                proc.tick_every_s = tick_every_s(ctx.settings)
            await proc.start()
            active[partition] = (proc, lease)
            return [proc, *(also_run(ctx, proc, built) if also_run is not None else ())]

        if partitions > 1:
            await serve_partitioned(ctx, partitions, lead)
        else:
            await serve_replicated(ctx, service, lead, rides_out=rides_out)

    return run_service(service, serve, nats_url=args.nats_url, creds=args.creds, metrics_port=args.metrics_port,
                       settings=settings)
