"""The fleet simulator (COL-14): N nodes in one process, each running the collector's own
report code (:class:`Collector`, :func:`run_agent`) against synthetic hardware.

Faults are injected over core NATS request/reply on ``hp.sim.{cluster}.inject`` (a
development channel, not a stream: nothing durable depends on it). Every fault lands where the
real collector would see it: counters in the synthetic EDAC, SMART, SCSI and GPU readings,
and kernel ring-buffer findings folded into the node's own :class:`KmsgTally`, which also
triggers an out-of-band report exactly as a real ``/dev/kmsg`` record would.

Remediation requests (REM-2) for the fleet's nodes are answered by the agent's own
:class:`Remediator`, with :class:`SimActions` in place of ``nvidia-smi`` and ``systemctl``: a
GPU reset clears what a reset clears on the card (:meth:`SimNode.reset_gpus`), a reboot
restarts the node's agent on a new boot (:meth:`SimNode.boot`), and the outcome goes in the
next resource report as the real agent's does.
"""

from __future__ import annotations

import asyncio
import math
import random
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from healthplane.contracts import domains, subjects, wire
from healthplane_collector.agent import Collector, Settings, run_agent
from healthplane_collector.choices import FAULTS
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
from healthplane_collector.metrics import count_remediation, rejecter
from healthplane_collector.remediation import (
    NodeFacts,
    PendingReboot,
    Remediator,
    gpu_reset_argv,
    settle,
)

SIGNALS: Final = ("edac", "smart", "ioerr", "kmsg", "mounts", "gpu")
SIM_GPU_MEMORY_BYTES: Final = 143_771_336_704  # an H200's framebuffer, as NVML reports it


NVLINK_FABRIC_XID = 145  # `--fault nvlink-fabric`: NVLink5's fabric Xid, as a domain's fabric failing logs it

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
    # JOB-2's cases: the node kills jobs while every counter stays clean. The reports never show
    # it; the reference scheduler learns it from `sim inject` (hp.hardware) and fails the steps.
    jobs: wire.SimJobFailures | None = None


class SimKmsg:
    def __init__(self) -> None:
        self.tally = KmsgTally()

    def signal(self, gpus_by_pci: Mapping[str, int]) -> wire.KmsgSignal:
        return self.tally.signal(gpus_by_pci, backlog_skipped=True)


