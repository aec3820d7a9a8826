"""Merge the routed lanes a worker reads back into each source partition's order, up to what every lane passed."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

from agents.stream.raw_message import RawMessage
from schemas.routed_batch import NOTICE, OVERSIZED, TOMBSTONE, Frame, RoutedBatch, cut_size

SOURCE = "source-changes"
_ORDER = {1: 0, TOMBSTONE: 0, OVERSIZED: 0, NOTICE: 1}  # at one offset the record goes before notices of lanes it left


@dataclass
class _Lane:
    """One lane read by this worker: the frames not released yet, per source partition, and its marks."""

    topic: str
    partition: int
    joined: set[int]
    """Source partitions this lane is merged in: a gained lane joins each once it has caught up with it."""
    pending: dict[int, deque[tuple[int, Frame]]] = field(default_factory=dict)
    """Source partition -> (carrier offset, frame) not released yet, in source order."""
    marks: dict[int, int] = field(default_factory=dict)
    """Source partition -> the end of the last batch read: nothing below it is still to come on this lane."""
    open: dict[int, int] = field(default_factory=dict)
    """Carrier offset -> frames of that batch not released yet."""
    next_carrier: int = 0
    """One past the last carrier record read."""
    fed: set[int] = field(default_factory=set)
    """Carrier offsets past `next_carrier` merged as this worker's router sent them: skipped when read."""
    reported: dict[int, int] = field(default_factory=dict)
    """Source partition -> how far an owner of this lane reported its refusals dead-lettered (see REPORT_HEADER)."""
    history_to: dict[int, int] = field(default_factory=dict)
    """Source partition -> one past the last history frame handed out: a span routed again is not history twice."""

    def resume_at(self) -> int:
        """Where a restarted reader must read this lane from: its oldest batch with frames not released."""
        return min((*self.open, self.next_carrier))  # a batch fed ahead of the reader leaves none between unread


@dataclass(frozen=True)
class Released:
    """What a merge step lets the writer apply, and the positions that hold once it is applied."""

    messages: list[RawMessage]
    """Live `source-changes` records in source order per partition."""
    history: list[RawMessage]
    """Records of lanes still catching up, below what the worker applied: a gained shard's restore."""
    positions: dict[tuple[str, int], int]
    """(topic, partition) -> next offset: `source-changes` partitions released, and where each lane resumes."""
    caught_up: frozenset[int]
    """Entity lanes that joined every source partition in this step: their shards are whole."""
    reported: dict[int, dict[int, int]] = field(default_factory=dict)
    """For each caught-up lane: source partition -> how far its owners reported their refusals dead-lettered."""


