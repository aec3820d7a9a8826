"""One consumed input record before decoding, as every reader hands it to the applier."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.quick_init import quick_init


@quick_init
@dataclass(frozen=True, slots=True)
class RawMessage:
    """One consumed record, before decoding."""

    topic: str
    """Logical topic name."""
    partition: int
    """Partition it was read from."""
    offset: int
    """Its offset in that partition."""
    key: bytes | None
    """Message key."""
    value: bytes | None
    """Message value (None for a tombstone)."""
    timestamp: float | None = None
    """Broker timestamp in epoch seconds, for event-to-invalidation latency."""
    lane: int | None = None
    """For a `source-changes` record read from a routed lane: the entity lane (None: the shared lane)."""
    notice: bool = False
    """A move notice: the resource whose id is `value` left `lane` (see `agents.stream.router`)."""
    original_size: int | None = None
    """For a record too large to route: its value's size (`value` holds its beginning only; dead-lettered)."""
