"""Validation runs and adaptive fault isolation in eviction's fold (VAL-1..4): starting a run,
judging each step as it ends, gating a node's return to service on a passing run, and
bisecting a failed job's nodes."""

from __future__ import annotations

from datetime import UTC, datetime

from healthplane.contracts import domains, wire
from healthplane.contracts.subjects import job_key, node_key
from healthplane_eviction import holds, isolation, rules
from healthplane_eviction import validation as vrules
from healthplane_eviction.run_verdict import Rule, Verdict, judge
from healthplane_eviction.state import SERVICE, EvictionState, Node, Out, node_of
from healthplane_eviction.validation import Gate, Isolating, Run, SeenJob

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def start_run(state: EvictionState, cluster: str, rule: Rule, nodes: list[str],
               purpose: vrules.Purpose, actor: str, out: Out, *, command_id: str | None = None,
               isolating: Isolating | None = None, round_: int | None = None) -> Run:
    """Append a validation job pinned to ``nodes`` and say so on each node. A suite that needs
    a domain's fabric runs on the whole domain of the node it validates (DOM-4)."""
    domain = None
    if purpose != "isolate":  # an isolation's groups are its own (kept_together)
        nodes, domain = across_domain(state, cluster, rule, nodes)
    run = Run(id=vrules.run_id(out.stem, len(out.emits)), cluster=cluster, rule=rule, nodes=list(nodes),
              purpose=purpose, actor=actor, command_id=command_id,
              isolating=isolating.key if isolating else None, round=round_, domain=domain)
    state.runs[run.id] = run
    out.job(wire.Job(id=run.id, cluster=cluster, steps=len(nodes), duration_seconds=0, submitted_at=out.at,
                     submitted_by=SERVICE, nodes=list(nodes), validation=rule.suite))
    record = run_record(run, isolating)
    for node_id in run.nodes:
        out.event(node_of(state, cluster, node_id), "VALIDATION_STARTED", vrules.started_message(run),
                  actor, validation=record, command_id=command_id)
    return run


def across_domain(state: EvictionState, cluster: str, rule: Rule, nodes: list[str]) -> tuple[list[str], str | None]:
    """DOM-4: the nodes a run of ``rule`` covers. A suite that needs its domain's fabric
    (``acrossDomain: nvlink``, an NCCL all-reduce) runs on every member of the validated nodes'
    domain of that kind that can take part (VAL-4's exclusions; a member already being validated
    runs in its own run): the nodes asked for first, then the others in id order, and the domain
    as ``kind=value``. Nodes in no such domain, or in several, run as they are (None)."""
    kind = rule.across
    if kind is None:
        return nodes, None
    values = {domain_of(state, cluster, node_id, kind) for node_id in nodes}
    if len(values) != 1 or None in values:
        return nodes, None
    [value] = values
    asked = set(nodes)
    others = sorted(node.node_id for node in state.nodes.values()
                    if node.cluster == cluster and node.node_id not in asked and node.known and not node.gone
                    and domain_of(state, cluster, node.node_id, kind) == value
                    and excluded_why(state, cluster, node.node_id, rule) is None and running_on(state, node) is None)
    return [*nodes, *others], f"{kind}={value}"


def domain_of(state: EvictionState, cluster: str, node_id: str, kind: str) -> str | None:
    node = state.nodes.get(node_key(cluster, node_id))
    return domains.resolve(node_id, node.hardware_domains if node else {}, state.config.domains).get(kind)


def run_record(run: Run, isolating: Isolating | None = None, verdict: Verdict | None = None) -> wire.ValidationRecord:
    return wire.ValidationRecord(
        suite=run.rule.suite.name, job=run.id, nodes=len(run.nodes), round=run.round, domain=run.domain,
        isolating=isolating.job_id if isolating else None,
        duration_seconds=round(run.seconds(), 3) if verdict is not None else None,
        reason=verdict.reason if verdict is not None else None)


def excluded_why(state: EvictionState, cluster: str, node_id: str, rule: Rule, *,
              cordoned_excludes: bool = False) -> str | None:
    node = state.nodes.get(node_key(cluster, node_id))
    if node is None:
        return "not a known node"
    return vrules.excluded_reason(known=node.known, gone=node.gone, offline=node.offline, gpus=node.gpus,
                                  needs=rule.suite.gpus, suite=rule.suite.name,
                                  cordoned=cordoned_excludes and bool(node.holds))


def running_on(state: EvictionState, node: Node) -> Run | None:
    return next((r for r in state.runs.values() if r.cluster == node.cluster and node.node_id in r.nodes), None)


