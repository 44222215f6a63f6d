"""PCI bus ids in one form everywhere: lower-case ``dddd:bb:dd.f``.

Sources disagree: NVML gives ``00000000:3B:00.0`` (8-digit domain), nvidia-smi the same,
Xid lines ``0000:3b:00`` or ``PCI:0000:3b:00`` (no function), sysfs ``0000:3b:00.0``.
"""

from __future__ import annotations

import re
from functools import lru_cache

_PCI_RE = re.compile(
    r"^(?:PCI:)?(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})"
    r"(?:\.(?P<fn>[0-7]))?$"
)


@lru_cache(maxsize=4096)  # a node has a handful of addresses; every report asks again
def normalize(bus_id: str) -> str:
    """``00000000:3B:00.0`` / ``PCI:0000:3b:00`` / ``3b:00.0`` → ``0000:3b:00.0``.

    Raises ``ValueError`` for anything that is not a PCI address.
    """
    match = _PCI_RE.match(bus_id.strip())
    if not match:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain = int(match.group("domain") or "0", 16)
    if domain > 0xFFFF:
        raise ValueError(f"PCI domain out of range: {bus_id!r}")
    bus, dev = int(match.group("bus"), 16), int(match.group("dev"), 16)
    fn = int(match.group("fn") or "0")
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"
