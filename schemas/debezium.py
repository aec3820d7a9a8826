"""Map Debezium change envelopes (before/after/op/source/ts_ms), keys and tombstones onto source-changes events."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timedelta, timezone
from typing import Any

import orjson

from schemas import cdc_mapping, connect_types, debezium_shapes as shapes
from schemas.cdc_mapping import CdcMapping, TableMapping
from schemas.connect_types import ColumnError
from schemas.errors import InvalidEvent
from schemas.records import LOG_TICK_BITS

# Source fields that together name one change, by the field that identifies the connector's
# position (MySQL binlog file and offset and row, SQL Server and Oracle change numbers, Postgres LSN).
_POSITIONS = (("file", ("file", "pos", "row")), ("change_lsn", ("change_lsn", "commit_lsn", "event_serial_no")),
              ("commit_lsn", ("change_lsn", "commit_lsn", "event_serial_no")), ("scn", ("scn", "commit_scn")),
              ("lsn", ("lsn", "txId")))
# The connector's software version is no part of where a change came from.
_VOLATILE = {"version"}
# `source.snapshot` of a row read by an initial or blocking snapshot (Debezium's SnapshotRecord, lower case).
_SNAPSHOT_FLAGS = {"true", "first", "first_in_data_collection", "last_in_data_collection", "last"}
UNAVAILABLE = "__debezium_unavailable_value"
# The placeholder as Debezium writes it in a bytea column (base64) and in a Connect Decimal.
_UNAVAILABLE_FORMS = {UNAVAILABLE, "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="}
UNKNOWN_EVENT_TIME = "1970-01-01T00:00:00Z"
"""`occurred_at` of a CDC record whose envelope carries neither `source.ts_ms` nor `ts_ms` (with
`occurred_at_source: "unknown"`): the epoch, so it is never later than anything it could be ordered against."""

is_debezium = shapes.is_envelope
control_kind = shapes.control_kind
_unwrap = shapes.unwrap


def table_name(source: Any) -> str:
    """`schema.table` (Postgres, SQL Server) or `db.table` (MySQL) from an envelope's source block."""
    if not isinstance(source, dict):
        return ""
    scope = source.get("schema") or source.get("db")
    return f"{scope}.{source.get('table')}" if scope else str(source.get("table") or "")


def qualified_table(source: Any) -> str:
    """Database, schema and table of a change (those present), so equal table names never share an event id."""
    if not isinstance(source, dict):
        return ""
    return ".".join(str(source[k]) for k in ("db", "schema", "table") if source.get(k) not in (None, ""))


