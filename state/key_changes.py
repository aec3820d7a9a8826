"""Where each dependency key last changed, and which plans that makes stale, judged without recompiling."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

import orjson
import pyarrow as pa

from state.parked_plans import AS_OF_TYPE, DEPS_TYPE
from state.store import Store

# A key can change on several partitions (a scope key gets resources keyed by their own ids),
# and compiled_as_of is per partition, so the last change is kept per (key, topic, partition).
# key_changes_from says from which offset on a partition's changes are all recorded: a file
# written before this table existed knows nothing of earlier changes.
_DDL = """
CREATE TABLE IF NOT EXISTS key_changes (change_key VARCHAR PRIMARY KEY, dep_key VARCHAR, topic VARCHAR,
  partition INTEGER, change_offset BIGINT, event_id VARCHAR);
CREATE TABLE IF NOT EXISTS key_changes_from (topic VARCHAR, partition INTEGER, from_offset BIGINT,
  PRIMARY KEY (topic, partition));
"""
# One column keys a row (see `change_key`): DuckDB (1.5) finds the rows of a composite key by
# scanning the table, and the apply path upserts changed keys in every batch (11 ms for a batch
# of 8 keys with 200,000 recorded, against under 2 ms on one column at any size).
_KEYED = ("CREATE TABLE key_changes_keyed (change_key VARCHAR PRIMARY KEY, dep_key VARCHAR, topic VARCHAR, "
          "partition INTEGER, change_offset BIGINT, event_id VARCHAR); "
          "INSERT INTO key_changes_keyed SELECT topic || chr(31) || partition || chr(31) || dep_key, dep_key, topic, "
          "partition, change_offset, event_id FROM key_changes; "
          "DROP TABLE key_changes; ALTER TABLE key_changes_keyed RENAME TO key_changes")


def change_key(dep_key: str, topic: str, partition: int) -> str:
    """The one-column key of a key's changes on a partition (topic and partition hold no separator: unique)."""
    return f"{topic}\x1f{partition}\x1f{dep_key}"


# Change keys the writer wrote (so their rows exist): a batch of only those is an update, not an
# upsert. Only `forget` deletes rows, and it drops the set; so does a rollback (`Store.forget`).
STORED_MEMO = "key_changes.stored"
STORED_ENTRIES = 50_000  # keys remembered before the set starts over (a miss only costs the upsert)
UPDATE_KEYS = 32  # keys one update joins; past it, on a big table, the upsert's index lookups are cheaper

TIME_PREFIX = "time:"

Position = tuple[str, int, int]
"""(topic, partition, offset) of an input event, topic named as in `Store.save_offsets`."""


@dataclass(frozen=True)
class Staleness:
    """Why a plan is stale: the first reason found, usable as an invalidation's cause."""

    dependency_key: str
    """The key that changed: `time:<instant>` for a passed horizon, else `incarnation:`, `dependencies:` or
    `offsets:<topic>/<partition>` when the record cannot be judged."""
    topic: str | None
    """Topic of the event that last changed the key; None when no event is to blame."""
    partition: int | None
    """Its partition."""
    offset: int | None
    """Its offset (at or after the plan's compiled_as_of for that partition)."""
    event_id: str | None = None
    """The event id of that change, as subscribers correlate causes by it (None when not recorded)."""


@dataclass(frozen=True)
class PlanPosition:
    """What staleness is judged from: a `plans` record's id, dependency keys and compiled_as_of."""

    plan_id: str
    """The plan id."""
    dependencies: Sequence[str]
    """Its dependency keys."""
    compiled_as_of: Mapping[str, Mapping[Any, int]]
    """Topic -> partition (int, or str as on the wire) -> next offset the compiling state had applied."""
    compiled_in: str | None = None
    """Cluster id those offsets belong to."""

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> "PlanPosition":
        """From a `plans` record (a dict as published)."""
        return cls(record["plan_id"], tuple(record.get("dependencies") or ()), record.get("compiled_as_of") or {},
                   record.get("compiled_in"))


