"""Argument parsing and dispatch. Each subcommand lives in its own module and returns an
exit code: 0 success, 1 refused or failed, 2 usage error, 3 retryable (SPEC.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from healthplane import __version__, registry
from healthplane.cli.common import EXIT_USAGE, one_of
from healthplane.runtime.connect import DEFAULT_URL


def _connection_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nats-url", help=f"NATS server (env HEALTHPLANE_NATS_URL, default {DEFAULT_URL})")
    parser.add_argument("--creds", help="NATS credentials file (env HEALTHPLANE_NATS_CREDS)")


def _output_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", **one_of(["text", "json"]), default="text")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="healthplane", description="Node-health control plane")
    parser.add_argument("--version", action="version", version=f"healthplane {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = commands.add_parser("up", help="run the control plane on an embedded nats-server")
    up.add_argument("--nodes", type=int, default=8, help="simulated nodes (default 8)")
    up.add_argument("--no-sim", action="store_true", help="no simulated fleet")
    where = up.add_mutually_exclusive_group()
    where.add_argument("--nats-url", help="use this server instead of starting one")
    where.add_argument("--nats-port", type=int, default=4222, help="port of the embedded server (0 = any free)")
    up.add_argument("--config", help="cluster config to apply (default: built-in defaults)")
    up.add_argument("--data-dir", default=".healthplane", help="store and stack.json (default ./.healthplane)")

    service = commands.add_parser("service", help="run one service (production entry point)")
    service.add_argument("name", **one_of(registry.SERVICE_NAMES), metavar="NAME",
                         help=", ".join(registry.SERVICE_NAMES))
    service.add_argument("--config", help="service config file")
    service.add_argument("--metrics-port", type=int, default=0, help="Prometheus port (0 = any free, logged)")
    _connection_flags(service)

    collector = commands.add_parser("collector", help="the node agent (reads this machine, reports it)")
    from healthplane_collector.cli import add_collector_arguments, add_sim_arguments

    add_collector_arguments(collector)

    node = commands.add_parser("node", help="nodes: list, show, events, cordon, drain, evict, deprovision, holds")
    from healthplane.cli import node_cmd

    node_cmd.add_arguments(node)

    sim = commands.add_parser("sim", help="the fleet simulator and fault injection")
    add_sim_arguments(sim)

    policy = commands.add_parser("policy", help="the policy service: circuit breaker reset")
    from healthplane.cli import policy_cmd

    policy_cmd.add_arguments(policy)

    dead = commands.add_parser("dead-letters", help="inputs the services set aside: list, replay")
    from healthplane.cli import dead_letters_cmd

    dead_letters_cmd.add_arguments(dead)

    config = commands.add_parser("config", help="validate, apply and show the cluster config")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    validate = config_commands.add_parser("validate", help="check a config file")
    validate.add_argument("-f", "--file", required=True)
    apply = config_commands.add_parser("apply", help="validate and apply a config file")
    apply.add_argument("-f", "--file", required=True)
    _connection_flags(apply)
    show = config_commands.add_parser("show", help="the config in force")
    _connection_flags(show)
    _output_flag(show)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            from healthplane.cli import up

            return up.run(args)
        if args.command == "service":
            return registry.run(args.name, args)
        if args.command == "collector":
            from healthplane_collector.main import run as run_collector

            return run_collector(args)
        if args.command == "node":
            from healthplane.cli import node_cmd as node_commands

            return node_commands.run(args)
        if args.command == "sim":
            from healthplane_collector.sim import run_cli as run_sim

            return run_sim(args)
        if args.command == "policy":
            from healthplane.cli import policy_cmd as policy_commands

            return policy_commands.run(args)
        if args.command == "dead-letters":
            from healthplane.cli import dead_letters_cmd as dead_letters

            return dead_letters.run(args)
        if args.command == "config":
            from healthplane.cli import config_cmd

            return config_cmd.run(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    parser.print_usage(sys.stderr)
    return EXIT_USAGE
