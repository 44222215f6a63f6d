"""``healthplane sim submit | jobs | provider``: work for the reference scheduler (EVI-8).

``submit`` appends ``Job`` records on ``hp.job.{cluster}.{job}`` (acked by JetStream, the job id
as ``Nats-Msg-Id`` so a retried publish is stored once) and prints the job ids; the scheduler
may be down, the jobs wait in the stream. ``jobs`` reads the latest record of every job and
allocation back. ``provider reject|accept NODE`` appends a ``ProviderSetting`` on
``hp.provider.{cluster}.{node}``: how the simulated provisioner answers a terminate directive.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import math
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from healthplane.cli.common import fail, nats_client
from healthplane.client.connection import decoded
from healthplane.client.errors import EXIT_RETRY, EXIT_USAGE, CommandFailed
from healthplane.contracts import subjects, wire
from healthplane.runtime.publish import Publisher, PublishError
from healthplane.runtime.replay import read_all

# The reference scheduler's allocation ids: "{job}.{step}.{attempt}" (docs/scheduler.md).
_ALLOCATION_ID = re.compile(r"(.+)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)")


def run_work(args: argparse.Namespace) -> int:
    try:
        if args.sim_command == "submit":
            return asyncio.run(_submit(args))
        if args.sim_command == "jobs":
            return asyncio.run(_jobs(args))
        return asyncio.run(_provider(args))
    except CommandFailed as exc:
        return fail(exc)


def _whoami() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


def jobs_to_submit(args: argparse.Namespace, now: datetime) -> list[wire.Job]:
    """The Job records ``sim submit`` appends; a value out of range is a usage error."""
    if args.steps < 1:
        raise CommandFailed(f"--steps must be at least 1 (got {args.steps})", EXIT_USAGE)
    if not math.isfinite(args.duration) or args.duration < 0:
        raise CommandFailed(f"--duration must be a number of seconds >= 0 (got {args.duration:g})", EXIT_USAGE)
    if args.retry_attempts < 0:
        raise CommandFailed(f"--retry-attempts must be >= 0 (got {args.retry_attempts})", EXIT_USAGE)
    if args.count < 1:
        raise CommandFailed(f"--count must be at least 1 (got {args.count})", EXIT_USAGE)
    if args.user is not None and not 1 <= len(args.user) <= wire.NAME_MAX:
        raise CommandFailed(f"--user must be 1 to {wire.NAME_MAX} characters (got {len(args.user)})", EXIT_USAGE)
    who = args.user or _whoami()
    return [wire.Job(id=f"job-{secrets.token_hex(4)}", cluster=args.cluster, steps=args.steps,
                     duration_seconds=args.duration, submitted_at=now, submitted_by=who,
                     retry_on=sorted(set(args.retry_on)), retry_attempts=args.retry_attempts,
                     restart=args.restart, definition=args.definition,
                     fails_everywhere=args.fails_everywhere)
            for _ in range(args.count)]


async def _submit(args: argparse.Namespace) -> int:
    jobs = jobs_to_submit(args, datetime.now(UTC))
    async with nats_client(args) as nc:
        publisher = Publisher(nc)
        for job in jobs:
            await publisher.publish(subjects.job(job.cluster, job.id), wire.encode(job), {"Nats-Msg-Id": job.id})
        try:
            await publisher.flush()
        except PublishError as exc:
            raise CommandFailed(f"jobs not stored: {exc}", EXIT_RETRY) from exc
    if args.output == "json":
        print(json.dumps([wire.to_builtins(job) for job in jobs], indent=2))
    else:
        print("\n".join(job.id for job in jobs))
    return 0


async def _provider(args: argparse.Namespace) -> int:
    reject = args.provider_answer == "reject"
    setting = wire.ProviderSetting(node_id=args.node, cluster=args.cluster, reject_terminations=reject,
                                   message=args.message if reject else None, set_at=datetime.now(UTC),
                                   actor=_whoami())
    async with nats_client(args) as nc:
        try:
            await nc.jetstream().publish(subjects.provider(args.cluster, args.node), wire.encode(setting),
                                         stream="HP_COMMANDS")
        except Exception as exc:
            raise CommandFailed(f"setting not stored: {exc}", EXIT_RETRY) from exc
    if reject:
        print(f"the simulated provider will reject terminations of {args.node}"
              + (f": {args.message}" if args.message else ""))
    else:
        print(f"the simulated provider will terminate {args.node} when asked")
    return 0


# ---------------------------------------------------------------------------- sim jobs


def step_of(alloc: wire.Allocation) -> tuple[int, int]:
    """``(step, attempt)`` of a reference-scheduler allocation; ``(0, 0)`` for a foreign id."""
    found = _ALLOCATION_ID.fullmatch(alloc.id)
    return (int(found[2]), int(found[3])) if found and found[1] == alloc.job_id else (0, 0)


def job_state(steps: int, allocations: list[wire.Allocation]) -> str:
    """failed if a step failed; finished once every step finished; running while any step has an
    allocation placed or started; queued otherwise."""
    latest: dict[int, wire.Allocation] = {}
    for alloc in sorted(allocations, key=step_of):
        latest[step_of(alloc)[0]] = alloc
    states = [latest[i].state if i in latest else "queued" for i in range(steps)]
    if "failed" in states:
        return "failed"
    if states and all(s == "finished" for s in states):
        return "finished"
    if any(s in ("placed", "started") for s in states):
        return "running"
    return "queued"


@dataclass(frozen=True, slots=True)
class JobEntry:
    job: wire.Job
    state: str
    allocations: list[wire.Allocation]  # the latest record of each, by step and attempt

    def to_json(self) -> dict[str, Any]:
        return {**wire.to_builtins(self.job), "state": self.state,
                "allocations": [wire.to_builtins(a) for a in self.allocations]}


def listing(jobs: list[wire.Job], allocations: list[wire.Allocation]) -> list[JobEntry]:
    """Every job, oldest first, with its state and its allocations' latest records."""
    by_job: dict[str, list[wire.Allocation]] = {}
    for alloc in allocations:
        by_job.setdefault(alloc.job_id, []).append(alloc)
    out = []
    for job in sorted(jobs, key=lambda j: (j.submitted_at, j.id)):
        mine = sorted(by_job.get(job.id, []), key=step_of)
        out.append(JobEntry(job, job_state(job.steps, mine), mine))
    return out


