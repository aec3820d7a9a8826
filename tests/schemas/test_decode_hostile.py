"""Shapes no check foresaw become one dead letter each (InvalidEvent), never an exception that fails a batch."""

from __future__ import annotations

import base64
import time

import orjson
import pytest

from schemas.codec import decode, fast_validator, validator
from schemas.errors import InvalidEvent
from tests.cdc.test_fixtures import MAPPING
from tests.schemas.test_fastcheck import _outcome

ROW_SOURCE = {"db": "crm", "table": "documents", "file": "mysql-bin.000001", "pos": 4, "ts_ms": 1700000000000}


def _refused(topic, key, value, cdc=None) -> InvalidEvent:
    with pytest.raises(InvalidEvent) as err:
        decode(topic, key, value, cdc=cdc)
    return err.value


def _nested_array_schema(levels: int) -> bytes:
    schema, value = '{"type":"string"}', '"x"'
    for _ in range(levels):
        schema, value = '{"type":"array","items":' + schema + "}", "[" + value + "]"
    return ('{"schema":{"fields":[{"field":"after","fields":[' + schema[:-1] + ',"field":"x"}]}]},"payload":'
            '{"op":"c","after":{"id":"r1","x":' + value + '},"source":{"table":"t","lsn":5}}}').encode()


@pytest.mark.parametrize("topic", ["clock", "source-changes", "revocations", "policy-versions"])
@pytest.mark.parametrize("event_id", [5, None, ["dbz:x"]])
def test_an_event_id_that_is_not_a_string_is_a_schema_violation_with_a_cdc_mapping(topic, event_id):
    assert _refused(topic, None, orjson.dumps({"event_id": event_id}), MAPPING).error_class == "schema_violation"


@pytest.mark.parametrize("kind", [5, None, True, 1.5])
def test_a_debezium_row_whose_kind_is_not_a_string_is_a_schema_violation(kind):
    row = orjson.dumps({"op": "c", "after": {"id": "r1", "kind": kind}, "source": {"table": "t", "lsn": 1}})
    assert _refused("source-changes", None, row).error_class == "schema_violation"


def test_the_fast_check_sends_a_document_it_cannot_read_on_to_the_published_schema():
    doc = {"event_id": "e", "schema_version": 1, "occurred_at": "2026-01-01T00:00:00Z", "kind": "resource",
           "op": "upsert", 5: {"id": "r"}}  # a key that is not a string: jsonschema-rs raises ValueError on it
    assert not _outcome(fast_validator("source-changes"), doc) and not _outcome(validator("source-changes"), doc)


@pytest.mark.parametrize("column, after, source, cdc", [
    ("tokens", {"id": "r1", "tokens": "BQ=="}, {"table": "t", "lsn": 1}, None),
    ("token_count", {"document_id": "d1", "customer_id": "E1", "token_count": "BQ==", "doc_class": "c"}, ROW_SOURCE,
     MAPPING)])
def test_a_decimal_whose_parameters_are_not_an_object_is_an_invalid_value(column, after, source, cdc):
    value = orjson.dumps({"schema": {"fields": [{"field": "after", "fields": [
        {"field": column, "name": "org.apache.kafka.connect.data.Decimal", "parameters": 5}]}]},
        "payload": {"op": "c", "after": after, "source": source}})
    assert _refused("source-changes", None, value, cdc).error_class == "invalid_value"


