"""Tell Debezium's message shapes apart: row changes, unwrapped rows, control messages, and what is never applied."""

from __future__ import annotations

from typing import Any

from schemas.errors import InvalidEvent

ROW_OPS = {"c": "upsert", "u": "upsert", "r": "upsert", "d": "delete"}
_HEARTBEAT = "io.debezium.connector.common.Heartbeat"
_TRANSACTION = "io.debezium.connector.common.TransactionMetadataValue"
_TRANSACTION_FIELDS = {"status", "id", "event_count", "data_collections", "ts_ms"}
_FRESHPLAN_FIELDS = {"event_id", "schema_version", "occurred_at", "kind"}
_UNWRAP_HINT = ("configure ExtractNewRecordState with add.fields=op,table,schema,lsn,source.ts_ms "
                "(MySQL: op,table,db,file,pos,gtid,server_id,source.ts_ms) and delete.tombstone.handling.mode=rewrite")


def unwrap(doc: Any) -> tuple[Any, dict | None]:
    """The payload and Connect schema of a JsonConverter document (schema None without schemas)."""
    if isinstance(doc, dict) and set(doc) == {"schema", "payload"}:
        return doc["payload"], doc["schema"] if isinstance(doc["schema"], dict) else None
    return doc, None


def row_op(op: Any) -> bool:
    """Whether a value is one of Debezium's row-change ops (any JSON value: a list or object is none)."""
    return isinstance(op, str) and op in ROW_OPS


def control_kind(doc: Any) -> str | None:
    """`heartbeat` or `transaction` for Debezium's own messages (no row change), else None."""
    body, schema = unwrap(doc)
    name = (schema or {}).get("name")
    name = name if isinstance(name, str) else ""
    if name.endswith(_HEARTBEAT) or (isinstance(body, dict) and set(body) == {"ts_ms"}):
        return "heartbeat"
    if name.endswith(_TRANSACTION) or (isinstance(body, dict) and body.get("status") in ("BEGIN", "END")
                                       and "id" in body and set(body) <= _TRANSACTION_FIELDS):
        return "transaction"
    return None


def is_envelope(doc: Any) -> bool:
    """True when the document is a Debezium row-change envelope (optionally wrapped in payload)."""
    doc, _ = unwrap(doc)
    op = doc.get("op") if isinstance(doc, dict) else None
    return row_op(op) and ("after" in doc or "before" in doc)


def is_unwrapped(doc: Any) -> bool:
    """True for a row flattened by ExtractNewRecordState that carries its metadata (`__op` or `__deleted`)."""
    body, _ = unwrap(doc)
    return isinstance(body, dict) and ("__op" in body or "__deleted" in body) and not _FRESHPLAN_FIELDS & set(body)


def refuse(doc: Any) -> None:
    """Raise InvalidEvent naming the shape of a Debezium message that is no row change freshplan applies."""
    body, schema = unwrap(doc)
    if not isinstance(body, dict) or _FRESHPLAN_FIELDS & set(body):
        return
    name = str((schema or {}).get("name") or "")
    op = body.get("op")
    if op == "t":
        raise InvalidEvent("truncate_not_applied", f"Debezium truncate of table {_table(body)}: not applied, "
                           "because freshplan does not track which resources a table produced; delete the rows "
                           "(or publish deletes) to withdraw them")
    if op == "m" or "message" in body and isinstance(body.get("message"), dict) and "prefix" in body["message"]:
        raise InvalidEvent("logical_message", "Debezium logical decoding message (pg_logical_emit_message) carries "
                           "no row: not applied; exclude it from the route to source-changes")
    if "ddl" in body or "tableChanges" in body or name.endswith("SchemaChangeValue"):
        raise InvalidEvent("schema_change", "Debezium schema change event (DDL): not applied; route the schema "
                           "change topic (topic.prefix alone) away from source-changes")
    if isinstance(op, str) and op not in ROW_OPS and ("source" in body or "after" in body or "before" in body):
        raise InvalidEvent("unknown_debezium_op", "Debezium envelope with an op this service does not know "
                           "(it applies c, u, r and d); check the connector version")
    if is_unwrapped(body):
        if "__table" not in body:
            raise InvalidEvent("unwrapped_without_metadata", "a row unwrapped by ExtractNewRecordState without "
                               f"__table cannot be mapped; {_UNWRAP_HINT}")
        return
    if name.endswith(".Value") or not any(k in body for k in ("op", "before", "after", "source")):
        raise InvalidEvent("unwrapped_without_metadata", "neither a freshplan event (event_id, schema_version, "
                           "occurred_at, kind) nor a Debezium envelope; if it is a row unwrapped by "
                           f"ExtractNewRecordState, {_UNWRAP_HINT}")


def _table(body: dict) -> str:
    source = body.get("source") if isinstance(body.get("source"), dict) else {}
    scope = source.get("schema") or source.get("db")
    return f"{scope}.{source.get('table')}" if scope else str(source.get("table") or "(unknown)")


def envelope_of_unwrapped(doc: Any) -> dict:
    """The envelope an unwrapped row stands for: `__` fields become its source block, `__deleted` a delete."""
    body, schema = unwrap(doc)
    row = {k: v for k, v in body.items() if not k.startswith("__")}
    source: dict[str, Any] = {}
    for key, value in body.items():
        if key.startswith("__source_"):
            source[key[len("__source_"):]] = value
        elif key.startswith("__") and key not in ("__op", "__deleted", "__ts_ms"):
            source[key[2:]] = value
    deleted = body.get("__deleted") in ("true", True)
    op = "d" if deleted else body.get("__op")
    if op not in ROW_OPS:
        raise InvalidEvent("unwrapped_without_metadata", "an unwrapped row whose __op is missing or not one of "
                           f"c, u, r, d; {_UNWRAP_HINT}")
    which = "before" if op == "d" else "after"
    envelope = {"op": op, which: row, "source": source}
    if "__ts_ms" in body:
        envelope["ts_ms"] = body["__ts_ms"]
    if schema is None:
        return envelope
    fields = [f for f in schema.get("fields") or () if isinstance(f, dict) and not str(f.get("field")).startswith("__")]
    return {"schema": {"fields": [{"field": which, "fields": fields}]}, "payload": envelope}
