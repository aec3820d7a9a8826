"""Records to publish, written in the same transaction as the state that produced them."""

from __future__ import annotations

from typing import Sequence

import logging
import threading
from dataclasses import dataclass

import orjson
import pyarrow as pa

from schemas.outbound import compact_plan, fits, letter_key, shown_key, too_large_letter
from state.store import Store

log = logging.getLogger(__name__)

Source = tuple[str, int, int]  # (input topic, partition, offset) of the event that caused a record
Due = tuple[int, str, bytes | None, bytes | None, int | None]  # (seq, topic, key, value, partition or None)


@dataclass(frozen=True)
class OutboundLimit:
    """What the producer can publish, checked before a record is stored."""

    max_bytes: int
    """Largest record (key, value and framing) the producer and broker accept."""
    dead_letters: str
    """Broker-side name of `dead-letters`, where records that cannot fit are reported."""
    compactable: frozenset[str]
    """Broker-side names of topics whose records have a compact form (plans, receipts)."""


class Acknowledged:
    """Sequence numbers of records the broker acknowledged whose rows are not deleted yet (thread-safe).

    Deleting them is left to the next write transaction (the apply path's, or the publisher's
    idle timer): a transaction of their own after every flush cost a commit and a writer job per
    batch. Until then every read of due records passes over them. After a crash they are sent
    again: at least once, as for a crash between a send and its commit.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seqs: set[int] = set()

    def add(self, seqs: Sequence[int]) -> None:
        """These records were acknowledged (the event loop, after a send)."""
        with self._lock:
            self._seqs.update(seqs)

    def current(self) -> list[int]:
        """The sequence numbers waiting to be deleted, as of now."""
        with self._lock:
            return list(self._seqs)

    def deleted(self, seqs: Sequence[int]) -> None:
        """Their deletion committed."""
        with self._lock:
            self._seqs.difference_update(seqs)

    def __len__(self) -> int:
        return len(self._seqs)


LANE_LETTERS = "outbox.lane_letters"  # whether letters are kept for lanes' owners (`Store.cached`)


class Outbox:
    """A durable queue of (topic, key, value); rows go only after the broker acknowledged them.

    Every worker applies every input event (the catalog is replicated), but only the worker the
    consumer group gave an event's partition to publishes what the event caused. Rows caused by
    an input event are therefore queued on *standby*, tagged with the event's position, and
    promoted by the partition's owner; the others are pruned once the group has moved past them.
    """

    def __init__(self, store: Store, limit: OutboundLimit | None = None, acked: Acknowledged | None = None) -> None:
        self.store = store
        self.db = store.db
        self.limit = limit
        self.acked = acked if acked is not None else Acknowledged()  # shared with the views over the same file
        # Times records were queued or promoted on this connection: unchanged, nothing new can be due.
        self.queued = 0
        self.promoted = 0  # times standby records were promoted: an older record may have come due

    def _fit(self, rows: list[tuple[str, bytes | None, bytes]], sources: list[Source | None],
             places: list[int | None]) -> tuple[list[tuple[str, bytes | None, bytes]], list[Source | None],
                                                 list[int | None]]:
        """Every row within the limit, with its source and partition: as it is, compacted, or replaced by its
        dead letter (which goes where the producer puts it)."""
        limit = self.limit
        if limit is None or all(fits(k, v, limit.max_bytes) for _, k, v in rows):
            return rows, sources, places
        out, kept, placed, counts = [], [], [], {}
        for (topic, key, value), source, place in zip(rows, sources, places, strict=True):
            kept.append(source)
            placed.append(place)
            if fits(key, value, limit.max_bytes):
                out.append((topic, key, value))
                continue
            if topic in limit.compactable:
                try:
                    doc = orjson.loads(value)
                    if isinstance(doc, dict) and "receipt" in doc:
                        # A `plan-dependencies` record without its receipt (the `receipts` topic has it)
                        # is still restorable whole, which a compact one is not.
                        doc.pop("receipt")
                        whole = orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS)
                        if fits(key, whole, limit.max_bytes):
                            out.append((topic, key, whole))
                            continue
                    compact = orjson.dumps(compact_plan(doc), option=orjson.OPT_NON_STR_KEYS)
                except (orjson.JSONDecodeError, TypeError, AttributeError):
                    compact = value
                if fits(key, compact, limit.max_bytes):
                    out.append((topic, key, compact))
                    counts["outbound_compacted"] = counts.get("outbound_compacted", 0) + 1
                    log.warning("published a compact %s record %s (%d bytes without contents)", topic, shown_key(key),
                                len(value), extra={"topic": topic, "error_class": "compacted"})
                    continue
            letter = self._letter(topic, key, value, "stored", counts)
            placed[-1] = None
            if letter is not None:
                out.append(letter)
            else:
                kept.pop()
                placed.pop()
            log.error("outbound %s record %s of %d bytes cannot be published", topic, shown_key(key), len(value),
                      extra={"topic": topic, "error_class": "record_too_large"})
        self.store.bump_many(counts)
        return out, kept, placed

    def _letter(self, topic: str, key: bytes | None, value: bytes, why: str, counts: dict[str, int],
                refused: bool = False) -> tuple[str, bytes | None, bytes] | None:
        """The dead letter standing in for a record that cannot be published, or None (counted) when there is none.

        A dead letter the broker `refused` gets no dead letter of its own (the next would be
        refused the same way, for ever): it is dropped, counted and logged. So is a letter over a
        limit set below a letter's size. A dead letter merely too large to store (an input
        event's, with its original) is replaced by a letter naming it, as any record is.
        """
        assert self.limit is not None
        letter_key_ = letter_key(key)
        letter = too_large_letter(topic, key, value, self.limit.max_bytes, why)
        if (refused and topic == self.limit.dead_letters) or not fits(letter_key_, letter, self.limit.max_bytes):
            counts["outbound_dropped"] = counts.get("outbound_dropped", 0) + 1
            log.error("outbound %s record %s of %d bytes dropped: its dead letter could not be published either",
                      topic, shown_key(key), len(value), extra={"topic": topic, "error_class": "outbound_dropped"})
            return None
        counts["dead_letters.record_too_large"] = counts.get("dead_letters.record_too_large", 0) + 1
        return self.limit.dead_letters, letter_key_, letter

    def add_many(self, rows: list[tuple[str, bytes | None, bytes]], sources: Sequence[Source | None] | None = None,
                 standby: bool = False, lane: int | None = None,
                 partitions: Sequence[int | None] | None = None) -> None:
        """Queue records for publication, in order, in one statement (each within the outbound limit).

        `lane`: dead letters of an entity lane's records that its owner sends and reports, kept on standby
        by a worker holding a copy of the lane until a report covers them (`reported`) or the copy is
        promoted to owner (`promote_lanes`): the owner may die before it sends them.
        `partitions`: per record, the partition it must go to, or None for the producer's partitioner."""
        if not rows:
            return
        rows, sources, places = self._fit(rows, list(sources) if sources is not None else [None] * len(rows),
                                          list(partitions) if partitions is not None else [None] * len(rows))
        if not rows:
            return
        table = pa.table({
            "topic": [r[0] for r in rows], "key": pa.array([r[1] for r in rows], pa.binary()),
            "value": pa.array([r[2] for r in rows], pa.binary()),
            "src_topic": pa.array([s and s[0] for s in sources], pa.string()),
            "src_partition": pa.array([s and s[1] for s in sources], pa.int32()),
            "src_offset": pa.array([s and s[2] for s in sources], pa.int64()),
            "standby": pa.array([standby and s is not None for s in sources], pa.bool_())})
        if any(p is not None for p in places):
            table = table.append_column("to_partition", pa.array(places, pa.int32()))
        self.queued += 1
        if lane is not None:
            table = table.append_column("lane", pa.array([lane] * len(rows), pa.int32()))
            self.store.forget(LANE_LETTERS)
        # Row order (VALUES or the Arrow scan's rowids) is the list order, so seq keeps publication order.
        self.store.insert_rows("outbox", table, verb="INSERT INTO", columns=True)

    def add_selected(self, select: str, params: list, standby: bool, largest: int) -> None:
        """Queue the rows a query selects, as (topic, key, value, src_topic, src_partition, src_offset).

        `largest` bounds the framed size of any of them: within the outbound limit they are
        inserted by the query itself; otherwise they pass through Python to be fitted (`add_many`).
        """
        if self.limit is not None and largest > self.limit.max_bytes:
            rows = self.db.execute(select, params).fetchall()
            self.add_many([row[:3] for row in rows], [row[3:] for row in rows], standby=standby)
            return
        self.queued += 1
        self.db.execute("INSERT INTO outbox (topic, key, value, src_topic, src_partition, src_offset, standby) "
                        f"SELECT *, ? FROM ({select})", [standby, *params])

    def promote(self, topic: str, partition: int, first: int, last: int, drop_earlier: bool = True) -> int:
        """This worker owns events first..last of a partition: publish what they caused.

        With `drop_earlier` (events delivered by the consumer group), standby rows of earlier
        offsets are dropped: the group hands an owner its partition at the committed offset,
        so everything before it was published by the previous owner.
        """
        if drop_earlier:
            self.db.execute("DELETE FROM outbox WHERE standby AND lane IS NULL AND src_topic = ? AND src_partition = ? "
                            "AND src_offset < ?", [topic, partition, first])
        self.queued += 1
        self.promoted += 1
        return self.db.execute("UPDATE outbox SET standby = false WHERE standby AND lane IS NULL AND src_topic = ? "
                               "AND src_partition = ? AND src_offset BETWEEN ? AND ?",
                               [topic, partition, first, last]).fetchone()[0]

    def prune(self, committed: dict[tuple[str, int], int]) -> None:
        """Drop standby rows of events the consumer group has committed (another owner published them)."""
        if not committed:
            return
        rows = pa.table({"t": [t for t, _ in committed], "p": pa.array([p for _, p in committed], pa.int32()),
                         "o": pa.array(list(committed.values()), pa.int64())})
        self.db.register("_committed", rows)
        try:
            self.db.execute("DELETE FROM outbox USING _committed c WHERE outbox.standby AND outbox.lane IS NULL "
                            "AND outbox.src_topic = c.t "
                            "AND outbox.src_partition = c.p AND outbox.src_offset < c.o")
        finally:
            self.db.unregister("_committed")

    def reported(self, reports: dict[tuple[int, int], int]) -> None:
        """Drop the letters kept for lanes' owners that reports read on the lanes cover: (lane, source partition)
        -> the source offset the owner dead-lettered its refusals below (see `add_many`)."""
        if not reports or not self.store.cached(LANE_LETTERS, self._any_kept):
            return
        keys = list(reports)
        self.db.execute("DELETE FROM outbox USING (SELECT unnest(?) AS q, unnest(?) AS p, unnest(?) AS upto) r "
                        "WHERE outbox.standby AND outbox.lane = r.q AND outbox.src_partition = r.p "
                        "AND outbox.src_offset < r.upto",
                        [[k[0] for k in keys], [k[1] for k in keys], list(reports.values())])
        self.store.forget(LANE_LETTERS)

    def oldest_kept(self) -> dict[tuple[int, int], int]:
        """(lane, source partition) -> the oldest source offset of a letter kept for the lane's owner (`add_many`):
        a report of this worker's, as the lane's owner, never covers it before it is sent."""
        if not self.store.cached(LANE_LETTERS, self._any_kept):
            return {}
        return {(q, p): o for q, p, o in self.db.execute(
            "SELECT lane, src_partition, min(src_offset) FROM outbox WHERE standby AND lane IS NOT NULL "
            "GROUP BY ALL").fetchall()}

    def _any_kept(self) -> bool:
        return self.db.execute("SELECT count(*) FROM outbox WHERE lane IS NOT NULL").fetchone()[0] > 0

    def promote_lanes(self, lanes: frozenset[int]) -> int:
        """This worker owns these lanes now: send the letters kept for their previous owner (`add_many`), whenever
        they were kept (as a copy, or live while the lane was restored; before a restart too)."""
        if not lanes or not self.store.cached(LANE_LETTERS, self._any_kept):
            return 0
        self.store.forget(LANE_LETTERS)
        self.queued += 1
        self.promoted += 1
        return self.db.execute("UPDATE outbox SET standby = false, lane = NULL WHERE standby AND lane IN "
                               "(SELECT unnest(?))", [sorted(lanes)]).fetchone()[0]

    def drop_lanes(self, held: frozenset[int]) -> None:
        """Lanes not among these are no longer held here: the letters kept for their owners are theirs alone."""
        if self.store.cached(LANE_LETTERS, self._any_kept):
            self.db.execute("DELETE FROM outbox WHERE standby AND lane IS NOT NULL AND lane NOT IN "
                            "(SELECT unnest(?::INTEGER[]))", [sorted(held)])
            self.store.forget(LANE_LETTERS)

    def due(self, limit: int = 5000, after: int | None = None) -> list[Due]:
        """The oldest records due for publication, in order (past sequence number `after`, if given), each with the
        partition it must go to (None: wherever the producer's partitioner puts it)."""
        unacked, params = self.unacked()
        return self.db.execute("SELECT seq, topic, key, value, to_partition FROM outbox "
                               f"WHERE NOT standby AND seq > ?{unacked} ORDER BY seq LIMIT ?",
                               [-1 if after is None else after, *params, limit]).fetchall()

    def pending(self, limit: int = 5000, after: int | None = None) -> list[tuple[int, str, bytes | None, bytes]]:
        """As `due`, without the partitions: (seq, topic, key, value)."""
        return [row[:4] for row in self.due(limit, after)]

    def unacked(self) -> tuple[str, list]:
        """A condition (` AND ...`) passing over acknowledged rows not deleted yet, and its parameters."""
        seqs = self.acked.current()
        return (" AND seq NOT IN (SELECT unnest(?))", [seqs]) if seqs else ("", [])

    def forget_acked(self) -> list[int]:
        """Delete the acknowledged rows inside the caller's transaction; call `acked.deleted` once it committed."""
        seqs = self.acked.current()
        self.remove(seqs)
        return seqs

    def replace_with_dead_letters(self, rows: list[tuple[int, str, bytes | None, bytes]], why: str) -> None:
        """Records the broker refused for good: queue a dead letter for each and forget them."""
        if not rows or self.limit is None:
            self.remove([seq for seq, *_ in rows])
            return
        seqs = [seq for seq, *_ in rows]
        # A letter keeps its record's source: until it is published it holds the group's commit as the record did.
        source = {seq: (t, p, o) if t is not None else None for seq, t, p, o in self.db.execute(
            "SELECT seq, src_topic, src_partition, src_offset FROM outbox WHERE seq IN (SELECT unnest(?))",
            [seqs]).fetchall()}
        self.remove(seqs)
        counts: dict[str, int] = {}
        letters = [(self._letter(topic, key, value, why, counts, refused=True), source.get(seq))
                   for seq, topic, key, value, *_ in rows]
        self.add_many([letter for letter, _ in letters if letter is not None],
                      [src for letter, src in letters if letter is not None])
        self.store.bump_many(counts)

    def remove(self, seqs: list[int]) -> None:
        """Forget these records (acknowledged, or permanently unpublishable)."""
        if seqs:
            self.db.execute("DELETE FROM outbox WHERE seq IN (SELECT unnest(?))", [seqs])

    def size(self) -> int:
        """Records due for publication."""
        unacked, params = self.unacked()
        return self.db.execute(f"SELECT count(*) FROM outbox WHERE NOT standby{unacked}", params).fetchone()[0]

    def oldest_due(self, topic: str, source: str) -> dict[int, int]:
        """Per partition of the input topic `source`, the offset whose record caused the oldest row due for
        `topic` (a dead letter not acknowledged yet, for instance)."""
        unacked, params = self.unacked()
        return dict(self.db.execute(
            f"SELECT src_partition, min(src_offset) FROM outbox WHERE NOT standby AND topic = ? AND src_topic = ?"
            f"{unacked} GROUP BY src_partition", [topic, source, *params]).fetchall())

    def any_due(self) -> bool:
        """Whether any record is due for publication (cheaper than `size` for a loop that polls while it is)."""
        unacked, params = self.unacked()
        return self.db.execute(f"SELECT 1 FROM outbox WHERE NOT standby{unacked} LIMIT 1",
                               params).fetchone() is not None

    def last_due(self, through: int | None = None) -> int | None:
        """The sequence number of the latest record due for publication (at or before `through`, if given)."""
        unacked, params = self.unacked()
        bound = "" if through is None else " AND seq <= ?"
        return self.db.execute(f"SELECT max(seq) FROM outbox WHERE NOT standby{unacked}{bound}",
                               params + ([] if through is None else [through])).fetchone()[0]

    def newest(self) -> int | None:
        """The sequence number of the record queued last (on the writer: the caller's own last record)."""
        return self.db.execute("SELECT max(seq) FROM outbox").fetchone()[0]

    def standby_size(self) -> int:
        """Records held for events whose partition another worker may own."""
        return self.db.execute("SELECT count(*) FROM outbox WHERE standby").fetchone()[0]
