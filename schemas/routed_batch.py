"""Routed batches: the records of one span of a `source-changes` partition meant for one lane, framed."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from schemas.errors import InvalidEvent
from schemas.quick_init import quick_init

VERSION = 1
_HEAD = struct.Struct(">BIqq")  # version, source partition, from, to
_FRAME = struct.Struct(">BqqiI")  # kind, offset, timestamp ms (-1: none), key length (-1: none), value length
_SIZE = struct.Struct(">q")  # an OVERSIZED frame's value starts with the original value's size
RECORD, NOTICE = 1, 2  # a source record as read; a move notice (its value is the resource id that moved)
TOMBSTONE = 3  # a source record with no value
OVERSIZED = 4  # a source record too large to route: its first KEPT_BYTES, to be dead-lettered `oversized`
KEPT_BYTES = 65_536  # what a dead letter keeps of an original anyway
FRAME_OVERHEAD = 25  # bytes a frame adds to its key and value
SHARED = -1  # the lane of what every worker applies (resources about no entity among it), as a lane number
# A Kafka record header marking an entity lane's record as a *report* of the lane's owner: an empty batch of
# [n, n) of a source partition, saying every refusal of this lane's records of that partition below n was
# dead-lettered and acknowledged. A gained lane's history above its last report is dead-lettered again.
REPORT_HEADER = "freshplan-lane-report"


@quick_init
@dataclass(frozen=True, slots=True)
class Frame:
    """One record of a routed batch."""

    kind: int
    """RECORD, TOMBSTONE, NOTICE or OVERSIZED."""
    offset: int
    """Its offset in the source partition."""
    timestamp_ms: int | None
    """The source record's broker timestamp."""
    key: bytes | None
    """The source record's key."""
    value: bytes | None
    """The source record's value (None for a tombstone; the resource id for a notice)."""


@quick_init
@dataclass(frozen=True, slots=True)
class RoutedBatch:
    """What one lane receives of one span of a source partition."""

    partition: int
    """The `source-changes` partition the span is of."""
    start: int
    """The first offset of the span."""
    end: int
    """One past the last offset of the span: the lane's mark once the batch is applied."""
    frames: tuple[Frame, ...]
    """The span's records meant for this lane, in source order."""


def pack(batch: RoutedBatch) -> bytes:
    """The bytes of a routed batch."""
    parts = [_HEAD.pack(VERSION, batch.partition, batch.start, batch.end)]
    for f in batch.frames:
        key, value = f.key, f.value
        parts.append(_FRAME.pack(f.kind, f.offset, -1 if f.timestamp_ms is None else f.timestamp_ms,
                                 -1 if key is None else len(key), 0 if value is None else len(value)))
        if key is not None:
            parts.append(key)
        if value is not None:
            parts.append(value)
    return b"".join(parts)


def unpack(data: bytes) -> RoutedBatch:
    """Read a routed batch; anything that is not one is an `InvalidEvent` (a poisoned internal topic)."""
    try:
        version, partition, start, end = _HEAD.unpack_from(data, 0)
        if version != VERSION:
            raise InvalidEvent("unknown_schema_version", f"routed batch version {version}; this worker reads {VERSION}")
        if not 0 <= start <= end:
            raise InvalidEvent("invalid_value", f"routed batch span [{start}, {end}) is not a span")
        at, frames, last = _HEAD.size, [], start - 1
        while at < len(data):
            kind, offset, stamp, key_len, value_len = _FRAME.unpack_from(data, at)
            at += _FRAME.size
            if kind not in (RECORD, NOTICE, TOMBSTONE, OVERSIZED) or not last < offset < end:
                raise InvalidEvent("invalid_value", f"routed batch frame of kind {kind} at offset {offset} "
                                   f"is out of order or outside [{start}, {end})")
            key = None if key_len < 0 else data[at:at + key_len]
            at += max(key_len, 0)
            value = data[at:at + value_len] if kind != TOMBSTONE else None
            at += value_len
            if at > len(data) or (key is not None and len(key) != key_len):
                raise InvalidEvent("malformed_json", "routed batch is truncated")
            frames.append(Frame(kind, offset, None if stamp < 0 else stamp, key, value))
            last = offset
        return RoutedBatch(partition, start, end, tuple(frames))
    except struct.error as exc:
        raise InvalidEvent("malformed_json", f"routed batch is truncated ({exc})") from None


def split(batch: RoutedBatch, max_bytes: int) -> list[RoutedBatch]:
    """The batch as contiguous spans whose packed size stays under `max_bytes` (each at least one frame)."""
    out: list[RoutedBatch] = []
    frames: list[Frame] = []
    size, start = _HEAD.size, batch.start
    for f in batch.frames:
        grows = FRAME_OVERHEAD + len(f.key or b"") + len(f.value or b"")
        if frames and size + grows > max_bytes:
            out.append(RoutedBatch(batch.partition, start, f.offset, tuple(frames)))
            frames, size, start = [], _HEAD.size, f.offset
        frames.append(f)
        size += grows
    out.append(RoutedBatch(batch.partition, start, batch.end, tuple(frames)))
    return out


def fitted(frame: Frame, max_bytes: int) -> Frame:
    """A frame that fits a routed batch alone: a record too large is cut to what its dead letter keeps."""
    if FRAME_OVERHEAD + _HEAD.size + len(frame.key or b"") + len(frame.value or b"") <= max_bytes:
        return frame
    room = max(0, min(KEPT_BYTES, max_bytes - FRAME_OVERHEAD - _HEAD.size - _SIZE.size) // 2)
    value = frame.value or b""
    return Frame(OVERSIZED, frame.offset, frame.timestamp_ms, (frame.key or b"")[:room],
                 _SIZE.pack(len(value)) + value[:room])


def cut_size(value: bytes) -> tuple[int | None, bytes]:
    """An OVERSIZED frame's value: (the original value's size, its beginning); (None, value) if unreadable."""
    if len(value) < _SIZE.size:
        return None, value
    return _SIZE.unpack_from(value)[0], value[_SIZE.size:]
