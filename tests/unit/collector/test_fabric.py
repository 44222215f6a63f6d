"""DOM-1: NVML's GPU fabric info (cluster UUID, clique id) read through pynvml where the driver
has it, and absent (NOT_SUPPORTED, an old driver, no fabric) without an error; the GPUs carry
it into the resource report, and the simulator tells it for groups of nodes.

There is no NVIDIA driver here: the decode is tested on pynvml's own ``c_nvmlGpuFabricInfo*``
structures, and the adapter (``probe.read_fabric``, the one place that calls NVML for it)
against pynvml with its device calls replaced, as tests/unit/collector/test_gpu.py does."""

from __future__ import annotations

import ctypes
import types
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pynvml
import pytest

from healthplane.contracts import domains, wire
from healthplane_collector.agent import Settings, build_resource_report
from healthplane_collector.gpu_nvml import fabric_info, fabric_of_struct
from healthplane_collector.inventory import Inventory
from healthplane_collector.probe import read_fabric, read_gpu_nvml
from healthplane_collector.resources import merge_gpus
from healthplane_collector.sim import Fleet
from tests.unit.collector.test_gpu import FakeGpu, FakeNvml, fake_nvml, nvml_error  # noqa: F401 - a fixture

CLUSTER_UUID = uuid.UUID("6b1d6c4e-2e0f-4c65-9d3e-0d8f8a1c2b3a")


def filled(kind: type[Any], *, state: int, status: int = pynvml.NVML_SUCCESS, clique: int = 32766,
           cluster: uuid.UUID = CLUSTER_UUID) -> Any:
    info = kind()
    for i, byte in enumerate(cluster.bytes):
        info.clusterUuid[i] = byte
    info.cliqueId, info.state, info.status = clique, state, status
    return info


@pytest.mark.parametrize("kind", [pynvml.c_nvmlGpuFabricInfo_t, pynvml.c_nvmlGpuFabricInfo_v2_t,
                                  pynvml.c_nvmlGpuFabricInfoV_t])
@pytest.mark.parametrize(("state", "status", "expected"), [
    (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS, "completed"),
    (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_ERROR_UNKNOWN, "failed"),
    (pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, pynvml.NVML_SUCCESS, "in-progress"),
    (pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED, pynvml.NVML_SUCCESS, "not-started"),
    (pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, pynvml.NVML_SUCCESS, None),
    (77, pynvml.NVML_SUCCESS, None),  # a state this code does not know: no claim
])
def test_dom1_fabric_structures_decode(kind: type[Any], state: int, status: int, expected: str | None) -> None:
    found = fabric_of_struct(filled(kind, state=state, status=status))
    if expected is None:
        assert found is None
    else:
        assert found == wire.GpuFabric(cluster_uuid=str(CLUSTER_UUID), clique_id=32766, state=expected)  # type: ignore[arg-type]


def test_dom1_the_fabric_decode_takes_exactly_sixteen_bytes() -> None:
    assert fabric_info(bytes(15), 1, pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 0) is None
    assert fabric_info(list(CLUSTER_UUID.bytes), 4, pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 0) == wire.GpuFabric(
        cluster_uuid=str(CLUSTER_UUID), clique_id=4, state="completed")


class StandIn:
    """pynvml with the two fabric calls answering as a driver would."""

    NVMLError = pynvml.NVMLError
    c_nvmlGpuFabricInfo_t = pynvml.c_nvmlGpuFabricInfo_t
    c_nvmlGpuFabricInfo_v2_t = pynvml.c_nvmlGpuFabricInfo_v2_t

    def __init__(self, v: Callable[[Any], None] | int, v1: Callable[[Any], None] | int | None = None) -> None:
        self.v, self.v1, self.calls = v, v1, []  # type: ignore[var-annotated]

    @staticmethod
    def _answer(how: Callable[[Any], None] | int | None, ref: Any) -> None:
        if how is None or isinstance(how, int):
            raise nvml_error(how if how is not None else pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        how(ref._obj)

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, ref: Any) -> int:
        self.calls.append(("V", type(ref._obj).__name__))
        self._answer(self.v, ref)
        return 0

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, ref: Any) -> int:
        self.calls.append(("v1", type(ref._obj).__name__))
        self._answer(self.v1, ref)
        return 0


def _fill(state: int, clique: int = 32766) -> Callable[[Any], None]:
    def fill(info: Any) -> None:
        answer = filled(type(info), state=state, clique=clique)  # as the driver writes it
        ctypes.memmove(ctypes.addressof(info), ctypes.addressof(answer), ctypes.sizeof(info))
    return fill


def test_dom1_the_adapter_asks_the_versioned_call_with_its_version_set() -> None:
    seen: list[int] = []

    def fill(info: Any) -> None:
        seen.append(info.version)
        _fill(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED)(info)

    nvml = StandIn(fill)
    assert read_fabric(nvml, object()) == wire.GpuFabric(cluster_uuid=str(CLUSTER_UUID), clique_id=32766,
                                                         state="completed")
    assert nvml.calls == [("V", "c_nvmlGpuFabricInfo_v2_t")]
    assert seen == [pynvml.nvmlGpuFabricInfo_v2]


