"""The remediation ladder (REM-1) as a pure state machine: which step a faulty node gets next,
and when it stops for good.

Peers' users complain of three things (NVSentinel #1543, #1808): a node rebooted again and
again, repairs that silently stop retrying, remediation that assumes a reboot happened. Here:

- a ladder only goes **up**: each step runs once per episode, in order, and after the last
  (``replace`` or ``needs-attention``) nothing automatic touches the node again until an
  operator records service (the caller then forgets the episode);
- every step **ends**: with the agent's outcome, or at its timeout, which moves to the next
  step like a failure — never a silent stop; a step the host refused runs again after a
  doubling backoff, up to its ``retries``, then the next step;
- a reboot **counts only when proven**: the agent reports a new boot id, else it failed;
- attempts per node are bounded over a window, whatever the ladders say.

Pure: the caller (eviction) keeps a :class:`Climb` per node, feeds it what happened and
runs what it returns; no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Final, Literal

# draining: its work is leaving; running: a rung was sent; verifying: the agent ran it and the
# fault's condition has until the rung's deadline to clear; backoff: the host or provider
# refused the rung, which runs again at the deadline; stopped, succeeded: final.
Phase = Literal["draining", "running", "verifying", "backoff", "stopped", "succeeded"]


@dataclass(frozen=True, slots=True)
class Rung:
    action: str
    timeout_s: int
    retries: int = 0  # how often a refused step runs again before the next rung
    backoff_s: int = 30  # before the first retry; doubled for each one after


@dataclass(frozen=True, slots=True)
class Climb:
    """One node's episode: the ladder, where it is on it, and what it waits for."""

    fault_class: str
    rungs: tuple[Rung, ...]
    step: int = 0  # the rung being run (or next, while draining)
    phase: Phase = "draining"
    deadline: datetime | None = None  # the current rung's timeout
    attempts: tuple[datetime, ...] = ()  # when each agent step started (the window's bound)
    tries: int = 0  # retries of the current rung so far

    @property
    def rung(self) -> Rung:
        return self.rungs[self.step]

    @property
    def final(self) -> bool:
        """Nothing automatic touches the node again (until service)."""
        return self.phase in ("stopped", "succeeded")


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do now: run ``action`` (an agent step, ``replace``), or stop with ``why``."""

    action: Literal["run", "retry", "replace", "needs-attention", "succeeded", "wait"]
    step: str | None = None
    why: str = ""


WAIT: Final = Decision("wait")


def begin(fault_class: str, rungs: tuple[Rung, ...], attempts: tuple[datetime, ...] = ()) -> Climb:
    """A new episode; ``attempts``: the node's agent steps of earlier episodes (the window's
    bound holds across episodes)."""
    if not rungs or rungs[-1].action not in ("replace", "needs-attention"):
        raise ValueError("a ladder ends in replace or needs-attention")
    return Climb(fault_class, rungs, attempts=attempts)


def _in_window(attempts: tuple[datetime, ...], now: datetime, window: timedelta) -> int:
    return sum(1 for at in attempts if now - at < window)


def next_step(climb: Climb, now: datetime, max_attempts: int, window: timedelta) -> tuple[Climb, Decision]:
    """The node is drained (or the previous rung failed): run the current rung."""
    if climb.final:
        return climb, WAIT
    rung = climb.rung
    if rung.action == "needs-attention":
        return replace(climb, phase="stopped", deadline=None), Decision(
            "needs-attention", why=f"{climb.fault_class}: every step of its ladder was tried")
    if rung.action == "replace":
        return replace(climb, phase="stopped", deadline=None), Decision("replace", "replace")
    if _in_window(climb.attempts, now, window) >= max_attempts:
        stopped = replace(climb, phase="stopped", deadline=None)
        return stopped, Decision("needs-attention", why=(
            f"{climb.fault_class}: {max_attempts} remediation attempt(s) within {_span(window)}, the bound"))
    running = replace(climb, phase="running", deadline=now + timedelta(seconds=rung.timeout_s),
                      attempts=(*climb.attempts, now))
    return running, Decision("run", rung.action)


def drained(climb: Climb, now: datetime, max_attempts: int, window: timedelta) -> tuple[Climb, Decision]:
    if climb.phase != "draining":
        return climb, WAIT
    return next_step(climb, now, max_attempts, window)


def outcome(climb: Climb, now: datetime, *, ran: bool, reason: str, fault_active: bool,
            max_attempts: int, window: timedelta) -> tuple[Climb, Decision]:
    """The agent's outcome for the running rung. ``ran``: it succeeded (a reset the driver
    took, a reboot with a new boot id). It helped if the fault is gone; while its condition
    is still raised the rung waits for it to clear until its deadline (``verifying``: the
    next report decides). A step that did not run fails into the next rung at once."""
    if climb.phase != "running":
        return climb, WAIT
    if not ran:
        rung = climb.rung
        if climb.tries < rung.retries:
            delay = rung.backoff_s * 2 ** climb.tries
            waiting = replace(climb, phase="backoff", tries=climb.tries + 1, deadline=now + timedelta(seconds=delay))
            return waiting, Decision("retry", rung.action, f"retry {climb.tries + 1} of {rung.retries} in {delay}s")
        return _climb(climb, now, max_attempts, window)
    if not fault_active:
        return replace(climb, phase="succeeded", deadline=None), Decision("succeeded", climb.rung.action, reason)
    return replace(climb, phase="verifying"), WAIT


def cleared(climb: Climb) -> tuple[Climb, Decision]:
    """The fault's condition cleared while a rung ran: that rung worked."""
    if climb.phase not in ("running", "verifying"):
        return climb, WAIT
    return replace(climb, phase="succeeded", deadline=None), Decision("succeeded", climb.rung.action,
                                                                     "the fault's condition cleared")


def timed_out(climb: Climb, now: datetime, max_attempts: int, window: timedelta) -> tuple[Climb, Decision]:
    """The deadline passed: a backoff ends and its rung runs again; a rung without an outcome
    (or whose fault persisted) failed, and the next rung runs (never a stop)."""
    if climb.phase not in ("running", "verifying", "backoff") or climb.deadline is None or now < climb.deadline:
        return climb, WAIT
    if climb.phase == "backoff":
        return next_step(climb, now, max_attempts, window)
    return _climb(climb, now, max_attempts, window)


def _climb(climb: Climb, now: datetime, max_attempts: int, window: timedelta) -> tuple[Climb, Decision]:
    return next_step(replace(climb, step=climb.step + 1, deadline=None, tries=0), now, max_attempts, window)


def _span(window: timedelta) -> str:
    minutes = int(window.total_seconds() // 60)
    return f"{minutes // 60} h" if minutes % 60 == 0 else f"{minutes} min"
