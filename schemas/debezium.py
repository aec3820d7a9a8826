"""Map Debezium change envelopes (before/after/op/source/ts_ms) onto source-changes events."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

_OPS = {"c": "upsert", "u": "upsert", "r": "upsert", "d": "delete"}
# Source fields that together name one change, by the field that identifies the connector's
# position (MySQL binlog file and offset and row, SQL Server and Oracle change numbers, Postgres LSN).
_POSITIONS = (("file", ("file", "pos", "row")), ("change_lsn", ("change_lsn", "commit_lsn", "event_serial_no")),
              ("commit_lsn", ("change_lsn", "commit_lsn", "event_serial_no")), ("scn", ("scn", "commit_scn")),
              ("lsn", ("lsn", "txId")))
# The connector's software version is no part of where a change came from.
_VOLATILE = {"version"}


def is_debezium(doc: Any) -> bool:
    """True when the document looks like a Debezium envelope (optionally wrapped in payload)."""
    if isinstance(doc, dict) and isinstance(doc.get("payload"), dict) and "schema" in doc:
        doc = doc["payload"]
    return isinstance(doc, dict) and doc.get("op") in _OPS and ("after" in doc or "before" in doc)


def from_debezium(doc: dict[str, Any]) -> dict[str, Any]:
    """Turn an envelope into a source-changes document; the row is a resource record.

    The table row must carry the resource fields (id, version, entity, ...); a `kind`
    column selects principal or entity rows. The event id is derived from the source
    position so that a replayed envelope deduplicates.
    """
    if "schema" in doc and isinstance(doc.get("payload"), dict):
        doc = doc["payload"]
    op = _OPS[doc["op"]]
    row = doc.get("after") if op == "upsert" else doc.get("before")
    if not isinstance(row, dict):
        row = {}
    row = dict(row)
    kind = row.pop("kind", "resource")
    source = doc.get("source") or {}
    position = source_position(source) or str(doc.get("ts_ms"))
    event_id = f"dbz:{source.get('table', kind)}:{row.get('id')}:{position}:{doc['op']}"
    ts_ms = doc.get("ts_ms") or source.get("ts_ms") or 0
    occurred = datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    return {"event_id": event_id, "schema_version": 1, "occurred_at": occurred,
            "kind": kind, "op": op, kind: row}


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


def tombstone(key: bytes | None, position: str) -> dict[str, Any] | None:
    """A Debezium tombstone (null value) deletes the resource named by the message key."""
    if not key:
        return None
    rid = key.decode("utf-8", "replace")
    return {"event_id": f"dbz:tombstone:{rid}:{position}", "schema_version": 1,
            "occurred_at": "1970-01-01T00:00:00Z", "kind": "resource", "op": "delete",
            "resource": {"id": rid}}
