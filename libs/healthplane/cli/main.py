"""Argument parsing and dispatch from one table of command groups (``CommandGroup``).

The library's own groups are listed here; those a service package adds (the collector's
``collector`` and ``sim``) come through ``registry.command_groups()``, which imports the
package by name, so the library never imports a service. Every group's ``run`` returns an
exit code: 0 success, 1 refused or failed, 2 usage error, 3 retryable (SPEC.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Final

from healthplane import __version__
from healthplane.cli import registry
from healthplane.cli.common import (
    CommandGroup,
    connection_flags,
    export_tls_flags,
    one_of,
    output_flag,
)
from healthplane.client.errors import EXIT_REFUSED
from healthplane.contracts import wire
from healthplane.contracts.streams import PARTITION_SLOTS

PARTITIONS_ENV: Final = "HEALTHPLANE_PARTITIONS"


# `up`, `service` and `config` run code that is slow to import (the stack, a service, the config
# models): their arguments are here, and their modules are imported when they run.
def up_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=8, help="simulated nodes (default 8)")
    parser.add_argument("--no-sim", action="store_true", help="no simulated fleet")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--nats-url", help="use this server instead of starting one")
    where.add_argument("--nats-port", type=int, default=4222, help="port of the embedded server (0 = any free)")
    parser.add_argument("--servers", type=_server_count, default=1, metavar="1|3|5",
                        help="nats-servers to start: 3 or 5 make a JetStream cluster, every stream R3 (HA-1); "
                             "client ports from --nats-port up")
    parser.add_argument("--replicas", type=int, default=1, metavar="N",
                        help="processes per service (2: a warm standby behind each service's lease, HA-3)")
    parser.add_argument("--partitions", type=_partitions, default=1, metavar="P",
                        help="health-ingest and the scorer split the nodes into P partitions, shared out among "
                             "their replicas (HA-4); chosen at install: the streams get partition slots")
    parser.add_argument("--api-port", type=int, default=0,
                        help="port of the HTTP API and web UI (default 0: any free one, printed)")
    parser.add_argument("--config", help="cluster config to apply (default: built-in defaults)")
    parser.add_argument("--data-dir", default=".healthplane", help="store and stack.json (default ./.healthplane)")
    parser.add_argument("--insecure", action="store_true",
                        help="no authentication on the bus (anyone who reaches the server may command it)")
    parser.add_argument("--tls", action="store_true", help="TLS with a throwaway CA made in DATA_DIR/tls")
    parser.add_argument("--scheduler", **one_of(["reference", "slurm"]), default="reference",
                        help="reference: the simulated scheduler; slurm: the adapter for the Slurm cluster "
                             "this host's Slurm commands reach (SLURM_CONF), instead (docs/slurm.md)")
    federation = parser.add_mutually_exclusive_group()
    federation.add_argument("--federation-hub", action="store_true",
                            help="run a federation hub: clusters attach to it, it lists them all (FED, "
                                 "docs/federation.md); no fleet of its own")
    federation.add_argument("--attach", metavar="URL",
                            help="attach this cluster to the hub at URL (nats-leaf://HOST:PORT, printed by "
                                 "`healthplane federation attach NAME` on the hub; a hub of several servers: "
                                 "their URLs comma-separated); with --servers 3 every server connects")
    parser.add_argument("--attach-creds", metavar="FILE", help="the member credentials the hub issued (--attach)")
    parser.add_argument("--leaf-port", type=int, default=7422,
                        help="--federation-hub: port for the members' leaf connections (default 7422, 0: any free; "
                             "--servers 3: one per server, from this port up)")


def _server_count(text: str) -> int:
    if text not in ("1", "3", "5"):
        raise argparse.ArgumentTypeError(f"{text!r}: 1, 3 or 5 (a JetStream cluster keeps a majority of an odd number)")
    return int(text)


def _partitions(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= PARTITION_SLOTS:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of partitions from 1 to {PARTITION_SLOTS}")
    return int(text)


def service_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", **one_of(registry.SERVICE_NAMES), metavar="NAME",
                        help=", ".join(registry.SERVICE_NAMES))
    parser.add_argument("--config", help="service config file")
    parser.add_argument("--partitions", type=_partitions, default=os.environ.get(PARTITIONS_ENV, "1"),
                        help=f"HA-4: run as P partitions of the node space (health-ingest, scorer; "
                             f"${PARTITIONS_ENV}); every replica of the service takes the same P")
    parser.add_argument("--metrics-port", type=int, default=0, help="Prometheus port (0 = any free, logged)")
    connection_flags(parser)


def run_service(args: argparse.Namespace) -> int:
    return registry.run(args.name, args)


def config_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    validate = actions.add_parser("validate", help="check a config file")
    validate.add_argument("-f", "--file", required=True)
    apply = actions.add_parser("apply", help="validate and apply a config file")
    apply.add_argument("-f", "--file", required=True)
    connection_flags(apply)
    show = actions.add_parser("show", help="the config in force")
    connection_flags(show)
    output_flag(show)


LIBRARY_GROUPS: Final = (
    CommandGroup("up", "run the control plane on an embedded nats-server", "healthplane.cli.main:up_arguments",
                 "healthplane.cli.up:run"),
    CommandGroup("service", "run one service (production entry point)", "healthplane.cli.main:service_arguments",
                 "healthplane.cli.main:run_service"),
    CommandGroup("node", "nodes: list, show, events, cordon, drain, evict, deprovision, holds",
                 "healthplane.cli.node_cmd:add_arguments", "healthplane.cli.node_cmd:run"),
    CommandGroup("events", "node events live: watch (filtered, JSON lines, resumable; INT-1)",
                 "healthplane.cli.events_cmd:add_arguments", "healthplane.cli.events_cmd:run"),
    CommandGroup("isolate", "find the faulty node(s) of a failed multi-node job by validating halves (VAL-3)",
                 "healthplane.cli.validate_cmd:add_isolate", "healthplane.cli.validate_cmd:run_isolate"),
    CommandGroup("jobs", "the scheduler as a sensor: impact (failed jobs, their nodes and conditions; JOB-1)",
                 "healthplane.cli.jobs_cmd:add_arguments", "healthplane.cli.jobs_cmd:run"),
    CommandGroup("policy", "the policy service: circuit breaker reset", "healthplane.cli.policy_cmd:add_arguments",
                 "healthplane.cli.policy_cmd:run"),
    CommandGroup("dead-letters", "inputs the services set aside: list, replay",
                 "healthplane.cli.dead_letters_cmd:add_arguments", "healthplane.cli.dead_letters_cmd:run"),
    CommandGroup("webhooks", "webhook endpoints: list (slot, lag), replay dead-lettered deliveries (INT-2)",
                 "healthplane.cli.webhooks_cmd:add_arguments", "healthplane.cli.webhooks_cmd:run"),
    CommandGroup("config", "validate, apply and show the cluster config", "healthplane.cli.main:config_arguments",
                 "healthplane.cli.config_cmd:run"),
    CommandGroup("creds", "identities on the bus: init, node, user, service, token, revoke, list",
                 "healthplane.cli.creds_cmd:add_arguments", "healthplane.cli.creds_cmd:run"),
    CommandGroup("federation", "a federation hub: attach a cluster, list the attached ones",
                 "healthplane.cli.federation_cmd:add_arguments", "healthplane.cli.federation_cmd:run"),
    CommandGroup("streams", "stream administration as the maintainer: converge (SEC-10)",
                 "healthplane.cli.streams_cmd:add_arguments", "healthplane.cli.streams_cmd:run"),
    CommandGroup("breakfix", "fault to out of service, remediated, back (MTTR) and between incidents, per fault class",
                 "healthplane.cli.breakfix_cmd:add_arguments", "healthplane.cli.breakfix_cmd:run"),
    CommandGroup("rules", "promotion rules: show those in force, backtest a file over stored events (RUL-1..3)",
                 "healthplane.cli.rules_cmd:add_arguments", "healthplane.cli.rules_cmd:run"),
    CommandGroup("xid", "what GPU Xid N means and what NVIDIA's catalog says to do (XID-1)",
                 "healthplane.cli.xid_cmd:add_arguments", "healthplane.cli.xid_cmd:run"),
)


def command_groups() -> tuple[CommandGroup, ...]:
    """The table: the library's groups, then each service package's."""
    return (*LIBRARY_GROUPS, *registry.command_groups())


def build_parser(groups: Sequence[CommandGroup] | None = None, only: str | None = None) -> argparse.ArgumentParser:
    """Every group's parser; with ``only``, the arguments of that group alone (the others are
    listed by name and help, their modules not imported)."""
    parser = argparse.ArgumentParser(prog="healthplane", description="Node-health control plane")
    parser.add_argument("--version", action="version", version=f"healthplane {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in command_groups() if groups is None else groups:
        group_parser = commands.add_parser(group.name, help=group.help)
        if only is None or group.name == only:
            registry.load(group.arguments)(group_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    groups = command_groups()
    # The group is the first word that is not an option (the top level's options take no
    # value); none, or one that is no group, and argparse answers from the names alone.
    named = next((word for word in argv if not word.startswith("-")), "")
    args = build_parser(groups, only=named).parse_args(argv)
    run: Callable[[argparse.Namespace], int] = registry.load(next(g.run for g in groups if g.name == args.command))
    export_tls_flags(args)
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except wire.WireError as exc:
        # The last line of defence: a record no reader above expected is bad data, said in
        # one line, never a traceback (each reader skips and names its own first).
        print(f"healthplane: {exc}", file=sys.stderr)
        return EXIT_REFUSED
