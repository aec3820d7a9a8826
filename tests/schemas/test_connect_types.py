"""Connect logical types decode to freshplan values, by schema or by declared type, without echoing values."""

from __future__ import annotations

import base64

import pytest

from schemas.connect_types import ColumnError, by_name, by_schema, decimal, row_fields, valid_type


def test_epoch_timestamps_in_three_precisions_become_rfc3339():
    assert by_name("timestamp_millis", 1787961600123) == "2026-08-29T00:00:00.123000Z"
    assert by_name("timestamp_micros", 1787961600000000) == "2026-08-29T00:00:00Z"
    assert by_name("timestamp_nanos", 1787961600000001000) == "2026-08-29T00:00:00.000001Z"
    assert by_name("timestamp_micros", -1) == "1969-12-31T23:59:59.999999Z"


def test_dates_iso_and_json():
    assert by_name("date_days", 20726) == "2026-09-30T00:00:00Z"
    assert by_name("iso", "2026-08-29T02:00:00+02:00") == "2026-08-29T00:00:00Z"
    assert by_name("iso", "2026-08-29") == "2026-08-29T00:00:00Z"
    assert by_name("json", '{"a": [1]}') == {"a": [1]}
    assert by_name("json", None) is None


def test_decimal_is_base64_unscaled_with_its_scale():
    assert decimal("BLA=", "0") == 1200 and decimal("BLA=", 2) == 12.0 and decimal("BLE=", 2) == 12.01
    assert decimal("/w==", 0) == -1
    assert by_name("decimal:1", "AQ==") == 0.1


@pytest.mark.parametrize("type_name, value, reason", [
    ("json", "{nope", "is not valid JSON"), ("timestamp_micros", "2026-08-29", "is not an integer"),
    ("date_days", 1.5, "days"), ("iso", "2026-08-29T00:00:00", "without an offset"),
    ("decimal:2", "***", "base64"), ("timestamp_millis", 10**20, "outside")])
def test_bad_values_say_why_without_the_value(type_name, value, reason):
    with pytest.raises(ColumnError) as bad:
        by_name(type_name, value)
    assert reason in str(bad.value) and str(value) not in str(bad.value)


def test_by_schema_uses_logical_names_parameters_and_array_items():
    assert by_schema({"type": "string", "name": "io.debezium.data.Json"}, "[1]") == [1]
    assert by_schema({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                      "parameters": {"scale": "1"}}, "AQ==") == 0.1
    dates = {"type": "array", "items": {"type": "int32", "name": "io.debezium.time.Date"}}
    assert by_schema(dates, [0, 1]) == ["1970-01-01T00:00:00Z", "1970-01-02T00:00:00Z"]
    assert by_schema({"type": "boolean"}, True) is True
    assert by_schema({"type": "string"}, "plain") == "plain"
    with pytest.raises(ColumnError, match="scale"):
        by_schema({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                   "parameters": {"scale": "x"}}, "AQ==")
    with pytest.raises(ColumnError, match="boolean"):
        by_schema({"type": "boolean"}, "yes")


def test_row_fields_and_declared_type_names():
    schema = {"fields": [{"field": "after", "fields": [{"field": "a", "type": "int32"}]}]}
    assert row_fields(schema, "after") == {"a": {"field": "a", "type": "int32"}}
    assert row_fields(schema, "before") == {} and row_fields(None, "after") == {}
    assert valid_type("decimal:2") and valid_type("json") and not valid_type("decimal:x") and not valid_type("money")


def test_booleans_and_uuids_decode_as_debezium_sends_them():
    # MySQL BOOLEAN is TINYINT(1): 0 or 1 without a converter; Postgres and BIT(1): JSON booleans.
    decoded = [by_name("boolean", v) for v in (True, False, 1, 0, "true", "FALSE")]
    assert decoded == [True, False, True, False, True, False] and {type(v) for v in decoded} == {bool}  # 1 == True
    for bad in (2, -1, "yes", 1.0, []):
        with pytest.raises(ColumnError, match="is not a boolean"):
            by_name("boolean", bad)
    ref = "6f1c2a4e-9b3d-4c5e-8a7f-0123456789ab"
    assert by_name("uuid", ref.upper()) == ref and by_schema({"type": "string", "name": "io.debezium.data.Uuid"},
                                                             ref.upper()) == ref
    # MySQL BINARY(16), as binary.handling.mode writes it: bytes (base64 in JSON), base64-url-safe, hex.
    assert by_name("uuid", "bxwqTps9TF6KfwEjRWeJqw==") == ref
    assert by_name("uuid", base64.urlsafe_b64encode(bytes.fromhex("fbff" + "00" * 14)).decode()) == (
        "fbff0000-0000-0000-0000-000000000000")
    assert by_name("uuid", ref.replace("-", "")) == ref
    for bad in ("not-a-uuid", "bxwqTps9TF6KfwEjRWeJ", "AAAAAAAAAAAAAAAAAAAAAAA=", 42):
        with pytest.raises(ColumnError, match="is not a UUID"):
            by_name("uuid", bad)
    assert valid_type("boolean") and valid_type("uuid")
