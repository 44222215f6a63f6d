"""What the collector's and the simulator's flags accept: shared by the argument parsers
(``cli.py``, kept cheap to import) and the code they run."""

from __future__ import annotations

from typing import Final

FAULTS: Final = (
    "xid:<N>", "ecc-correctable", "ecc-uncorrectable", "row-remap-failure", "edac-ce", "edac-ue",
    "mce-corrected", "mce-fatal", "hw-error-corrected", "hw-error-fatal", "smart-failing",
    "io-errors", "readonly-mount", "throttle-thermal", "power-brake", "collector-failed:<signal>",
    "silent-gpu", "job-killer", "slow-death", "silent", "power-loss", "nvlink-fabric", "resume", "clear",
)
DEADLINE_DEFAULT_S: Final = 30.0
DEADLINE_MIN_S: Final = 1.0
DEADLINE_MAX_S: Final = 55.0
