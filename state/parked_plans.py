"""The latest `plan-dependencies` record of each plan of the partitions a worker holds, for the day it owns them."""

from __future__ import annotations

import itertools
from typing import Any, Collection, Iterable, Mapping

import orjson
import pyarrow as pa

from schemas.plan_partition import plan_partition
from state.plan_restore import prepare
from state.store import Store

# A take-over must not wait for the network: each worker keeps the records of the partitions it
# holds (owned, and standby copies) in its file, one row per plan key, so a kill -9 of a peer whose
# partition it copies costs a local read; a partition gained without a copy is read from its start.
# Each record is also kept in the shape a restore writes (prepared as it arrives, off the
# take-over's clock), so taking 100,000 plans over is a few SQL statements, not a Python pass.
_DDL = """
CREATE TABLE IF NOT EXISTS parked_plans (plan_key VARCHAR PRIMARY KEY, partition INTEGER, plan_id VARCHAR,
  progress BIGINT, record VARCHAR, live BOOLEAN, valid_until TIMESTAMPTZ, request VARCHAR, plan VARCHAR,
  receipt_id VARCHAR, deps VARCHAR, as_of VARCHAR, compiled_in VARCHAR, unrestorable VARCHAR, superseded VARCHAR,
  receipt VARCHAR, source INTEGER);
"""
# A record's receipt of its own plan (`plan_restore._receipt`), for a file parked before it had a column: read out of
# the record as a restore once read it (ids of another JSON type do not count: their text can equal a string id).
_RECEIPT_OF_RECORD = """
UPDATE parked_plans SET receipt = json_extract(record, '$.receipt')::VARCHAR
WHERE unrestorable IS NULL AND json_extract_string(record, '$.receipt.receipt_id') = receipt_id
  AND json_extract_string(record, '$.receipt.plan_id') = plan_id
  AND json_type(record, '$.receipt.receipt_id') = 'VARCHAR' AND json_type(record, '$.receipt.plan_id') = 'VARCHAR'
"""
SUPERSEDED_KEPT = 8  # plan ids a key's lineage replaced, remembered so that a late copy of one is known
# deps (a JSON array of keys) and as_of (a JSON array of {topic, partition, next_offset}) are
# text, read with from_json on take-over: list columns make each replacement of a parked record
# cost DuckDB 20-30 ms at commit, against 3-8 ms for text (measured).
DEPS_TYPE = '["VARCHAR"]'
AS_OF_TYPE = '[{"topic": "VARCHAR", "partition": "INTEGER", "next_offset": "BIGINT"}]'
_WHEN = pa.timestamp("us", tz="UTC")
IN_LIST = 250  # ids `records_of` gives DuckDB as values (200 of 20,000: 0.06 s against 0.11 s; slower from 1,000)


def progress(record: Mapping[str, Any]) -> int:
    """How far the compiling state had read: the sum of its next offsets (a later compilation reads further)."""
    as_of = record.get("compiled_as_of") or {}
    try:
        return sum(int(o) for by_partition in as_of.values() for o in by_partition.values())
    except (AttributeError, TypeError, ValueError):
        return -1


def succession(held: tuple[str, int, list[str]] | None, record: Mapping[str, Any]) -> tuple[bool, list[str], bool]:
    """Whether `record` replaces the parked (plan id, progress, replaced ids); the replaced ids after; crossed.

    Progress alone cannot order two workers' records: each sums its own replica's offsets, and
    one ahead on an unrelated partition outranks a later compilation by the other. So a record
    naming the parked plan as the one it replaced (and so announced) descends from it and wins,
    and the parked id joins the key's replaced ids; a plan among those is a late copy (a restarted
    worker sends its last second again) and loses. The same plan again, or a record unrelated to
    the parked one (a crossing: the topic compacted the records between them away, or two workers
    owned the key at once), keeps the one read further, as before; a crossing records nothing as
    replaced, since nobody is known to have announced the loser.
    """
    if held is None:
        return True, [], False
    plan_id, rank, replaced = held
    new_id, replaces = record["plan_id"], record.get("replaces")
    if new_id == plan_id:
        return progress(record) >= rank, replaced, False
    if replaces == plan_id:
        return True, _bounded(replaced + [plan_id], new_id), False
    if new_id in replaced:
        return False, replaced, False
    return progress(record) >= rank, [i for i in replaced if i != new_id], isinstance(replaces, str)


