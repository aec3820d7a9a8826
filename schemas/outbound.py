"""Outbound records within the broker's size limit: a compact plan, else a dead letter in its place."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import orjson

# Kafka adds a record batch header and per-record framing on top of key and value.
RECORD_OVERHEAD_BYTES = 512
DEAD_LETTER_ORIGINAL_BYTES = 64 * 1024


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
    """
    return orjson.dumps({
        "schema_version": 1, "topic": topic, "partition": -1, "offset": -1, "error_class": "record_too_large",
        "message": f"outbound {topic} record of {len(value)} bytes exceeds the {limit}-byte limit ({reason}); "
                   "it was not published",
        "original": "", "original_size": len(value), "original_truncated": True,
        "outbound_key": (key or b"").decode("utf-8", "replace")})


def input_dead_letter(topic: str, partition: int, offset: int, error_class: str, message: str,
                      original: bytes | None) -> bytes:
    """The dead letter of a rejected input event, with its original bytes up to a bound.

    The bound keeps an oversized event from becoming an oversized dead letter that the broker
    refuses in turn.
    """
    original = original or b""
    return orjson.dumps({"schema_version": 1, "topic": topic, "partition": partition, "offset": offset,
                         "error_class": error_class, "message": message,
                         "original": base64.b64encode(original[:DEAD_LETTER_ORIGINAL_BYTES]).decode(),
                         "original_size": len(original),
                         "original_truncated": len(original) > DEAD_LETTER_ORIGINAL_BYTES})
