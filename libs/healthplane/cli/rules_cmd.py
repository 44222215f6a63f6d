"""``healthplane rules`` (RUL-1..RUL-3): the promotion rules.

``rules backtest -f FILE --since 30d``: what each rule of FILE would have raised and done over
the node events stored since then (``healthplane.client.rules``), writing nothing; ``rules
show``: the rules in force (the applied config's, else the defaults). This module parses and
prints."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from healthplane.cli.common import connection_flags, fail, nats_client, output_flag, who
from healthplane.client import rules as backtesting
from healthplane.client.connection import acked_or_refused
from healthplane.client.errors import EXIT_USAGE, CommandFailed
from healthplane.client.reads import parse_since
from healthplane.contracts import promotion, wire
from healthplane.contracts.config import ClusterConfig, ConfigError, load_promotion_rules
from healthplane.runtime import configstore

DETAIL_LINES = 20  # firings listed per rule in text (all of them in JSON)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="rules_command", required=True, metavar="ACTION")
    test = actions.add_parser("backtest", help="what rules would have raised and done over the stored node events")
    test.add_argument("-f", "--file", required=True, metavar="FILE",
                      help="the rules: a YAML list of rules, or a cluster config (its promotionRules)")
    test.add_argument("--since", default="30d", help="events stored since: 30d (default), 24h or an RFC 3339 time")
    test.add_argument("--cluster", help="only this cluster's nodes")
    output_flag(test)
    connection_flags(test)
    show = actions.add_parser("show", help="the promotion rules in force")
    output_flag(show)
    connection_flags(show)


def run(args: argparse.Namespace) -> int:
    try:
        if args.rules_command == "show":
            return asyncio.run(_show(args))
        return asyncio.run(_backtest(args))
    except ConfigError as exc:
        return fail(CommandFailed(str(exc).splitlines()[0], EXIT_USAGE))
    except CommandFailed as exc:
        return fail(exc)


async def _backtest(args: argparse.Namespace) -> int:
    rules = [rule.compiled() for rule in load_promotion_rules(args.file)]
    since = parse_since(args.since, datetime.now(UTC))
    async with nats_client(args) as nc:
        found = await acked_or_refused(nc, who(args), "read node events",
                                       backtesting.backtest(nc, nc.jetstream(), rules, since, args.cluster))
    if args.output == "json":
        print(json.dumps(_as_json(found, since), indent=2))
        return 0
    for line in _text(found, since):
        print(line)
    return 0


def _as_json(found: backtesting.Backtest, since: datetime) -> dict[str, Any]:
    return {
        "since": wire.rfc3339(since), "eventsRead": found.read, "occurrences": found.counted,
        "skipped": found.skipped, "seconds": round(found.seconds, 3),
        "rules": [{
            "name": rule.name, "mode": rule.mode, "action": rule.action, "condition": rule.condition,
            "describe": rule.describe(), "fired": len(found.firings[rule.name]),
            "nodes": len({(f.cluster, f.node_id) for f in found.firings[rule.name]}),
            "firings": [{"cluster": f.cluster, "node": f.node_id, "at": wire.rfc3339(f.firing.at),
                         "firstAt": wire.rfc3339(f.firing.first_at), "count": f.firing.count,
                         "devices": list(f.firing.devices)} for f in found.firings[rule.name]],
        } for rule in found.rules],
    }


def _text(found: backtesting.Backtest, since: datetime) -> list[str]:
    lines = [f"backtest since {wire.rfc3339(since)}: {found.read} events read, {found.counted} occurrences, "
             f"{len(found.rules)} rules, {found.seconds:.1f} s; nothing was written"]
    if found.skipped:
        lines.append(f"  {found.skipped} records did not decode and were passed over")
    for rule in found.rules:
        fired = found.firings[rule.name]
        nodes = Counter(f"{f.cluster}/{f.node_id}" for f in fired)
        would = ("would record" if rule.mode == "record" or rule.action == "none"
                 else f"would raise {rule.condition} and {_does(rule)}")
        lines.append(f"{rule.name} ({rule.mode}): {rule.describe()}")
        lines.append(f"  fired {len(fired)} times on {len(nodes)} nodes; {would}")
        for f in fired[:DETAIL_LINES]:
            devices = f" on {', '.join(f.firing.devices)}" if f.firing.devices else ""
            lines.append(f"    {wire.rfc3339(f.firing.at)}  {f.cluster}/{f.node_id}  {f.firing.count} since "
                         f"{wire.rfc3339(f.firing.first_at)}{devices}")
        if len(fired) > DETAIL_LINES:
            lines.append(f"    … {len(fired) - DETAIL_LINES} more (-o json lists them all)")
    return lines


def _does(rule: promotion.Rule) -> str:
    return {"validate": "validate the node", "remediate": "remediate the node",
            "needs-attention": "stop the node for a human"}.get(rule.action, "nothing")


async def _show(args: argparse.Namespace) -> int:
    async with nats_client(args) as nc:
        found = await acked_or_refused(nc, who(args), "read the config", configstore.read(nc.jetstream()))
    config = found.in_force.config if found.in_force else ClusterConfig()
    rules = [rule.compiled() for rule in config.promotion_rules]
    if args.output == "json":
        print(json.dumps([rule.model_dump(mode="json", by_alias=True, exclude_none=True)
                          for rule in config.promotion_rules], indent=2))
        return 0
    source = f"config version {found.in_force.envelope.version}" if found.in_force else "the defaults (no config applied)"
    print(f"promotion rules in force ({source}):")
    for rule in rules:
        print(f"  {rule.name} ({rule.mode}, {rule.action}): {rule.describe()}")
    if not rules:
        print("  none")
    return 0
