"""The DuckDB file: schema, transactions, offsets, event ids, the clock and counters."""

from __future__ import annotations

import copy
import logging
from collections import Counter
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import duckdb
import pyarrow as pa

from state.checkpoints import COMPACT_STORED_ROWS, DEFAULT_WAL_LIMIT, Checkpoints
from state.counts import Counts, write_counts
from state.drained import DrainedConnection
from state.event_generations import LEGACY_MEMO, OLDER_MEMO, has_legacy, older_tables
from state.event_ids import claim_any, claim_scoped
from state.head_cache import HeadCache
from state.row_writes import insert_rows, update_rows
from state.store_migrations import migrate
from state.store_tables import TABLES

log = logging.getLogger(__name__)

# DuckDB's 256 KiB default block puts a floor under every table, index and what a checkpoint frees: 16 KiB made
# the bench's files 2.2x smaller at the same apply cost. Fixed when a file is created (older files keep theirs).
BLOCK_SIZE = 16 * 1024
# Rows deleted from a table with an index (every primary key) stay in the file unless a checkpoint may compact it
# and rebuild its indexes (a parked plan replaced 80,000 times over 200 keys made 500 MB): see `checkpoints`.
_LATER = "CAST({record_offset} AS BIGINT) >= coalesce(record_offset, -1)"  # a mark of a later record (or the first)
LANE_TOPICS = ("shared-changes", "entity-changes")  # this worker's read positions: in no token, no compiled_as_of
_LATER_ROW = "excluded.record_offset >= coalesce(offsets.record_offset, -1)"  # the same, in an upsert


