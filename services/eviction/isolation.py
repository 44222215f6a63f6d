"""Adaptive fault isolation (VAL-3, reference 003): which nodes of a failed multi-node job are
faulty, found by validating groups of the suspects instead of the whole set again.

Every group that fails is split in two and both halves are validated in the next round, in
parallel up to a cap; a group that passes clears its nodes; a failing single node is named.
With one faulty node among n that takes ⌈log2 n⌉ rounds; with several, each is found along its
own path, so the nodes that are not faulty are always cleared and never attributed.

DOM-4: suspects that share a failure domain whose fault is the domain's (an NVLink domain:
a job across an NVL72 fails when any member's fabric does) are one *unit*, never split: a
half is whole units, and a failing unit is named faulty as a whole (the domain).

Pure: the service that drives it (the validation runs, the node events of each step) keeps an
:class:`Isolation` in its state and feeds it the outcome of each validation; no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Final

Group = tuple[str, ...]
DEFAULT_MAX_CONCURRENT: Final = 8


class IsolationError(ValueError):
    """A result for a group that is not being validated, or suspects that cannot be isolated."""


@dataclass(frozen=True, slots=True)
class Step:
    """One validation of the isolation: the nodes, and the round it belongs to (1-based)."""

    nodes: Group
    round: int


@dataclass(frozen=True, slots=True)
class Isolation:
    job: str
    waiting: tuple[Step, ...]  # to validate, in order
    running: tuple[Step, ...]  # validations under way
    faulty: frozenset[str] = frozenset()
    cleared: frozenset[str] = frozenset()
    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    validations: int = 0  # started so far
    rounds: int = 0  # the deepest round started so far
    together: tuple[Group, ...] = ()  # DOM-4: suspects validated as one (a domain's members)

    @property
    def done(self) -> bool:
        return not self.waiting and not self.running


def units_of(nodes: Sequence[str], together: Sequence[Group] = ()) -> list[Group]:
    """``nodes`` as units in node order: each ``together`` group's members among them as one
    (at its first member's place), every other node alone."""
    group_of = {node: index for index, group in enumerate(together) for node in group}
    units: dict[int | str, list[str]] = {}  # a group's index, or the node itself; in first-seen order
    for node in nodes:
        units.setdefault(group_of.get(node, node), []).append(node)
    return [tuple(members) for members in units.values()]


def halves(nodes: Sequence[str], together: Sequence[Group] = ()) -> tuple[Group, Group]:
    """Two halves of whole units, the first holding at least half the nodes: a unit is never
    split (DOM-4); without units, the first ⌈n/2⌉ nodes and the rest."""
    units = units_of(nodes, together)
    target = (len(nodes) + 1) // 2
    taken = 0
    while taken < len(units) and sum(len(u) for u in units[:taken]) < target:
        taken += 1
    if taken == len(units) and len(units) > 1:
        taken -= 1  # a large last unit: the rest is that unit
    return tuple(n for u in units[:taken] for n in u), tuple(n for u in units[taken:] for n in u)


def _whole_unit(nodes: Group, together: Sequence[Group]) -> bool:
    return len(nodes) > 1 and len(units_of(nodes, together)) == 1


def start(job: str, suspects: Iterable[str], max_concurrent: int = DEFAULT_MAX_CONCURRENT,
          together: Sequence[Group] = ()) -> Isolation:
    """The first round: both halves of the suspects (one suspect, or one unit: itself), in
    node order."""
    nodes = tuple(sorted(set(suspects)))
    if not nodes:
        raise IsolationError(f"job {job}: no suspects to isolate")
    if max_concurrent < 1:
        raise IsolationError(f"max_concurrent {max_concurrent}: at least 1")
    groups = tuple(tuple(n for n in nodes if n in group) for group in together)
    groups = tuple(g for g in groups if len(g) > 1)
    single = len(nodes) == 1 or _whole_unit(nodes, groups)
    first = [nodes] if single else [g for g in halves(nodes, groups) if g]
    return Isolation(job, tuple(Step(g, 1) for g in first), (), max_concurrent=max_concurrent, together=groups)


def launch(state: Isolation) -> tuple[Isolation, list[Step]]:
    """The validations to start now: waiting ones, up to the cap of concurrent validations."""
    room = max(0, state.max_concurrent - len(state.running))
    started, waiting = state.waiting[:room], state.waiting[room:]
    if not started:
        return state, []
    return replace(state, waiting=waiting, running=(*state.running, *started),
                   validations=state.validations + len(started),
                   rounds=max(state.rounds, *(s.round for s in started))), list(started)


def on_result(state: Isolation, nodes: Group, passed: bool) -> Isolation:
    """A validation of ``nodes`` ended: passed clears them; failed names a single node faulty,
    or puts both halves of a larger group into the next round."""
    step = next((s for s in state.running if s.nodes == nodes), None)
    if step is None:
        raise IsolationError(f"job {state.job}: no validation of {', '.join(nodes)} is running")
    running = tuple(s for s in state.running if s is not step)
    if passed:
        return replace(state, running=running, cleared=state.cleared | set(nodes))
    if len(nodes) == 1 or _whole_unit(nodes, state.together):  # a node, or a domain: named as one
        return replace(state, running=running, faulty=state.faulty | set(nodes))
    following = tuple(Step(g, step.round + 1) for g in halves(nodes, state.together) if g)
    return replace(state, running=running, waiting=(*state.waiting, *following))
