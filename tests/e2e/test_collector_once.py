"""`healthplane collector --once -o json` on this machine: every signal's status is honest
(COL-4): unavailable only where the machine lacks the hardware or tool, never "ok" with
nothing behind it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path


def test_once_on_this_machine_is_honest(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "healthplane.cli", "collector", "--once", "-o", "json",
                             "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    signals = report["signals"]
    assert set(signals) == {"edac", "smart", "ioerr", "kmsg", "mounts", "gpu"}
    for name, signal in signals.items():
        assert signal["status"] in ("ok", "unavailable", "failed"), name
        if signal["status"] != "ok":
            assert signal["reason"], f"{name} is {signal['status']} without saying why"

    edac_root = Path("/sys/devices/system/edac/mc")
    has_edac = edac_root.is_dir() and any(re.fullmatch(r"mc\d+", p.name) for p in edac_root.iterdir())
    assert (signals["edac"]["status"] == "unavailable") == (not has_edac)
    if shutil.which("smartctl") is None:
        assert signals["smart"]["status"] == "unavailable" and "smartctl" in signals["smart"]["reason"]
    if shutil.which("nvidia-smi") is None and not Path("/proc/driver/nvidia").exists():
        assert signals["gpu"]["status"] == "unavailable"
    if not Path("/dev/kmsg").exists():
        assert signals["kmsg"]["status"] == "unavailable"
    else:
        assert signals["kmsg"]["backlogSkipped"] is False  # --once reads the whole buffer
    assert report["trigger"] == "start" and report["intervalSeconds"] == 30
