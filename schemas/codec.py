"""Decode raw topic bytes into validated records; every failure becomes InvalidEvent."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from datetime import datetime
from functools import lru_cache
from importlib import resources
from types import MappingProxyType
from typing import Any

import orjson
import fastjsonschema
import jsonschema_rs

from schemas import debezium, debezium_shapes
from schemas.cdc_mapping import CdcMapping
from schemas.errors import InvalidEvent, SkippedEvent
from schemas.records import (ClockTick, Contract, Entity, InputEvent, PolicyBundle, Principal,
                             Proposition, Resource, Revocation, SourceChange)
from schemas.timefmt import parse_duration, parse_instant

SCHEMA_VERSION = 1
NESTING_LIMIT = 254  # levels of arrays and objects inside an event that orjson can write back (it reads 1,024)
# What decoding raises on a value no check foresaw; never MemoryError and the like, which are the worker's.
_UNUSABLE = (ValueError, TypeError, KeyError, IndexError, AttributeError, ArithmeticError, RecursionError, OSError)
INPUT_TOPICS = ("source-changes", "policy-versions", "revocations", "clock")
TOPICS = ("source-changes", "policy-versions", "revocations", "clock", "plan-invalidations",
          "plans", "receipts", "dead-letters", "plan-dependencies")


def schema_text(topic: str) -> str:
    """The JSON Schema document of one topic, as shipped in the package."""
    return resources.files("schemas").joinpath("json", f"{topic}.schema.json").read_text("utf-8")


@lru_cache(maxsize=None)
def _documents() -> dict[str, dict]:
    """Every shipped schema by its $id, so cross-file $refs resolve without the network."""
    docs = (json.loads(schema_text(name)) for name in ("_common",) + TOPICS)
    return {doc["$id"]: doc for doc in docs}


def _compile(schema: dict):
    return fastjsonschema.compile(schema, use_formats=False, handlers={"https": lambda uri: _documents()[uri]})


@lru_cache(maxsize=None)
def validator(topic: str):
    """A validator compiled once per process from the topic's JSON Schema.

    fastjsonschema generates Python code (tens of microseconds per event instead of
    milliseconds); the schema files use only keywords whose meaning is the same in
    draft-07 and 2020-12, so producers may validate with either.
    """
    return _compile(json.loads(schema_text(topic)))


@lru_cache(maxsize=None)
def fast_validator(topic: str):
    """For an input topic, a validator that accepts what `validator` accepts and never more, in a sixth of the time.

    jsonschema-rs (compiled Rust) checks the published schema itself; whatever it rejects is
    checked again by `validator`, which decides and names the problem, so its messages stay the
    dead letters'. tests/schemas/test_fastcheck.py proves that it never accepts what `validator`
    refuses, and that it accepts every fixture and generated event.
    """
    if topic not in INPUT_TOPICS:
        return validator(topic)
    registry = jsonschema_rs.Registry(list(_documents().items()))
    accepts = jsonschema_rs.validator_for(json.loads(schema_text(topic)), registry=registry,
                                          validate_formats=False).is_valid

    def check(doc: Any) -> Any:
        try:
            accepted = accepts(doc)
        except (ValueError, TypeError, OverflowError):  # a non-string key, say: the published validator judges it
            accepted = False
        if not accepted:
            raise fastjsonschema.JsonSchemaException("rejected: the published schema names why")
        return doc
    return check


def validate(topic: str, doc: Any) -> None:
    """Raise InvalidEvent(schema_violation) naming the problem, if any."""
    try:
        fast_validator(topic)(doc)
        return
    except fastjsonschema.JsonSchemaException:
        pass
    published(topic, doc)


def published(topic: str, doc: Any) -> None:
    """`validate` by the published schema alone (fastjsonschema), which names the problem."""
    try:
        validator(topic)(doc)
    except fastjsonschema.JsonSchemaException as err:
        where = "/".join(str(p) for p in (err.path or [])[1:]) or "(top level)"
        raise InvalidEvent("schema_violation", f"{topic} event at {where}: {_broken_rule(err)}") from None


def _broken_rule(err: fastjsonschema.JsonSchemaException) -> str:
    """What the schema asked for, from the schema alone: dead letters never repeat the offending value."""
    rule, wanted = err.rule, err.rule_definition
    if rule == "type":
        return f"must be of type {wanted}"
    if rule in ("enum", "const"):
        return f"must be one of {wanted if isinstance(wanted, list) else [wanted]}"
    if rule == "required":
        return f"must contain the properties {', '.join(map(str, wanted))}"
    if rule == "pattern":
        return f"must match the pattern {wanted}"
    if rule in ("additionalProperties", "propertyNames"):
        return "has properties the schema does not define"
    if rule in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
                "minItems", "maxItems", "minProperties", "maxProperties", "multipleOf"):
        return f"breaks {rule} {wanted}"
    return f"breaks the schema's {rule} rule"


@lru_cache(maxsize=4096)
def _parsed_instant(text: str) -> datetime:
    # A resource's occurred_at is read twice per event, and valid_from/now values repeat across events.
    return parse_instant(text)


def _instant(value: Any, field: str):
    """Parse an instant, naming the field (not the value) when it is not one."""
    try:
        return _parsed_instant(value) if isinstance(value, str) else parse_instant(value)
    except (ValueError, TypeError, OverflowError):
        raise InvalidEvent("invalid_value", f"{field} is not an RFC 3339 timestamp with an offset that this "
                           "service can represent, such as 2026-08-30T00:00:00Z") from None


def document(topic: str, key: bytes | None, value: bytes | None, *, position: str = "",
             max_bytes: int = 1_000_000, cdc: CdcMapping | None = None) -> Any:
    """The JSON document a message stands for: Debezium envelopes and tombstones become source changes.

    Raises SkippedEvent for Debezium heartbeats and transaction boundaries, InvalidEvent otherwise.
    """
    if value is None:
        doc = debezium.tombstone(key, position, cdc) if topic == "source-changes" else None
        if doc is None:
            raise InvalidEvent("malformed_json", f"empty message on {topic}: a value is required")
        return doc
    if len(value) > max_bytes:
        raise InvalidEvent("oversized", f"event of {len(value)} bytes exceeds the "
                           f"{max_bytes}-byte limit; split the record or raise the limit")
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise InvalidEvent("malformed_json", f"not valid JSON ({exc.msg} at line {exc.lineno} column "
                           f"{exc.colno})") from None
    if topic != "source-changes":
        return doc
    if isinstance(doc, dict) and "event_id" in doc and not debezium_shapes.row_op(doc.get("op")):
        # freshplan's own shape, the usual case: no Debezium message has a top-level event_id (that field makes
        # every shape check below pass it through), and an envelope's op is one of Debezium's letters.
        return doc
    if kind := debezium.control_kind(doc):
        raise SkippedEvent(kind)
    debezium_shapes.refuse(doc)
    if debezium.is_debezium(doc) or debezium_shapes.is_unwrapped(doc):
        try:
            return debezium.from_debezium(doc, cdc)
        except (ValueError, TypeError, KeyError, OverflowError, OSError) as exc:
            if isinstance(exc, InvalidEvent):
                raise
            raise InvalidEvent("invalid_value", "Debezium envelope with an unusable ts_ms or source "
                               "position; check the connector's output") from None
    return doc


def decode(topic: str, key: bytes | None, value: bytes | None, *, position: str = "",
           max_bytes: int = 1_000_000, cdc: CdcMapping | None = None) -> InputEvent:
    """Turn one consumed message of an input topic into an InputEvent or raise InvalidEvent.

    `cdc` is the mapping file loaded at start-up (None: Debezium rows carry freshplan's field names).
    """
    try:
        doc = document(topic, key, value, position=position, max_bytes=max_bytes, cdc=cdc)
        try:
            return _checked(topic, doc)
        except InvalidEvent as exc:
            if cdc is None or value is None or not isinstance(doc, dict) or not str(doc.get("event_id")).startswith(
                    "dbz:"):
                raise
            raise InvalidEvent(exc.error_class, debezium.blame(orjson.loads(value), cdc, exc.message)) from None
    except (InvalidEvent, SkippedEvent):
        raise
    except _UNUSABLE as exc:
        # A shape no check above foresaw (a Connect schema, a key, a value the mapping chokes on): this record
        # alone is refused. Raised on, it would fail its whole batch into one-by-one retries.
        raise InvalidEvent("invalid_value", f"{topic} event holds a value this service cannot use "
                           f"({type(exc).__name__}); check it against the topic's JSON Schema and its fields in "
                           "docs/topics.md (Debezium messages: docs/cdc.md)") from None


def _checked(topic: str, doc: Any) -> InputEvent:
    if not isinstance(doc, dict):
        raise InvalidEvent("schema_violation", f"{topic} event must be a JSON object")
    version = doc.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version != SCHEMA_VERSION:
        raise InvalidEvent("unknown_schema_version", "schema_version is not supported "
                           f"(this service reads version {SCHEMA_VERSION}); upgrade freshplan first")
    validate(topic, doc)
    try:
        payload = _PAYLOAD[topic](doc)
        occurred = _instant(doc["occurred_at"], "occurred_at")
    except InvalidEvent as exc:
        raise InvalidEvent(exc.error_class, f"{topic} event: {exc.message}") from None
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        raise InvalidEvent("invalid_value", f"{topic} event: a field holds a value of the right type that this "
                           f"service cannot use ({type(exc).__name__}); check it against the topic's "
                           "JSON Schema and its fields in docs/topics.md") from None
    try:
        digest = content_hash(doc)
    except orjson.JSONEncodeError as exc:
        # What cannot be written back would fail every later write of it: parsing allows 1,024 levels and
        # writing 255, and a Debezium Decimal can be wider than 64 bits (which the Rust check may let through
        # past 4,300 digits: the published schema decides first).
        published(topic, doc)
        what = (f"a value nested more than {NESTING_LIMIT} levels deep" if "Recursion" in str(exc)
                else "an integer beyond 64 bits" if "64-bit" in str(exc) else "a value JSON cannot hold")
        raise InvalidEvent("invalid_value", f"{topic} event: holds {what}, which this service cannot store; "
                           "change the producer") from None
    return InputEvent(event_id=doc["event_id"], occurred_at=occurred, topic=topic, payload=payload,
                      content_hash=digest)


def content_hash(doc: dict) -> str:
    """Digest of what an event says, so a repeated id can be told from a conflicting one.

    `occurred_at` is left out: a producer retry that restamps the time is the same event.
    """
    body = {k: v for k, v in doc.items() if k != "occurred_at"}
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def _duration(value: Any, field: str):
    try:
        return parse_duration(value)
    except (ValueError, TypeError, OverflowError):
        raise InvalidEvent("invalid_value", f"{field} is not an ISO 8601 duration such as P400D or PT12H") from None


def _opt_instant(value: str | None, field: str):
    return None if value is None else _instant(value, field)


def _frozen(mapping: dict | None) -> MappingProxyType:
    return MappingProxyType(dict(mapping or {}))


def resource_from(doc: dict, observed_default: datetime | None = None) -> Resource:
    """Build a Resource from its wire shape; `observed_at` defaults to `observed_default` (the event's time)."""
    observed = _opt_instant(doc.get("observed_at"), "observed_at")
    return Resource(
        id=doc["id"], version=int(doc["version"]), entity=doc["entity"],
        evidence_class=doc["evidence_class"], tokens=int(doc["tokens"]),
        title=doc.get("title") or "", content=doc.get("content") or "",
        supports=tuple(doc.get("supports") or ()), contradicts=tuple(doc.get("contradicts") or ()),
        valid_from=_opt_instant(doc.get("valid_from"), "valid_from"),
        valid_to=_opt_instant(doc.get("valid_to"), "valid_to"),
        superseded_by=doc.get("superseded_by"), provenance_group=doc.get("provenance_group"),
        sensitivity=doc.get("sensitivity") or "internal", attributes=_frozen(doc.get("attributes")),
        observed_at=observed or observed_default,
    )


def principal_from(doc: dict) -> Principal:
    """Build a Principal from its wire shape."""
    return Principal(id=doc["id"], roles=tuple(doc.get("roles") or ()),
                     attributes=_frozen(doc.get("attributes")),
                     delegation_version=int(doc.get("delegation_version") or 0))


def entity_from(doc: dict) -> Entity:
    """Build an Entity from its wire shape."""
    return Entity(id=doc["id"], aliases=tuple(doc.get("aliases") or ()))


def contract_from(name: str, doc: dict) -> Contract:
    """Build a decision type's evidence contract from its wire shape."""
    props = tuple(
        Proposition(id=p["id"], accepted_classes=tuple(p["accepted_classes"]),
                    required=bool(p.get("required", True)),
                    min_independent=int(p.get("min_independent") or 1),
                    max_age=_duration(p["max_age"], "max_age") if p.get("max_age") else None,
                    threshold=p.get("threshold"), precedence=tuple(p.get("precedence") or ()))
        for p in doc["propositions"]
    )
    return Contract(decision_type=name, purposes=tuple(doc["purposes"]), propositions=props,
                    threshold=float(doc.get("threshold", 0.8)),
                    conflict_ceiling=float(doc.get("conflict_ceiling", 0.5)),
                    loss=doc.get("loss"), observations=doc.get("observations"),
                    min_relevance=None if doc.get("min_relevance") is None else float(doc["min_relevance"]),
                    controller=doc.get("controller"), ask_scope=bool(doc.get("ask_scope", False)))


def _source_change(doc: dict) -> SourceChange:
    kind, op = doc["kind"], doc["op"]
    body = doc[kind]
    if op == "delete":
        return SourceChange(kind=kind, op=op, record_id=body["id"], record=None)
    if kind == "resource":
        # A fact is as fresh as the event that last confirmed it, unless the source says when.
        record = resource_from(body, _opt_instant(doc.get("occurred_at"), "occurred_at"))
        if doc.get("log_ordered") is True:
            record = replace(record, log_ordered=True, log_position=doc.get("log_position"),
                             log_snapshot=doc.get("log_snapshot") is True)
    else:
        record = {"principal": principal_from, "entity": entity_from}[kind](body)
    return SourceChange(kind=kind, op=op, record_id=body["id"], record=record,
                        unavailable=tuple(sorted((doc.get("unavailable") or {}).items())))


def _policy(doc: dict) -> PolicyBundle:
    contracts = tuple(contract_from(name, body) for name, body in sorted(doc["decision_types"].items()))
    sources = {group: tuple(classes) for group, classes in (doc.get("sources") or {}).items()}
    return PolicyBundle(bundle_id=doc["bundle_id"], version=int(doc["version"]),
                        effective_at=_instant(doc["effective_at"], "effective_at"), cedar=doc["cedar"],
                        contracts=contracts, sources=MappingProxyType(sources),
                        source_trust=bool(doc.get("source_trust", True)))


def _revocation(doc: dict) -> Revocation:
    return Revocation(principal=doc["principal"], revoke=doc["revoke"], value=doc["value"],
                      effective_at=_instant(doc["effective_at"], "effective_at"),
                      issued_by=doc.get("issued_by") or "", delegation_version=doc.get("delegation_version"))


def _clock(doc: dict) -> ClockTick:
    return ClockTick(now=_instant(doc["now"], "now"))


_PAYLOAD = {"source-changes": _source_change, "policy-versions": _policy,
            "revocations": _revocation, "clock": _clock}


def event_key(topic: str, doc: dict) -> bytes | None:
    """The message key the design assigns to an input event (None for the clock)."""
    if topic == "source-changes":
        if debezium.is_debezium(doc) or debezium_shapes.is_unwrapped(doc):
            doc = debezium.from_debezium(doc)
        return str(doc[doc["kind"]]["id"]).encode()
    if topic == "policy-versions":
        return str(doc["bundle_id"]).encode()
    if topic == "revocations":
        return str(doc["principal"]).encode()
    return None
