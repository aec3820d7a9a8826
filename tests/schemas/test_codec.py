"""Decoding: each kind of bad input becomes one InvalidEvent with its class; Debezium maps."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import orjson
import pytest
from jsonschema import Draft202012Validator

from schemas.codec import TOPICS, decode, event_key, schema_text
from schemas.errors import InvalidEvent
from schemas.records import Resource, SourceChange
from tests.catalog_double import SCENARIOS
from tests.events import resource, tick


@pytest.mark.parametrize("topic", TOPICS)
def test_every_topic_ships_a_valid_json_schema(topic):
    Draft202012Validator.check_schema(json.loads(schema_text(topic)))


def test_a_resource_event_decodes_into_records():
    topic, event = resource("approved-waiver-W2")
    decoded = decode(topic, b"approved-waiver-W2", orjson.dumps(event))
    assert isinstance(decoded.payload, SourceChange) and isinstance(decoded.payload.record, Resource)
    assert decoded.payload.record.valid_to.isoformat() == "2026-09-30T23:59:59+00:00"
    assert event_key(topic, event) == b"approved-waiver-W2"


@pytest.mark.parametrize("mutate, error_class", [
    (lambda e: b"{nope", "malformed_json"),
    (lambda e: orjson.dumps(dict(e, schema_version=2)), "unknown_schema_version"),
    (lambda e: orjson.dumps({k: v for k, v in e.items() if k != "event_id"}), "schema_violation"),
    (lambda e: orjson.dumps(dict(e, resource=dict(e["resource"], tokens="many"))), "schema_violation"),
    (lambda e: orjson.dumps(dict(e, kind="spaceship")), "schema_violation"),
    (lambda e: orjson.dumps(dict(e, resource=dict(e["resource"], valid_to="next tuesday"))), "invalid_value"),
    (lambda e: orjson.dumps(dict(e, resource=dict(e["resource"], content="x" * 2_000_000))), "oversized"),
    (lambda e: orjson.dumps([e]), "schema_violation"),
    (lambda e: orjson.dumps(dict(e, resource=dict(e["resource"], valid_to="9999-12-31T23:59:59-01:00"))),
     "invalid_value"),
    (lambda e: orjson.dumps(dict(e, occurred_at="0001-01-01T00:00:00+14:00")), "invalid_value"),
    (lambda e: orjson.dumps(dict(e, resource=dict(e["resource"], tokens=2**63))), "schema_violation"),
    (lambda e: orjson.dumps(dict(e, resource=dict(e["resource"], version=2**64 - 1))), "schema_violation"),
    (lambda e: orjson.dumps({"op": "c", "after": e["resource"], "ts_ms": 2**62, "source": {}}),
     "invalid_value"),
])
def test_bad_input_is_classified(mutate, error_class):
    topic, event = resource("w")
    with pytest.raises(InvalidEvent) as err:
        decode(topic, b"w", mutate(event))
    assert err.value.error_class == error_class and err.value.message


def test_clock_and_policy_shapes_are_checked():
    topic, event = tick("2026-09-01T00:00:00Z")
    assert decode(topic, None, orjson.dumps(event)).payload.now.year == 2026
    with pytest.raises(InvalidEvent):
        decode("policy-versions", b"b", orjson.dumps({"event_id": "p", "schema_version": 1,
                                                       "occurred_at": "2026-01-01T00:00:00Z"}))


def test_debezium_envelopes_and_tombstones_map_onto_source_changes():
    row = resource("dbz-1")[1]["resource"]
    for op in ("c", "u", "r"):
        env = {"before": None, "after": row, "op": op, "ts_ms": 1788000000000,
               "source": {"table": "documents", "lsn": 42}}
        change = decode("source-changes", b"dbz-1", orjson.dumps(env)).payload
        assert change.op == "upsert" and change.record.id == "dbz-1"
    deleted = decode("source-changes", b"dbz-1", orjson.dumps(
        {"before": row, "after": None, "op": "d", "ts_ms": 1788000000000, "source": {"lsn": 43}}))
    assert deleted.payload.op == "delete" and deleted.payload.record is None
    gone = decode("source-changes", b"dbz-1", None, position="0:7")
    assert gone.payload.op == "delete" and gone.payload.record_id == "dbz-1"
    with pytest.raises(InvalidEvent):
        decode("clock", None, None)


def test_out_of_range_clock_ticks_are_invalid_values():
    with pytest.raises(InvalidEvent) as err:
        decode("clock", None, orjson.dumps(tick("0001-01-01T00:00:00+14:00")[1]))
    assert err.value.error_class == "invalid_value" and "0001-01-01T00:00:00+14:00" not in err.value.message
    assert decode("clock", None, orjson.dumps(tick("9999-12-31T23:59:59Z")[1])).payload.now.year == 9999


def _nested(levels: int) -> bytes:
    """A resource event whose attribute value holds `levels` nested arrays (written by hand: orjson cannot)."""
    _, doc = resource("r-deep")
    text = orjson.dumps(dict(doc, resource=dict(doc["resource"], attributes={"a": "HERE"}))).decode()
    return text.replace('"HERE"', "[" * levels + "1" + "]" * levels).encode()


def test_values_nested_deeper_than_can_be_stored_are_invalid_values_not_type_errors():
    # The event, its resource and its attributes are three levels: 251 arrays more is the most orjson writes.
    assert decode("source-changes", None, _nested(251)).payload.record.attributes["a"]
    for levels in (252, 600, 1_000):
        with pytest.raises(InvalidEvent) as err:
            decode("source-changes", None, _nested(levels))
        assert err.value.error_class == "invalid_value" and "nested more than 254 levels" in err.value.message
    with pytest.raises(InvalidEvent) as err:  # past what orjson reads: not JSON it can parse
        decode("source-changes", None, _nested(2_000))
    assert err.value.error_class == "malformed_json"


def test_observed_at_defaults_to_the_event_time():
    _, stated = resource("r-stated", observed_at="2026-08-01T00:00:00Z")
    _, unstated = resource("r-unstated")
    assert decode("source-changes", None, orjson.dumps(stated)).payload.record.observed_at == datetime(
        2026, 8, 1, tzinfo=timezone.utc)
    assert decode("source-changes", None, orjson.dumps(unstated)).payload.record.observed_at == datetime(
        2026, 8, 30, 9, tzinfo=timezone.utc)


@pytest.mark.parametrize("op", [[], {}, ["c"], 1, None])
def test_a_debezium_like_op_of_the_wrong_type_is_a_schema_violation(op):
    # A list or object `op` once raised TypeError (unhashable) before validation could name the problem.
    with pytest.raises(InvalidEvent) as caught:
        decode("source-changes", b"k", orjson.dumps({"op": op, "after": {}}))
    assert caught.value.error_class == "schema_violation"
    with pytest.raises(InvalidEvent):
        decode("source-changes", b"k", orjson.dumps({"schema": {"name": []}, "payload": {"op": op, "after": {}}}))


@pytest.mark.parametrize("source", ["s", [1], 7, True])
def test_a_debezium_envelope_whose_source_is_not_an_object_is_a_schema_violation(source):
    # It once raised AttributeError past decode's error handling (the batch was retried one by one).
    with pytest.raises(InvalidEvent) as caught:
        decode("source-changes", b"k", orjson.dumps({"op": "c", "after": {"id": "x"}, "source": source, "ts_ms": 1}))
    assert caught.value.error_class == "schema_violation"


def test_a_bundle_may_opt_out_of_source_trust_and_only_with_a_boolean():
    first = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    assert decode("policy-versions", b"credit", orjson.dumps(first)).payload.source_trust is True  # the default
    opted = decode("policy-versions", b"credit", orjson.dumps(dict(first, source_trust=False))).payload
    assert opted.source_trust is False
    with pytest.raises(InvalidEvent) as bad:
        decode("policy-versions", b"credit", orjson.dumps(dict(first, source_trust="off")))
    assert bad.value.error_class == "schema_violation"
