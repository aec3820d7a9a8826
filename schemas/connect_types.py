"""Decode Kafka Connect / Debezium logical types (as the JSON converter writes them) to freshplan values."""

from __future__ import annotations

import base64
import binascii
import uuid
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Callable

import orjson

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

# Logical type names in a Connect schema -> the mapping file's type name that decodes them.
LOGICAL = {
    "io.debezium.data.Json": "json",
    "io.debezium.time.Timestamp": "timestamp_millis",
    "org.apache.kafka.connect.data.Timestamp": "timestamp_millis",
    "io.debezium.time.MicroTimestamp": "timestamp_micros",
    "io.debezium.time.NanoTimestamp": "timestamp_nanos",
    "io.debezium.time.ZonedTimestamp": "iso",
    "io.debezium.time.Date": "date_days",
    "org.apache.kafka.connect.data.Date": "date_days",
    "org.apache.kafka.connect.data.Decimal": "decimal",
    "io.debezium.data.Uuid": "uuid",
}
# The type names a mapping file may declare (`decimal:<scale>` besides these).
DECLARED = ("json", "timestamp_millis", "timestamp_micros", "timestamp_nanos", "iso", "date_days", "boolean", "uuid")


class ColumnError(ValueError):
    """A column value that does not decode as its type; the reason never repeats the value."""


def _rfc3339(moment: datetime) -> str:
    text = moment.isoformat(timespec="microseconds" if moment.microsecond else "seconds")
    return text.replace("+00:00", "Z")


def _epoch(divisor: int) -> Callable[[Any], str]:
    def decode(value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ColumnError("is not an integer count since the epoch")
        whole, rest = divmod(value, divisor)
        try:
            # Integer arithmetic: a float would lose microseconds on today's timestamps.
            return _rfc3339(_EPOCH + timedelta(seconds=whole, microseconds=rest * 1_000_000 // divisor))
        except OverflowError:
            raise ColumnError("is outside the representable time range") from None
    return decode


def _days(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ColumnError("is not an integer count of days since the epoch")
    try:
        return _rfc3339(_EPOCH + timedelta(days=value))
    except OverflowError:
        raise ColumnError("is outside the representable date range") from None


def _iso(value: Any) -> str:
    if not isinstance(value, str):
        raise ColumnError("is not an ISO 8601 string")
    try:
        if len(value) == 10:  # a bare date (io.debezium.time.Date in string mode) is that day's midnight UTC
            return _rfc3339(datetime.combine(date.fromisoformat(value), datetime.min.time(), timezone.utc))
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ColumnError("is not an ISO 8601 timestamp") from None
    if moment.tzinfo is None:
        raise ColumnError("is an ISO 8601 timestamp without an offset")
    return _rfc3339(moment.astimezone(timezone.utc))


def _json(value: Any) -> Any:
    if not isinstance(value, str):
        return value  # already structured (a converter that inlines JSON)
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        raise ColumnError("is not valid JSON") from None


def _boolean(value: Any) -> bool:
    # MySQL's BOOLEAN is TINYINT(1): Debezium sends 0 or 1 unless a converter makes it a Connect boolean.
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ColumnError("is not a boolean (true, false, 0 or 1)")


def _uuid(value: Any) -> str:
    """A UUID's canonical text (lower case), from its text or its 16 bytes (MySQL BINARY(16)) as Debezium sends
    them: base64 (the default), URL-safe base64, or hex (`binary.handling.mode`)."""
    if not isinstance(value, str):
        raise ColumnError("is not a UUID")
    try:
        if len(value) == 24:  # base64 of 16 bytes; no UUID text is 24 characters long
            raw = base64.b64decode(value.replace("-", "+").replace("_", "/"), validate=True)
            return str(uuid.UUID(bytes=raw))
        return str(uuid.UUID(value))  # also 32 hex digits
    except (ValueError, binascii.Error):
        raise ColumnError("is not a UUID") from None


DECIMAL_BYTES = 128


def decimal(value: Any, scale: Any) -> int | float:
    """A Connect Decimal: base64 of the big-endian two's-complement unscaled integer, with its scale."""
    try:
        scale = int(scale)
    except (TypeError, ValueError):
        raise ColumnError("has no usable decimal scale") from None
    if not 0 <= scale <= 38:
        raise ColumnError("has a decimal scale outside 0..38")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value  # decimal.handling.mode=double or a plain number
    if not isinstance(value, str):
        raise ColumnError("is not a base64 Decimal")
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ColumnError("is not a base64 Decimal") from None
    if len(raw) > DECIMAL_BYTES:
        # No number here holds more (a float stops near 2**1024), and converting a wider one takes seconds.
        raise ColumnError(f"is a Decimal wider than {DECIMAL_BYTES * 8} bits")
    number = Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-scale)
    return int(number) if number == number.to_integral_value() else float(number)


_DECODERS: dict[str, Callable[[Any], Any]] = {
    "json": _json, "timestamp_millis": _epoch(1_000), "timestamp_micros": _epoch(1_000_000),
    "timestamp_nanos": _epoch(1_000_000_000), "iso": _iso, "date_days": _days, "boolean": _boolean, "uuid": _uuid,
}


def valid_type(name: str) -> bool:
    """True when `name` is a type a mapping file may declare."""
    if name.startswith("decimal:"):
        return name[8:].isdigit() and int(name[8:]) <= 38
    return name in _DECODERS


def by_name(type_name: str, value: Any) -> Any:
    """Decode one value by a declared type name (`json`, `timestamp_micros`, `decimal:2`, ...)."""
    if value is None:
        return None
    if type_name.startswith("decimal:"):
        return decimal(value, type_name[8:])
    return _DECODERS[type_name](value)


def by_schema(field: dict[str, Any], value: Any) -> Any:
    """Decode one value by its Connect field schema (logical type name, parameters, array items)."""
    if value is None or not isinstance(field, dict):
        return value
    name = field.get("name")
    if name == "org.apache.kafka.connect.data.Decimal":
        return decimal(value, (field.get("parameters") or {}).get("scale"))
    if name in LOGICAL:
        return by_name(LOGICAL[name], value)
    if field.get("type") == "array" and isinstance(value, list):
        return [by_schema(field.get("items") or {}, item) for item in value]
    if field.get("type") == "boolean" and not isinstance(value, bool):
        raise ColumnError("is not a boolean")
    return value


def row_fields(envelope_schema: Any, which: str) -> dict[str, dict]:
    """The field schemas of the `before` or `after` struct of an envelope schema, by column name."""
    if not isinstance(envelope_schema, dict):
        return {}
    for part in envelope_schema.get("fields") or ():
        if isinstance(part, dict) and part.get("field") == which:
            return {f["field"]: f for f in part.get("fields") or () if isinstance(f, dict) and "field" in f}
    return {}
