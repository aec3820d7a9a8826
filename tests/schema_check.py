"""Validators of outbound records against the JSON Schemas shipped in schemas/json (for tests)."""

from __future__ import annotations

import json

from jsonschema import Draft202012Validator, FormatChecker
from referencing import Registry, Resource

from schemas.codec import TOPICS, schema_text
from schemas.timefmt import parse_instant

OUTBOUND = ("plan-invalidations", "plans", "receipts", "dead-letters", "clock")


def _checker() -> FormatChecker:
    checker = FormatChecker()
    checker.checks("date-time", raises=ValueError)(lambda value: bool(parse_instant(value)))
    return checker


def validators(documented: bool = False, topics: tuple[str, ...] = OUTBOUND) -> dict[str, Draft202012Validator]:
    """A draft 2020-12 validator per topic, cross-file `$ref`s resolved from the shipped files.

    `documented` also refuses top-level fields the schema does not name: the shipped files stay
    open (consumers must ignore what they do not know), but every field we publish is described.
    """
    docs = [json.loads(schema_text(name)) for name in ("_common",) + TOPICS]
    registry = Registry().with_resources([(d["$id"], Resource.from_contents(d)) for d in docs])
    out = {}
    for topic in topics:
        schema = json.loads(schema_text(topic))
        Draft202012Validator.check_schema(schema)
        if documented:
            schema["unevaluatedProperties"] = False
        out[topic] = Draft202012Validator(schema, registry=registry, format_checker=_checker())
    return out
