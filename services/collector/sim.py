"""The fleet simulator (COL-14): N nodes in one process, each running the collector's own
report code (:class:`Collector`, :func:`run_agent`) against synthetic hardware.

Faults are injected over core NATS request/reply on ``hp.sim.{cluster}.inject`` (a
development channel, not a stream: nothing durable depends on it). Every fault lands where the
real collector would see it: counters in the synthetic EDAC, SMART, SCSI and GPU readings,
and kernel ring-buffer findings folded into the node's own :class:`KmsgTally`, which also
triggers an out-of-band report exactly as a real ``/dev/kmsg`` record would.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from healthplane import wire
from healthplane_collector.agent import Collector, Settings, run_agent
from healthplane_collector.cli import FAULTS
from healthplane_collector.gpu_nvml import throttle_from_reasons
from healthplane_collector.inventory import Inventory
from healthplane_collector.kmsg import (
    EdacFinding,
    HardwareErrorFinding,
    KmsgTally,
    MachineCheckFinding,
    RemountReadOnlyFinding,
    XidFinding,
)

SIGNALS: Final = ("edac", "smart", "ioerr", "kmsg", "mounts", "gpu")
SIM_GPU_MEMORY_BYTES: Final = 143_771_336_704  # an H200's framebuffer, as NVML reports it


class FaultError(ValueError):
    """An injection that names no known fault, signal or GPU."""


@dataclass
class SimGpu:
    index: int
    pci_bus_id: str
    uuid: str
    ecc_volatile: list[int] = field(default_factory=lambda: [0, 0])   # corrected, uncorrected
    ecc_aggregate: list[int] = field(default_factory=lambda: [0, 0])
    throttle: list[str] = field(default_factory=list)
    remap_failed: bool = False
    lost: bool = False
    # A bad GPU whose counters look clean: only a validation run finds it (VAL-3). The reports
    # never show it; the reference scheduler learns it from `sim inject` (hp.hardware).
    silently_bad: bool = False


@dataclass
class SimHardware:
    gpus: list[SimGpu]
    edac_ce: int = 0
    edac_ue: int = 0
    smart_failing: bool = False
    io_errors: int = 0
    readonly_mount: bool = False
    failing: set[str] = field(default_factory=set)


class SimKmsg:
    def __init__(self) -> None:
        self.tally = KmsgTally()

    def signal(self, gpus_by_pci: Mapping[str, int]) -> wire.KmsgSignal:
        return self.tally.signal(gpus_by_pci, backlog_skipped=True)


class SimNode:
    """Synthetic sources for one node: the :class:`Sources` the collector reads."""

    in_memory = True

    def __init__(self, node_id: str, gpus: int = 8, seed: int = 0) -> None:
        self.node_id = node_id
        rng = random.Random(f"{node_id}:{seed}")
        self.boot_id = str(uuid.UUID(int=rng.getrandbits(128)))
        self.hardware = SimHardware([
            SimGpu(i, f"0000:{0x18 + 0x10 * i:02x}:00.0", f"GPU-{uuid.UUID(int=rng.getrandbits(128))}")
            for i in range(gpus)
        ])
        self.kmsg = SimKmsg()
        self.silent = False
        self.out_of_band = asyncio.Event()
        self._readings: dict[str, Any] = {}
        self._inventory: Inventory | None = None

    def inventory(self) -> Inventory:
        if self._inventory is None:
            self._inventory = self._build_inventory()
        return self._inventory

    def _build_inventory(self) -> Inventory:
        return Inventory(
            hostname=self.node_id, cores=192, memory_bytes=2_164_663_517_184, boot_id=self.boot_id,
            # What sysfs would list; the GPU signal names them (uuid, model, memory), as on a node.
            gpus=tuple(wire.ResourceDevice(kind="gpu", vendor="nvidia", index=g.index, pci_bus_id=g.pci_bus_id)
                       for g in self.hardware.gpus),
        )

    async def read(self, name: str) -> Any:
        if name in self.hardware.failing:
            raise RuntimeError(f"simulated {name} collector failure")
        # Synthetic hardware changes only when a fault is injected: build each reading once
        # per change, so one process can carry a large fleet.
        reading = self._readings.get(name)
        if reading is None:
            reading = self._readings[name] = self._reading(name)
        return reading

    def _reading(self, name: str) -> Any:
        hw = self.hardware
        if name == "edac":
            return wire.EdacSignal(status="ok", controllers=[
                wire.EdacController(name="mc0", ce=hw.edac_ce, ue=hw.edac_ue,
                                    dimms=[wire.DimmCounts(name="dimm0", label="CPU_SrcID#0_MC#0_Chan#0_DIMM#0",
                                                           ce=hw.edac_ce, ue=hw.edac_ue)])])
        if name == "smart":
            return wire.SmartSignal(status="ok", devices=[wire.SmartDevice(
                name="/dev/nvme0", protocol="NVMe", model="SAMSUNG MZQL23T8HCLS", serial=f"S6{self.node_id[-6:]}",
                passed=not hw.smart_failing, exit_status=8 if hw.smart_failing else 0,
                exit_status_bits=["disk_failing"] if hw.smart_failing else [],
                critical_warning=4 if hw.smart_failing else 0)])
        if name == "ioerr":
            return wire.IoerrSignal(status="ok", devices=[wire.IoErrorCount(name="sda", count=hw.io_errors)])
        if name == "mounts":
            read_only = [wire.ReadOnlyMount(mount_point="/data", device="/dev/sdb1", fs_type="ext4")] if hw.readonly_mount else []
            return wire.MountsSignal(status="ok", read_only=read_only)
        if name == "gpu":
            lost = [g for g in hw.gpus if g.lost]
            if lost:
                return wire.GpuSignal(status="failed", source="nvml",
                                      reason=f"GPU {lost[0].pci_bus_id}: GPU is lost (NVML_ERROR_GPU_IS_LOST)")
            return wire.GpuSignal(status="ok", source="nvml", driver_version="570.86.15", devices=[
                wire.GpuDevice(
                    index=g.index, pci_bus_id=g.pci_bus_id, uuid=g.uuid, name="NVIDIA H200",
                    memory_bytes=SIM_GPU_MEMORY_BYTES,
                    ecc=wire.GpuEcc(status="ok",
                                    volatile=wire.EccCounts(corrected=g.ecc_volatile[0], uncorrected=g.ecc_volatile[1]),
                                    aggregate=wire.EccCounts(corrected=g.ecc_aggregate[0], uncorrected=g.ecc_aggregate[1])),
                    throttle=throttle_from_reasons(g.throttle),
                    row_remap=wire.GpuRowRemap(failed=g.remap_failed), temperature_c=41)
                for g in hw.gpus])
        raise KeyError(name)

    def _gpu(self, index: int | None) -> SimGpu:
        if index is None:
            index = 0
        if not 0 <= index < len(self.hardware.gpus):
            raise FaultError(f"{self.node_id} has no GPU {index} (it has {len(self.hardware.gpus)})")
        return self.hardware.gpus[index]

    def inject(self, fault: str, gpu: int | None, now: datetime) -> str:
        """Apply ``fault``; returns what happened, in words. Raises :class:`FaultError`."""
        hw, tally = self.hardware, self.kmsg.tally
        out_of_band = False
        if fault.startswith("xid:"):
            code = fault.removeprefix("xid:")
            if not code.isdigit():
                raise FaultError(f"xid needs a number, e.g. xid:79 (got {fault!r})")
            target = self._gpu(gpu)
            xid = int(code)
            tally.add_finding(XidFinding(target.pci_bus_id, xid,
                                         f"NVRM: Xid (PCI:{target.pci_bus_id[:-2]}): {xid}, pid=4242, name=python3"), now)
            if xid == 79:
                target.lost = True  # fallen off the bus: the GPU signal fails too (COL-8)
            out_of_band = True
        elif fault in ("ecc-correctable", "ecc-uncorrectable"):
            target, slot = self._gpu(gpu), 0 if fault == "ecc-correctable" else 1
            target.ecc_volatile[slot] += 1
            target.ecc_aggregate[slot] += 1
        elif fault == "row-remap-failure":
            self._gpu(gpu).remap_failed = True
        elif fault == "edac-ce":
            hw.edac_ce += 1
        elif fault == "edac-ue":
            hw.edac_ue += 1
            tally.add_finding(EdacFinding("ue", 1, 0), now)
            out_of_band = True
        elif fault in ("mce-corrected", "mce-fatal"):
            tally.add_finding(MachineCheckFinding(fatal=fault == "mce-fatal", cpu=0, bank=5), now)
            out_of_band = True
        elif fault in ("hw-error-corrected", "hw-error-fatal"):
            tally.add_finding(HardwareErrorFinding("corrected" if fault.endswith("corrected") else "fatal"), now)
            out_of_band = True
        elif fault == "smart-failing":
            hw.smart_failing = True
        elif fault == "io-errors":
            hw.io_errors += 3
        elif fault == "readonly-mount":
            hw.readonly_mount = True
            tally.add_finding(RemountReadOnlyFinding("sdb1", "EXT4-fs (sdb1): Remounting filesystem read-only"), now)
        elif fault == "throttle-thermal":
            self._gpu(gpu).throttle = ["SwThermalSlowdown", "HwThermalSlowdown"]
        elif fault == "power-brake":
            self._gpu(gpu).throttle = ["HwPowerBrakeSlowdown"]
        elif fault.startswith("collector-failed:"):
            signal_name = fault.removeprefix("collector-failed:")
            if signal_name not in SIGNALS:
                raise FaultError(f"unknown signal {signal_name!r}; one of {', '.join(SIGNALS)}")
            hw.failing.add(signal_name)
        elif fault == "silent-gpu":
            if gpu is None:
                raise FaultError("silent-gpu needs --gpu N: the GPU that fails diagnostics")
            self._gpu(gpu).silently_bad = True
        elif fault == "silent":
            self.silent = True
        elif fault == "resume":
            self.silent = False
        elif fault == "clear":
            self.hardware = SimHardware([SimGpu(g.index, g.pci_bus_id, g.uuid) for g in hw.gpus])
            self.kmsg = SimKmsg()
        else:
            raise FaultError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
        self._readings.clear()
        if out_of_band:
            self.out_of_band.set()
        return f"{fault} injected on {self.node_id}" + (f" GPU {gpu}" if gpu is not None else "")


class InjectRequest(msgspec.Struct, rename="camel"):
    node_id: str
    fault: str
    gpu: int | None = None


class InjectReply(msgspec.Struct, rename="camel", omit_defaults=True):
    ok: bool
    message: str
    failing_gpus: list[int] | None = None  # the node's silently bad GPUs after the injection


# The faults that change what only a validation run can see: `sim inject` records the node's
# hidden truth for the reference scheduler after each.
HIDDEN_FAULTS: Final = ("silent-gpu", "clear")


def inject_subject(cluster: str) -> str:
    from healthplane.subjects import PREFIX, encode_token

    return f"{PREFIX}.sim.{encode_token(cluster)}.inject"


async def _tell_hardware(nc: Any, args: Any, reply: InjectReply) -> None:
    """Record the node's hidden truth for the reference scheduler (development only)."""
    from healthplane import subjects
    from healthplane.cli.common import EXIT_RETRY, CommandFailed, actor

    truth = wire.SimHardware(node_id=args.node, cluster=args.cluster, failing_gpus=reply.failing_gpus or [],
                             set_at=datetime.now(UTC), actor=actor(args))
    try:
        await nc.jetstream().publish(subjects.hardware(args.cluster, args.node), wire.encode(truth), timeout=5)
    except Exception as exc:
        raise CommandFailed(f"{reply.message}, but the reference scheduler was not told: {exc}", EXIT_RETRY) from exc


