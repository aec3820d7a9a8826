"""Retention: evict plans nobody selects, expire old plan rows, receipts and event ids, in bounded passes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Iterable

import orjson
import pyarrow as pa

from compiler import dependency_keys as dk
from schemas.outbound import Cause
from schemas.plan_partition import plan_partition
from schemas.timefmt import format_instant
from state import event_generations
from state.dependency_index import EDGES_MEMO, WRITTEN_MEMO
from state.event_generations import Pruned
from state.invalidations import Invalidation
from state.outbox import Outbox
from state.store import Store

_DDL = """
CREATE TABLE IF NOT EXISTS plan_selected (plan_key VARCHAR PRIMARY KEY, selected_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS evicted_plans (plan_id VARCHAR PRIMARY KEY, plan_key VARCHAR, evicted_at TIMESTAMPTZ,
  cause VARCHAR);
"""

EVICTION_KEY = dk.EVICTION
"""The `dependency_key` of an eviction's cause: no input changed, the plan went unused."""


@dataclass(frozen=True)
class RetentionPolicy:
    """How long unused plans, old plan rows and receipts are kept, in event time."""

    plan_span: timedelta = timedelta(days=30)
    """A plan key not selected for this long is evicted; invalidated plan rows are kept this long."""
    receipt_span: timedelta = timedelta(days=400)
    """Receipts are deleted from DuckDB this long after they were stored (the `receipts` topic keeps them)."""
    batch: int = 1000
    """Most plan keys, plan rows and receipts one pass removes, each."""
    event_id_span: timedelta = timedelta(days=7)
    """Event ids are remembered at least this long after their first claim, at most twice it (`event_generations`)."""


@dataclass(frozen=True)
class PassResult:
    """What one retention pass removed."""

    evicted: list[tuple[str, str]] = field(default_factory=list)
    """(plan key, plan id) of each evicted plan, announced on the outbox."""
    plan_rows_expired: int = 0
    """Rows of invalidated (superseded or evicted) plans deleted."""
    receipts_expired: int = 0
    """Receipts deleted."""
    event_ids: Pruned = Pruned()
    """Event-id generations dropped (with the ids they held) and whether a new one opened."""

    def counts(self) -> dict[str, int]:
        """Counters for `Store.bump_many`."""
        return {"plans_evicted": len(self.evicted), "plan_rows_expired": self.plan_rows_expired,
                "receipts_expired": self.receipts_expired, "event_ids_expired": self.event_ids.ids_dropped,
                "event_id_generations_dropped": self.event_ids.generations_dropped}


def dependency_place(entity_id: str | None, partitions: int | None) -> int | None:
    """Where a plan key's `plan-dependencies` tombstone goes: its entity's partition, where its records go.

    Not also where the key hashes, where records published before they were placed by entity may
    still lie: the feed cannot order a tombstone there against a record on the entity's partition,
    and would drop a plan compiled again after its eviction. Such a record, parked again, is judged
    against the changes since it was compiled before any use, as every taken-over record is.
    """
    return None if partitions is None or entity_id is None else plan_partition(entity_id, partitions)


@dataclass(frozen=True)
class Topics:
    """Broker-side names the eviction records go to."""

    invalidations: str
    """`plan-invalidations`: the `evicted` announcement."""
    plans: str
    """`plans`: a tombstone, so peers and compacted readers drop the plan too."""
    clock: str
    """`clock`: named in the cause, since event time is what expired the plan."""
    dependencies: str | None = None
    """`plan-dependencies`: a tombstone for the plan key, so no later owner takes the plan over."""
    partitions: int | None = None
    """Partitions `plan-dependencies` records are placed by (their entity's); None: the producer's partitioner."""


class Retention:
    """Pure state operations of the retention policy; the worker's timer calls `run_pass`.

    Selects stamp plan keys in memory (the read path writes nothing); a pass writes those
    stamps, then removes what the policy says is due, all in the caller's transaction so that
    the announcements enter the outbox with the deletions they describe.
    """

    def __init__(self, store: Store, outbox: Outbox, ensure_schema: bool = True) -> None:
        self.store = store
        self.db = store.db
        self.outbox = outbox
        if ensure_schema:  # readers beside the writer must not checkpoint: the writer's connection did it
            self._ensure_schema()

    def _ensure_schema(self) -> None:
        self.db.execute(_DDL)
        columns = {r[0] for r in self.db.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = 'receipts'").fetchall()}
        if "stored_at" not in columns:
            # Files before retention: their receipts are stamped by the first pass.
            self.db.execute("ALTER TABLE receipts ADD COLUMN stored_at TIMESTAMPTZ")
        self.db.execute("CHECKPOINT")  # see Store.__init__: DDL must not wait in the WAL

    # -- stamps ------------------------------------------------------------------------

    def stamp(self, plan_keys: Iterable[str], at: datetime) -> None:
        """Record that these plan keys were selected at event time `at` (stamps only move forward).

        Only keys with a current plan are stamped: a select that failed leaves nothing behind.
        """
        keys = sorted(set(plan_keys))
        if not keys:
            return
        stamps = pa.array([at] * len(keys), pa.timestamp("us", tz="UTC"))
        rows = pa.table({"plan_key": keys, "selected_at": stamps})
        self.db.register("_stamps", rows)
        try:
            self.db.execute("INSERT INTO plan_selected SELECT s.plan_key, s.selected_at FROM _stamps s "
                            "SEMI JOIN plan_heads h USING (plan_key) ON CONFLICT (plan_key) DO UPDATE SET "
                            "selected_at = greatest(plan_selected.selected_at, excluded.selected_at)")
        finally:
            self.db.unregister("_stamps")

    def _stamp_unstamped(self, now: datetime) -> None:
        """Heads, plan rows and receipts with no time yet count from `now` (adopted, or stored before a tick).

        Stamps of keys whose plan was dropped (it can no longer compile) go with it.
        """
        self.db.execute("DELETE FROM plan_selected WHERE plan_key IN (SELECT s.plan_key FROM plan_selected s "
                        "ANTI JOIN plan_heads h USING (plan_key))")
        self.db.execute("INSERT INTO plan_selected SELECT h.plan_key, ? FROM plan_heads h "
                        "ANTI JOIN plan_selected s USING (plan_key)", [now])
        self.db.execute("UPDATE receipts SET stored_at = ? WHERE stored_at IS NULL", [now])
        self.db.execute("UPDATE plans SET invalidated_at = ? WHERE status = 'invalidated' AND invalidated_at IS NULL "
                        "AND compiled_at IS NULL", [now])

    def last_selected(self, plan_key: str) -> datetime | None:
        """The event time a plan key was last selected (or first seen), if stamped."""
        row = self.db.execute("SELECT selected_at FROM plan_selected WHERE plan_key = ?", [plan_key]).fetchone()
        return row[0] if row else None

    # -- the pass ----------------------------------------------------------------------

    def run_pass(self, now: datetime, policy: RetentionPolicy, selected: Iterable[str], topics: Topics,
                 invalidated_at: str) -> PassResult:
        """Stamp `selected`, then evict, expire and announce what is due at event time `now`.

        `invalidated_at` is the wall-clock stamp of the announcements (latency is measured
        against wall time, as for every other invalidation).
        """
        self.stamp(selected, now)
        self._stamp_unstamped(now)
        evicted = self._evict(now, now - policy.plan_span, policy.batch, topics, invalidated_at)
        rows = self._expire_plan_rows(now - policy.plan_span, policy.batch)
        receipts = self._expire_receipts(now - policy.receipt_span, policy.batch)
        event_ids = event_generations.prune(self.db, now, policy.event_id_span)
        if event_ids.generations_dropped or event_ids.opened:
            self.store.forget(event_generations.OLDER_MEMO, event_generations.LEGACY_MEMO)
        result = PassResult(evicted, rows, receipts, event_ids)
        self.store.bump_many(result.counts())
        return result

    def _evict(self, now: datetime, cutoff: datetime, limit: int, topics: Topics,
               invalidated_at: str) -> list[tuple[str, str]]:
        due = self.db.execute("SELECT h.plan_key, h.plan_id, json_extract_string(p.plan, '$.entity_id') "
                              "FROM plan_heads h JOIN plan_selected s USING (plan_key) "
                              "LEFT JOIN plans p ON p.plan_id = h.plan_id "
                              "WHERE s.selected_at < ? ORDER BY s.selected_at, h.plan_key LIMIT ?",
                              [cutoff, limit]).fetchall()
        if not due:
            return []
        cause = self._cause(now, topics.clock)
        as_of = format_instant(now)
        rows: list[tuple[str, bytes | None, bytes | None]] = []
        places: list[int | None] = []
        for plan_key, plan_id, entity_id in due:
            announced = Invalidation(plan_id, plan_key, "evicted", cause, invalidated_at, as_of).rows(
                topics.invalidations)
            rows.extend(announced + [(topics.plans, plan_id.encode(), None)])
            places += [None] * (len(announced) + 1)
            if topics.dependencies:
                rows.append((topics.dependencies, plan_key.encode(), None))
                places.append(dependency_place(entity_id, topics.partitions))
        due = [(plan_key, plan_id) for plan_key, plan_id, _ in due]
        self._forget(due, now, cause)
        self.outbox.add_many(rows, partitions=places)
        return due

    def _cause(self, now: datetime, clock_topic: str) -> dict:
        """The clock position whose tick made `now`: the event time that expired the plans."""
        row = self.db.execute("SELECT c.id, o.next_offset FROM clock c LEFT JOIN offsets o ON o.topic = 'clock' "
                              "AND o.partition = c.id ORDER BY c.now DESC, c.id LIMIT 1").fetchone()
        partition, offset = (row[0], (row[1] or 0) - 1) if row else (None, None)
        return Cause(clock_topic, f"retention-{format_instant(now)}", partition, offset, EVICTION_KEY).as_wire()

    def _forget(self, due: list[tuple[str, str]], now: datetime, cause: dict) -> None:
        """Remove evicted keys' heads, plan rows, edges, queue entries and stamps; remember the ids."""
        keys = [k for k, _ in due]
        ids = [p for _, p in due]
        self.store.heads.remove_keys(keys)
        self.store.insert_rows("evicted_plans", pa.table({
            "plan_id": ids, "plan_key": keys, "evicted_at": pa.array([now] * len(ids), pa.timestamp("us", tz="UTC")),
            "cause": [orjson.dumps(cause).decode()] * len(ids)}))
        for table, column, values in (("plan_heads", "plan_key", keys), ("plans", "plan_id", ids),
                                      ("plan_history", "plan_id", ids),
                                      ("dependency_index", "plan_key", keys), ("recompile_queue", "plan_key", keys),
                                      ("plan_selected", "plan_key", keys)):
            self.db.execute(f"DELETE FROM {table} WHERE {column} IN (SELECT unnest(?))", [values])
        self.store.forget(EDGES_MEMO, WRITTEN_MEMO)  # the writer's remembered edges still name these plan keys
        self.store.heads_changed()

    def _expire_plan_rows(self, cutoff: datetime, limit: int) -> int:
        """Delete invalidated plan rows (never a key's head) and eviction markers older than `cutoff`."""
        gone = self.db.execute(
            "DELETE FROM plans WHERE plan_id IN (SELECT p.plan_id FROM plans p ANTI JOIN plan_heads h USING (plan_id) "
            "WHERE p.status = 'invalidated' AND coalesce(p.invalidated_at, p.compiled_at) < ? "
            "ORDER BY coalesce(p.invalidated_at, p.compiled_at) LIMIT ?)", [cutoff, limit]).fetchone()[0]
        if gone:
            self.db.execute("DELETE FROM plan_history WHERE plan_id IN (SELECT h.plan_id FROM plan_history h "
                            "ANTI JOIN plans p USING (plan_id))")
        gone += self.db.execute("DELETE FROM evicted_plans WHERE plan_id IN (SELECT plan_id FROM evicted_plans "
                                "WHERE evicted_at < ? ORDER BY evicted_at LIMIT ?)", [cutoff, limit]).fetchone()[0]
        return gone

    def _expire_receipts(self, cutoff: datetime, limit: int) -> int:
        return self.db.execute("DELETE FROM receipts WHERE receipt_id IN (SELECT receipt_id FROM receipts "
                               "WHERE stored_at < ? ORDER BY stored_at LIMIT ?)", [cutoff, limit]).fetchone()[0]

    # -- status ------------------------------------------------------------------------

    def evicted_status(self, plan_id: str) -> dict | None:
        """GET /v1/plans/{id} of an evicted plan: invalidated, reason `evicted` (until the marker expires)."""
        row = self.db.execute("SELECT cause FROM evicted_plans WHERE plan_id = ?", [plan_id]).fetchone()
        if row is None:
            return None
        return {"plan_id": plan_id, "status": "invalidated", "reason": "evicted", "cause": orjson.loads(row[0]),
                "successor_plan_id": None}

    def sizes(self) -> dict[str, int]:
        """Stamped plan keys, eviction markers and event-id generations held."""
        return {"stamped_keys": self.db.execute("SELECT count(*) FROM plan_selected").fetchone()[0],
                "evicted_markers": self.db.execute("SELECT count(*) FROM evicted_plans").fetchone()[0],
                **event_generations.sizes(self.db)}
