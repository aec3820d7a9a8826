"""`freshplan cdc check` (a sample Debezium message under a mapping file, no broker) and `freshplan cdc demo`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def cmd_cdc_check(args: argparse.Namespace) -> int:
    """Print the freshplan event a sample envelope becomes under MAPPING.json, or why it would be dead-lettered.

    SAMPLE.json is one envelope as Debezium's JSON converter writes it (with or without schemas),
    or {"key": ..., "value": ...} to give the message key too (value null: a tombstone).
    Exits 0 for an event or a skipped heartbeat/transaction message, 1 for a dead letter, 2 for unusable files.
    """
    import orjson

    from schemas.cdc_mapping import MappingError, parse
    from schemas.codec import decode, document
    from schemas.errors import InvalidEvent, SkippedEvent

    try:
        mapping = parse(Path(args.mapping).read_text("utf-8"), args.mapping)
        sample = json.loads(Path(args.sample).read_text("utf-8"))
    except (OSError, ValueError, MappingError) as exc:
        print(f"freshplan cdc check: {exc}", file=sys.stderr)
        return 2
    key = value = None
    if isinstance(sample, dict) and "value" in sample and set(sample) <= {"key", "value"}:
        key = None if sample.get("key") is None else orjson.dumps(sample["key"])
        value = None if sample["value"] is None else orjson.dumps(sample["value"])
    else:
        value = orjson.dumps(sample)
    try:
        decode("source-changes", key, value, position="0:0", cdc=mapping)
        event = document("source-changes", key, value, position="0:0", cdc=mapping)
    except SkippedEvent as exc:
        print(json.dumps({"skipped": exc.kind}))
        return 0
    except InvalidEvent as exc:
        print(json.dumps({"dead_letter": {"error_class": exc.error_class, "message": exc.message}}))
        return 1
    print(json.dumps(event, indent=2))
    return 0


def add_parser(sub) -> None:
    """Register `freshplan cdc check`."""
    cdc = sub.add_parser("cdc", help="change data capture: check a Debezium mapping file against samples")
    cdc_sub = cdc.add_subparsers(dest="cdc_command", required=True)
    check = cdc_sub.add_parser("check", help="print the event a sample envelope becomes, or its dead letter",
                               description=cmd_cdc_check.__doc__)
    check.add_argument("mapping", metavar="MAPPING.json")
    check.add_argument("sample", metavar="SAMPLE.json")
    check.set_defaults(func=cmd_cdc_check)
    from agents.cli.cdc_demo import cmd_cdc_demo

    demo = cdc_sub.add_parser("demo", help="Postgres -> Debezium -> worker: a row update invalidates a plan",
                              description=cmd_cdc_demo.__doc__)
    demo.add_argument("--dir", help="keep the worker's state, log and mapping file here (default: a temporary dir)")
    demo.set_defaults(func=cmd_cdc_demo)
