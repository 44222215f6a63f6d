"""``healthplane collector`` and ``healthplane sim``: the command groups this package adds to
``healthplane`` (``healthplane.cli.registry.COMMAND_GROUPS`` names them). Their arguments live
here, apart from the code they run (``healthplane_collector.main``, ``.sim_cli``), imported only
when one of them runs."""

from __future__ import annotations

import argparse
from typing import Final

from healthplane.cli.common import CommandGroup, connection_flags, one_of
from healthplane_collector.choices import DEADLINE_DEFAULT_S, DEADLINE_MAX_S, DEADLINE_MIN_S, FAULTS


def add_collector_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="collector config file (the reference's extension config shape)")
    parser.add_argument("--root", default="/", help="prefix of every host path read (a fixture tree stands in for a machine)")
    parser.add_argument("--state-dir", default="/var/lib/healthplane/collector", help="keeps the kmsg cursor and the remediation state (handled request ids, a pending reboot)")
    parser.add_argument("--node-id", help="node id (default: config node-id, else the hostname)")
    parser.add_argument("--cluster", help="cluster (default: config cluster, else 'default')")
    parser.add_argument("--gpu-source", **one_of(["auto", "nvml", "nvidia-smi"]), default="auto")
    parser.add_argument("--once", action="store_true", help="print one health report and exit, without NATS")
    parser.add_argument("--slurm-health-check", action="store_true",
                        help="run as Slurm's HealthCheckProgram: one collection, its health and resource reports "
                             "published to NATS, then exit (0 published; 1 not, one line on stderr). Never drains "
                             "or touches Slurm: the slurm-adapter does that from the control plane")
    parser.add_argument("--deadline-seconds", type=float,
                        help=f"with --slurm-health-check: bound on connect, collection and acks "
                             f"({DEADLINE_MIN_S:g}..{DEADLINE_MAX_S:g}, default {DEADLINE_DEFAULT_S:g}; "
                             f"Slurm kills a health check after 60 s)")
    parser.add_argument("--interval-seconds", type=int,
                        help="seconds between reports, by which health-ingest expects the next (default: config "
                             "report-interval-seconds, else 30); with --slurm-health-check, slurm.conf's "
                             "HealthCheckInterval")
    parser.add_argument("-o", "--output", **one_of(["text", "json"]), default="json")
    connection_flags(parser)
    parser.add_argument("--metrics-port", type=int, default=0)


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="sim_command", required=True, metavar="ACTION")
    run_parser = actions.add_parser("run", help="run a simulated fleet")
    run_parser.add_argument("--nodes", type=int, default=8)
    run_parser.add_argument("--cluster", default="default")
    run_parser.add_argument("--interval", type=int, default=30, help="report interval in seconds")
    run_parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    run_parser.add_argument("--provisioned", type=int, default=0,
                            help="how many nodes (the last ones) the control plane provisioned (default 0)")
    run_parser.add_argument("--nvlink-domain-size", type=int, default=0, metavar="N",
                            help="every N nodes in a row share an NVLink domain, told by their GPUs' fabric "
                                 "info as NVML tells it (DOM-1; default 0: no fabric)")
    run_parser.add_argument("--metrics-port", type=int, default=0)
    load = actions.add_parser("load", help="a large simulated fleet at a set rate (pre-encoded reports; faults "
                                           "injected as with run)")
    load.add_argument("--nodes", type=int, default=10_000)
    load.add_argument("--cluster", default="default")
    load.add_argument("--interval", type=int, default=30, help="report interval in seconds")
    load.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    load.add_argument("--in-flight", type=int, default=4096, help="reports at most unacknowledged (default 4096)")
    load.add_argument("--prefix", default="load-", help="node ids are PREFIX000000… (default load-)")
    load.add_argument("--metrics-port", type=int, default=0)
    for fleet in (run_parser, load):
        fleet.add_argument("--rack-size", default="0", metavar="N",
                           help="every N nodes in a row share a rack, r0, r1, …, told by their resource reports "
                                "as an agent told its rack does (DOM-1; default 0: no rack)")
    inject = actions.add_parser("inject", help="inject a fault into a simulated node, or every node of a "
                                "failure domain (--domain)")
    inject.add_argument("node", nargs="?", help="the node (or --domain instead)")
    inject.add_argument("--domain", metavar="KIND=VALUE",
                        help="every node of this failure domain as the views show it, e.g. rack=r12 (DOM-3: a "
                             "rack losing power is --fault silent; an NVLink domain's fabric, --fault xid:145)")
    inject.add_argument("--fault", required=True, help=", ".join(FAULTS))
    inject.add_argument("--gpu", type=int)
    inject.add_argument("--rate", type=float,
                        help="job-killer: the chance each job on the node fails, within seconds of its start (a "
                             "black hole; default 1); slow-death: the chance reached at the end of --ramp (default 1)")
    inject.add_argument("--ramp", type=float, metavar="SECONDS",
                        help="slow-death: seconds over which the chance a job fails rises from 0 to --rate "
                             "(default 3600); each such job fails at its normal end")
    inject.add_argument("--cluster", default="default")
    work = add_work_arguments(actions)
    for sub in (run_parser, load, inject, *work):
        connection_flags(sub)