def validate(state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
    """VAL-1: run a suite on this node; the outcome comes when the run ends."""
    policy = state.config.validation
    problem = vrules.no_suite(command.suite, policy)
    if problem is not None:
        out.outcome(command, "refused", f"cannot validate {node.node_id}: {problem}")
        return
    busy = running_on(state, node)
    if busy is not None:
        out.outcome(command, "refused", f"{node.node_id} is already being validated (job {busy.id})")
        return
    rule = policy.rules[command.suite or policy.default_suite or ""]
    why = excluded_why(state, node.cluster, node.node_id, rule)
    if why is not None:
        out.outcome(command, "refused", f"cannot validate {node.node_id}: {why}", excluded={node.node_id: why})
        return
    start_run(state, node.cluster, rule, [node.node_id], "validate", command.actor, out,
                    command_id=command.id)


def gated(state: EvictionState, node: Node, command: wire.Command, releasing: list[wire.Hold],
           out: Out) -> bool:
    """VAL-2: releasing the last holds of a node that carried a hardware fault waits for it to
    pass the default suite. True when this command is answered here (waiting, or refused)."""
    if node.gate is not None:
        out.outcome(command, "refused", f"{node.node_id} is being validated before it returns to service "
                    f"(job {node.gate.run}); its holds are released if it passes")
        return True
    policy = state.config.validation
    left = [h for h in node.holds.values() if h not in releasing]
    if (not releasing or left or not node.fault_seen or not policy.before_return_for(node.definition)
            or policy.default_suite is None or policy.default_suite not in policy.rules):
        return False
    rule = policy.rules[policy.default_suite]
    why = excluded_why(state, node.cluster, node.node_id, rule)
    if why is not None:
        out.outcome(command, "refused", f"{node.node_id} carried a hardware fault and must pass suite "
                    f"{rule.suite.name} before it returns, but cannot be validated: {why}; its holds stay",
                    excluded={node.node_id: why})
        return True
    busy = running_on(state, node)
    if busy is not None:
        out.outcome(command, "refused", f"{node.node_id} is being validated (job {busy.id}); release its "
                    "holds once that run has ended")
        return True
    run = start_run(state, node.cluster, rule, [node.node_id], "gate", command.actor, out,
                          command_id=command.id)
    node.gate = Gate(run=run.id, command_id=command.id, verb=command.verb, actor=command.actor,
                     hold_ids=[h.id for h in releasing])
    out.outcome(command, "applied", f"{node.node_id} carried a hardware fault: it returns to service once "
                f"suite {rule.suite.name} passes (validation job {run.id}); its {len(releasing)} hold(s) stay "
                "until then")
    return True


def run_step(state: EvictionState, run: Run, alloc: wire.Allocation, out: Out) -> None:
    """One step of a run moved: started (its clock starts: VAL-4), or ended (judged)."""
    node_id = alloc.node_id
    if node_id not in run.nodes or node_id in run.results or alloc.state == "placed":
        return
    if alloc.state == "started":
        run.started = {**run.started, node_id: alloc.at}
        iso = state.isolations.get(run.isolating or "")
        if iso is not None and iso.first_started is None:
            iso.first_started = alloc.at
        return
    seconds = max(0.0, (alloc.at - run.started.get(node_id, alloc.at)).total_seconds())
    exit_code = alloc.exit_code if alloc.exit_code is not None or alloc.state != "finished" else 0
    said = alloc.output or alloc.reason
    verdict = judge(run.rule, exit_code, said or "", timed_out=alloc.timed_out)
    run.results = {**run.results, node_id: vrules.Result(verdict.passed, vrules.step_reason(verdict, said),
                                                          seconds)}
    if run.done:
        run_ended(state, run, out)


def run_ended(state: EvictionState, run: Run, out: Out) -> None:
    del state.runs[run.id]
    verdict = run.verdict()
    iso = state.isolations.get(run.isolating or "")
    record = run_record(run, iso, verdict)
    message = vrules.ended_message(run, verdict)
    kind: wire.EventType = "VALIDATION_PASSED" if verdict.passed else "VALIDATION_FAILED"
    for node_id in run.nodes:
        node = node_of(state, run.cluster, node_id)
        out.event(node, kind, message, run.actor, validation=record, command_id=run.command_id)
        if verdict.passed:
            node.fault_seen = False
    if run.purpose == "validate" and run.command_id is not None:
        command = wire.Command(id=run.command_id, node_id=run.nodes[0], cluster=run.cluster, verb="validate",
                               actor=run.actor, issued_at=out.at, suite=run.rule.suite.name)
        out.outcome(command, "applied", f"{run.nodes[0]}: {message}", passed=verdict.passed)
    elif run.purpose == "gate":
        gate_ended(state, run, verdict, out)
    elif iso is not None:
        isolation_result(state, iso, run, verdict, out)


def gate_ended(state: EvictionState, run: Run, verdict: Verdict, out: Out) -> None:
    node = node_of(state, run.cluster, run.nodes[0])
    gate, node.gate = node.gate, None
    if gate is None or gate.run != run.id or not verdict.passed:
        return  # failed: the holds stay; the event says why and health-ingest raises validation_failed
    command = wire.Command(id=gate.command_id, node_id=node.node_id, cluster=node.cluster,
                           verb=gate.verb, actor=gate.actor, issued_at=out.at)  # type: ignore[arg-type]
    held = [node.holds[h] for h in gate.hold_ids if h in node.holds]
    holds.release_holds(node, held, command, out)
    if gate.verb == "uncordon" and held:
        out.event(node, "NODE_UNCORDONED", f"uncordoned after passing suite {run.rule.suite.name}: "
                  f"{len(held)} cordon hold(s) released", gate.actor, command_id=gate.command_id)


def seen_job(state: EvictionState, alloc: wire.Allocation) -> SeenJob:
    """Keep where each job ran while it runs, and its failed ones (the newest, bounded)."""
    key = job_key(alloc.cluster, alloc.job_id)
    seen = state.jobs.get(key)
    if seen is None:
        seen = state.jobs[key] = SeenJob(cluster=alloc.cluster, job_id=alloc.job_id)
    seen.at = alloc.at
    if alloc.state in ("placed", "started"):
        seen.nodes = {**seen.nodes, alloc.node_id: alloc.id}
        if alloc.id not in seen.open:
            seen.open = [*seen.open, alloc.id]
        return seen
    seen.open = [a for a in seen.open if a != alloc.id]
    if alloc.state == "failed" and not seen.failed:
        seen.failed = True
        failed = [k for k, j in state.jobs.items() if j.failed and k not in state.isolations]
        for old in sorted(failed, key=lambda k: state.jobs[k].at or _EPOCH)[:-vrules.KEPT_FAILED_JOBS]:
            del state.jobs[old]
    if not seen.open and not seen.failed:
        state.jobs.pop(key, None)
    return seen


def isolate(state: EvictionState, node: Node, command: wire.Command, out: Out) -> None:
    """``healthplane isolate JOB``: bisect the failed job's nodes; the outcome comes at the end."""
    policy = state.config.validation
    problem = vrules.no_suite(command.suite, policy)
    seen = state.jobs.get(job_key(command.cluster, command.job_id or ""))
    if problem is None and seen is None:
        problem = (f"no record of job {command.job_id} in cluster {command.cluster}: isolation needs the "
                   "nodes it ran on (kept for running jobs and the newest failed ones)")
    if problem is None and seen is not None and job_key(seen.cluster, seen.job_id) in state.isolations:
        problem = f"job {command.job_id} is already being isolated"
    if problem is not None or seen is None:
        out.outcome(command, "refused", f"cannot isolate job {command.job_id}: {problem}")
        return
    rule = policy.rules[command.suite or policy.default_suite or ""]
    refusal = start_isolation(state, seen, rule, command.actor, out, command)
    if refusal is not None:
        out.outcome(command, "refused", refusal[0], excluded=refusal[1] or None)


def isolate_automatically(state: EvictionState, seen: SeenJob, out: Out) -> None:
    """VAL-3 "when configured": a multi-node job failed and no node of it carries a fault."""
    policy = state.config.validation
    if (not policy.isolate_auto or seen.isolated or len(seen.nodes) < 2 or policy.default_suite is None
            or policy.default_suite not in policy.rules):
        return
    if any(rules.worst_fault(state.nodes[node_key(seen.cluster, n)].faults) is not None
           for n in seen.nodes if node_key(seen.cluster, n) in state.nodes):
        return  # a node is named already (EVI-7)
    start_isolation(state, seen, policy.rules[policy.default_suite], SERVICE, out, None)


def start_isolation(state: EvictionState, seen: SeenJob, rule: Rule, actor: str, out: Out,
                     command: wire.Command | None) -> tuple[str, dict[str, str]] | None:
    excluded = {n: why for n in sorted(seen.nodes)
                if (why := excluded_why(state, seen.cluster, n, rule, cordoned_excludes=True)) is not None}
    suspects = [n for n in sorted(seen.nodes) if n not in excluded]
    if not suspects:
        return f"cannot isolate job {seen.job_id}: none of its {len(seen.nodes)} node(s) can be validated", excluded
    policy = state.config.validation
    kinds = (*policy.isolate_together, *((rule.across,) if rule.across else ()))  # DOM-4: the fabric's
    machine = isolation.start(seen.job_id, suspects, policy.isolate_max_concurrent,
                              kept_together(state, seen.cluster, suspects, kinds))
    iso = Isolating(key=job_key(seen.cluster, seen.job_id), cluster=seen.cluster, job_id=seen.job_id, rule=rule,
                    actor=actor, max_concurrent=policy.isolate_max_concurrent, excluded=excluded,
                    command_id=command.id if command else None,
                    command_node=command.node_id if command else None, timeout_s=policy.isolate_timeout_s)
    iso.keep(machine)
    state.isolations[iso.key] = iso
    seen.isolated = True
    launch(state, iso, out)
    return None


def kept_together(state: EvictionState, cluster: str, suspects: list[str],
                  kinds: tuple[str, ...] | None = None) -> list[tuple[str, ...]]:
    """DOM-4: the suspects that share a domain of a kind validated as one (``kinds``; default
    the config's ``keepTogether``), group by group."""
    groups: dict[tuple[str, str], list[str]] = {}
    for node_id in suspects:
        node = state.nodes.get(node_key(cluster, node_id))
        found = domains.resolve(node_id, node.hardware_domains if node else {}, state.config.domains)
        for kind in state.config.validation.isolate_together if kinds is None else kinds:
            if kind in found:
                groups.setdefault((kind, found[kind]), []).append(node_id)
    merged: list[set[str]] = []  # two kinds' domains that overlap are one unit
    for members in groups.values():
        joined = set(members)
        for other in [m for m in merged if m & joined]:
            joined |= other
            merged.remove(other)
        merged.append(joined)
    return [tuple(sorted(members)) for members in merged if len(members) > 1]


def launch(state: EvictionState, iso: Isolating, out: Out) -> None:
    machine, started = isolation.launch(iso.machine())
    iso.keep(machine)
    for step in started:
        start_run(state, iso.cluster, iso.rule, list(step.nodes), "isolate", iso.actor, out,
                        isolating=iso, round_=step.round)


def isolation_result(state: EvictionState, iso: Isolating, run: Run, verdict: Verdict, out: Out) -> None:
    iso.keep(isolation.on_result(iso.machine(), tuple(run.nodes), verdict.passed))
    timed_out = (iso.first_started is not None
                 and (out.at - iso.first_started).total_seconds() > iso.timeout_s)
    if not timed_out:
        launch(state, iso, out)
    if not iso.running and (timed_out or not iso.waiting):
        isolation_ended(state, iso, out, timed_out)


def isolation_ended(state: EvictionState, iso: Isolating, out: Out, timed_out: bool) -> None:
    del state.isolations[iso.key]
    seen = state.jobs.get(iso.key)
    for node_id in iso.faulty:
        if seen is not None and node_id in seen.attributed:
            continue  # attributed when it failed there, for the fault it carried (EVI-7)
        node = node_of(state, iso.cluster, node_id)
        out.event(node, "JOB_FAILURE_ATTRIBUTED",
                  f"job {iso.job_id} failed on a node that failed validation (suite {iso.rule.suite.name}, "
                  f"isolated in {iso.rounds} round(s))", SERVICE, fault_class="VALIDATION_FAILED",
                  allocation_id=seen.nodes.get(node_id) if seen else None)
    message = vrules.isolation_summary(iso.job_id, iso.faulty, iso.cleared, iso.rounds, iso.validations)
    if timed_out:
        left = sorted({n for step in iso.waiting for n in step.nodes})
        message = (f"isolation of job {iso.job_id} stopped: it ran past {iso.timeout_s}s; "
                   f"faulty so far: {', '.join(iso.faulty) or 'none'}; not yet cleared: {', '.join(left)}")
    if iso.command_id is not None:
        command = wire.Command(id=iso.command_id, node_id=iso.command_node or iso.faulty[0], cluster=iso.cluster,
                               verb="isolate", actor=iso.actor, issued_at=out.at, job_id=iso.job_id)
        out.outcome(command, "applied", message, faulty=list(iso.faulty), cleared=list(iso.cleared),
                    excluded=iso.excluded or None)
