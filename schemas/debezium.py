"""Map Debezium change envelopes (before/after/op/source/ts_ms) onto source-changes events."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

_OPS = {"c": "upsert", "u": "upsert", "r": "upsert", "d": "delete"}


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
    position = source.get("lsn") or source.get("pos") or source.get("gtid") or doc.get("ts_ms")
    event_id = f"dbz:{source.get('table', kind)}:{row.get('id')}:{position}:{doc['op']}"
    ts_ms = doc.get("ts_ms") or source.get("ts_ms") or 0
    occurred = datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    return {"event_id": event_id, "schema_version": 1, "occurred_at": occurred,
            "kind": kind, "op": op, kind: row}


def tombstone(key: bytes | None, position: str) -> dict[str, Any] | None:
    """A Debezium tombstone (null value) deletes the resource named by the message key."""
    if not key:
        return None
    rid = key.decode("utf-8", "replace")
    return {"event_id": f"dbz:tombstone:{rid}:{position}", "schema_version": 1,
            "occurred_at": "1970-01-01T00:00:00Z", "kind": "resource", "op": "delete",
            "resource": {"id": rid}}