def add_work_arguments(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> list[argparse.ArgumentParser]:
    """``sim submit``, ``sim jobs`` and ``sim provider``: work for the reference scheduler (EVI-8)."""
    submit = actions.add_parser("submit", help="submit simulated jobs to the reference scheduler")
    submit.add_argument("--cluster", default="default")
    submit.add_argument("--steps", type=int, default=1, help="steps per job, each one allocation (default 1)")
    submit.add_argument("--duration", type=float, default=60.0, help="seconds each step runs (default 60)")
    submit.add_argument("--retry-on", action="append", **one_of(["node"]), default=[],
                        help="the step may be moved when its node is evicted (retry.on: [node])")
    submit.add_argument("--retry-attempts", type=int, default=0, help="retry.attempts of each step (default 0)")
    submit.add_argument("--restart", **one_of(["never", "on-node-fault"]), default="never",
                        help="policy.restart: on-node-fault requeues the step when its node faults or is lost")
    submit.add_argument("--definition", help="run only on nodes of this provisioner definition")
    submit.add_argument("--count", type=int, default=1, help="how many such jobs (default 1)")
    submit.add_argument("--user", help="the user the jobs run as (default: you)")
    submit.add_argument("--fails-everywhere", action="store_true",
                        help="a bad application: every step fails within seconds wherever it runs (the job's fault, "
                             "not a node's: JOB-2 blames no node for it)")
    submit.add_argument("-o", "--output", **one_of(["text", "json"]), default="text")
    jobs = actions.add_parser("jobs", help="jobs and the state of their allocations")
    jobs.add_argument("--cluster", default="default")
    jobs.add_argument("-o", "--output", **one_of(["text", "json"]), default="text")
    provider = actions.add_parser("provider", help="how the simulated provisioner answers terminations")
    answer = provider.add_subparsers(dest="provider_answer", required=True, metavar="ANSWER")
    reject = answer.add_parser("reject", help="refuse every termination of NODE until `accept`")
    reject.add_argument("node")
    reject.add_argument("--message", help="the provider's words (default: a cloud API refusal)")
    accept = answer.add_parser("accept", help="terminate NODE when asked (the default)")
    accept.add_argument("node")
    for sub in (reject, accept):
        sub.add_argument("--cluster", default="default")
    return [submit, jobs, reject, accept]


COMMAND_GROUPS: Final = (
    CommandGroup("collector", "the node agent (reads this machine, reports it)",
                 "healthplane_collector.cli:add_collector_arguments", "healthplane_collector.main:run"),
    CommandGroup("sim", "the fleet simulator and fault injection", "healthplane_collector.cli:add_sim_arguments",
                 "healthplane_collector.sim_cli:run_cli"),
)