class SimNode:
    """Synthetic sources for one node: the :class:`Sources` the collector reads."""

    in_memory = True

    def __init__(self, node_id: str, gpus: int = 8, seed: int = 0, fabric: wire.GpuFabric | None = None) -> None:
        self.node_id = node_id
        self.fabric = fabric  # DOM-1: what NVML's fabric info says of every GPU (None: no fabric)
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
        # REM-2: a reboot asked for (the agent of this boot stops; the next settles it), the
        # agent of this boot, and the latest remediation outcome for its resource reports.
        self.rebooting = asyncio.Event()
        self.pending_reboot: PendingReboot | None = None
        self.collector: Collector | None = None
        self.remediation: wire.RemediationOutcome | None = None

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
                    row_remap=wire.GpuRowRemap(failed=g.remap_failed), temperature_c=41, fabric=self.fabric)
                for g in hw.gpus])
        raise KeyError(name)

    def _gpu(self, index: int | None) -> SimGpu:
        if index is None:
            index = 0
        if not 0 <= index < len(self.hardware.gpus):
            raise FaultError(f"{self.node_id} has no GPU {index} (it has {len(self.hardware.gpus)})")
        return self.hardware.gpus[index]

    def reset_gpus(self, gpus: Sequence[int]) -> str | None:
        """``nvidia-smi -r`` on each of ``gpus`` in turn: a reset clears the card's volatile
        state (volatile ECC counts, throttling). It keeps what the card stores (aggregate ECC
        counts, a failed row remap), what the kernel logged (an Xid stays in the ring buffer),
        and a silently bad GPU, a defect of the part. A GPU that fell off the bus cannot be
        reset (the first such ends the step; the GPUs before it were reset). None: all reset."""
        for index in gpus:
            gpu = self._gpu(index)
            if gpu.lost:
                self._readings.clear()
                return (f"{' '.join(gpu_reset_argv(index))} exited with 15: Unable to determine the device handle "
                        f"for GPU {gpu.pci_bus_id}: GPU is lost. Reboot the system to recover this GPU")
            gpu.ecc_volatile = [0, 0]
            gpu.throttle = []
        self._readings.clear()
        return None

    def boot(self) -> None:
        """The node comes back from a reboot: a new boot id and a fresh kernel ring buffer;
        the GPUs' volatile state is gone and a GPU that fell off the bus is back, the kernel's
        per-boot counters (EDAC, SCSI I/O errors) start at zero and a filesystem remounted
        read-only is mounted read-write again. What the hardware keeps stays: aggregate ECC
        counts, a failed row remap, a silently bad GPU, a failing disk; so do injected collector
        failures. Health-ingest decides which of its held conditions a reboot clears."""
        hw = self.hardware
        self.boot_id = str(uuid.uuid4())
        self.kmsg = SimKmsg()
        for gpu in hw.gpus:
            gpu.ecc_volatile = [0, 0]
            gpu.throttle = []
            gpu.lost = False
        hw.edac_ce = hw.edac_ue = hw.io_errors = 0
        hw.readonly_mount = False
        self._inventory = None
        self._readings.clear()

    def report_outcome(self, outcome: wire.RemediationOutcome) -> None:
        """To the agent of this boot, at once; kept for the next boot's reports too."""
        self.remediation = outcome
        if self.collector is not None:
            self.collector.report_outcome(outcome)

    def inject(self, fault: str, gpu: int | None, now: datetime, *, rate: float | None = None,
               ramp_s: float | None = None) -> str:
        """Apply ``fault``; returns what happened, in words. Raises :class:`FaultError`."""
        hw, tally = self.hardware, self.kmsg.tally
        out_of_band = False
        if fault in JOB_MODELS:
            hw.jobs = job_failures(fault, rate, ramp_s, now)
            return f"{fault} injected on {self.node_id}: {describe_jobs(hw.jobs)}"
        if rate is not None or ramp_s is not None:
            raise FaultError(f"--rate and --ramp are job-killer's and slow-death's, not {fault}'s")
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
        elif fault == "nvlink-fabric":
            # The NVLink fabric of the node's domain failed (NVL72: its switch trays, or the fabric
            # manager): every GPU, or --gpu N alone, logs NVLink5's Xid 145 (the catalog's decode).
            for target in [self._gpu(gpu)] if gpu is not None else hw.gpus:
                tally.add_finding(XidFinding(target.pci_bus_id, NVLINK_FABRIC_XID,
                                             f"NVRM: Xid (PCI:{target.pci_bus_id[:-2]}): {NVLINK_FABRIC_XID}, "
                                             "pid=4242, name=python3"), now)
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
        elif fault in ("silent", "power-loss"):  # power-loss: the node of a rack whose feed failed
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


class SimActions:
    """The vocabulary on a simulated node (:class:`remediation.Actions`)."""

    def __init__(self, node: SimNode) -> None:
        self.node = node

    async def gpu_reset(self, gpus: Sequence[int], within_s: float) -> str | None:
        return self.node.reset_gpus(gpus)

    async def reboot(self, pending: PendingReboot, within_s: float) -> str | None:
        self.node.pending_reboot = pending
        self.node.rebooting.set()  # the node's agent stops; its next boot settles the request
        return None


def remediator_of(node: SimNode, cluster: str, log: Any) -> Remediator:
    def facts() -> NodeFacts:
        return NodeFacts(gpus=tuple(g.index for g in node.hardware.gpus), boot_id=node.boot_id)

    return Remediator(node.node_id, cluster, SimActions(node), facts, node.report_outcome, log,
                      count_remediation, rejecter("sim"))


def remediation_subjects(cluster: str) -> str:
    """Every node's remediation subject of ``cluster``: the simulator reads them all."""
    return f"{subjects.PREFIX}.remediate.{subjects.encode_token(cluster)}.*"


class InjectRequest(msgspec.Struct, rename="camel"):
    node_id: str
    fault: str
    gpu: int | None = None
    rate: float | None = None  # job-killer, slow-death: the failure probability (slow-death: reached after the ramp)
    ramp_seconds: float | None = None  # slow-death: how long the probability takes to rise from 0 to the rate


