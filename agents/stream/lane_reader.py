"""The lanes a worker reads `source-changes` through: unpack each routed batch, merge, and say what it releases."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from agents.stream.lane_merge import LaneMerge, Released
from agents.stream.raw_message import RawMessage
from schemas.errors import InvalidEvent
from schemas.routed_batch import REPORT_HEADER, RoutedBatch, unpack

log = logging.getLogger(__name__)

LANES = ("shared-changes", "entity-changes")  # routed `source-changes` (see `agents.stream.router`)


class Fetched:
    """What one fetch hands the writer: records to apply, a gained lane's history, and the positions they reach."""

    __slots__ = ("messages", "history", "positions", "caught_up", "reported", "gained", "reports")

    def __init__(self, messages: list[RawMessage], released: Released | None = None,
                 gained: frozenset[int] = frozenset()) -> None:
        self.messages = messages + (released.messages if released else [])
        self.history = released.history if released else []
        self.positions = released.positions if released else {}
        self.caught_up = released.caught_up if released else frozenset()
        self.reported = released.reported if released else {}  # per caught-up lane (see `Released.reported`)
        self.gained = gained  # entity lanes read from their start since the last fetch: cleaned first
        self.reports: dict[tuple[int, int], int] = {}  # (entity lane, source partition) -> reported below, as read

    def join(self, later: "Fetched") -> "Fetched":
        """This fetch followed by a later one, as one batch.

        A lane the later one gained again (lost in between) starts over: this one's history and catch-up of it
        belonged to the read before, and would mark the new read caught up before its history was read."""
        again = later.gained
        self.messages = self.messages + later.messages
        self.history = [m for m in self.history if m.lane not in again] + later.history
        self.positions = {**self.positions, **later.positions}
        self.caught_up = (self.caught_up - again) | later.caught_up
        self.reported = {**{q: r for q, r in self.reported.items() if q not in again}, **later.reported}
        self.gained = self.gained | later.gained
        self.reports = {k: max(v, self.reports.get(k, 0)) for k, v in later.reports.items()} | {
            k: v for k, v in self.reports.items() if k not in later.reports}
        return self

    def __len__(self) -> int:
        return len(self.messages) + len(self.history)


class FetchQueue(asyncio.Queue):
    """Fetched batches waiting for the writer, bounded in batches of up to `most` records each.

    A batch that fits in the last one waiting joins it (the writer would join them anyway): a
    run of small batches (a router's sends, merged as they are acknowledged) never fills the
    queue and never holds up the early announcements made as a batch is queued.
    """

    def __init__(self, maxsize: int, most: int) -> None:
        super().__init__(maxsize)
        self.most = most

    def waits(self, records: int) -> bool:
        """Whether queueing a batch of this many records would wait for the writer."""
        return self.full() and len(self._queue[-1]) + records > self.most

    async def put_joined(self, batch: Fetched, wait: bool = True) -> bool:
        """Queue a batch, joined to the last one waiting where it fits (without `wait`, whatever its size when the
        queue is full); whether it went in as a batch of its own."""
        if self._queue and (len(self._queue[-1]) + len(batch) <= self.most or (not wait and self.full())):
            self._queue[-1].join(batch)
            return False
        await self.put(batch)
        return True


