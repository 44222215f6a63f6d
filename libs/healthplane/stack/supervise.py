"""When ``healthplane up`` restarts a service that died: systemd's ``Restart=on-failure`` with
a growing ``RestartSec`` and a start limit. Pure: times and exit codes arrive as arguments.

- a clean exit (code 0) is not a failure and is not restarted (the service chose to stop);
- a failure (non-zero code, or killed by a signal) is restarted after ``base_delay_s``,
  doubling with each failure inside ``window_s`` up to ``max_delay_s``;
- ``burst`` failures inside ``window_s`` give up on the service: a crash loop restarted
  forever hides the fault and burns the machine (systemd's ``StartLimitBurst``).
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    base_delay_s: float = 1.0
    max_delay_s: float = 30.0
    burst: int = 5
    window_s: float = 60.0


@dataclass(frozen=True, slots=True)
class Restart:
    delay_s: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    reason: str


@dataclass(frozen=True, slots=True)
class LeaveStopped:
    reason: str


Decision = Restart | GiveUp | LeaveStopped


def exit_reason(code: int) -> str:
    """``Popen.returncode`` in words: negative is the signal that ended the process."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with {code}"


def after_exit(policy: RestartPolicy, code: int, failures_at: Sequence[float], now: float) -> Decision:
    """What to do about a service that just ended with ``code``; ``failures_at`` are the
    times of its earlier failures (this one not included)."""
    if code == 0:
        return LeaveStopped("exited cleanly")
    recent = [t for t in failures_at if now - t < policy.window_s] + [now]
    if len(recent) >= policy.burst:
        return GiveUp(f"failed {len(recent)} times within {policy.window_s:g}s")
    return Restart(min(policy.max_delay_s, policy.base_delay_s * 2 ** (len(recent) - 1)))
