"""``healthplane collector`` / ``healthplane service collector``: the node agent's entry point,
and ``healthplane collector --slurm-health-check``, the same agent as one run for Slurm's
``HealthCheckProgram`` (SLU-6)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.contracts.config import CollectorConfig, ConfigError, load_collector_config
from healthplane.runtime import creds as credentials
from healthplane.runtime import logs, metrics, telemetry
from healthplane.runtime.connect import (
    COLLECTOR_PING_INTERVAL_S,
    connect,
    default_creds,
    default_url,
)
from healthplane_collector import udev
from healthplane_collector.agent import (
    Collector,
    HostSources,
    Hotplug,
    KmsgWatcher,
    Settings,
    report_once,
    run_agent,
)
from healthplane_collector.choices import DEADLINE_DEFAULT_S, DEADLINE_MAX_S, DEADLINE_MIN_S
from healthplane_collector.inventory import InventoryError
from healthplane_collector.metrics import count_remediation, rejecter
from healthplane_collector.probe import read_inventory
from healthplane_collector.remediation import HostActions, NodeFacts, Remediator

SERVICE = "collector"
EXIT_NOT_PUBLISHED, EXIT_USAGE = 1, 2
INTERVAL_MAX_S: Final = 86400
PUBLISH_SHARE_S: Final = 5.0  # of the health check's deadline, kept for the publish and its acks
CONNECT_MARGIN_S: Final = 0.5  # connect gives up this much before the deadline, to say why itself


def settings_from(args: argparse.Namespace) -> tuple[Settings, str | None]:
    config = load_collector_config(args.config) if args.config else CollectorConfig()
    conf = config.config
    root = Path(args.root)
    node_id = args.node_id or conf.node_id
    if not node_id:
        try:
            node_id = read_inventory(root).hostname
        except InventoryError:
            node_id = socket.gethostname()
    settings = Settings(
        node_id=node_id, cluster=args.cluster or conf.cluster, root=root, state_dir=Path(args.state_dir),
        gpu_source=args.gpu_source, interval_s=args.interval_seconds or conf.health.report_interval_seconds,
        health_disabled=conf.health.disabled, maintenance=conf.maintenance, definition=conf.definition,
        provisioned=conf.provisioned, annotations=conf.annotations,
        expected_read_only=tuple(conf.read_only_mounts_expected),
        smartctl_timeout_s=conf.smartctl_timeout_seconds, signal_timeout_s=conf.signal_timeout_seconds,
    )
    return settings, args.nats_url or conf.nats_url


async def _once(settings: Settings) -> wire.HealthReport:
    sources = HostSources(settings)
    kmsg = KmsgWatcher(settings.root / "dev" / "kmsg", settings.state_dir, None)
    kmsg.read_once()
    collector = Collector(settings, sources, kmsg)
    collector.refresh_inventory()
    return await collector.collect("start")


def _creds_mismatch(settings: Settings, path: str | None) -> str | None:
    """Why these credentials cannot carry this collector's reports: the server would refuse
    every one of them (SEC-1), so say it once at start instead."""
    if not path:
        return None
    try:
        bound = credentials.node_of(path)
    except credentials.CredsError as exc:
        return str(exc)
    if bound is not None and bound != (settings.cluster, settings.node_id):
        return (f"{path} holds the credentials of node {bound[1]} (cluster {bound[0]}), but this collector reports "
                f"as node {settings.node_id} (cluster {settings.cluster}); issue them with `healthplane creds node "
                f"{settings.node_id} --cluster {settings.cluster}`")
    return None


def publisher(js: JetStreamContext) -> Callable[[str, bytes], Awaitable[None]]:
    """The agent's publish. With OpenTelemetry export on (INT-4), each report starts a trace:
    the publish runs in its span and the record's headers carry its ``traceparent``, which
    every service that folds the report, and what follows from it, continues."""
    exporting = telemetry.active

    async def publish(subject: str, payload: bytes) -> None:
        await js.publish(subject, payload, timeout=5)

    if exporting is None:
        return publish

    async def traced(subject: str, payload: bytes) -> None:
        with exporting.publishing(SERVICE, subject) as headers:
            await js.publish(subject, payload, timeout=5, headers=headers)

    return traced


async def _serve(settings: Settings, nats_url: str | None, creds: str | None, metrics_port: int) -> int:
    log = logs.configure(SERVICE).bind(node_id=settings.node_id, cluster=settings.cluster)
    mismatch = _creds_mismatch(settings, creds or default_creds())
    if mismatch:
        log.error("cannot start", reason=mismatch)
        return 1
    telemetry.start(SERVICE, log)  # INT-4: nothing unless HEALTHPLANE_OTEL=1
    try:
        return await _agent(settings, nats_url, creds, metrics_port, log)
    finally:
        await asyncio.to_thread(telemetry.shutdown)


async def _agent(settings: Settings, nats_url: str | None, creds: str | None, metrics_port: int, log: Any) -> int:
    endpoint = metrics.serve(metrics_port)
    log.info("metrics endpoint", url=endpoint.url)
    stopping, out_of_band = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    sources = HostSources(settings)
    collector = Collector(settings, sources, None, log)
    inventory = collector.refresh_inventory()
    kmsg = KmsgWatcher(settings.root / "dev" / "kmsg", settings.state_dir,
                       inventory.boot_id if inventory else None, log, out_of_band.set)
    try:
        kmsg.start()
    except OSError as exc:
        kmsg.failure = f"cannot open {kmsg.path}: {exc.strerror or exc}"
    collector.kmsg = kmsg
    kmsg_task = asyncio.create_task(kmsg.run(stopping))
    hotplug = Hotplug()
    watcher = udev.watch(settings.root, hotplug.add, log)
    remediator = _remediator(settings, collector, log)
    remediator.settle_pending(inventory.boot_id if inventory else None, datetime.now(UTC))
    nc = await connect(nats_url, name=f"healthplane-collector-{settings.node_id}", creds=creds, log=log,
                       ping_interval_s=COLLECTOR_PING_INTERVAL_S)
    publish = publisher(nc.jetstream())

    async def on_remediation(msg: Msg) -> None:
        remediator.take(msg.data, datetime.now(UTC))

    # Core NATS, not a consumer: the node reads nothing from streams (SEC-1), and a request
    # is for the agent that is up when it is sent; eviction's timeout covers one that is not.
    await nc.subscribe(subjects.remediate(settings.cluster, settings.node_id), cb=on_remediation)
    log.info("collector started", interval_s=settings.interval_s, health_disabled=settings.health_disabled,
             backlog_skipped=kmsg.backlog_skipped)
    try:
        await run_agent(collector, publish, stopping, out_of_band, log, hotplug)
    finally:
        stopping.set()
        if watcher is not None:
            watcher.detach()
        await remediator.close()
        await kmsg_task
        await nc.drain()
    return 0


def _remediator(settings: Settings, collector: Collector, log: Any) -> Remediator:
    """REM-2 on this machine: ``nvidia-smi -r`` and ``systemctl reboot``, handled ids and a
    pending reboot kept in the state dir, outcomes into the next resource report."""

    def facts() -> NodeFacts:
        inventory = collector.inventory
        return NodeFacts(gpus=collector.nvidia_gpus(), boot_id=inventory.boot_id if inventory else None)

    return Remediator(settings.node_id, settings.cluster, HostActions(settings.state_dir), facts,
                      collector.report_outcome, log, count_remediation, rejecter(SERVICE), settings.state_dir)


def _bounded_by(settings: Settings, deadline_s: float) -> Settings:
    """Signal timeouts that end the collection with the publish's share of the deadline left:
    a hung smartctl or nvidia-smi is then a failed signal in a report that goes out, rather
    than a health check that misses its deadline."""
    budget = deadline_s - min(PUBLISH_SHARE_S, deadline_s / 2)
    longest = settings.signal_timeout_s + settings.smartctl_timeout_s  # smart's bound (Collector._timeout)
    if longest <= budget:
        return settings
    scale = budget / longest
    return dataclasses.replace(settings, signal_timeout_s=settings.signal_timeout_s * scale,
                               smartctl_timeout_s=settings.smartctl_timeout_s * scale)


def _not_published(reason: str) -> int:
    print(f"healthplane collector: health check not published: {reason}", file=sys.stderr)
    return EXIT_NOT_PUBLISHED


async def _health_check(settings: Settings, nats_url: str | None, creds: str | None, deadline_s: float) -> int:
    """``--slurm-health-check`` (SLU-6): one collection, published, then exit.

    slurmd runs this as its ``HealthCheckProgram`` every ``HealthCheckInterval`` and kills a
    health check that runs past 60 s, so connecting, collecting and the publish acks share one
    deadline: the connection is made while the signals are read, and their timeouts leave the
    publish its share (``_bounded_by``). The reports are the agent's, on its subjects
    (``report_once``); the kmsg reader carries cursor and counts from run to run.

    It never drains a node and never calls Slurm: health-ingest and policy judge the report,
    and Healthplane's slurm-adapter drains from the control plane. Quiet on success (exit 0);
    a report that did not reach JetStream in time is one line on stderr and exit 1.
    """
    url = nats_url or default_url()
    creds = creds or default_creds()
    mismatch = _creds_mismatch(settings, creds)
    if mismatch:
        return _not_published(mismatch)
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + deadline_s
    settings = _bounded_by(settings, deadline_s)
    collector = Collector(settings, HostSources(settings), None)
    inventory = collector.refresh_inventory()
    kmsg = KmsgWatcher(settings.root / "dev" / "kmsg", settings.state_dir, inventory.boot_id if inventory else None)
    kmsg.catch_up()
    collector.kmsg = kmsg
    connecting = asyncio.create_task(connect(url, name=f"healthplane-health-check-{settings.node_id}", creds=creds,
                                             give_up_after=max(0.5, deadline_s - CONNECT_MARGIN_S)))
    stage: Literal["collection", "connect", "ack"] = "collection"
    subject = ""

    async def publish(to: str, payload: bytes) -> None:
        nonlocal stage, subject
        stage, subject = "connect", to
        nc = await connecting
        stage = "ack"
        await nc.jetstream().publish(to, payload, timeout=max(0.1, deadline - loop.time()))

    try:
        async with asyncio.timeout_at(deadline):
            await report_once(collector, publish)
    except TimeoutError:
        if stage == "collection":
            return _not_published(f"the collection did not finish within {deadline_s:g} s")
        if stage == "connect":
            return _not_published(f"{url} unreachable after {deadline_s:g} s")
        refusal = _last_error(connecting)
        return _not_published(f"{url} did not acknowledge {subject} within {deadline_s:g} s"
                              + (f" ({refusal})" if refusal else ""))
    except ConnectionError as exc:  # connect gave up, or the credentials or TLS files are unusable
        reason = str(exc)
        prefix = f"cannot connect to NATS at {url}: "
        if reason.startswith(prefix):
            why = reason.removeprefix(prefix)
            why = "no answer" if why == "TimeoutError" else why  # TCP accepted, the server silent
            reason = f"{url} unreachable after {loop.time() - started:.0f} s ({why})"
        return _not_published(reason)
    except nats.errors.Error as exc:  # e.g. no stream takes the subject: no responders
        return _not_published(f"{url} refused {subject}: {str(exc).removeprefix('nats: ')}")
    finally:
        await _close(connecting)
    return 0


def _last_error(connecting: asyncio.Task[NATS]) -> str | None:
    """What the server last said: a publish it refused (permissions) is never acked."""
    if not connecting.done() or connecting.cancelled() or connecting.exception() is not None:
        return None
    error = connecting.result().last_error
    return str(error).removeprefix("nats: ") if error else None


async def _close(connecting: asyncio.Task[NATS]) -> None:
    if not connecting.done():
        connecting.cancel()
    try:
        nc = await connecting
    except (asyncio.CancelledError, Exception):
        return
    try:
        await asyncio.wait_for(nc.close(), 1.0)
    except Exception:
        pass  # the reports are acked or reported lost already; nothing left to say


def _usage_error(args: argparse.Namespace) -> str | None:
    if args.once and args.slurm_health_check:
        return "--once and --slurm-health-check cannot be combined (--once prints, the health check publishes)"
    if args.deadline_seconds is not None:
        if not args.slurm_health_check:
            return "--deadline-seconds applies only to --slurm-health-check"
        if not DEADLINE_MIN_S <= args.deadline_seconds <= DEADLINE_MAX_S:
            return (f"--deadline-seconds must be between {DEADLINE_MIN_S:g} and {DEADLINE_MAX_S:g} "
                    f"(Slurm kills a health check after 60 s), not {args.deadline_seconds:g}")
    if args.interval_seconds is not None and not 1 <= args.interval_seconds <= INTERVAL_MAX_S:
        return f"--interval-seconds must be between 1 and {INTERVAL_MAX_S}, not {args.interval_seconds}"
    return None


def run(args: argparse.Namespace) -> int:
    usage = _usage_error(args)
    if usage:
        print(f"healthplane collector: {usage}", file=sys.stderr)
        return EXIT_USAGE
    try:
        settings, nats_url = settings_from(args)
    except ConfigError as exc:
        print(f"healthplane collector: {exc}", file=sys.stderr)
        return 1
    if args.slurm_health_check:
        deadline_s = DEADLINE_DEFAULT_S if args.deadline_seconds is None else args.deadline_seconds
        try:
            return asyncio.run(_health_check(settings, nats_url, args.creds, deadline_s))
        except Exception as exc:  # slurmd keeps one line of it: a traceback would say less
            return _not_published(f"{type(exc).__name__}: {exc}")
    if args.once:
        report = asyncio.run(_once(settings))
        if args.output == "json":
            sys.stdout.write(msgspec.json.format(wire.encode(report), indent=2).decode() + "\n")
        else:
            for name, value in wire.to_builtins(report.signals).items():
                print(f"{name:<7} {value['status']:<12} {value.get('reason') or ''}")
        return 0
    return asyncio.run(_serve(settings, nats_url, args.creds, args.metrics_port))


def main(args: argparse.Namespace) -> int:
    """``healthplane service collector``: same as ``healthplane collector`` without ``--once``."""
    for name, default in (("root", "/"), ("state_dir", "/var/lib/healthplane/collector"), ("node_id", None),
                          ("cluster", None), ("gpu_source", "auto"), ("once", False), ("output", "json"),
                          ("slurm_health_check", False), ("deadline_seconds", None), ("interval_seconds", None)):
        if not hasattr(args, name):
            setattr(args, name, default)
    return run(args)