def _bounded(ids: list[str], current: str) -> list[str]:
    """The last SUPERSEDED_KEPT distinct ids, oldest first, without the key's current plan id."""
    kept = [i for i in dict.fromkeys(reversed(ids)) if i != current][:SUPERSEDED_KEPT]
    return kept[::-1]


def _as_of(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """compiled_as_of as rows; unreadable offsets count as none read (every recorded change is after them)."""
    try:
        return [{"topic": topic, "partition": int(partition), "next_offset": int(offset)}
                for topic, by_partition in (record.get("compiled_as_of") or {}).items()
                for partition, offset in by_partition.items()]
    except (AttributeError, TypeError, ValueError):
        return []


class ParkedPlans:
    """Plan key -> its latest record on `plan-dependencies` (see `succession`), with its owning partition."""

    def __init__(self, store: Store, partitions: int) -> None:
        self.store = store
        self.db = store.db
        self.partitions = partitions
        self.crossed = 0  # crossings met by `park` since start (see `succession`), for the caller to count
        columns = {c for (c,) in self.db.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = 'parked_plans'").fetchall()}
        if "deps" not in columns:
            # Files parked before records were prepared: park their records again in the new shape,
            # all or nothing (a record lost here is a plan nobody would announce after a kill -9).
            with store.transaction():
                held = [orjson.loads(t) for (t,) in self.db.execute("SELECT record FROM parked_plans").fetchall()] \
                    if columns else []
                self.db.execute("DROP TABLE IF EXISTS parked_plans")
                self.db.execute(_DDL)
                self.park(held, [None] * len(held))
            self.db.execute("CHECKPOINT")  # as the store does: DDL must not wait in the WAL
        elif not {"superseded", "receipt", "source"} <= columns:
            # DuckDB alters no table an index depends on: the index is made again below.
            self.db.execute("DROP INDEX IF EXISTS parked_plans_plan")
            with store.transaction():
                if "superseded" not in columns:  # files parked before records named the plan they replaced
                    self.db.execute("ALTER TABLE parked_plans ADD COLUMN superseded VARCHAR")
                if "receipt" not in columns:  # a restore read each receipt out of its record (5 parses of 4 kB)
                    self.db.execute("ALTER TABLE parked_plans ADD COLUMN receipt VARCHAR")
                    self.db.execute(_RECEIPT_OF_RECORD)
                if "source" not in columns:  # files parked from every partition, before records were placed
                    self.db.execute("ALTER TABLE parked_plans ADD COLUMN source INTEGER")
            self.db.execute("CHECKPOINT")
        # Take-overs, restarts and status reads find parked plans by id (a scan of every parked record
        # otherwise). Created after the migrations above: DuckDB alters no table an index depends on.
        if not self.db.execute("SELECT 1 FROM duckdb_indexes() WHERE index_name = 'parked_plans_plan'").fetchone():
            self.db.execute("CREATE INDEX parked_plans_plan ON parked_plans (plan_id)")
            self.db.execute("CHECKPOINT")

    def park(self, records: Iterable[Mapping[str, Any]], sources: Iterable[int | None] | None = None,
             ) -> dict[str, Mapping[str, Any]]:
        """Keep these records (validated `plan-dependencies` values, in topic order) as `succession` decides;
        `sources`: the partition each was read from (None for one parked before records were placed by entity).
        Without `sources`, each was read from its entity's partition.

        Returns, by plan key, each record that is now its key's parked record.
        """
        by_key: dict[str, list[Mapping[str, Any]]] = {}
        read_from: dict[int, int | None] = {}  # id of a record -> the partition it was read from
        for record, source in zip(records, sources if sources is not None else itertools.repeat(None), strict=False):
            by_key.setdefault(record["plan_key"], []).append(record)
            read_from[id(record)] = source if sources is not None else self.partition_of(record["entity_id"])
        if not by_key:
            return {}
        held: dict[str, tuple[str, int, list[str]]] = {
            key: (plan_id, rank, orjson.loads(superseded) if superseded else [])
            for key, plan_id, rank, superseded in self.db.execute(
                "SELECT plan_key, plan_id, progress, superseded FROM parked_plans "
                "WHERE plan_key IN (SELECT unnest(?::VARCHAR[]))", [list(by_key)]).fetchall()}
        latest: dict[str, tuple[int, Mapping[str, Any], list[str]]] = {}
        for key, candidates in by_key.items():
            current = held.get(key)
            for record in candidates:
                wins, superseded, crossed = succession(current, record)
                self.crossed += crossed
                if wins:
                    current = (record["plan_id"], progress(record), superseded)
                    latest[key] = (current[1], record, superseded)
                elif current is not None:
                    current = (current[0], current[1], superseded)
        if not latest:
            return {}
        columns: dict[str, list] = {name: [] for name in (
            "plan_key", "partition", "plan_id", "progress", "record", "live", "valid_until", "request", "plan",
            "receipt_id", "deps", "as_of", "compiled_in", "unrestorable", "superseded", "receipt", "source")}
        for key, (rank, record, superseded) in latest.items():
            entity_id = record["entity_id"]
            try:
                ready, why = prepare(record, entity_id), None
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                ready, why = None, str(exc) or type(exc).__name__
            deps = record.get("dependencies")
            keys = list(ready.dependencies) if ready else [d for d in deps if isinstance(d, str)] \
                if isinstance(deps, list) else []
            values = (key, plan_partition(entity_id, self.partitions), record["plan_id"], rank,
                      orjson.dumps(record).decode(), ready and ready.live, ready and ready.valid_until,
                      ready and ready.request, ready and ready.plan, ready and ready.receipt_id,
                      orjson.dumps(keys).decode(), orjson.dumps(_as_of(record)).decode(), record.get("compiled_in"),
                      why, orjson.dumps(superseded).decode(),
                      ready.receipt if ready and isinstance(ready.receipt_id, str) else None, read_from[id(record)])
            for column, value in zip(columns.values(), values, strict=True):
                column.append(value)
        types = {"partition": pa.int32(), "progress": pa.int64(), "live": pa.bool_(), "valid_until": _WHEN,
                 "source": pa.int32()}
        rows = pa.table({name: pa.array(values, types.get(name, pa.string())) for name, values in columns.items()})
        # Deleted and written again, not upserted: an upsert replacing 6,000 held records cost DuckDB 14.8 s
        # (11 s of it at commit), a delete and an insert 3.3-4.7 s (measured, batches of 500, single-threaded).
        replaced = [key for key in latest if key in held]
        if replaced:
            self.db.execute("DELETE FROM parked_plans WHERE plan_key IN (SELECT unnest(?::VARCHAR[]))", [replaced])
        self.store.insert_rows("parked_plans", rows, verb="INSERT INTO")
        return {key: record for key, (_, record, _) in latest.items()}

    def forget(self, plan_keys: list[str]) -> None:
        """Drop plan keys whose record was tombstoned (the owner evicted or dropped the plan)."""
        if plan_keys:
            self.db.execute("DELETE FROM parked_plans WHERE plan_key IN (SELECT unnest(?::VARCHAR[]))", [plan_keys])

    def partition_of(self, entity_id: str) -> int:
        """The partition owning plans about this canonical entity id."""
        return plan_partition(entity_id, self.partitions)

    def drop(self, partitions: Collection[int]) -> int:
        """Forget the plans of partitions this worker no longer holds (inside the caller's transaction).

        Records not read from their entity's partition stay (parked before records were placed by
        entity, or read where their keys hashed): on a broker that kept its topics they may lie on a
        partition the holders of their own do not read, until an owner places them (`unplaced`).
        """
        if not partitions:
            return 0
        return self.db.execute("DELETE FROM parked_plans WHERE partition IN (SELECT unnest(?::INTEGER[])) "
                               "AND source = partition", [sorted(partitions)]).fetchone()[0]

    def unplaced(self, partitions: Collection[int]) -> list[tuple[str, int, str]]:
        """(plan key, partition, record) of these partitions' records not read from their entity's partition."""
        if not partitions:
            return []
        return self.db.execute("SELECT plan_key, partition, record FROM parked_plans "
                               "WHERE source IS DISTINCT FROM partition "
                               "AND partition IN (SELECT unnest(?::INTEGER[]))", [sorted(partitions)]).fetchall()

    def sources(self) -> set[int]:
        """The partitions of `plan-dependencies` the parked records were read from."""
        return {r[0] for r in self.db.execute(
            "SELECT DISTINCT source FROM parked_plans WHERE source IS NOT NULL").fetchall()}

    def placed(self, partitions: Collection[int]) -> list[tuple[str, int, str]]:
        """(plan key, partition, record) of the records read from these partitions of `plan-dependencies`."""
        if not partitions:
            return []
        return self.db.execute("SELECT plan_key, partition, record FROM parked_plans "
                               "WHERE source IN (SELECT unnest(?::INTEGER[]))", [sorted(partitions)]).fetchall()

    def published(self, partitions: Collection[int]) -> None:
        """The records read from these partitions were queued again, each on its entity's partition: read from there."""
        self.db.execute("UPDATE parked_plans SET source = partition WHERE source IN (SELECT unnest(?::INTEGER[]))",
                        [sorted(partitions)])

    def records(self, partitions: Collection[int]) -> list[dict[str, Any]]:
        """The parked records of plans owned by these partitions."""
        if not partitions:
            return []
        rows = self.db.execute("SELECT record FROM parked_plans WHERE partition IN (SELECT unnest(?::INTEGER[]))",
                               [sorted(partitions)]).fetchall()
        return [orjson.loads(text) for (text,) in rows]

    def records_of(self, plan_ids: list[str]) -> list[tuple[dict[str, Any], bool]]:
        """The parked records with these plan ids, each with whether it is restorable."""
        if not plan_ids:
            return []
        if len(plan_ids) <= IN_LIST:  # a list of values is looked up in `parked_plans_plan`; a subquery scans records
            rows = self.db.execute("SELECT record, unrestorable IS NULL FROM parked_plans WHERE plan_id IN "
                                   f"({', '.join('?' * len(plan_ids))})", plan_ids).fetchall()
        else:
            rows = self.db.execute("SELECT record, unrestorable IS NULL FROM parked_plans "
                                   "WHERE plan_id IN (SELECT unnest(?::VARCHAR[]))", [plan_ids]).fetchall()
        return [(orjson.loads(text), ok) for text, ok in rows]

    def unknown(self, partitions: Collection[int]) -> list[tuple[str, str, bool]]:
        """(plan id, plan key, restorable) of the parked plans of these partitions whose ids the file never stored.

        Ids, not records: a restart finds thousands of them and restores them where they lie.
        """
        if not partitions:
            return []
        return self.db.execute("SELECT plan_id, plan_key, unrestorable IS NULL FROM parked_plans "
                               "WHERE partition IN (SELECT unnest(?::INTEGER[])) "
                               "AND plan_id NOT IN (SELECT plan_id FROM plans)", [sorted(partitions)]).fetchall()

    def size(self) -> int:
        """Parked plan keys."""
        return self.db.execute("SELECT count(*) FROM parked_plans").fetchone()[0]