@pytest.mark.parametrize("key, cdc", [
    (b'{"schema":{"name":5},"payload":{"doc_id":"x"}}', MAPPING),
    (b'{"schema":{"fields":[{"field":[]}]},"payload":{"id":"x"}}', None),
    (b'{"schema":{"fields":[{"field":"id","name":[]}]},"payload":{"id":"x"}}', None),
    (b'{"schema":{"fields":5},"payload":{"id":"x"}}', None),
    (b'{"schema":{"fields":[{"field":"id","name":"org.apache.kafka.connect.data.Decimal","parameters":5}]},'
     b'"payload":{"id":"AQ=="}}', None),
    (b'{"schema":{"fields":[{"field":"id","name":"io.debezium.time.ZonedTimestamp"}]},'
     b'"payload":{"id":"0001-01-01T00:00:00+01:00"}}', None),
    (b'{"schema":{"name":"x.kb.documents.Key","fields":[{"field":"doc_id","name":"io.debezium.time.ZonedTimestamp"}]},'
     b'"payload":{"doc_id":"0001-01-01T00:00:00+01:00"}}', MAPPING),
    (b'{"id":' + b"[" * 300 + b"]" * 300 + b"}", None),
])
def test_a_tombstone_whose_key_holds_an_unusable_shape_is_an_invalid_value(key, cdc):
    assert _refused("source-changes", key, None, cdc).error_class == "invalid_value"


def test_an_array_schema_nested_past_the_interpreter_s_recursion_is_an_invalid_value():
    assert _refused("source-changes", None, _nested_array_schema(500)).error_class == "invalid_value"


@pytest.mark.timeout(30)
def test_a_decimal_wider_than_any_number_here_is_refused_at_once():
    """A 554 KB Decimal took 15 s of CPU and raised decimal.Overflow; one of 1,800 bytes was accepted by the Rust
    check (past 4,300 digits) and reported as nested too deep."""
    for size in (1_800, 415_300):
        wide = base64.b64encode(b"\x7f" + b"\xff" * (size - 1)).decode()
        row = orjson.dumps({"op": "c", "after": {"document_id": "d1", "customer_id": "E1", "token_count": wide,
                                                 "doc_class": "c"}, "source": ROW_SOURCE})
        started = time.perf_counter()
        err = _refused("source-changes", None, row, MAPPING)
        assert err.error_class == "invalid_value" and "wider than 1024 bits" in err.message
        assert time.perf_counter() - started < 5


def test_a_decimal_beyond_64_bits_is_refused_by_the_published_schema():
    wide = base64.b64encode(b"\x7f" + b"\xff" * 20).decode()  # about 10**50: under the width limit
    row = orjson.dumps({"op": "c", "after": {"document_id": "d1", "customer_id": "E1", "token_count": wide,
                                             "doc_class": "c"}, "source": ROW_SOURCE})
    assert _refused("source-changes", None, row, MAPPING).error_class == "schema_violation"


@pytest.mark.parametrize("op", [["c"], {"c": 1}, 5, None, True, "upsert"])
def test_a_native_event_s_op_of_any_json_type_is_judged_by_the_schema_not_a_crash(op):
    # A top-level event_id marks freshplan's own shape and skips the Debezium shape checks: an op that is a list
    # or an object must not be hashed into them (TypeError) nor change the error class the schema gives.
    from tests.events import resource

    _, event = resource("r-op")
    if op == "upsert":
        assert decode("source-changes", b"r-op", orjson.dumps(event)).payload.op == "upsert"
        return
    assert _refused("source-changes", b"r-op", orjson.dumps(dict(event, op=op))).error_class == "schema_violation"


@pytest.mark.parametrize("shape", [
    {"op": "c", "after": {"id": "r1"}, "source": ROW_SOURCE},  # an envelope carrying an event_id is still one
    {"__op": "c", "id": "r1"},  # an unwrapped row carrying an event_id is freshplan's shape: the schema judges it
    {"status": "BEGIN", "id": "t1"},  # a transaction boundary with an event_id is no boundary
])
def test_a_document_with_an_event_id_is_judged_as_before_the_shape_checks_were_skipped(shape):
    from schemas import codec

    value = orjson.dumps(dict(shape, event_id="e1"))
    try:
        now = decode("source-changes", b"r1", value, cdc=MAPPING)
    except InvalidEvent as exc:
        now = exc.error_class
    real = codec.debezium_shapes.row_op
    try:  # the old path: every shape check run
        codec.debezium_shapes.row_op = lambda op: True
        try:
            before = decode("source-changes", b"r1", value, cdc=MAPPING)
        except InvalidEvent as exc:
            before = exc.error_class
    finally:
        codec.debezium_shapes.row_op = real
    assert now == before
