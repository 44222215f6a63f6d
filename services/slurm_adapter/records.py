"""What Slurm says, as records: its nodes and jobs (``sinfo``/``squeue --json``), accounting
rows and the outcome of a command. Pure data: ``slurm.py`` runs the commands and decodes into
these; the adapter's fold and rules read them."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec


class SlurmError(Exception):
    def __init__(self, command: str, message: str, *, transient: bool) -> None:
        super().__init__(f"{command}: {message}")
        self.command, self.message, self.transient = command, message, transient


class SlurmNode(msgspec.Struct, kw_only=True):
    """One entry of ``sinfo --json`` (openapi v0.0.38): only what the adapter reads."""

    name: str
    state: str = ""  # idle, allocated, mixed, down, drained, ...
    state_flags: list[str] = []  # DRAIN, NOT_RESPONDING, POWERED_DOWN, ...
    reason: str = ""
    reason_set_by_user: str | None = None
    reason_changed_at: int = 0  # unix seconds

    @property
    def drained(self) -> bool:
        """DRAIN set: draining (work still on it) or drained."""
        return "DRAIN" in self.state_flags or self.state.lower() in ("drained", "draining")

    @property
    def down(self) -> bool:
        return self.state.lower() == "down" or "NOT_RESPONDING" in self.state_flags


class AllocatedNode(msgspec.Struct):
    nodename: str


class JobResources(msgspec.Struct):
    allocated_nodes: list[AllocatedNode] = []


class SlurmJob(msgspec.Struct, kw_only=True):
    """One entry of ``squeue --json``: only what the adapter reads."""

    job_id: int
    job_state: str
    user_name: str = ""
    partition: str = ""
    name: str = ""
    nodes: str = ""  # the node list, compressed (sim-[000-001])
    state_reason: str = ""
    requeue: bool = True
    restart_cnt: int = 0
    exit_code: int = 0
    job_resources: JobResources | None = None
    # JOB-1: what an outcome record says of the run (unix seconds; 0: not known).
    start_time: int = 0
    end_time: int = 0
    account: str = ""
    node_count: int = 0

    @property
    def node_names(self) -> list[str]:
        """Every node of the allocation, expanded (Slurm lists them one by one here)."""
        return [n.nodename for n in self.job_resources.allocated_nodes] if self.job_resources else []


@dataclass(frozen=True, slots=True)
class Accounted:
    """How a job that left the queue ended, from accounting: its state and its wait status
    (exit code in the high byte, the signal that killed it in the low bits, as squeue's
    ``exit_code``)."""

    state: str
    status: int = 0
    # JOB-1, from ``sacct --json`` where the site has accounting (slurmdbd): when it ran, whose.
    started_at: int = 0  # unix seconds; 0: not known
    ended_at: int = 0
    account: str = ""
    user: str = ""
    partition: str = ""
    size: int = 0  # nodes the job held