class InjectReply(msgspec.Struct, rename="camel", omit_defaults=True):
    ok: bool
    message: str
    failing_gpus: list[int] | None = None  # the node's silently bad GPUs after the injection
    jobs: wire.SimJobFailures | None = None  # how the node kills jobs after the injection


# The faults that change what only a validation run can see: `sim inject` records the node's
# hidden truth for the reference scheduler after each.
HIDDEN_FAULTS: Final = ("silent-gpu", "job-killer", "slow-death", "clear")
JOB_MODELS: Final = ("job-killer", "slow-death")
SLOW_DEATH_RAMP_S: Final = 3600.0


def job_failures(fault: str, rate: float | None, ramp_s: float | None, now: datetime) -> wire.SimJobFailures:
    """``--fault job-killer [--rate R]`` (R defaults to 1: every job) or ``--fault slow-death
    [--rate R] [--ramp S]`` (rising from 0 to R, default 1, over S seconds, default an hour)."""
    chosen = 1.0 if rate is None else rate
    if not 0.0 <= chosen <= 1.0:
        raise FaultError(f"--rate must be a probability between 0 and 1 (got {chosen:g})")
    if fault == "job-killer":
        if ramp_s is not None:
            raise FaultError("--ramp is slow-death's: a job-killer fails jobs at its rate at once")
        return wire.SimJobFailures(model="job-killer", rate=chosen, since=now)
    ramp = SLOW_DEATH_RAMP_S if ramp_s is None else ramp_s
    if not (math.isfinite(ramp) and ramp > 0.0):
        raise FaultError(f"--ramp must be a number of seconds > 0 (got {ramp:g})")
    return wire.SimJobFailures(model="slow-death", rate=chosen, since=now, ramp_seconds=ramp)


def describe_jobs(jobs: wire.SimJobFailures) -> str:
    if jobs.model == "job-killer":
        return f"each job it runs fails within seconds with probability {jobs.rate:g}"
    return (f"the chance a job it runs fails rises from 0 to {jobs.rate:g} over {jobs.ramp_seconds:g}s, "
            "each failing at its normal end")


def inject_subject(cluster: str) -> str:
    from healthplane.contracts.subjects import PREFIX, encode_token

    return f"{PREFIX}.sim.{encode_token(cluster)}.inject"


def terminations_subject(cluster: str) -> str:
    from healthplane.contracts.subjects import PREFIX, encode_token

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


