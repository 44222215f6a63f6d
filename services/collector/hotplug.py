"""What a device added or removed means for the agent (COL-11). Pure: the udev adapter
(``udev.py``) turns each event into a :class:`DeviceEvent` and asks :func:`reprobe_for`.

Every event that counts re-reads the inventory and sends a resource report at once; it also
re-reads the signal that covers the device:

* ``pci`` ``add`` / ``remove`` / ``bind`` / ``unbind``: an NVIDIA device (``PCI_ID`` vendor
  ``10DE``) re-reads ``gpu``, since the driver can read a GPU only once it is bound to it;
  any other PCI device only the inventory (AMD GPUs are inventory-only, COL-3).
* ``block`` ``add`` / ``remove`` of a whole disk re-reads ``smart`` and ``ioerr``.
  Partitions come with their disk, and virtual block devices (loop, zram, device mapper,
  md: everything under ``/devices/virtual/``) come and go with mounts, not hardware.
* Anything else (``change``, ``move``, other subsystems) is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

PCI_ACTIONS: Final = frozenset({"add", "remove", "bind", "unbind"})
BLOCK_ACTIONS: Final = frozenset({"add", "remove"})
NVIDIA_PCI_VENDOR: Final = "10de"
VIRTUAL_DEVICES: Final = "/devices/virtual/"


@dataclass(frozen=True, slots=True)
class DeviceEvent:
    """One udev event, as much of it as the decision needs."""

    action: str | None
    subsystem: str | None
    sys_name: str
    device_path: str  # under /sys: /devices/pci0000:00/0000:00:02.0/...
    device_type: str | None = None  # block: "disk" or "partition"
    pci_id: str | None = None  # the PCI_ID property, "10DE:2330"


@dataclass(frozen=True, slots=True)
class Reprobe:
    """Re-read the inventory (always) and these signals, then send a resource report."""

    signals: frozenset[str]
    devices: tuple[str, ...]  # "add pci 0000:3b:00.0", for the log

    def union(self, other: Reprobe) -> Reprobe:
        return Reprobe(self.signals | other.signals, self.devices + other.devices)


def reprobe_for(event: DeviceEvent) -> Reprobe | None:
    """What ``event`` asks of the agent; None when it is not a hotplug the agent cares about."""
    if event.action is None:
        return None
    what = (f"{event.action} {event.subsystem} {event.sys_name}",)
    if event.subsystem == "pci" and event.action in PCI_ACTIONS:
        vendor = (event.pci_id or "").partition(":")[0].lower()
        return Reprobe(frozenset({"gpu"}) if vendor == NVIDIA_PCI_VENDOR else frozenset(), what)
    if (event.subsystem == "block" and event.action in BLOCK_ACTIONS and event.device_type == "disk"
            and not event.device_path.startswith(VIRTUAL_DEVICES)):
        return Reprobe(frozenset({"smart", "ioerr"}), what)
    return None
