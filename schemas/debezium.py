"""Map Debezium change envelopes (before/after/op/source/ts_ms), keys and tombstones onto source-changes events."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

import orjson

from schemas import cdc_mapping, connect_types
from schemas.cdc_mapping import CdcMapping, TableMapping
from schemas.connect_types import ColumnError
from schemas.errors import InvalidEvent

_OPS = {"c": "upsert", "u": "upsert", "r": "upsert", "d": "delete"}
# Source fields that together name one change, by the field that identifies the connector's
# position (MySQL binlog file and offset and row, SQL Server and Oracle change numbers, Postgres LSN).
_POSITIONS = (("file", ("file", "pos", "row")), ("change_lsn", ("change_lsn", "commit_lsn", "event_serial_no")),
              ("commit_lsn", ("change_lsn", "commit_lsn", "event_serial_no")), ("scn", ("scn", "commit_scn")),
              ("lsn", ("lsn", "txId")))
# The connector's software version is no part of where a change came from.
_VOLATILE = {"version"}
_HEARTBEAT = "io.debezium.connector.common.Heartbeat"
_TRANSACTION = "io.debezium.connector.common.TransactionMetadataValue"
_TRANSACTION_FIELDS = {"status", "id", "event_count", "data_collections", "ts_ms"}


def _unwrap(doc: Any) -> tuple[Any, dict | None]:
    """The payload and Connect schema of a JsonConverter document (schema None without schemas)."""
    if isinstance(doc, dict) and set(doc) == {"schema", "payload"}:
        return doc["payload"], doc["schema"] if isinstance(doc["schema"], dict) else None
    return doc, None


def is_debezium(doc: Any) -> bool:
    """True when the document looks like a Debezium envelope (optionally wrapped in payload)."""
    doc, _ = _unwrap(doc)
    op = doc.get("op") if isinstance(doc, dict) else None
    return isinstance(op, str) and op in _OPS and ("after" in doc or "before" in doc)


def control_kind(doc: Any) -> str | None:
    """`heartbeat` or `transaction` for Debezium's own messages (no row change), else None."""
    body, schema = _unwrap(doc)
    name = (schema or {}).get("name")
    name = name if isinstance(name, str) else ""
    if name.endswith(_HEARTBEAT) or (isinstance(body, dict) and set(body) == {"ts_ms"}):
        return "heartbeat"
    if name.endswith(_TRANSACTION) or (isinstance(body, dict) and body.get("status") in ("BEGIN", "END")
                                       and "id" in body and set(body) <= _TRANSACTION_FIELDS):
        return "transaction"
    return None


def table_name(source: Any) -> str:
    """`schema.table` (Postgres, SQL Server) or `db.table` (MySQL) from an envelope's source block."""
    if not isinstance(source, dict):
        return ""
    scope = source.get("schema") or source.get("db")
    return f"{scope}.{source.get('table')}" if scope else str(source.get("table") or "")


def from_debezium(doc: dict[str, Any], mapping: CdcMapping | None = None) -> dict[str, Any]:
    """Turn an envelope into a source-changes document, or raise InvalidEvent naming table and column.

    Without a mapping the row carries freshplan's field names (a `kind` column selects
    principal or entity rows). The event id is derived from the source position so that a
    replayed envelope deduplicates.
    """
    doc, schema = _unwrap(doc)
    op = _OPS[doc["op"]]
    which = "after" if op == "upsert" else "before"
    row = doc.get(which)
    row = dict(row) if isinstance(row, dict) else {}
    source = doc.get("source")
    if source is not None and not isinstance(source, dict):
        raise InvalidEvent("schema_violation", "Debezium envelope whose `source` is not an object; the connector's "
                           "source block names the table and position of the change")
    source = source or {}
    table = table_name(source)
    columns = connect_types.row_fields(schema, which)
    try:
        if mapping is None:
            kind = row.pop("kind", "resource")
            record = {c: connect_types.by_schema(columns.get(c) or {}, v) if c in columns else v
                      for c, v in row.items()}
        else:
            kind, record = _mapped(mapping, table, op, row, columns, source)
    except ColumnError as exc:
        raise InvalidEvent("invalid_value", f"table {table}: {exc}") from None
    position = source_position(source) or str(doc.get("ts_ms"))
    event_id = f"dbz:{source.get('table', kind)}:{record.get('id')}:{position}:{doc['op']}"
    ts_ms = doc.get("ts_ms") or source.get("ts_ms") or 0
    occurred = datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    return {"event_id": event_id, "schema_version": 1, "occurred_at": occurred,
            "kind": kind, "op": op, kind: record}


def _mapped(mapping: CdcMapping, table: str, op: str, row: dict, columns: dict, source: dict) -> tuple[str, dict]:
    target = mapping.tables.get(table)
    if target is None:
        raise InvalidEvent("unmapped_table", f"table {table or '(none)'} is not in the CDC mapping file; "
                           "add it under \"tables\" or stop capturing it")
    record = cdc_mapping.apply(target, row, columns)
    if op == "delete":
        return target.kind, {"id": record["id"]} if "id" in record else {}
    if target.kind == "resource" and "version" not in target.fields:
        record["version"] = position_version(source, table)
    return target.kind, record