class LaneReader:
    """The merge of the lanes read, the lanes gained since the last fetch, and who waits for a lane to catch up."""

    def __init__(self, partitions: int, held: Callable[[], frozenset[int]]) -> None:
        self.partitions = partitions
        self.held = held  # the entity lanes the file holds (read at start, each from where it was)
        self.merge: LaneMerge | None = None
        self.gained: set[int] = set()
        self.errors = 0  # lane records that were not routed batches (a poisoned internal topic), skipped
        self.fed = 0  # routed batches merged as this worker's router sent them (not read back first)
        self.passed_fed = 0  # of those, read back and passed over without unpacking
        self.epoch = 0  # counts gains: a fetch names the epoch it was read in
        self._gained_at: dict[int, int] = {}  # entity lane -> the epoch it was last gained in
        self._read_now: frozenset[int] = frozenset()
        self.wakers: list[asyncio.Event] = []  # set when gained lanes joined the merge (a follower waits on one)
        self._released: dict[tuple[str, int], int] = {}  # `source-changes` positions handed to the writer
        self._reports: dict[tuple[int, int], int] = {}  # (entity lane, source partition) -> reported, handed on

    def start(self, applied: dict[str, dict[int, int]], lanes: dict[str, dict[int, int]]) -> None:
        """Merge from what the file applied (after any rebase), the shared lanes and the entity lanes held each
        from where it was read to."""
        self.merge = LaneMerge(self.partitions, applied.get("source-changes", {}),
                               {(t, p): n for t in LANES for p, n in lanes.get(t, {}).items()}, held=self.held())
        self.gained = set()
        self._read_now = self.reading()

    def reading(self) -> frozenset[int]:
        """The entity lanes read now (held, or catching up)."""
        if self.merge is None:
            return frozenset()
        return frozenset(p for t, p in self.merge.lanes if t == "entity-changes")

    def read_now(self) -> frozenset[int]:
        """`reading` as of the last gain or loss, safe to ask from the writer thread (a value, not a view)."""
        return self._read_now

    def gain(self, lanes: frozenset[int]) -> None:
        """Read these entity lanes from their start."""
        if self.merge is None:
            raise RuntimeError("the replica is not reading yet")
        self.epoch += 1
        for q in lanes:
            self.merge.gain(q)
            self._gained_at[q] = self.epoch
        self.gained.update(lanes)
        self._read_now = self.reading()

    def lose(self, lanes: frozenset[int]) -> None:
        """Stop reading these entity lanes."""
        if self.merge is None:
            return
        for q in lanes:
            self.merge.lose(q)
        self.gained.difference_update(lanes)
        self._read_now = self.reading()

    def fetched(self, batch: dict, logical: dict[str, str], epoch: int | None = None) -> Fetched:
        """A fetch's records: the direct ones as read, the lanes' through the merge (what it can release now).

        Records of a lane gained again after the fetch's `epoch` belong to the read before: dropped."""
        direct: list[RawMessage] = []
        lanes = False
        for tp, records in batch.items():
            name = logical[tp.topic]
            if (epoch is not None and name == "entity-changes"
                    and self._gained_at.get(tp.partition, 0) > epoch):
                continue
            if self.merge is not None and name in LANES:
                lanes = True
                for m in records:
                    reports = bool(m.headers) and any(k == REPORT_HEADER for k, _ in m.headers)
                    if not reports and self.merge.fed_already(name, tp.partition, m.offset):
                        self.passed_fed += 1  # its frames were merged as it was sent: not unpacked again
                        continue
                    try:
                        routed = unpack(m.value or b"")
                    except InvalidEvent as exc:
                        self.errors += 1
                        log.error("skipped a record of %s/%d/%d that is not a routed batch (%s): only workers may "
                                  "write the lanes", name, tp.partition, m.offset, exc,
                                  extra={"reason": "lane_record_invalid", "topic": name, "partition": tp.partition})
                        continue
                    self.merge.add(name, tp.partition, m.offset, routed)
                    if reports:
                        self.merge.report(name, tp.partition, routed.partition, routed.end)
                continue
            direct.extend(RawMessage(name, tp.partition, m.offset, m.key, m.value,
                                     m.timestamp / 1000 if m.timestamp else None) for m in records)
        gained, self.gained = frozenset(self.gained), set()
        if self.merge is None or not (lanes or gained):
            return Fetched(direct, gained=gained)
        return self._reported(Fetched(direct, self.merge.release(), gained))

    def sent(self, batches: list[tuple[str, int, int, RoutedBatch]]) -> Fetched | None:
        """Routed batches this worker's router just had acknowledged, as (lane topic, partition, offset, batch):
        what merging them releases now; None when the merge took none (it reads them back later instead)."""
        if self.merge is None:
            return None
        taken = sum(self.merge.feed(*b) for b in batches)
        if not taken:
            return None
        self.fed += taken
        gained, self.gained = frozenset(self.gained), set()
        return self._reported(Fetched([], self.merge.release(), gained))

    def _reported(self, batch: Fetched) -> Fetched:
        """Hand the writer how far each entity lane's owner reported, as far as the records are released: a report
        read before the records it covers (another lane lagging) covers them once they are."""
        released = self.merge.released if self.merge is not None else {}
        for (topic, q), lane in (self.merge.lanes.items() if self.merge is not None else ()):
            if topic != "entity-changes":
                continue
            for p, upto in lane.reported.items():
                upto = min(upto, released.get(p, 0))
                if upto > self._reports.get((q, p), 0):
                    batch.reports[(q, p)] = self._reports[(q, p)] = upto
        return batch

    def advanced(self, batch: Fetched) -> bool:
        """Whether a fetch moved a `source-changes` position (a freshness token may wait for it), and remember it."""
        moved = {k: v for k, v in batch.positions.items() if k[0] == "source-changes" and v > self._released.get(k, 0)}
        self._released.update(moved)
        return bool(moved)

    def applied(self, batch: Fetched) -> None:
        """After the writer applied a batch: wake whoever waits for lanes to catch up."""
        if batch.caught_up:
            for event in self.wakers:
                event.set()
