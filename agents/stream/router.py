"""Route a span of a `source-changes` partition to the lanes of the shards that apply it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from agents.stream.raw_message import RawMessage
from schemas.errors import InvalidEvent, SkippedEvent
from schemas.records import InputEvent, SourceChange
from schemas.routed_batch import NOTICE, RECORD, SHARED, TOMBSTONE, Frame, RoutedBatch, fitted
from schemas.shard_peek import peek


@dataclass(frozen=True, slots=True)
class Lane:
    """Where a routed batch goes: an entity partition's lane, or the source partition's shared lane."""

    topic: str
    """`entity-changes` or `shared-changes` (logical names)."""
    partition: int
    """The entity partition, or for `shared-changes` the source partition."""


@dataclass(frozen=True, slots=True)
class Destination:
    """Where one source record goes, as the router judged it."""

    lane: int
    """The entity partition of its resource, or SHARED."""
    everywhere: bool = False
    """Also to every entity lane (a delete or move whose earlier lane is unknown)."""
    notice_to: int | None = None
    """The lane it left (its id is named there as a move notice); None when it left none it knows of."""
    notice_everywhere: bool = False
    """Named as a move notice in every other lane, the shared one included (its earlier lane is unknown)."""
    resource_id: str | None = None
    """The resource id a notice names."""


class Router:
    """Decides each record's lanes and frames a span's records per lane.

    Holds only what it routed since it started (each resource id's lane), so a new router
    names a resource in every other lane the first time it routes it: the lane it left, if
    any, removes it there.
    """

    def __init__(self, partitions: int, decode: Callable[[RawMessage], InputEvent],
                 max_bytes: int = 1_000_000) -> None:
        self.partitions = partitions
        self.max_bytes = max_bytes  # a routed batch's largest size: a record that cannot fit is cut (OVERSIZED)
        self.decode = decode  # the pure input decode (CDC mapping included): records a glance cannot read
        # Per source partition: resource id -> the lane it was last routed to (SHARED: no entity). Forgotten at
        # any gap in a partition's offsets: another router may have routed what lies between.
        self.lanes: dict[int, dict[str, int]] = {}
        self.routed_to: dict[int, int] = {}  # source partition -> one past the last offset routed
        self.partition_of: Callable[[str], int] = _partitioner(partitions)
        self._known: dict[str, int] = {}
        self.notices = 0  # move notices sent, one per lane a resource left (for /healthz)
        self.unplaced = 0  # resources whose earlier lane was unknown here, so every other lane got a notice

    def destination(self, m: RawMessage) -> Destination:
        """Where one record of `source-changes` goes."""
        glance = peek(m.value)
        if glance is not None:
            if glance.kind != "resource":
                return Destination(SHARED)
            if glance.entity is not None:
                return self._upsert(glance.resource_id, self.partition_of(glance.entity))
        try:
            event = self.decode(m)
        except (InvalidEvent, SkippedEvent):
            return Destination(SHARED)  # judged by every worker, dead-lettered by the duty owner, as today
        change = event.payload
        if not isinstance(change, SourceChange) or change.kind != "resource":
            return Destination(SHARED)
        if change.op == "delete":
            known = self._known.pop(change.record_id, None)
            if known is None:
                return Destination(SHARED, everywhere=True)
            return Destination(known)
        entity = getattr(change.record, "entity", None)
        return self._upsert(change.record_id, SHARED if entity is None else self.partition_of(entity))

    def _upsert(self, resource_id: str, lane: int) -> Destination:
        known = self._known.get(resource_id)
        self._known[resource_id] = lane
        if known == lane:
            return Destination(lane)
        if known is None:
            return Destination(lane, notice_everywhere=True, resource_id=resource_id)
        return Destination(lane, notice_to=known, resource_id=resource_id)

    def route(self, partition: int, records: Sequence[RawMessage], start: int, end: int) -> dict[Lane, RoutedBatch]:
        """Every lane's batch for the span `[start, end)` of a source partition (every lane gets one: its mark)."""
        if self.routed_to.get(partition) != start:
            self.lanes[partition] = {}  # a gap, a repeat, or the partition is new here: what it knew may be stale
        self._known = self.lanes.setdefault(partition, {})
        self.routed_to[partition] = end
        per_lane: dict[int, list[Frame]] = {q: [] for q in range(self.partitions)}
        per_lane[SHARED] = []
        for m in records:
            where = self.destination(m)
            stamp = None if m.timestamp is None else round(m.timestamp * 1000)
            frame = fitted(Frame(RECORD if m.value is not None else TOMBSTONE, m.offset, stamp, m.key, m.value),
                           self.max_bytes)
            per_lane[where.lane].append(frame)
            if where.everywhere:
                for q in range(self.partitions):
                    if q != where.lane:
                        per_lane[q].append(frame)
            if where.resource_id is not None and (where.notice_everywhere or where.notice_to is not None):
                notice = Frame(NOTICE, m.offset, stamp, None, where.resource_id.encode())
                left = [*range(self.partitions), SHARED] if where.notice_everywhere else [where.notice_to]
                self.unplaced += where.notice_everywhere
                for q in left:
                    if q != where.lane:
                        per_lane[q].append(notice)
                        self.notices += 1
        return {Lane("shared-changes" if q == SHARED else "entity-changes", partition if q == SHARED else q):
                RoutedBatch(partition, start, end, tuple(frames)) for q, frames in per_lane.items()}


def _partitioner(partitions: int) -> Callable[[str], int]:
    from schemas.plan_partition import plan_partition
    return lambda entity: plan_partition(entity, partitions)
