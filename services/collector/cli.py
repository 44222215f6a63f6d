"""The collector's and simulator's command-line arguments: kept apart from the code they run
so that building the ``healthplane`` parser imports nothing heavy."""

from __future__ import annotations

import argparse
from typing import Final

FAULTS: Final = (
    "xid:<N>", "ecc-correctable", "ecc-uncorrectable", "row-remap-failure", "edac-ce", "edac-ue",
    "mce-corrected", "mce-fatal", "hw-error-corrected", "hw-error-fatal", "smart-failing",
    "io-errors", "readonly-mount", "throttle-thermal", "power-brake", "collector-failed:<signal>",
    "silent", "resume", "clear",
)


def add_collector_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="collector config file (the reference's extension config shape)")
    parser.add_argument("--root", default="/", help="prefix of every host path read (a fixture tree stands in for a machine)")
    parser.add_argument("--state-dir", default="/var/lib/healthplane/collector", help="keeps the kmsg cursor")
    parser.add_argument("--node-id", help="node id (default: config node-id, else the hostname)")
    parser.add_argument("--cluster", help="cluster (default: config cluster, else 'default')")
    parser.add_argument("--gpu-source", choices=["auto", "nvml", "nvidia-smi"], default="auto")
    parser.add_argument("--once", action="store_true", help="print one health report and exit, without NATS")
    parser.add_argument("-o", "--output", choices=["text", "json"], default="json")
    parser.add_argument("--nats-url", help="NATS server (env HEALTHPLANE_NATS_URL)")
    parser.add_argument("--creds", help="NATS credentials file")
    parser.add_argument("--metrics-port", type=int, default=0)


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="sim_command", required=True, metavar="ACTION")
    run_parser = actions.add_parser("run", help="run a simulated fleet")
    run_parser.add_argument("--nodes", type=int, default=8)
    run_parser.add_argument("--cluster", default="default")
    run_parser.add_argument("--interval", type=int, default=30, help="report interval in seconds")
    run_parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    run_parser.add_argument("--metrics-port", type=int, default=0)
    inject = actions.add_parser("inject", help="inject a fault into a simulated node")
    inject.add_argument("node")
    inject.add_argument("--fault", required=True, help=", ".join(FAULTS))
    inject.add_argument("--gpu", type=int)
    inject.add_argument("--cluster", default="default")
    for sub in (run_parser, inject):
        sub.add_argument("--nats-url")
        sub.add_argument("--creds")