class LaneMerge:
    """Per source partition, the shared lane and the held entity lanes merged in offset order.

    A record is released once every lane merged for its partition has a mark past it, so the
    applier sees `source-changes` as if it read it directly: in order, without gaps, and a
    position means what it meant before routing.
    """

    def __init__(self, partitions: int, released: dict[int, int], resume: dict[tuple[str, int], int] | None = None,
                 held: Iterable[int] = ()) -> None:
        self.partitions = partitions
        self.released = {p: released.get(p, 0) for p in range(partitions)}  # source partition -> next offset
        resume = resume or {}
        self.lanes: dict[tuple[str, int], _Lane] = {}
        for p in range(partitions):
            self._add("shared-changes", p, {p}, resume.get(("shared-changes", p), 0))  # its own partition only
        for q in held:  # held before a restart: whole up to what was applied
            self._add("entity-changes", q, set(range(partitions)), resume.get(("entity-changes", q), 0))

    def _add(self, topic: str, partition: int, joined: set[int], carrier: int) -> None:
        self.lanes[(topic, partition)] = _Lane(topic, partition, joined, marks=dict(self.released),
                                               next_carrier=carrier)

    def gain(self, q: int) -> None:
        """Read entity lane `q` from its start: its records below what was applied are its shard's history."""
        self._add("entity-changes", q, set(), 0)
        self.lanes[("entity-changes", q)].marks = {}

    def lose(self, q: int) -> None:
        """Stop merging entity lane `q`."""
        self.lanes.pop(("entity-changes", q), None)

    def restoring(self) -> frozenset[int]:
        """Entity lanes not yet merged in every source partition."""
        return frozenset(lane.partition for lane in self.lanes.values()
                         if lane.topic == "entity-changes" and len(lane.joined) < self.partitions)

    def add(self, topic: str, partition: int, carrier: int, batch: RoutedBatch) -> None:
        """One routed batch read from a lane (a lane no longer held is ignored)."""
        lane = self.lanes.get((topic, partition))
        if lane is None or carrier < lane.next_carrier:
            return
        lane.next_carrier = carrier + 1
        if lane.fed:
            if carrier in lane.fed:  # merged when it was sent
                lane.fed.discard(carrier)
                return
            lane.fed = {c for c in lane.fed if c > carrier}
        self._merge(lane, carrier, batch)

    def fed_already(self, topic: str, partition: int, carrier: int) -> bool:
        """Whether the batch read at `carrier` is one this worker's router fed when it was sent: passed over (as
        `add` would) without reading it. A worker alone routes every batch of its lanes and reads each back."""
        lane = self.lanes.get((topic, partition))
        if lane is None or carrier < lane.next_carrier or carrier not in lane.fed:
            return False
        lane.next_carrier = carrier + 1
        lane.fed.discard(carrier)
        return True

    def report(self, topic: str, partition: int, source_partition: int, upto: int) -> None:
        """A report read on a lane: its owner dead-lettered its refusals of `source_partition` below `upto`."""
        lane = self.lanes.get((topic, partition))
        if lane is not None:
            lane.reported[source_partition] = max(lane.reported.get(source_partition, 0), upto)

    def feed(self, topic: str, partition: int, carrier: int, batch: RoutedBatch) -> bool:
        """A batch this worker's router sent, acknowledged at `carrier`, merged before the lane's reader meets it
        (saving the hop back); whether it was. Only where the lane holds everything of its source partition
        below the batch already: the reader brings the rest, and this batch with it."""
        lane = self.lanes.get((topic, partition))
        if (lane is None or batch.partition not in lane.joined or carrier < lane.next_carrier
                or carrier in lane.fed or lane.marks.get(batch.partition, 0) < batch.start):
            return False
        lane.fed.add(carrier)
        self._merge(lane, carrier, batch)
        return True

    def _merge(self, lane: _Lane, carrier: int, batch: RoutedBatch) -> None:
        if batch.frames:
            lane.open[carrier] = len(batch.frames)
            queue = lane.pending.setdefault(batch.partition, deque())
            queue.extend((carrier, f) for f in batch.frames)
        lane.marks[batch.partition] = max(lane.marks.get(batch.partition, 0), batch.end)

    def release(self) -> Released:
        """Everything every merged lane has passed, and the history of lanes catching up."""
        messages: list[RawMessage] = []
        history: list[RawMessage] = []
        before = self.restoring()
        for p in range(self.partitions):
            members = [lane for lane in self.lanes.values() if p in lane.joined]
            limit = min(lane.marks.get(p, 0) for lane in members)
            # Below `released` a frame was applied already (a lane read again after a restart): dropped.
            frames = [(f, lane) for lane in members for f in self._take(lane, p, max(limit, self.released[p]))]
            frames.sort(key=lambda x: (x[0].offset, _ORDER[x[0].kind]))
            seen: set[int] = set()
            for f, lane in frames:
                if f.offset < self.released[p]:
                    continue
                if f.kind != NOTICE:
                    if f.offset in seen:  # a record routed to several lanes (an unknown delete): applied once
                        continue
                    seen.add(f.offset)
                messages.append(_message(p, f, lane))
            self.released[p] = max(limit, self.released[p])
            for lane in self.lanes.values():
                if p in lane.joined or lane.topic == "shared-changes":  # a shared lane carries its own partition
                    continue
                for f in self._take(lane, p, self.released[p]):
                    # Read in carrier order, a span a new router sent again comes after later records: only the
                    # first routing of an offset is history (a repeated move notice would undo a later upsert).
                    if f.offset >= lane.history_to.get(p, 0):
                        history.append(_message(p, f, lane))
                        lane.history_to[p] = f.offset + 1
                if lane.marks.get(p, 0) >= self.released[p]:
                    lane.joined.add(p)
        positions = {(SOURCE, p): n for p, n in self.released.items()}
        positions.update({key: lane.resume_at() for key, lane in self.lanes.items()})
        caught_up = before - self.restoring()
        return Released(messages, history, positions, caught_up,
                        {q: dict(self.lanes[("entity-changes", q)].reported) for q in caught_up})

    def _take(self, lane: _Lane, p: int, below: int) -> list[Frame]:
        """Pop a lane's frames of source partition `p` below an offset; close the batches they emptied."""
        queue = lane.pending.get(p)
        taken: list[Frame] = []
        while queue and queue[0][1].offset < below:
            carrier, frame = queue.popleft()
            taken.append(frame)
            lane.open[carrier] -= 1
            if not lane.open[carrier]:
                del lane.open[carrier]
        return taken


def _message(p: int, f: Frame, lane: _Lane) -> RawMessage:
    entity_lane = lane.partition if lane.topic == "entity-changes" else None
    value, size = f.value, None
    if f.kind == OVERSIZED:
        size, value = cut_size(f.value or b"")
    return RawMessage(SOURCE, p, f.offset, f.key, value, None if f.timestamp_ms is None else f.timestamp_ms / 1000,
                      lane=entity_lane, notice=f.kind == NOTICE, original_size=size)