class KeyChanges:
    """The last change position of every dependency key, written by the apply path in its transaction."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.db = store.db
        if not self.db.execute("SELECT 1 FROM duckdb_tables() WHERE table_name = 'key_changes'").fetchone():
            with store.transaction():
                self.db.execute(_DDL)
                # A file that already applied events did so without recording what they changed.
                self.db.execute("INSERT INTO key_changes_from SELECT topic, partition, next_offset FROM offsets "
                                "WHERE next_offset > 0")
            self.db.execute("CHECKPOINT")  # as the store does: DDL must not wait in the WAL
            return
        columns = {r[0] for r in self.db.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = 'key_changes'").fetchall()}
        if "change_key" in columns:
            return
        with store.transaction():
            if "event_id" not in columns:  # files of 2026-11-30 morning
                self.db.execute("ALTER TABLE key_changes ADD COLUMN event_id VARCHAR")
            self.db.execute(_KEYED)
        self.db.execute("CHECKPOINT")

    def record(self, keys_by_position: Mapping[Position, Iterable[str]],
               event_ids: Mapping[Position, str] | None = None) -> None:
        """Record that the event at each position (with its event id, if given) changed these keys, in one statement."""
        latest: dict[tuple[str, str, int], int] = {}
        for (topic, partition, offset), keys in keys_by_position.items():
            for key in keys:
                at = (key, topic, partition)
                if latest.get(at, -1) < offset:
                    latest[at] = offset
        if not latest:
            return
        ids = event_ids or {}
        keys = [change_key(k, t, p) for k, t, p in latest]
        stored = self.store.cached(STORED_MEMO, set)
        if len(keys) <= UPDATE_KEYS and stored.issuperset(keys):
            self._update(keys, list(latest.values()), [ids.get((t, p, o)) for (_, t, p), o in latest.items()])
            return
        rows = pa.table({"change_key": keys,
                         "dep_key": [k for k, _, _ in latest], "topic": [t for _, t, _ in latest],
                         "partition": pa.array([p for _, _, p in latest], pa.int32()),
                         "change_offset": pa.array(list(latest.values()), pa.int64()),
                         "event_id": pa.array([ids.get((t, p, o)) for (_, t, p), o in latest.items()], pa.string())})
        self.store.insert_rows("key_changes", rows, verb="INSERT INTO", on_conflict=(
            "ON CONFLICT (change_key) DO UPDATE SET "
            "event_id = CASE WHEN excluded.change_offset >= key_changes.change_offset THEN excluded.event_id "
            "ELSE key_changes.event_id END, "
            "change_offset = greatest(key_changes.change_offset, excluded.change_offset)"), columns=True)
        if len(stored) + len(keys) > STORED_ENTRIES:
            stored.clear()
        stored.update(keys)

    def _update(self, keys: list[str], offsets: list[int], event_ids: list[str | None]) -> None:
        """`record` of keys the writer knows to have rows: an update in place costs half the upsert (2.4 vs 4.1 ms
        for 3 keys, 1.0 ms for one, at any table size)."""
        later = "CASE WHEN {o} >= change_offset THEN {e} ELSE event_id END"
        if len(keys) == 1:  # an equality finds the row by its key
            self.db.execute(f"UPDATE key_changes SET event_id = {later.format(o='$1', e='$2')}, "
                            "change_offset = greatest(change_offset, $1) WHERE change_key = $3",
                            [offsets[0], event_ids[0], keys[0]])
            return
        self.db.execute(f"UPDATE key_changes SET event_id = {later.format(o='v.o', e='v.e')}, "
                        "change_offset = greatest(change_offset, v.o) FROM (SELECT unnest($1::VARCHAR[]) AS c, "
                        "unnest($2::BIGINT[]) AS o, unnest($3::VARCHAR[]) AS e) v WHERE change_key = v.c",
                        [keys, offsets, event_ids])

    def forget(self, topics: list[str]) -> None:
        """Drop the changes recorded on these topics (their offsets belonged to another incarnation)."""
        self.store.forget(STORED_MEMO)
        for table in ("key_changes", "key_changes_from"):
            self.db.execute(f"DELETE FROM {table} WHERE topic IN (SELECT unnest(?))", [topics])

    def last_change(self, dep_key: str) -> dict[tuple[str, int], int]:
        """(topic, partition) -> offset of the key's last recorded change there."""
        return {(t, p): o for t, p, o in self.db.execute(
            "SELECT topic, partition, change_offset FROM key_changes WHERE dep_key = ?", [dep_key]).fetchall()}

    def stale_plans(self, plans: Sequence[PlanPosition], now: datetime | None,
                    cluster_id: str | None) -> dict[str, Staleness]:
        """The stale ones among these plans, in one query, each with one reason.

        Stale: a dependency key changed at an offset at or after the plan's compiled_as_of for
        that partition (a partition missing there counts as offset 0); a `time:` key at or
        before `now` (or unreadable, or `now` unknown); offsets of another broker incarnation
        than `cluster_id`; no dependency keys at all (every compilation has some, so the record
        does not carry them); or offsets older than the first change this file recorded there.
        """
        if not plans:
            return {}
        plan_ids, as_of_ids, foreign, unknown, deps = [], [], [], [], []
        as_of_rows: dict[bytes, int] = {}
        topics, parts, nexts, ids = [], [], [], []
        for p in plans:
            text = orjson.dumps(p.compiled_as_of, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SORT_KEYS)
            as_of_id = as_of_rows.get(text)
            if as_of_id is None:
                as_of_id = as_of_rows[text] = len(as_of_rows)
                for topic, by_partition in p.compiled_as_of.items():
                    for partition, nxt in by_partition.items():
                        topics.append(topic)
                        parts.append(int(partition))
                        nexts.append(int(nxt))
                        ids.append(as_of_id)
            plan_ids.append(p.plan_id)
            as_of_ids.append(as_of_id)
            foreign.append(cluster_id is None or p.compiled_in != cluster_id)
            unknown.append(not p.dependencies)
            deps.append(list(p.dependencies))
        tables = {
            "_kc_plans": pa.table({"plan_id": plan_ids, "as_of_id": pa.array(as_of_ids, pa.int32()),
                                   "foreign_offsets": pa.array(foreign, pa.bool_()),
                                   "no_keys": pa.array(unknown, pa.bool_()),
                                   "deps": pa.array(deps, pa.list_(pa.string()))}),
            "_kc_as_of": pa.table({"as_of_id": pa.array(ids, pa.int32()), "topic": pa.array(topics, pa.string()),
                                   "partition": pa.array(parts, pa.int32()),
                                   "next_offset": pa.array(nexts, pa.int64())}),
        }
        for name, table in tables.items():
            self.db.register(name, table)
        try:
            rows = self.db.execute("WITH " + _STALE_SQL, [now]).fetchall()
        finally:
            for name in tables:
                self.db.unregister(name)
        return {plan_id: Staleness(key, topic, partition, offset, event_id)
                for plan_id, key, topic, partition, offset, event_id in rows}

    def stale_parked(self, partitions: Sequence[int], now: datetime | None, cluster_id: str | None,
                     plan_ids: Sequence[str] | None = None) -> dict[str, Staleness]:
        """`stale_plans` of the parked plans (`ParkedPlans`) of these partitions, judged in SQL where they lie.

        With `plan_ids`, only the parked plans with those ids are judged.
        """
        if not partitions or plan_ids is not None and not plan_ids:
            return {}
        parked = "parked_plans WHERE partition IN (SELECT unnest($3::INTEGER[]))"
        if plan_ids is not None:
            parked += " AND plan_id IN (SELECT plan_id FROM _stale_ids)"
            self.db.register("_stale_ids", pa.table({"plan_id": pa.array(list(plan_ids), pa.string())}))
        try:
            rows = self.db.execute("WITH " + _PARKED_SQL.replace("{parked}", parked) + ", " + _STALE_SQL,
                                   [now, cluster_id, sorted(partitions)]).fetchall()
        finally:
            if plan_ids is not None:
                self.db.unregister("_stale_ids")
        return {plan_id: Staleness(key, topic, partition, offset, event_id)
                for plan_id, key, topic, partition, offset, event_id in rows}


