"""What a routed lane's records amount to at the applier: move notices as deletes, each position's keys and id."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable

from agents.stream.raw_message import RawMessage
from schemas.records import InputEvent, SourceChange

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MOVED = "moved:"  # the event id a move notice applies under (the record it stands for has its own)


def event_ids(pairs) -> dict[tuple[str, int, int], str]:
    """The event id of each input position: a record's, not a move notice's that shares its offset."""
    out: dict[tuple[str, int, int], str] = {}
    for position, event_id in pairs:
        if position not in out or out[position].startswith(MOVED):
            out[position] = event_id
    return out


def moved_away(m: RawMessage, now: datetime | None) -> InputEvent | None:
    """A move notice as the delete it amounts to in the lane it names (applied only if the resource is there)."""
    try:
        rid = (m.value or b"").decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not rid:
        return None
    return InputEvent(f"{MOVED}{rid}", now or _EPOCH, m.topic, SourceChange("resource", "delete", rid, None))


def moves_to_apply(decoded: list[tuple[RawMessage, InputEvent | None]], now: datetime | None,
                   live: Callable[[set[str]], set[str]]) -> list[tuple[RawMessage, InputEvent]]:
    """A batch's events with its move notices (None there) as deletes, only those of resources that may be in the
    lane they left: stored (`live`), or upserted earlier in the batch. A notice of any other removes nothing.

    Each resource new to a router is named in every other lane, so a lane mostly holds notices of
    resources it never had: a catching-up worker skips them without an event each.
    """
    named = {(m.value or b"").decode("utf-8", "replace") for m, e in decoded if e is None}
    if not named:
        return decoded  # type: ignore[return-value]
    upserted = {e.payload.record_id for _, e in decoded
                if e is not None and isinstance(e.payload, SourceChange) and e.payload.kind == "resource"}
    maybe = (named & upserted) | live(named - upserted)
    out: list[tuple[RawMessage, InputEvent]] = []
    for m, e in decoded:
        if e is None:
            if (m.value or b"").decode("utf-8", "replace") not in maybe or (e := moved_away(m, now)) is None:
                continue
        out.append((m, e))
    return out


def by_position(pairs) -> dict[tuple[str, int, int], list[str]]:
    """Changed keys by input position, those of one position together."""
    out: dict[tuple[str, int, int], list[str]] = {}
    for position, keys in pairs:
        if keys:
            out.setdefault(position, []).extend(keys)
    return out
