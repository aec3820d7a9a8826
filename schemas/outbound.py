"""Outbound records: their builders, and each within the broker's size limit (compact, else dead-lettered)."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from typing import Any, Mapping

import orjson

# Kafka adds a record batch header and per-record framing on top of key and value.
RECORD_OVERHEAD_BYTES = 512
DEAD_LETTER_ORIGINAL_BYTES = 64 * 1024
DEAD_LETTER_KEY_BYTES = 1024  # a longer key is named by its hash: a dead letter must always fit


def letter_key(key: bytes | None) -> bytes | None:
    """A dead letter's Kafka key: the original record's, or its sha256 when longer than DEAD_LETTER_KEY_BYTES."""
    if key is None or len(key) <= DEAD_LETTER_KEY_BYTES:
        return key
    return b"sha256:" + hashlib.sha256(key).hexdigest().encode()


def shown_key(key: bytes | None, width: int = 80) -> str:
    """A key for a log line: its start and its length, never the whole of a long one."""
    key = key or b""
    return repr(key) if len(key) <= width else f"{key[:width]!r}... ({len(key)} bytes)"


def compact_plan(doc: dict[str, Any]) -> dict[str, Any]:
    """The plan without item contents: each admitted item names the hash of what it left out."""
    items = []
    for item in doc.get("admitted") or ():
        if isinstance(item, dict) and "content" in item:
            content = item.get("content")
            text = content if isinstance(content, str) else orjson.dumps(content).decode()
            item = {k: v for k, v in item.items() if k != "content"}
            item.update(content_omitted=True, content_sha256=hashlib.sha256(text.encode()).hexdigest())
        items.append(item)
    out = dict(doc, admitted=items)
    request = out.get("request")
    if isinstance(request, dict) and isinstance(request.get("query"), str) and len(request["query"]) > 1024:
        # The query only ranks within slots; a hash still identifies the plan's request.
        out["request"] = dict(request, query=request["query"][:256], query_truncated=True,
                              query_sha256=hashlib.sha256(request["query"].encode()).hexdigest())
    return out


def fits(key: bytes | None, value: bytes | None, limit: int) -> bool:
    """Whether a record of this key and value is within `limit` bytes once framed."""
    return len(key or b"") + len(value or b"") + RECORD_OVERHEAD_BYTES <= limit


def too_large_letter(topic: str, key: bytes | None, value: bytes, limit: int, reason: str) -> bytes:
    """The dead letter that stands in for an outbound record no broker would accept.

    It names the record (topic, key, size) but carries none of it: plans hold evidence content.
    A key longer than DEAD_LETTER_KEY_BYTES is named by its sha256 (as `letter_key`), so the
    letter itself always fits.
    """
    return orjson.dumps({
        "schema_version": 1, "topic": topic, "partition": -1, "offset": -1, "error_class": "record_too_large",
        "message": f"outbound {topic} record of {len(value)} bytes exceeds the {limit}-byte limit ({reason}); "
                   "it was not published",
        "original": "", "original_size": len(value), "original_truncated": True,
        "outbound_key": (letter_key(key) or b"").decode("utf-8", "replace")})


def input_dead_letter(topic: str, partition: int, offset: int, error_class: str, message: str,
                      original: bytes | None, size: int | None = None) -> bytes:
    """The dead letter of a rejected input event, with its original bytes up to a bound.

    The bound keeps an oversized event from becoming an oversized dead letter that the broker
    refuses in turn.
    """
    original = original or b""
    size = len(original) if size is None else size  # `original` may be the beginning only (see RawMessage)
    return orjson.dumps({"schema_version": 1, "topic": topic, "partition": partition, "offset": offset,
                         "error_class": error_class, "message": message,
                         "original": base64.b64encode(original[:DEAD_LETTER_ORIGINAL_BYTES]).decode(),
                         "original_size": size,
                         "original_truncated": size > min(len(original), DEAD_LETTER_ORIGINAL_BYTES)})


@dataclass(frozen=True)
class Cause:
    """What made a plan stale: a `plan-invalidations` record's `cause`."""

    topic: str
    """The topic of the record to blame (broker-side on the wire)."""
    event_id: str
    """That record's event id, or a made-up one where no event is to blame (`plan:<id>`, `retention-<time>`)."""
    partition: int | None = None
    """The record's partition; None where no one record is to blame."""
    offset: int | None = None
    """The record's offset; None as for `partition`."""
    dependency_key: str | None = None
    """The dependency key it touched; None where the plan writer adds it."""
    at: float | None = field(default=None, compare=False)
    """The record's broker timestamp (seconds since the epoch), for latency figures only: never on the wire."""

    def as_wire(self) -> dict[str, Any]:
        """The wire shape, in its key order (receipt ids hash it); an unknown position is -1, as the schema wants
        integers there."""
        doc: dict[str, Any] = {"topic": self.topic, "partition": -1 if self.partition is None else self.partition,
                               "offset": -1 if self.offset is None else self.offset, "event_id": self.event_id}
        if self.dependency_key is not None:
            doc["dependency_key"] = self.dependency_key
        return doc

    @classmethod
    def from_wire(cls, doc: Mapping[str, Any]) -> "Cause":
        """A cause as `as_wire` shaped it (an unknown position back to None); KeyError, TypeError or ValueError for a
        document that is not one."""
        partition, offset = int(doc["partition"]), int(doc["offset"])
        return cls(doc["topic"], doc["event_id"], partition if partition >= 0 else None,
                   offset if offset >= 0 else None, doc.get("dependency_key"))


def invalidation_cause(*, topic: str, partition: int, offset: int, event_id: str,
                       dependency_key: str) -> dict[str, Any]:
    """What made a plan stale: the input record's position and id, and the dependency key it touched."""
    return Cause(topic, event_id, partition, offset, dependency_key).as_wire()


def invalidation_record(*, plan_id: str, plan_key: str, reason: str, cause: dict[str, Any], invalidated_at: str,
                        as_of: str | None, successor_plan_id: str | None) -> dict[str, Any]:
    """A `plan-invalidations` value (key: the plan id)."""
    return {"schema_version": 1, "plan_id": plan_id, "plan_key": plan_key, "reason": reason, "cause": cause,
            "invalidated_at": invalidated_at, "as_of": as_of, "successor_plan_id": successor_plan_id}


def invalidation_receipt(*, plan_id: str, reason: str, cause: dict[str, Any], invalidated_at: str,
                         successor_plan_id: str | None) -> dict[str, Any]:
    """The `receipts` value (key: its receipt id) carrying an invalidation's full cause for auditors.

    Published when the public cause was redacted; the id hashes the record in this key order,
    so one invalidation always gets the same receipt id.
    """
    audit = {"schema_version": 1, "kind": "invalidation", "plan_id": plan_id, "reason": reason, "cause": cause,
             "invalidated_at": invalidated_at, "successor_plan_id": successor_plan_id}
    audit["receipt_id"] = "rcpt-inv-" + hashlib.sha256(orjson.dumps(audit)).hexdigest()[:20]
    return audit


def clock_tick(now: str) -> dict[str, Any]:
    """A wall-clock `clock` value for the formatted instant `now` (its event id names the instant)."""
    return {"event_id": f"wall-{now}", "schema_version": 1, "occurred_at": now, "now": now}