class Store:
    """One DuckDB connection to the service's file; every write goes through `transaction()`."""

    def __init__(self, path: Path | str, wal_limit: int = DEFAULT_WAL_LIMIT) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = duckdb.connect(str(self.path), config={"default_block_size": str(BLOCK_SIZE),
                                                         "vacuum_rebuild_indexes": str(COMPACT_STORED_ROWS)})
        self.db.execute("SET TimeZone = 'UTC'")
        # Statements here are small and many: a second DuckDB thread only adds hand-offs (about +10%
        # events per CPU second with one in the bench's A/B), and a worker pinned to one core has no second.
        self.db.execute("SET threads = 1")
        # DuckDB's Python client draws a progress bar on stdout for any statement past 2 s (a take-over, a
        # restore): stray text among the JSON log lines.
        self.db.execute("SET enable_progress_bar = false; SET enable_progress_bar_print = false")
        self.db.execute(TABLES)
        migrate(self.db)
        # Schema changes must not wait in the WAL: DuckDB (1.x) can fail to replay DDL with
        # defaults after a kill -9, and then the file does not open at all.
        self.db.execute("CHECKPOINT")
        self.checkpoints = Checkpoints(self.db, self.path, wal_limit)  # shared with views, which only read its figures
        self._depth = 0
        self.heads = HeadCache()  # shared with views: what cached selects read instead of the file
        self._heads_writer = True  # views read only: their transactions never publish the writer's changes
        # The writer's copy of what it read or wrote and rarely changes (offsets, clock, incarnation, catalog
        # lookups): each saves a statement per batch. Dropped whenever a transaction rolls back, so it never holds
        # an uncommitted value past it; None on views, which must never see the writer's uncommitted values.
        self._memo: dict | None = {}
        self._moved = False  # offsets or incarnation written in the open transaction: published at commit
        self.counts = Counts()  # shared with views: committed increments not yet in the file
        self.rebases = 0  # rebases written on this connection (they promote standby records: `Publisher.prefetch`)
        self._staged: Counter[str] = Counter()  # the writer's increments in the open transaction
        self.heads.position = self.position()

    def heads_changed(self) -> None:
        """A write outside any transaction changed heads: it committed, so repeat its removals now."""
        if not self._depth and self._heads_writer:
            self.heads.committed(self._moved_position())

    def _moved_position(self) -> tuple[dict[str, dict[int, int]], str | None, int] | None:
        """The committed position, if offsets or incarnation moved since it was last published."""
        moved, self._moved = self._moved, False
        if not moved:
            return None
        return self.remembered_position()

    def remembered_position(self) -> tuple[dict[str, dict[int, int]], str | None, int]:
        """`position()` as the writer remembers it, with no read (a view, which remembers nothing, reads it)."""
        return (self.next_offsets(), *self.incarnation()) if self._memo is not None else self.position()

    def _position_moved(self) -> None:
        self._moved = True
        self.heads_changed()  # outside a transaction (autocommit) it is published at once

    def view(self) -> "Store":
        """A second connection to the same file, for reads from another thread (committed state only)."""
        other = copy.copy(self)
        cursor = self.db.cursor()
        cursor.execute("SET enable_progress_bar = false; SET enable_progress_bar_print = false")  # not inherited
        other.db = DrainedConnection(cursor)  # see state.drained: no read may stay open
        other._depth = 0
        other._heads_writer = False
        other._memo = None
        other._staged = Counter()
        return other

    def close(self) -> None:
        """Write pending counts, checkpoint and close the file."""
        try:
            if self._memo is not None and not self._depth:
                self.write_counts()
        except duckdb.Error:  # only these increments are lost: the file's rows are whole
            log.exception("could not write the counters' pending increments before closing")
        finally:
            self.db.close()

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """All-or-nothing writes; nested use joins the outer transaction."""
        if self._depth:
            self._depth += 1
            try:
                yield self.db
            finally:
                self._depth -= 1
            return
        self.db.begin()
        self._depth = 1
        try:
            yield self.db
        except BaseException:
            if self._heads_writer:
                self._moved = False
                self.heads.rolled_back()
            self.forget()
            self.db.rollback()
            raise
        else:
            try:
                if self._heads_writer:
                    self.heads.committing()
                self.db.commit()
            except BaseException:
                if self._heads_writer:
                    self._moved = False
                    self.heads.rolled_back()
                self.forget()
                raise
            if self._heads_writer:
                self.heads.committed(self._moved_position())
            self.counts.committed(self._staged)
        finally:
            self._depth = 0
            self._staged.clear()

    # -- the writer's memo --------------------------------------------------------------

    def cached(self, key: object, load: Callable[[], Any]) -> Any:
        """`load()`, remembered under `key` on the writer until a rollback or `forget(key)` (views: always loaded)."""
        memo = self._memo
        if memo is None:
            return load()
        try:
            return memo[key]
        except KeyError:
            value = memo[key] = load()
            return value

    def forget(self, *keys: object) -> None:
        """Drop these remembered values (all of them without keys): the next use reads the file."""
        if self._memo is None:
            return
        if not keys:
            self._memo.clear()
        for key in keys:
            self._memo.pop(key, None)

    def insert_rows(self, table: str, rows: pa.Table, *, verb: str = "INSERT OR REPLACE INTO",
                    on_conflict: str = "", columns: bool = False) -> None:
        """Write many rows in one statement (the hot paths batch through here; see `row_writes.insert_rows`)."""
        insert_rows(self.db, table, rows, verb=verb, on_conflict=on_conflict, columns=columns)

    def update_rows(self, table: str, keys: tuple[str, ...], values: tuple[str, ...], rows: list[tuple],
                    assign: str) -> int:
        """Update rows matched on `keys` in one statement (see `row_writes.update_rows`); the rows updated."""
        return update_rows(self.db, table, keys, values, rows, assign)

    # -- offsets and idempotence -------------------------------------------------------
    def next_offsets(self, lanes: bool = False) -> dict[str, dict[int, int]]:
        """Per input topic and partition, the next offset not yet applied (`lanes`: the lanes' read positions)."""
        out: dict[str, dict[int, int]] = {}
        for (topic, partition), nxt in self._offsets().items():
            if (topic in LANE_TOPICS) == lanes:
                out.setdefault(topic, {})[partition] = nxt
        return out

    def _offsets(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> next offset (the writer's remembered copy: never mutate it on a view)."""
        return self.cached("offsets", lambda: {(t, p): n for t, p, n in self.db.execute(
            "SELECT topic, partition, next_offset FROM offsets").fetchall()})

    def save_offsets(self, offsets: dict[tuple[str, int], int],
                     marks: dict[tuple[str, int], tuple[int, str]] | None = None) -> None:
        """Record many partitions' next offsets, with the mark of each last record read, in one statement.

        A mark (see `streams.incarnation.record_mark`) identifies the record at one offset, so a later start can
        tell whether the broker still holds the topic these offsets belong to; a mark never gives way to one of
        an earlier record. Known rows are updated in place (an upsert costs about twice an update in DuckDB),
        and only where they move: rewriting a dozen unchanged rows was a tenth of a small batch.
        """
        marks, known = marks or {}, self._offsets() if self._memo is not None else {}
        rows = [(t, p, nxt, *marks.get((t, p), (None, None))) for (t, p), nxt in offsets.items()
                if (t, p) in marks or known.get((t, p), -1) < nxt]  # a lane merge hands every position each batch
        old = [r for r in rows if (r[0], r[1]) in known]
        if old:
            self.update_rows("offsets", ("topic", "partition"), ("next_offset", "record_offset", "mark"), old,
                              "next_offset = greatest(next_offset, {next_offset}), "
                              f"record_offset = CASE WHEN {_LATER} THEN {{record_offset}} ELSE record_offset END, "
                              f"mark = CASE WHEN {_LATER} THEN {{mark}} ELSE mark END")
            rows = [r for r in rows if (r[0], r[1]) not in known]
        if rows:
            self.insert_rows("offsets", pa.table({
                "topic": [r[0] for r in rows], "partition": pa.array([r[1] for r in rows], pa.int32()),
                "next_offset": pa.array([r[2] for r in rows], pa.int64()),
                "record_offset": pa.array([r[3] for r in rows], pa.int64()),
                "mark": pa.array([r[4] for r in rows], pa.string())}), verb="INSERT INTO", on_conflict=(
                "ON CONFLICT (topic, partition) DO UPDATE SET "
                "next_offset = greatest(offsets.next_offset, excluded.next_offset), "
                f"record_offset = CASE WHEN {_LATER_ROW} THEN excluded.record_offset ELSE offsets.record_offset END, "
                f"mark = CASE WHEN {_LATER_ROW} THEN excluded.mark ELSE offsets.mark END"))
        if self._memo is not None:
            for pos, nxt in offsets.items():
                known[pos] = max(known.get(pos, nxt), nxt)
        if offsets:
            self._position_moved()

    def forget_offsets(self, topic: str, partitions: list[int]) -> None:
        """Forget where this file read some partitions of a topic (it reads them from their start again)."""
        self.db.execute("DELETE FROM offsets WHERE topic = ? AND list_contains(?, partition)", [topic, partitions])
        self.forget("offsets")
        self._position_moved()

    def offset_marks(self) -> dict[tuple[str, int], tuple[int, str]]:
        """(topic, partition) -> (offset, mark) of the last record applied there."""
        return {(t, p): (o, m) for t, p, o, m in self.db.execute(
            "SELECT topic, partition, record_offset, mark FROM offsets WHERE mark IS NOT NULL").fetchall()}

    # -- broker incarnation ------------------------------------------------------------
    def position(self) -> tuple[dict[str, dict[int, int]], str | None, int]:
        """`next_offsets()` and `incarnation()` in one statement: what a freshness token names."""
        rows = self.db.execute("SELECT o.topic, o.partition, o.next_offset, i.cluster_id, i.epoch "
                               "FROM (SELECT 0 AS id) LEFT JOIN incarnation i USING (id) "
                               "LEFT JOIN offsets o ON o.topic NOT IN ('shared-changes', 'entity-changes')").fetchall()
        out: dict[str, dict[int, int]] = {}
        for topic, partition, nxt, _, _ in rows:
            if topic is not None:
                out.setdefault(topic, {})[partition] = nxt
        _, _, _, cluster_id, epoch = rows[0]
        return out, cluster_id, epoch if epoch is not None else 0

    def incarnation(self) -> tuple[str | None, int]:
        """(cluster id the recorded offsets belong to, rebase epoch); (None, 0) before the first record."""
        def load() -> tuple[str | None, int]:
            row = self.db.execute("SELECT cluster_id, epoch FROM incarnation WHERE id = 0").fetchone()
            return (row[0], row[1]) if row else (None, 0)
        return self.cached("incarnation", load)

    def record_cluster(self, cluster_id: str) -> None:
        """Remember the cluster whose offsets this file records (first contact only)."""
        self.db.execute("INSERT INTO incarnation VALUES (0, ?, 0, NULL) ON CONFLICT (id) DO NOTHING", [cluster_id])
        self.forget("incarnation")
        self._position_moved()

    def rebase(self, cluster_id: str, topics: list[str]) -> int:
        """Forget offsets recorded against another incarnation of these topics; returns the new epoch.

        Catalog, plans and event ids stay: events read again from the new topics are applied by id (a repeat changes
        nothing), so nothing is skipped because of an old offset.
        """
        epoch = self.incarnation()[1] + 1
        self.db.execute("INSERT INTO incarnation VALUES (0, ?, ?, now()) ON CONFLICT (id) DO UPDATE SET "
                        "cluster_id = excluded.cluster_id, epoch = excluded.epoch, rebased_at = excluded.rebased_at",
                        [cluster_id, epoch])
        self.forget("incarnation")
        self.db.execute("DELETE FROM offsets WHERE topic IN (SELECT unnest(?))", [topics])
        self.forget("offsets")
        if "plans" in topics:
            self.db.execute("DELETE FROM plan_feed")
        # What old events caused but no owner published yet goes out now: a repeat is harmless,
        # a loss is not, and the old positions can never be promoted by new events.
        self.db.execute("UPDATE outbox SET standby = false, lane = NULL WHERE standby "
                        "AND src_topic IN (SELECT unnest(?))", [topics])
        self.rebases += 1
        self._position_moved()
        return epoch

    def claim_events(self, events: list[tuple[str, str, str]]) -> list[str]:
        """Classify (topic, event id, content hash) triples in order and record the new ones.

        Each gets `new` (first time on that topic), `duplicate` (seen with the same content, in
        this list or before) or `conflict` (the id was seen on that topic with other content).
        Ids recorded before ids were scoped by topic match any topic and count as duplicates.
        Ids are remembered for the event-id retention only (`event_generations.prune`).
        """
        if not events:
            return []
        older = self.cached(OLDER_MEMO, lambda: older_tables(self.db))  # generations: see state.event_generations
        if self._memo is not None and not self.cached(LEGACY_MEMO, lambda: has_legacy(self.db, older)):
            return claim_scoped(self.db, events, older)
        return claim_any(self.db, events, older)

    # -- clock -------------------------------------------------------------------------

    def now(self) -> datetime | None:
        """The service's event-time now: the latest tick applied on any clock partition."""
        return max(self._clocks().values(), default=None)

    def clocks(self) -> dict[int, datetime]:
        """Each clock partition's last tick (a batch of ticks plays over these, then `set_clocks`)."""
        return dict(self._clocks())

    def _clocks(self) -> dict[int, datetime]:
        return self.cached("clocks", lambda: dict(self.db.execute("SELECT id, now FROM clock").fetchall()))

    def set_clocks(self, ticks: dict[int, datetime]) -> None:
        """Record clock partitions' new last ticks in one statement (their order was checked by the caller)."""
        if ticks:
            # Partitions with a row are updated in place: `INSERT OR REPLACE` of one row cost 0.8 ms against 0.3.
            known = self._clocks()
            rows = [(p, t) for p, t in ticks.items() if p in known]
            updated = self.update_rows("clock", ("id",), ("now",), rows, "now = CAST({now} AS TIMESTAMPTZ)")
            # A row the memo holds and the file lacks would lose its tick: all are written again should one miss.
            new = {p: t for p, t in ticks.items() if p not in known or updated != len(rows)}
            if new:
                self.insert_rows("clock", pa.table({"id": pa.array(list(new), pa.int32()),
                                                    "now": pa.array(list(new.values()), pa.timestamp("us", tz="UTC"))}))
            if self._memo is not None and "clocks" in self._memo:  # as DuckDB reads them back: in UTC, to the us
                self._memo["clocks"].update({p: _in_utc(t) for p, t in ticks.items()})

    # -- counters ----------------------------------------------------------------------

    def bump_many(self, counts: dict[str, int]) -> None:
        """Add to many counters: with the writer's open transaction, in memory (see `Counts`); else in one statement."""
        if self._depth and self._memo is not None:
            self._staged.update({k: v for k, v in counts.items() if v})
        else:
            self._write_counts(counts)

    def write_counts(self) -> None:
        """The writer's pending counts into the file, in a transaction of their own (see `Counts`)."""
        self.counts.write(self.db, self._write_counts)

    def _write_counts(self, counts: dict[str, int]) -> None:
        names = self.cached("counter_names", lambda: {r[0] for r in self.db.execute(
            "SELECT name FROM counters").fetchall()}) if self._memo is not None else None
        try:
            write_counts(counts, names, self.update_rows, self.insert_rows)
        except BaseException:
            self.forget("counter_names")  # names may have been added for rows that are rolled back
            raise

    def counters(self) -> dict[str, int]:
        """Every counter with its value, those not yet written included."""
        return self.counts.read(lambda: self.db.execute("SELECT name, value FROM counters").fetchall(), self._staged)


def _in_utc(instant: datetime) -> datetime:
    """A tick as the clock table gives it back (a naive one is read in the session's UTC)."""
    return instant.replace(tzinfo=timezone.utc) if instant.tzinfo is None else instant.astimezone(timezone.utc)