def terminations_subject(cluster: str) -> str:
    from healthplane.subjects import PREFIX, encode_token

    return f"{PREFIX}.provision.{encode_token(cluster)}.*"


async def serve_injections(nc: Any, cluster: str, inject: Callable[[InjectRequest], InjectReply], log: Any) -> None:
    """Answer ``sim inject`` for ``cluster``: each request goes to ``inject``, its reply back."""

    async def on_inject(msg: Any) -> None:
        try:
            request = msgspec.json.decode(msg.data, type=InjectRequest)
        except msgspec.DecodeError as exc:
            reply = InjectReply(ok=False, message=f"bad request: {exc}")
        else:
            reply = inject(request)
            log.info("fault injected" if reply.ok else "fault refused", node_id=request.node_id,
                     fault=request.fault, gpu=request.gpu, message=reply.message)
        await msg.respond(msgspec.json.encode(reply))

    await nc.subscribe(inject_subject(cluster), cb=on_inject)


STOP_S = 1.0  # what a stopping fleet gets to finish the round in hand


class Fleet:
    def __init__(self, count: int, cluster: str = "default", interval_s: int = 30, prefix: str = "sim-",
                 gpus: int = 8, provisioned: int = 0) -> None:
        self.cluster = cluster
        self.nodes = {f"{prefix}{i:03d}": SimNode(f"{prefix}{i:03d}", gpus) for i in range(count)}
        self.interval_s = interval_s
        # The last ``provisioned`` nodes stand for instances the control plane created (a
        # cloud pool), the rest for hardware the site owns: deprovision and replace need both.
        self.provisioned = set(list(self.nodes)[count - provisioned:]) if provisioned > 0 else set()

    def inject(self, request: InjectRequest) -> InjectReply:
        node = self.nodes.get(request.node_id)
        if node is None:
            return InjectReply(ok=False, message=f"no simulated node {request.node_id!r} in cluster {self.cluster}")
        try:
            message = node.inject(request.fault, request.gpu, datetime.now(UTC))
            return InjectReply(ok=True, message=message,
                               failing_gpus=[g.index for g in node.hardware.gpus if g.silently_bad])
        except FaultError as exc:
            return InjectReply(ok=False, message=str(exc))

    async def run(self, nc: Any, stopping: asyncio.Event, log: Any) -> None:
        from healthplane.runtime.publish import Publisher

        publisher = Publisher(nc, window=8192)

        await serve_injections(nc, self.cluster, self.inject, log)

        async def on_terminated(msg: Any) -> None:
            # The reference scheduler plays the provisioner (EVI-8): an accepted termination
            # means the instance is gone, so its simulated node stops reporting.
            try:
                result = wire.decode(wire.TerminationResult, msg.data)
            except wire.WireError:
                return
            node = self.nodes.get(result.node_id)
            if result.accepted and node is not None and not node.silent:
                node.silent = True
                log.info("simulated instance terminated", node_id=result.node_id, message=result.message)

        await nc.subscribe(terminations_subject(self.cluster), cb=on_terminated)

        async def node_main(node: SimNode, delay: float) -> None:
            await asyncio.sleep(delay)
            settings = Settings(node_id=node.node_id, cluster=self.cluster, interval_s=self.interval_s,
                                definition="gpu-pool", provisioned=node.node_id in self.provisioned)
            collector = Collector(settings, node, node.kmsg)

            async def publish(subject: str, payload: bytes) -> None:
                if node.silent:
                    return
                future = await publisher.submit(subject, payload)
                await publisher.wait(subject, future)

            # Kmsg faults replace node.kmsg on "clear": keep the collector looking at the live one.
            class LiveKmsg:
                def signal(self, gpus_by_pci: Mapping[str, int]) -> wire.KmsgSignal:
                    return node.kmsg.signal(gpus_by_pci)

            collector.kmsg = LiveKmsg()
            await run_agent(collector, publish, stopping, node.out_of_band, log.bind(node_id=node.node_id))

        # Spread the fleet's first reports over one interval, as real agents would be.
        spread = min(float(self.interval_s), 5.0)
        tasks = [asyncio.create_task(node_main(node, spread * i / max(1, len(self.nodes))))
                 for i, node in enumerate(self.nodes.values())]
        await asyncio.gather(*tasks)


