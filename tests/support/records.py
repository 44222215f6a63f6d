"""Realistic wire records for tests and benchmarks."""

from __future__ import annotations

from datetime import UTC, datetime

from healthplane.contracts import wire


def resource_report(node_id: str, *, cluster: str = "default", cores: int = 192, gpus: int = 8,
                    annotations: int = 10, provisioned: bool = False, definition: str | None = "gpu-pool",
                    hostname: str | None = None, ready: bool = True, padding: int = 0) -> wire.ResourceReport:
    """A 192-core, 8-GPU node with 10 annotations by default (the reference's sizing example)."""
    devices = [
        wire.ResourceDevice(kind="gpu", vendor="nvidia", index=i, pci_bus_id=f"0000:{0x18 + 0x10 * i:02x}:00.0",
                            uuid=f"GPU-{i:08x}-1c2d-3e4f-5a6b-7c8d9e0f1a2b", model="NVIDIA H200",
                            memory_bytes=143_771_336_704)
        for i in range(gpus)
    ]
    notes = {f"healthplane.dev/annotation-{i}": f"value-{i}-{'x' * 24}" for i in range(annotations)}
    if padding:
        notes["padding"] = "p" * padding
    return wire.ResourceReport(
        node_id=node_id, cluster=cluster, hostname=hostname or node_id.replace("/", "-"),
        sent_at=datetime(2026, 11, 30, 8, 0, tzinfo=UTC), ready=ready, cores=cores,
        memory_bytes=2_164_663_517_184, devices=devices, annotations=notes, definition=definition,
        provisioned=provisioned,
    )


def subject_for(stream: str, data: bytes) -> str:
    """The subject a record of ``stream`` is stored on: its node's own (SEC-7), as the writer
    would publish it; for folds fed by hand in unit tests."""
    import json

    from healthplane.contracts import subjects

    record = json.loads(data)
    cluster, node_id = record["cluster"], record["nodeId"]
    if stream == "HP_REPORTS":
        return subjects.report(cluster, node_id)
    if stream == "HP_RESOURCES":
        return subjects.resource(cluster, node_id)
    if stream == "HP_ASSESSMENTS":
        return subjects.assessment(cluster, node_id)
    if stream == "HP_NODE_EVENTS":
        return subjects.event(cluster, node_id, record["type"])
    if stream == "HP_ALLOCATIONS":
        return subjects.allocation(cluster, node_id, record["id"])
    raise ValueError(f"no per-node subject for {stream}")