# One row per stale plan. Reasons in order of preference: the event that changed a key (a real
# cause to name), a passed time horizon, then the two "cannot tell" cases, which deny. The plans and
# their keys are materialized: each is read by several branches, and a restart's 20,000 parked plans
# were otherwise parsed from JSON and unnested once a branch (0.8 s against 0.6 s, measured).
_STALE_SQL = """
d AS MATERIALIZED (SELECT plan_id, as_of_id, unnest(deps) AS dep_key FROM _kc_plans WHERE NOT foreign_offsets),
changed AS (
  SELECT d.plan_id, d.dep_key, k.topic, k.partition, k.change_offset AS "offset", 0 AS rank, k.event_id
  FROM d JOIN key_changes k ON k.dep_key = d.dep_key
  LEFT JOIN _kc_as_of a ON a.as_of_id = d.as_of_id AND a.topic = k.topic AND a.partition = k.partition
  WHERE k.change_offset >= coalesce(a.next_offset, 0)),
timed AS (
  SELECT plan_id, dep_key, NULL, NULL, NULL, 1, NULL FROM d
  WHERE starts_with(dep_key, 'time:')
    AND coalesce(try_cast(substr(dep_key, 6) AS TIMESTAMPTZ) <= $1::TIMESTAMPTZ, true)),
foreign_plans AS (SELECT plan_id, 'incarnation:', NULL, NULL, NULL, 2, NULL FROM _kc_plans WHERE foreign_offsets
                  UNION ALL SELECT plan_id, 'dependencies:', NULL, NULL, NULL, 2, NULL FROM _kc_plans WHERE no_keys),
unrecorded AS (
  SELECT p.plan_id, 'offsets:' || c.topic || '/' || c.partition, c.topic, c.partition, c.from_offset, 3, NULL
  FROM _kc_plans p CROSS JOIN key_changes_from c
  LEFT JOIN _kc_as_of a ON a.as_of_id = p.as_of_id AND a.topic = c.topic AND a.partition = c.partition
  WHERE NOT p.foreign_offsets AND coalesce(a.next_offset, 0) < c.from_offset),
every AS (SELECT * FROM changed UNION ALL SELECT * FROM timed UNION ALL SELECT * FROM foreign_plans
          UNION ALL SELECT * FROM unrecorded)
SELECT plan_id, dep_key, topic, partition, "offset", event_id FROM every
QUALIFY row_number() OVER (PARTITION BY plan_id ORDER BY rank, dep_key, "offset" DESC) = 1
"""

# The two inputs of _STALE_SQL over parked plans: each plan's key is its as_of id.
# {parked} is the parked rows judged: "parked_plans WHERE ..." (the partitions are $3).
_PARKED_SQL = f"""
_kc_plans AS MATERIALIZED (
  SELECT plan_id, plan_key AS as_of_id, $2::VARCHAR IS NULL OR compiled_in IS DISTINCT FROM $2 AS foreign_offsets,
         coalesce(len(deps), 0) = 0 AS no_keys, deps
  FROM (SELECT plan_id, plan_key, compiled_in, from_json(deps, '{DEPS_TYPE}') AS deps
        FROM {{parked}})),
_kc_as_of AS (
  SELECT as_of_id, a['topic'] AS topic, a['partition'] AS partition, a['next_offset'] AS next_offset
  FROM (SELECT plan_key AS as_of_id, unnest(from_json(as_of, '{AS_OF_TYPE}')) AS a
        FROM {{parked}}))
"""
