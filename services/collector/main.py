"""``healthplane collector`` / ``healthplane service collector``: the node agent's entry point."""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import sys
from pathlib import Path

import msgspec

from healthplane import creds as credentials
from healthplane import wire
from healthplane.config import CollectorConfig, ConfigError, load_collector_config
from healthplane.runtime import logs, metrics
from healthplane.runtime.connect import connect, default_creds
from healthplane_collector import udev
from healthplane_collector.agent import (
    Collector,
    HostSources,
    Hotplug,
    KmsgWatcher,
    Settings,
    run_agent,
)
from healthplane_collector.inventory import InventoryError
from healthplane_collector.probe import read_inventory

SERVICE = "collector"


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
        gpu_source=args.gpu_source, interval_s=conf.health.report_interval_seconds,
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


async def _serve(settings: Settings, nats_url: str | None, creds: str | None, metrics_port: int) -> int:
    log = logs.configure(SERVICE).bind(node_id=settings.node_id, cluster=settings.cluster)
    mismatch = _creds_mismatch(settings, creds or default_creds())
    if mismatch:
        log.error("cannot start", reason=mismatch)
        return 1
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
    nc = await connect(nats_url, name=f"healthplane-collector-{settings.node_id}", creds=creds, log=log)
    js = nc.jetstream()

    async def publish(subject: str, payload: bytes) -> None:
        await js.publish(subject, payload, timeout=5)

    log.info("collector started", interval_s=settings.interval_s, health_disabled=settings.health_disabled,
             backlog_skipped=kmsg.backlog_skipped)
    try:
        await run_agent(collector, publish, stopping, out_of_band, log, hotplug)
    finally:
        stopping.set()
        if watcher is not None:
            watcher.detach()
        await kmsg_task
        await nc.drain()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        settings, nats_url = settings_from(args)
    except ConfigError as exc:
        print(f"healthplane collector: {exc}", file=sys.stderr)
        return 1
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
                          ("cluster", None), ("gpu_source", "auto"), ("once", False), ("output", "json")):
        if not hasattr(args, name):
            setattr(args, name, default)
    return run(args)