# ---------------------------------------------------------------------------- CLI


def run_cli(args: Any) -> int:
    import signal
    import sys

    from healthplane.cli.common import EXIT_RETRY, CommandFailed, fail, nats_client
    from healthplane.runtime import logs, metrics
    from healthplane.runtime.connect import connect
    from healthplane.runtime.lifecycle import let_go

    async def run_fleet() -> int:
        log = logs.configure("sim")
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
                                   in_flight=args.in_flight)
        else:
            fleet = Fleet(args.nodes, args.cluster, args.interval, gpus=args.gpus, provisioned=args.provisioned)
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
        return 0

    async def inject() -> int:
        request = InjectRequest(node_id=args.node, fault=args.fault, gpu=args.gpu)
        try:
            async with nats_client(args) as nc:
                try:
                    msg = await nc.request(inject_subject(args.cluster), msgspec.json.encode(request), timeout=5)
                except Exception as exc:
                    raise CommandFailed(f"no simulator answers for cluster {args.cluster} "
                                        "(is `healthplane sim run` up?)", EXIT_RETRY) from exc
                reply = msgspec.json.decode(msg.data, type=InjectReply)
                if reply.ok and args.fault in HIDDEN_FAULTS and reply.failing_gpus is not None:
                    await _tell_hardware(nc, args, reply)
        except CommandFailed as exc:
            return fail(exc)
        print(reply.message, file=sys.stdout if reply.ok else sys.stderr)
        return 0 if reply.ok else 1

    if args.sim_command in ("submit", "jobs", "provider"):
        from healthplane_collector.sim_work import run_work

        return run_work(args)
    return asyncio.run(run_fleet() if args.sim_command in ("run", "load") else inject())
