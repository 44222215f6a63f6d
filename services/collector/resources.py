"""The resource report's GPU list (COL-11): the GPUs on the PCI bus, as sysfs lists them,
merged with what the driver (NVML or ``nvidia-smi``) reads of each. Pure: no I/O.

* The two are matched by normalised PCI bus id (``pci.normalize``). A GPU both see carries
  the driver's ``uuid``, ``model`` (its product name, "NVIDIA H100 80GB HBM3") and
  ``memoryBytes`` (total framebuffer) and, from NVML, ``fabric`` (its NVLink domain, DOM-1);
  a field the driver did not read stays null.
* A GPU on the bus that the driver does not list (fallen off the bus, driver not loaded or
  not bound, an AMD GPU, a probe that failed or timed out) is listed without those fields.
  The fields always come from the current reading, never a remembered one: a card the
  driver cannot read right now is not described as if it could.
* A GPU only the driver lists (no sysfs entry: a container without the host's ``/sys``, a
  ``--root`` tree without ``sys/bus/pci``) is listed too, as an NVIDIA GPU with the driver's
  details: the driver reads it, so it is there to schedule on.
* ``index`` counts per vendor in PCI bus order over the merged list, as the inventory does:
  the same numbers as sysfs gave when sysfs lists every GPU, and NVML's default enumeration
  order when it lists none.
"""

from __future__ import annotations

from collections.abc import Iterable

from healthplane.contracts import wire
from healthplane_collector import pci


def _bus_id(raw: str) -> str | None:
    try:
        return pci.normalize(raw)
    except ValueError:
        return None


def merge_gpus(on_bus: Iterable[wire.ResourceDevice],
               read_by_driver: Iterable[wire.GpuDevice]) -> tuple[wire.ResourceDevice, ...]:
    """The resource report's GPUs: every GPU of ``on_bus`` or ``read_by_driver``, once each,
    in bus order, with the driver's details where it read that bus id."""
    driver: dict[str, wire.GpuDevice] = {}
    for gpu in read_by_driver:
        bus_id = _bus_id(gpu.pci_bus_id)
        if bus_id is not None:  # an address that does not parse can be neither matched nor listed
            driver.setdefault(bus_id, gpu)
    vendors: dict[str, wire.ResourceDevice] = {}
    for device in on_bus:
        bus_id = _bus_id(device.pci_bus_id)
        if bus_id is not None:
            vendors.setdefault(bus_id, device)

    next_index: dict[str, int] = {}
    merged: list[wire.ResourceDevice] = []
    for bus_id in sorted(vendors.keys() | driver.keys()):  # dddd:bb:dd.f sorts as bus order
        listed = vendors.get(bus_id)
        vendor = listed.vendor if listed is not None else "nvidia"
        index = next_index.get(vendor, 0)
        next_index[vendor] = index + 1
        read = driver.get(bus_id)
        merged.append(wire.ResourceDevice(
            kind="gpu", vendor=vendor, index=index, pci_bus_id=bus_id,
            uuid=read.uuid if read else None, model=read.name if read else None,
            memory_bytes=read.memory_bytes if read else None, fabric=read.fabric if read else None,
        ))
    return tuple(merged)
