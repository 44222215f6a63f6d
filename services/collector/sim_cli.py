"""``healthplane sim …``: the simulator's commands (``run``, ``load``, ``inject``; ``submit``,
``jobs``, ``provider`` through ``sim_work``), run as the CLI process. The fleets themselves are
``sim.Fleet`` and ``loadgen.LoadFleet``."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import msgspec

from healthplane.contracts import wire
from healthplane_collector.sim import (
    HIDDEN_FAULTS,
    STOP_S,
    Fleet,
    InjectReply,
    InjectRequest,
    inject_subject,
)


async def _tell_hardware(nc: Any, args: Any, node: str, reply: InjectReply) -> None:
    """Record the node's hidden truth for the reference scheduler (development only)."""
    from healthplane.cli.common import who
    from healthplane.client.errors import EXIT_RETRY, CommandFailed
    from healthplane.contracts import subjects

    truth = wire.SimHardware(node_id=node, cluster=args.cluster, failing_gpus=reply.failing_gpus or [],
                             set_at=datetime.now(UTC), actor=who(args).actor, jobs=reply.jobs)
    try:
        await nc.jetstream().publish(subjects.hardware(args.cluster, node), wire.encode(truth), timeout=5)
    except Exception as exc:
        raise CommandFailed(f"{reply.message}, but the reference scheduler was not told: {exc}", EXIT_RETRY) from exc


async def _domain_members(nc: Any, args: Any) -> list[str]:
    """The nodes of ``--domain`` as the views show them (DOM-1), in id order; none is an error."""
    from healthplane.client.errors import EXIT_USAGE, CommandFailed
    from healthplane.client.reads import read_listing
    from healthplane.contracts import domains

    if args.node is not None:
        raise CommandFailed("give a node or --domain, not both", EXIT_USAGE)
    try:
        wanted = domains.parse_selectors([args.domain])
    except domains.DomainError as exc:
        raise CommandFailed(f"--domain: {exc}", EXIT_USAGE) from None
    listing = await read_listing(nc, nc.jetstream(), args.cluster)
    members = sorted(row.node_id for row in listing.rows if domains.selected(row.domains, wanted))
    if not members:
        raise CommandFailed(f"no node of cluster {args.cluster} is in {args.domain}", EXIT_USAGE)
    return members


def rack_size(text: str) -> int:
    """``--rack-size``: a count of nodes, 0 for none; else one line, exit 2."""
    from healthplane.client.errors import EXIT_USAGE, CommandFailed

    if not text.isdigit():
        raise CommandFailed(f"--rack-size: {text!r} is not a number of nodes per rack (1 or more; 0: no racks)",
                            EXIT_USAGE)
    return int(text)


async def _inject_one(nc: Any, args: Any, node: str) -> InjectReply:
    from healthplane.client.errors import EXIT_RETRY, CommandFailed

    request = InjectRequest(node_id=node, fault=args.fault, gpu=args.gpu, rate=args.rate, ramp_seconds=args.ramp)
    try:
        msg = await nc.request(inject_subject(args.cluster), msgspec.json.encode(request), timeout=5)
    except Exception as exc:
        raise CommandFailed(f"no simulator answers for cluster {args.cluster} "
                            "(is `healthplane sim run` up?)", EXIT_RETRY) from exc
    reply = msgspec.json.decode(msg.data, type=InjectReply)
    if reply.ok and args.fault in HIDDEN_FAULTS and reply.failing_gpus is not None:
        await _tell_hardware(nc, args, node, reply)
    return reply


def run_cli(args: Any) -> int:
    import signal
    import sys

    from healthplane.cli.common import fail, nats_client
    from healthplane.client.errors import EXIT_USAGE, CommandFailed
    from healthplane.runtime import logs, metrics, telemetry
    from healthplane.runtime.connect import connect
    from healthplane.runtime.lifecycle import let_go

    async def run_fleet() -> int:
        log = logs.configure("sim")
        telemetry.start("sim", log)  # INT-4: nothing unless HEALTHPLANE_OTEL=1
        endpoint = metrics.serve(args.metrics_port)
        log.info("metrics endpoint", url=endpoint.url)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        nc = await connect(args.nats_url, name="healthplane-sim", creds=args.creds, log=log)
        if args.sim_command == "load":
            from healthplane_collector.loadgen import LoadFleet

            fleet: Any = LoadFleet(args.nodes, args.cluster, args.interval, prefix=args.prefix, gpus=args.gpus,
                                   in_flight=args.in_flight, rack_size=racks)
        else:
            fleet = Fleet(args.nodes, args.cluster, args.interval, gpus=args.gpus, provisioned=args.provisioned,
                          nvlink_domain_size=args.nvlink_domain_size, rack_size=racks)
        log.info("simulated fleet running", nodes=args.nodes, cluster=args.cluster, interval_s=args.interval)
        running = asyncio.create_task(fleet.run(nc, stopping, log))
        try:
            # A signal stops it within STOP_S whatever the bus does (a drain waits on a server
            # that may be gone, and a fleet blocked on a full window would never look).
            await asyncio.wait([running, asyncio.create_task(stopping.wait())], return_when=asyncio.FIRST_COMPLETED)
            if not running.done():
                await asyncio.wait([running], timeout=STOP_S)
                running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        finally:
            await let_go(nc)
            await asyncio.to_thread(telemetry.shutdown)
        return 0

    async def inject() -> int:
        try:
            if args.node is None and args.domain is None:
                raise CommandFailed("give the node to inject into, or --domain KIND=VALUE", EXIT_USAGE)
            async with nats_client(args) as nc:
                nodes = [args.node] if args.domain is None else await _domain_members(nc, args)
                failed = 0
                for node in nodes:
                    reply = await _inject_one(nc, args, node)
                    print(reply.message, file=sys.stdout if reply.ok else sys.stderr)
                    failed += not reply.ok
        except CommandFailed as exc:
            return fail(exc)
        if args.domain is not None:
            print(f"{len(nodes) - failed} of {len(nodes)} node(s) of {args.domain} injected with {args.fault}")
        return 0 if not failed else 1

    if args.sim_command in ("submit", "jobs", "provider"):
        from healthplane_collector.sim_work import run_work

        return run_work(args)
    if args.sim_command in ("run", "load"):
        try:
            racks = rack_size(args.rack_size)
        except CommandFailed as exc:
            return fail(exc)
    return asyncio.run(run_fleet() if args.sim_command in ("run", "load") else inject())