def position_version(source: dict, table: str) -> int:
    """A version from the source position, which only moves forward for one row.

    Postgres: the LSN. MySQL: the binlog file's sequence number, then the offset in it.
    """
    lsn, file, pos = source.get("lsn"), source.get("file"), source.get("pos")
    if isinstance(lsn, int) and not isinstance(lsn, bool) and lsn >= 0:
        return lsn
    match = re.search(r"(\d+)$", file) if isinstance(file, str) else None
    if match and isinstance(pos, int) and 0 <= pos < 2 ** 32:
        return int(match.group(1)) * 2 ** 32 + pos
    raise InvalidEvent("invalid_value", f"table {table} maps no version column and its source position "
                       "(Postgres lsn, MySQL file and pos) is missing; map a version column")


def source_position(source: Any) -> str:
    """The full source position of a change: every field the connector needs to name it uniquely.

    `mysql-bin.000002:154` and `mysql-bin.000001:154` are different changes; an unknown
    connector's position is all of its scalar source fields but its software version.
    """
    if not isinstance(source, dict):
        return ""
    for marker, names in _POSITIONS:
        if source.get(marker) is not None:
            return ":".join(f"{source[n]}" for n in names if source.get(n) is not None)
    return ":".join(f"{k}={v}" for k, v in sorted(source.items())
                    if k not in _VOLATILE and v is not None and not isinstance(v, (dict, list)))


def tombstone(key: bytes | None, position: str, mapping: CdcMapping | None = None) -> dict[str, Any] | None:
    """A Debezium tombstone (null value) deletes the record named by the message key."""
    if not key:
        return None
    kind, rid = key_record(key, mapping)
    return {"event_id": f"dbz:tombstone:{rid}:{position}", "schema_version": 1,
            "occurred_at": "1970-01-01T00:00:00Z", "kind": kind, "op": "delete", kind: {"id": rid}}


def key_record(key: bytes, mapping: CdcMapping | None) -> tuple[str, str]:
    """The kind and id a message key names: a struct key (with or without schema) or plain text."""
    try:
        doc = orjson.loads(key)
    except orjson.JSONDecodeError:
        doc = None
    fields, schema = _unwrap(doc)
    if not isinstance(fields, dict):
        return "resource", key.decode("utf-8", "replace")  # a plain key is the resource id itself
    if mapping is None:
        column = "id" if "id" in fields or len(fields) != 1 else next(iter(fields))
        return "resource", _key_id(fields, column, "the key", schema)
    target = _key_table(mapping, fields, schema)
    return target.kind, _key_id(fields, target.id_column, target.table, schema)


def _key_table(mapping: CdcMapping, fields: dict, schema: dict | None) -> TableMapping:
    name = (schema or {}).get("name") or ""
    if name.endswith(".Key"):
        parts = name[:-4].split(".")  # <topic prefix>.<schema or db>.<table>.Key
        table = ".".join(parts[-2:])
        if table not in mapping.tables:
            raise InvalidEvent("unmapped_table", f"table {table} (from the key schema) is not in the CDC mapping file")
        return mapping.tables[table]
    candidates = mapping.tables_keyed_by(set(fields))
    if len(candidates) > 1:
        raise InvalidEvent("ambiguous_key", f"a key with fields {sorted(fields)} matches the id columns of tables "
                           f"{', '.join(sorted(t.table for t in candidates))}; enable key schemas or rename a column")
    if not candidates:
        raise InvalidEvent("unmapped_table", f"a key with fields {sorted(fields)} matches no mapped table's id column")
    return candidates[0]


def _key_id(fields: dict, column: str, where: str, schema: dict | None) -> str:
    value = fields.get(column)
    if value is None:
        raise InvalidEvent("invalid_value", f"{where}: the message key has no {column} field")
    field_schema = {f.get("field"): f for f in (schema or {}).get("fields") or () if isinstance(f, dict)}
    try:
        value = connect_types.by_schema(field_schema.get(column) or {}, value)
    except ColumnError as exc:
        raise InvalidEvent("invalid_value", f"{where}: key column {column} {exc}") from None
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def blame(envelope: Any, mapping: CdcMapping | None, message: str) -> str:
    """A validation message for a mapped row, naming its table and the column behind the bad field."""
    doc, _ = _unwrap(envelope)
    table = mapping.tables.get(table_name(doc.get("source"))) if mapping and isinstance(doc, dict) else None
    if table is None:
        return message
    match = re.search(rf"at {table.kind}/(\w+)", message)
    column = table.fields.get(match.group(1)) if match else None
    return f"table {table.table}" + (f" column {column}" if column else "") + f": {message.split(': ', 1)[-1]}"