def table(entries: list[JobEntry]) -> str:
    """One row per allocation, and one per step waiting in the queue."""
    rows = [("JOB", "STEP", "STATE", "NODE", "ALLOCATION", "RESTARTS", "REASON")]
    for entry in entries:
        by_step: dict[int, list[wire.Allocation]] = {}
        for alloc in entry.allocations:
            by_step.setdefault(step_of(alloc)[0], []).append(alloc)
        for step in range(entry.job.steps):
            mine = by_step.get(step, [])
            rows += [(entry.job.id, str(step), a.state, a.node_id, a.id, str(a.node_fault_restarts), a.reason or "")
                     for a in mine]
            if not mine or mine[-1].state == "requeued":  # waiting in the queue
                restarts = mine[-1].node_fault_restarts + 1 if mine else 0
                rows.append((entry.job.id, str(step), "queued", "-", "-", str(restarts), ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


async def _jobs(args: argparse.Namespace) -> int:
    cluster = subjects.encode_token(args.cluster)
    async with nats_client(args) as nc:
        msgs = await read_all(nc, nc.jetstream(), "HP_ALLOCATIONS",
                              [f"{subjects.PREFIX}.job.{cluster}.*", f"{subjects.PREFIX}.alloc.{cluster}.*.*"],
                              last_per_subject=True)
    job_prefix = f"{subjects.PREFIX}.job."
    jobs = [job for _, job in decoded(wire.Job, (m for m in msgs if m.subject.startswith(job_prefix)))]
    allocations = [a for _, a in decoded(wire.Allocation, (m for m in msgs if not m.subject.startswith(job_prefix)))]
    entries = listing(jobs, allocations)
    if args.output == "json":
        print(json.dumps([e.to_json() for e in entries], indent=2))
    elif not entries:
        print(f"no jobs in cluster {args.cluster}")
    else:
        print(table(entries))
    return 0
