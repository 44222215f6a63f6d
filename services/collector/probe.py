"""Running a probe (smartctl, nvidia-smi) with a hard timeout: at the timeout its whole
process group is killed, so a hung tool can never stall the agent (COL-12)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Completed:
    returncode: int
    stdout: bytes
    stderr: bytes


class TimedOut(Exception):
    pass


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    # The group outlives its leader while any member lives (and its id is not reused until
    # then), so this also reaches a child that still holds the pipes after the leader exited.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def run_probe(argv: Sequence[str], timeout_s: float) -> Completed:
    """Run ``argv``; at ``timeout_s`` kill its whole process group and raise ``TimedOut``."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own group, so a hung child dies with it
        env={**os.environ, "LC_ALL": "C"},
    )
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        _kill_group(proc)
        await proc.wait()
        raise TimedOut from None
    except BaseException:
        _kill_group(proc)
        await proc.wait()
        raise
    return Completed(proc.returncode if proc.returncode is not None else -1, stdout, stderr)
