"""Hotplug through udev (``pyudev``, COL-11): block and PCI devices added or removed.

The monitor's socket is read on the agent's event loop (``loop.add_reader``): each event
becomes a :class:`DeviceEvent`, :func:`hotplug.reprobe_for` decides what it asks of the
agent, and the answer goes to ``on_reprobe`` (the agent's :class:`Hotplug`).

Optional at runtime: without a udev daemon (a container without the host's ``/run/udev``
or outside the host's network namespace, where udev's netlink messages never arrive), or
with ``--root`` pointing at a tree that is not this host, :func:`watch` logs one line and
returns None; the agent then sees hotplug at its next periodic probe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Protocol

from healthplane_collector.hotplug import DeviceEvent, Reprobe, reprobe_for

SUBSYSTEMS: Final = ("block", "pci")
UDEV_CONTROL: Final = Path("/run/udev/control")


class UdevUnavailable(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Monitor(Protocol):
    """What the watcher uses of ``pyudev.Monitor``."""

    def fileno(self) -> int: ...
    def poll(self, timeout: float | None = None) -> Any: ...


def open_monitor(root: Path, control: Path = UDEV_CONTROL) -> Monitor:
    """A started ``pyudev.Monitor`` on the ``udev`` source, filtered to block and PCI.

    Raises :class:`UdevUnavailable` saying why there is none.
    """
    if root != Path("/"):
        raise UdevUnavailable(f"--root {root} is not this host: its udev events describe other devices")
    if not control.exists():
        # libudev would open a monitor anyway and silently never deliver an event.
        raise UdevUnavailable(f"no udev daemon ({control} does not exist)")
    try:
        import pyudev

        monitor = pyudev.Monitor.from_netlink(pyudev.Context())
        for subsystem in SUBSYSTEMS:
            monitor.filter_by(subsystem)
        monitor.start()
    except (ImportError, OSError) as exc:
        raise UdevUnavailable(f"cannot monitor udev: {exc}") from exc
    result: Monitor = monitor
    return result


def event_of(device: Any) -> DeviceEvent:
    """A ``pyudev.Device`` received from a monitor → the facts the decision needs."""
    return DeviceEvent(
        action=device.action, subsystem=device.subsystem, sys_name=device.sys_name,
        device_path=device.device_path, device_type=device.device_type,
        pci_id=device.properties.get("PCI_ID"),
    )


class UdevWatcher:
    """Reads a monitor on the event loop; every event that counts goes to ``on_reprobe``."""

    def __init__(self, monitor: Monitor, on_reprobe: Callable[[Reprobe], None], log: Any = None) -> None:
        self.monitor, self.on_reprobe, self.log = monitor, on_reprobe, log
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self.monitor.fileno(), self.drain)

    def detach(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self.monitor.fileno())
            self._loop = None

    def drain(self) -> None:
        """Every event queued now; the socket is non-blocking, so this never waits."""
        while True:
            try:
                device = self.monitor.poll(timeout=0)
            except OSError as exc:
                if self.log is not None:
                    self.log.warning("udev monitor failed; hotplug seen at the next cycle", error=str(exc))
                self.detach()
                return
            if device is None:
                return
            reprobe = reprobe_for(event_of(device))
            if reprobe is not None:
                self.on_reprobe(reprobe)


def watch(root: Path, on_reprobe: Callable[[Reprobe], None], log: Any,
          control: Path = UDEV_CONTROL) -> UdevWatcher | None:
    """Watch udev on the running loop, or log one line saying why not and return None."""
    try:
        monitor = open_monitor(root, control)
    except UdevUnavailable as exc:
        log.info("udev unavailable; devices added or removed are seen at the next cycle", reason=exc.reason)
        return None
    watcher = UdevWatcher(monitor, on_reprobe, log)
    watcher.attach(asyncio.get_running_loop())
    log.info("watching udev for devices added or removed", subsystems=list(SUBSYSTEMS))
    return watcher
