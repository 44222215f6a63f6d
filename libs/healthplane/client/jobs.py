"""``healthplane jobs impact`` (JOB-1, JOB-4): who was hit. Per failed job since a time, its
nodes and the conditions each node carried when the job ended there.

Reads, by direct gets (no consumer, any reader's identity): the job outcomes from
``HP_JOB_OUTCOMES`` since the time, folded per node with the shared fold
(``contracts.joboutcomes``), then each affected node's CONDITION_RAISED / CONDITION_CLEARED
events from ``HP_NODE_EVENTS``, replayed up to each job's end. A record that does not decode is
passed over and counted (``skipped``), never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.client.connection import decoded
from healthplane.client.errors import EXIT_REFUSED, CommandFailed
from healthplane.contracts import joboutcomes, subjects, wire
from healthplane.runtime.replay import read_all, start_of_last

CONDITION_EVENTS = frozenset({"CONDITION_RAISED", "CONDITION_CLEARED"})


@dataclass
class Impact:
    since: datetime
    jobs: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0  # records that did not decode

    def to_json(self) -> dict[str, Any]:
        return {"since": wire.rfc3339(self.since), "jobs": self.jobs, "skipped": self.skipped}


def conditions_at(events: list[wire.NodeEvent], at: datetime) -> list[wire.ConditionChange]:
    """The node's active conditions at ``at``, from its condition events in order."""
    active: dict[str, wire.ConditionChange] = {}
    for event in events:
        if event.occurred_at > at:
            break
        if event.condition is None:
            continue
        if event.type == "CONDITION_RAISED":
            active[event.condition.type] = event.condition
        elif event.type == "CONDITION_CLEARED":
            active.pop(event.condition.type, None)
    return sorted(active.values(), key=lambda c: c.type)


def failed_jobs(state: joboutcomes.JobOutcomesState, since: datetime) -> dict[tuple[str, str, int], list[tuple[
        joboutcomes.NodeJobs, joboutcomes.JobEntry]]]:
    """(cluster, job, attempt) -> each node's entry, of the runs that failed at or after ``since``."""
    found: dict[tuple[str, str, int], list[tuple[joboutcomes.NodeJobs, joboutcomes.JobEntry]]] = {}
    for history in state.nodes.values():
        for entry in history.entries:
            if entry.failed and entry.ended_at >= since:
                found.setdefault((history.cluster, entry.job_id, entry.attempt), []).append((history, entry))
    return found


async def impact(nc: NATS, js: JetStreamContext, since: datetime, cluster: str | None = None) -> Impact:
    out = Impact(since)
    filter_ = f"{subjects.PREFIX}.jobend.{subjects.encode_token(cluster)}.>" if cluster else f"{subjects.PREFIX}.jobend.>"
    records: list[wire.JobOutcome] = []
    for stored in await read_all(nc, js, joboutcomes.STREAM, filter_, start_time=since):
        try:
            records.append(wire.decode(wire.JobOutcome, stored.data))
        except wire.WireError:
            out.skipped += 1
    runs = failed_jobs(joboutcomes.fold(records), since)
    histories: dict[str, list[wire.NodeEvent]] = {}
    for (job_cluster, job_id, attempt), hits in sorted(runs.items(), key=lambda kv: min(e.ended_at for _, e in kv[1])):
        first = min((entry for _, entry in hits), key=lambda e: e.ended_at)
        nodes = []
        for history, entry in sorted(hits, key=lambda hit: hit[0].node_id):
            key = subjects.node_key(history.cluster, history.node_id)
            if key not in histories:
                histories[key] = await _condition_events(nc, js, history.cluster, history.node_id, out)
            nodes.append({"nodeId": history.node_id, "outcome": entry.outcome, "endedAt": wire.rfc3339(entry.ended_at),
                          "conditions": [wire.to_builtins(c) for c in conditions_at(histories[key], entry.ended_at)]})
        out.jobs.append({
            "jobId": job_id, "attempt": attempt, "cluster": job_cluster, "outcome": first.outcome,
            "endedAt": wire.rfc3339(first.ended_at), "exitCode": first.exit_code, "signal": first.signal,
            "size": first.size, "runtimeSeconds": first.runtime_seconds, "partition": first.partition,
            "user": first.user, "account": first.account, "reason": first.reason, "scheduler": first.scheduler,
            "nodes": nodes})
    return out


async def _condition_events(nc: NATS, js: JetStreamContext, cluster: str, node_id: str,
                            out: Impact) -> list[wire.NodeEvent]:
    wanted = [subjects.node_events(cluster, node_id, kind) for kind in sorted(CONDITION_EVENTS)]
    events = []
    for stored in await read_all(nc, js, "HP_NODE_EVENTS", wanted):
        try:
            events.append(wire.decode(wire.NodeEvent, stored.data))
        except wire.WireError:
            out.skipped += 1
    return events


async def node_outcomes(nc: NATS, js: JetStreamContext, cluster: str, node_id: str,
                        count: int = 20) -> list[wire.JobOutcome]:
    """The node's newest ``count`` job outcomes (JOB-1), newest first: what the node page
    offers to isolate (a failed multi-node job). Records that do not decode are passed over."""
    wanted = [f"{subjects.PREFIX}.jobend.{subjects.encode_token(cluster)}.{subjects.encode_token(node_id)}.*"]
    start = await start_of_last(js, joboutcomes.STREAM, wanted, count)
    found = []
    for stored in await read_all(nc, js, joboutcomes.STREAM, wanted, start_seq=start, limit=count):
        try:
            found.append(wire.decode(wire.JobOutcome, stored.data))
        except wire.WireError:
            continue
    return sorted(found, key=lambda o: o.ended_at, reverse=True)


async def job_nodes(nc: NATS, js: JetStreamContext, cluster: str, job_id: str) -> list[str]:
    """The nodes the scheduler placed ``job_id``'s allocations on in ``cluster`` (VAL-3's
    suspects), sorted; none: the job is not known there. ``healthplane isolate`` and the API's
    isolate route send the command on one of them, and refuse a job with none in the same words."""
    token = subjects.encode_token(cluster)
    msgs = await read_all(nc, js, "HP_ALLOCATIONS", f"{subjects.PREFIX}.alloc.{token}.*.*", last_per_subject=True)
    return sorted({a.node_id for _, a in decoded(wire.Allocation, msgs) if a.job_id == job_id})


def no_allocations(cluster: str, job_id: str) -> CommandFailed:
    return CommandFailed(f"isolate {job_id}: no allocations of job {job_id} in cluster {cluster}", EXIT_REFUSED)