async def _either(first: asyncio.Event, second: asyncio.Event, then: asyncio.Event) -> None:
    """Set ``then`` when ``first`` or ``second`` is set."""
    waits = [asyncio.create_task(first.wait()), asyncio.create_task(second.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    then.set()


def sim_fabric(cluster: str, nvlink_domain_size: int, position: int) -> wire.GpuFabric | None:
    """DOM-1: the fabric info of the fleet's ``position``-th node when every ``nvlink_domain_size``
    nodes in a row share an NVLink domain (0: no fabric). Each domain is its own fabric cluster
    (a UUID derived from the cluster and the domain's number, stable across runs), clique 1."""
    if nvlink_domain_size <= 0:
        return None
    number = position // nvlink_domain_size
    fabric_uuid = uuid.uuid5(uuid.NAMESPACE_URL, f"healthplane-sim:{cluster}:nvlink:{number}")
    return wire.GpuFabric(cluster_uuid=str(fabric_uuid), clique_id=1, state="completed")


def sim_rack(rack_size: int, position: int) -> dict[str, str]:
    """DOM-1: the annotations by which the fleet's ``position``-th node tells its rack when every
    ``rack_size`` nodes in a row share one (r0, r1, …; 0: no rack told), as an agent told its
    rack at provisioning does."""
    if rack_size <= 0:
        return {}
    return domains.told_annotations({"rack": f"r{position // rack_size}"})


class Fleet:
    def __init__(self, count: int, cluster: str = "default", interval_s: int = 30, prefix: str = "sim-",
                 gpus: int = 8, provisioned: int = 0, nvlink_domain_size: int = 0, rack_size: int = 0) -> None:
        self.cluster = cluster
        self.nodes = {f"{prefix}{i:03d}": SimNode(f"{prefix}{i:03d}", gpus,
                                                  fabric=sim_fabric(cluster, nvlink_domain_size, i))
                      for i in range(count)}
        self.annotations = {node_id: sim_rack(rack_size, i) for i, node_id in enumerate(self.nodes)}
        self.interval_s = interval_s
        # The last ``provisioned`` nodes stand for instances the control plane created (a
        # cloud pool), the rest for hardware the site owns: deprovision and replace need both.
        self.provisioned = set(list(self.nodes)[count - provisioned:]) if provisioned > 0 else set()

    def inject(self, request: InjectRequest) -> InjectReply:
        node = self.nodes.get(request.node_id)
        if node is None:
            return InjectReply(ok=False, message=f"no simulated node {request.node_id!r} in cluster {self.cluster}")
        try:
            message = node.inject(request.fault, request.gpu, datetime.now(UTC), rate=request.rate,
                                  ramp_s=request.ramp_seconds)
            return InjectReply(ok=True, message=message,
                               failing_gpus=[g.index for g in node.hardware.gpus if g.silently_bad],
                               jobs=node.hardware.jobs)
        except FaultError as exc:
            return InjectReply(ok=False, message=str(exc))

    async def run(self, nc: Any, stopping: asyncio.Event, log: Any) -> None:
        from healthplane.runtime import telemetry
        from healthplane.runtime.publish import Publisher

        publisher = Publisher(nc, window=8192)
        exporting = telemetry.active  # INT-4: each simulated report starts a trace, as an agent's does

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

        remediators = {subjects.remediate(self.cluster, node_id): remediator_of(node, self.cluster,
                                                                                log.bind(node_id=node_id))
                       for node_id, node in self.nodes.items()}

        async def on_remediation(msg: Any) -> None:
            remediator = remediators.get(msg.subject)
            if remediator is None:
                return  # not a node of this fleet
            node = self.nodes[remediator.node_id]
            if node.silent:  # hung or terminated: nothing on it answers
                log.info("remediation request for a silent node; ignored", node_id=node.node_id)
                return
            remediator.take(msg.data, datetime.now(UTC))

        await nc.subscribe(remediation_subjects(self.cluster), cb=on_remediation)

        async def node_main(node: SimNode, delay: float) -> None:
            await asyncio.sleep(delay)
            settings = Settings(node_id=node.node_id, cluster=self.cluster, interval_s=self.interval_s,
                                definition="gpu-pool", provisioned=node.node_id in self.provisioned,
                                annotations=self.annotations[node.node_id])
            remediator = remediators[subjects.remediate(self.cluster, node.node_id)]

            async def publish(subject: str, payload: bytes) -> None:
                if node.silent:
                    return
                if exporting is None:
                    future = await publisher.submit(subject, payload)
                    await publisher.wait(subject, future)
                    return
                with exporting.publishing("collector", subject) as headers:
                    future = await publisher.submit(subject, payload, headers)
                    await publisher.wait(subject, future)

            # Kmsg faults replace node.kmsg on "clear": keep the collector looking at the live one.
            class LiveKmsg:
                def signal(self, gpus_by_pci: Mapping[str, int]) -> wire.KmsgSignal:
                    return node.kmsg.signal(gpus_by_pci)

            while not stopping.is_set():  # one agent per boot of the node
                node.collector = collector = Collector(settings, node, LiveKmsg())
                collector.remediation = node.remediation
                if node.pending_reboot is not None:  # back from a reboot: the new boot id proves it
                    pending, node.pending_reboot = node.pending_reboot, None
                    remediator.report(settle(pending, node.boot_id, datetime.now(UTC)))
                this_boot = asyncio.Event()
                ends = asyncio.create_task(_either(stopping, node.rebooting, this_boot))
                try:
                    await run_agent(collector, publish, this_boot, node.out_of_band, log.bind(node_id=node.node_id))
                finally:
                    ends.cancel()
                if node.rebooting.is_set() and not stopping.is_set():
                    node.rebooting.clear()
                    node.boot()
                    log.info("simulated node rebooted", node_id=node.node_id, boot_id=node.boot_id)

        # Spread the fleet's first reports over one interval, as real agents would be.
        spread = min(float(self.interval_s), 5.0)
        tasks = [asyncio.create_task(node_main(node, spread * i / max(1, len(self.nodes))))
                 for i, node in enumerate(self.nodes.values())]
        await asyncio.gather(*tasks)


# ---------------------------------------------------------------------------- CLI
