"""``healthplane xid N [--json]`` (XID-1): what Xid N means and what NVIDIA's catalog says to do.

Offline: it reads the catalog shipped with Healthplane (``healthplane.contracts.xid``), never the
bus. A code the catalog does not list is explained by the catalog's default, and says so."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from healthplane.client.errors import EXIT_USAGE
from healthplane.contracts import xid

_NUMBER = re.compile(r"[0-9]{1,12}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("code", metavar="N", help="the Xid number, as in 'NVRM: Xid (PCI:…): 79, …'")
    parser.add_argument("--json", action="store_true", help="print the explanation as JSON")


def run(args: argparse.Namespace) -> int:
    if not _NUMBER.fullmatch(args.code):
        print(f"healthplane: xid: {args.code!r} is not an Xid number (e.g. healthplane xid 79)", file=sys.stderr)
        return EXIT_USAGE
    explained = explain(int(args.code))
    print(json.dumps(explained, indent=2) if args.json else "\n".join(_text(explained)))
    return 0


def explain(code: int) -> dict[str, Any]:
    """One Xid as the CLI shows it (the ``--json`` shape)."""
    info = xid.lookup(code)
    catalog = xid.CATALOG
    action = xid.recommended_action(code)
    from_message = code in catalog.nvlink5 or info.immediate == xid.READ_FROM_MESSAGE
    out: dict[str, Any] = {
        "code": code,
        "known": info.known,
        "name": info.name,
        "mnemonic": info.mnemonic or None,
        "immediate": info.immediate,
        "immediateMeaning": xid.meaning(info.immediate),
        "recommendedAction": action,
        "investigatory": info.investigatory,
        "investigatoryMeaning": xid.meaning(info.investigatory) or None,
        "grade": xid.grade(code),
        "sticky": xid.sticky(code),
        # SPEC ING-2's reference grade, or the bucket's (healthplane.contracts.xid's rule)
        "gradedBy": "reference" if code in xid.REFERENCE_CRITICAL else "bucket",
        "decidedByMessage": from_message,
        "catalog": {"source": catalog.source_title, "url": catalog.source_url, "date": catalog.date,
                    "driverBranch": catalog.driver_branch, "version": catalog.version},
    }
    if not info.known:
        out["default"] = catalog.default_basis
    if info.immediate == xid.READ_FROM_MESSAGE:
        out["recoveryActions"] = [{"value": f"0x{a.value:x}", "name": a.name, "immediate": a.immediate}
                                  for a in catalog.recovery_actions]
    if code in catalog.nvlink5:
        out["decodeRows"] = len(catalog.nvlink5[code])
    return out


def _text(explained: dict[str, Any]) -> list[str]:
    code = explained["code"]
    if explained["known"]:
        mnemonic = f" ({explained['mnemonic']})" if explained["mnemonic"] else ""
        lines = [f"Xid {code}: {explained['name']}{mnemonic}"]
    else:
        lines = [f"Xid {code} is not in NVIDIA's Xid catalog: the catalog's default applies.",
                 f"  ({explained['default']})"]
    meaning = f" — {explained['immediateMeaning']}" if explained["immediateMeaning"] else ""
    lines.append(f"  immediate action:     {explained['immediate']}{meaning}")
    if explained["recommendedAction"] != explained["immediate"]:
        lines.append(f"    without its log line: {explained['recommendedAction']} — "
                     f"{xid.meaning(explained['recommendedAction'])}")
    for action in explained.get("recoveryActions", []):
        lines.append(f"    'to {action['value']} ({action['name']})' in the line: {action['immediate']}")
    if "decodeRows" in explained:
        lines.append(f"    the line's IntrInfo and Error Status select one of {explained['decodeRows']} rows "
                     f"of NVIDIA's XID 144-150 Decode")
    meaning = f" — {explained['investigatoryMeaning']}" if explained["investigatoryMeaning"] else ""
    lines.append(f"  investigatory action: {explained['investigatory'] or '(none given)'}{meaning}")
    held = ("sticky: held until the GPU is serviced or replaced" if explained["sticky"]
            else "not sticky: raised while its count climbs")
    why = ""
    if explained["gradedBy"] == "reference":
        why = " (SPEC ING-2's reference grade)"
    elif explained["decidedByMessage"]:
        why = " (without its log line; the line decides)"
    lines.append(f"  grade:                {explained['grade']}, {held}{why}")
    catalog = explained["catalog"]
    lines.append(f"  catalog:              {catalog['source']}")
    lines.append(f"                        {catalog['url']} ({catalog['date']}, driver {catalog['driverBranch']}; "
                 f"data version {catalog['version']})")
    return lines