def test_dom1_an_older_driver_answers_the_unversioned_call() -> None:
    nvml = StandIn(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, _fill(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 3))
    assert read_fabric(nvml, object()) == wire.GpuFabric(cluster_uuid=str(CLUSTER_UUID), clique_id=3,
                                                         state="completed")
    assert nvml.calls == [("V", "c_nvmlGpuFabricInfo_v2_t"), ("v1", "c_nvmlGpuFabricInfo_t")]


@pytest.mark.parametrize("nvml", [
    pytest.param(StandIn(pynvml.NVML_ERROR_NOT_SUPPORTED), id="NOT_SUPPORTED (no fabric)"),
    pytest.param(StandIn(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND),
                 id="a driver without either call"),
    pytest.param(StandIn(pynvml.NVML_ERROR_UNKNOWN), id="another error"),
    pytest.param(StandIn(_fill(pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED)), id="state NOT_SUPPORTED"),
])
def test_dom1_no_fabric_is_no_fabric_info_and_not_an_error(nvml: StandIn) -> None:
    assert read_fabric(nvml, object()) is None


def test_dom1_a_binding_without_the_fabric_calls_reads_none() -> None:
    assert read_fabric(types.SimpleNamespace(NVMLError=pynvml.NVMLError), object()) is None


def test_dom1_nvml_read_carries_each_gpus_fabric_into_the_signal_and_the_resource_report(
        fake_nvml: Callable[..., FakeNvml], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    fake_nvml(FakeGpu("00000000:3B:00.0"), FakeGpu("00000000:86:00.0"))
    completed = _fill(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED)

    def fabric_v(handle: FakeGpu, ref: Any) -> int:
        if handle.bus_id.startswith("00000000:86"):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        completed(ref._obj)
        return 0

    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuFabricInfoV", fabric_v)
    signal = read_gpu_nvml()
    assert signal.status == "ok"
    told = wire.GpuFabric(cluster_uuid=str(CLUSTER_UUID), clique_id=32766, state="completed")
    assert [d.fabric for d in signal.devices] == [told, None]

    on_bus = [wire.ResourceDevice(kind="gpu", vendor="nvidia", index=i, pci_bus_id=b)
              for i, b in enumerate(("0000:3b:00.0", "0000:86:00.0"))]
    merged = merge_gpus(on_bus, signal.devices)
    assert [d.fabric for d in merged] == [told, None]
    resources = build_resource_report(Settings(node_id="gb200-01"), Inventory("gb200-01", 8, 1 << 30, None,
                                                                              tuple(on_bus)),
                                      True, datetime.now(UTC), signal)
    again = wire.decode(wire.ResourceReport, wire.encode(resources))
    assert domains.hardware_domains(again) == {"nvlink": f"{CLUSTER_UUID}.32766"}


def test_dom1_a_report_from_before_the_fabric_still_decodes() -> None:
    old = (b'{"nodeId":"n","cluster":"default","hostname":"n","sentAt":"2026-08-05T13:41:02Z","ready":true,'
           b'"cores":8,"memoryBytes":1,"devices":[{"kind":"gpu","vendor":"nvidia","index":0,'
           b'"pciBusId":"0000:3b:00.0","uuid":null,"model":null,"memoryBytes":null}]}')
    decoded = wire.decode(wire.ResourceReport, old)
    assert decoded.devices[0].fabric is None and domains.hardware_domains(decoded) == {}


async def test_dom1_the_simulator_puts_every_n_nodes_in_one_nvlink_domain() -> None:
    fleet = Fleet(10, cluster="default", nvlink_domain_size=4)
    told: dict[str, str] = {}
    for node_id, node in fleet.nodes.items():
        gpus = (await node.read("gpu")).devices
        assert len({g.fabric for g in gpus}) == 1  # every GPU of a node in the same domain
        inventory = node.inventory()
        resources = build_resource_report(Settings(node_id=node_id), inventory, True, datetime.now(UTC),
                                          await node.read("gpu"))
        told[node_id] = domains.hardware_domains(resources)["nvlink"]
    groups = [sorted(n for n in told if told[n] == d) for d in dict.fromkeys(told.values())]
    assert groups == [["sim-000", "sim-001", "sim-002", "sim-003"], ["sim-004", "sim-005", "sim-006", "sim-007"],
                      ["sim-008", "sim-009"]]
    assert Fleet(2, cluster="default", nvlink_domain_size=4).nodes["sim-000"].fabric == \
        fleet.nodes["sim-000"].fabric  # stable across runs
    for node in Fleet(3).nodes.values():  # the default: no fabric, as on hardware without one
        assert {g.fabric for g in (await node.read("gpu")).devices} == {None}