def from_debezium(doc: dict[str, Any], mapping: CdcMapping | None = None) -> dict[str, Any]:
    """Turn an envelope (or an unwrapped row) into a source-changes document, or raise InvalidEvent.

    Without a mapping the row carries freshplan's field names (a `kind` column selects
    principal or entity rows). The event id is derived from the source position so that a
    replayed envelope deduplicates.
    """
    if shapes.is_unwrapped(doc):
        doc = shapes.envelope_of_unwrapped(doc)
    doc, schema = _unwrap(doc)
    op = shapes.ROW_OPS[doc["op"]]
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
    # Columns Debezium could not read (unchanged TOASTed values without REPLICA IDENTITY FULL) were not sent.
    missing = {c for c, v in row.items() if _unavailable(v)}
    row = {c: v for c, v in row.items() if c not in missing}
    incremental = source.get("snapshot") == "incremental"
    try:
        if mapping is None:
            kind = row.pop("kind", "resource")
            record = {c: connect_types.by_schema(columns.get(c) or {}, v) if c in columns else v
                      for c, v in row.items()}
            unavailable = {c: c for c in missing}
            if kind == "resource" and op == "upsert" and "version" not in record and incremental:
                record["version"] = 0
        else:
            kind, record = _mapped(mapping, table, op, row, columns, source)
            target = mapping.tables[table].fields
            # An attribute's column left out keeps the stored attributes whole: records keep whole fields.
            unavailable = {f.split(".")[0]: c for f, c in sorted(target.items()) if c in missing}
    except ColumnError as exc:
        raise InvalidEvent("invalid_value", f"table {table}: {exc}") from None
    if incremental:
        # Incremental snapshot rows carry no position of their own: name them by what they say.
        position = "snapshot:" + hashlib.sha256(orjson.dumps(row, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
    else:
        position = source_position(source) or str(doc.get("ts_ms"))
    where = qualified_table(source) or kind
    event_id = f"dbz:{where}:{record.get('id')}:{position}:{doc['op']}"
    occurred, known = event_time(doc, source)
    out = {"event_id": event_id, "schema_version": 1, "occurred_at": occurred, "occurred_at_source": known,
           "kind": kind, "op": op, kind: record}
    if unavailable and op == "upsert":
        # The applier keeps the stored values of these fields (or dead-letters the change if none are stored).
        out["unavailable"] = dict(sorted(unavailable.items()))
    if kind == "resource" and op == "upsert" and mapping is not None and _log_ticked(mapping, table, source):
        out["log_ordered"] = True
        pos = source.get("pos")
        if isinstance(pos, int) and not isinstance(pos, bool) and pos >= 0:
            out["log_position"] = f"{source['file']}:{pos}"
        if snapshot_read(source, doc["op"]):
            out["log_snapshot"] = True
    return out


def snapshot_read(source: dict, op: str) -> bool:
    """Whether a change is a row of an initial or blocking snapshot (not an incremental one, not streamed).

    `source.snapshot` says so (`true`, `first`, `first_in_data_collection`, `last_in_data_collection`,
    `last`); an unwrapped row whose SMT left that field out is a snapshot row when its op is `r`.
    """
    flag = source.get("snapshot")
    if flag is None:
        return op == "r"
    return flag is True or flag in _SNAPSHOT_FLAGS


def _unavailable(value: Any) -> bool:
    if isinstance(value, str):
        return value in _UNAVAILABLE_FORMS
    return isinstance(value, list) and len(value) == 1 and value[0] in _UNAVAILABLE_FORMS


def event_time(doc: dict, source: dict) -> tuple[str, str]:
    """`occurred_at` of a change and where it came from: the source's commit time, else the connector's
    processing time, else unknown (UNKNOWN_EVENT_TIME)."""
    for where, value in (("source.ts_ms", source.get("ts_ms")), ("ts_ms", doc.get("ts_ms"))):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            moment = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=value)
            return moment.isoformat().replace("+00:00", "Z"), where
    return UNKNOWN_EVENT_TIME, "unknown"


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

    Postgres: the LSN (every change has its own). MySQL: the source commit time in milliseconds,
    shifted left `LOG_TICK_BITS`: only the commit time survives a binlog reset and a failover
    (positions and GTIDs restart), and many changes share a tick (MySQL before 8.0 stamps whole
    seconds; one transaction's changes share its time and GTID). Those are ordered by the log
    itself: the event is `log_ordered`, and a change at the stored tick is stored one above it.
    A snapshot row's tick is when its table's read began; the event also names the binlog position
    the snapshot was read at (`log_position`, `log_snapshot`), from which streamed changes replace it.
    Incremental snapshot rows: 0, so that a snapshot read is never ahead of a streamed change of the same row.
    """
    if source.get("snapshot") == "incremental":
        return 0
    lsn, file, ts_ms = source.get("lsn"), source.get("file"), source.get("ts_ms")
    if isinstance(lsn, int) and not isinstance(lsn, bool) and lsn >= 0:
        return lsn
    if isinstance(file, str) and isinstance(ts_ms, int) and not isinstance(ts_ms, bool) and ts_ms > 0:
        return ts_ms << LOG_TICK_BITS
    raise InvalidEvent("invalid_value", f"table {table} maps no version column and its source position "
                       "(Postgres lsn; MySQL file with source ts_ms) is missing; map a version column")


def _log_ticked(mapping: CdcMapping, table: str, source: dict) -> bool:
    """Whether `position_version` made the version of a commit-time tick (MySQL), not of a unique position."""
    target = mapping.tables.get(table)
    lsn = source.get("lsn")
    return (target is not None and "version" not in target.fields and source.get("snapshot") != "incremental"
            and not (isinstance(lsn, int) and not isinstance(lsn, bool)))


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
    return {"event_id": f"dbz:tombstone:{rid}:{position}", "schema_version": 1, "occurred_at": UNKNOWN_EVENT_TIME,
            "occurred_at_source": "unknown", "kind": kind, "op": "delete", kind: {"id": rid}}


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
