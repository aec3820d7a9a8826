"""A look at a source change's kind and entity without decoding it, for a shard's restore to pass others' by."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from schemas.quick_init import quick_init


@quick_init
@dataclass(frozen=True, slots=True)
class Peek:
    """What a native `source-changes` record says of itself, read without validation."""

    kind: str
    """resource, principal or entity."""
    resource_id: str | None
    """The resource's id, for a resource upsert."""
    entity: str | None
    """The entity a resource upsert is about; None for anything else (a delete names no entity)."""
    version: int | None = None
    """The version a resource upsert carries, when it is an integer."""


def peek(value: bytes | None) -> Peek | None:
    """The kind and entity of a native source change; None when only a full decode can tell (CDC envelopes,
    tombstones, anything malformed)."""
    if not value or value[:1] != b"{":
        return None
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind not in ("resource", "principal", "entity"):
        return None
    if kind != "resource" or doc.get("op") != "upsert":
        return Peek(kind, None, None)
    body = doc.get("resource")
    if not isinstance(body, dict) or not isinstance(body.get("id"), str) or not isinstance(body.get("entity"), str):
        return None
    version = body.get("version")
    return Peek(kind, body["id"], body["entity"], version if type(version) is int else None)
