"""Every plan's latest `plan-dependencies` record, kept by every worker for the day it owns the plan's partition."""

from __future__ import annotations

from typing import Any, Collection, Iterable, Mapping

import orjson
import pyarrow as pa

from schemas.plan_partition import plan_partition
from state.store import Store

# A take-over must not wait for the network: each worker keeps the whole compacted topic in
# its file (one row per plan key), so a kill -9 of a peer costs a local read, not a replay.
_DDL = """
CREATE TABLE IF NOT EXISTS parked_plans (plan_key VARCHAR PRIMARY KEY, partition INTEGER, plan_id VARCHAR,
  progress BIGINT, record VARCHAR);
"""


def progress(record: Mapping[str, Any]) -> int:
    """How far the compiling state had read: the sum of its next offsets (a later compilation reads further)."""
    as_of = record.get("compiled_as_of") or {}
    try:
        return sum(int(o) for by_partition in as_of.values() for o in by_partition.values())
    except (AttributeError, TypeError, ValueError):
        return -1


class ParkedPlans:
    """Plan key -> the most advanced record of it seen on `plan-dependencies`, with its owning partition."""

    def __init__(self, store: Store, partitions: int) -> None:
        self.store = store
        self.db = store.db
        self.partitions = partitions
        if not self.db.execute("SELECT 1 FROM duckdb_tables() WHERE table_name = 'parked_plans'").fetchone():
            self.db.execute(_DDL)
            self.db.execute("CHECKPOINT")  # as the store does: DDL must not wait in the WAL

    def park(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Keep these records (validated `plan-dependencies` values) unless a more advanced one is held."""
        latest: dict[str, tuple[int, int, str, str]] = {}
        for record in records:
            rank = progress(record)
            held = latest.get(record["plan_key"])
            if held is None or rank >= held[0]:
                latest[record["plan_key"]] = (rank, plan_partition(record["entity_id"], self.partitions),
                                              record["plan_id"], orjson.dumps(record).decode())
        if not latest:
            return
        rows = pa.table({"plan_key": list(latest), "partition": pa.array([v[1] for v in latest.values()], pa.int32()),
                         "plan_id": [v[2] for v in latest.values()],
                         "progress": pa.array([v[0] for v in latest.values()], pa.int64()),
                         "record": [v[3] for v in latest.values()]})
        self.store.insert_rows("parked_plans", rows, verb="INSERT INTO", on_conflict=(
            "ON CONFLICT (plan_key) DO UPDATE SET partition = excluded.partition, plan_id = excluded.plan_id, "
            "progress = excluded.progress, record = excluded.record "
            "WHERE excluded.progress >= parked_plans.progress"))

    def forget(self, plan_keys: list[str]) -> None:
        """Drop plan keys whose record was tombstoned (the owner evicted or dropped the plan)."""
        if plan_keys:
            self.db.execute("DELETE FROM parked_plans WHERE plan_key IN (SELECT unnest(?::VARCHAR[]))", [plan_keys])

    def records(self, partitions: Collection[int]) -> list[dict[str, Any]]:
        """The parked records of plans owned by these partitions."""
        if not partitions:
            return []
        rows = self.db.execute("SELECT record FROM parked_plans WHERE partition IN (SELECT unnest(?::INTEGER[]))",
                               [sorted(partitions)]).fetchall()
        return [orjson.loads(text) for (text,) in rows]

    def keys_of(self, partitions: Collection[int]) -> list[str]:
        """Plan keys owned by these partitions."""
        if not partitions:
            return []
        return [k for (k,) in self.db.execute(
            "SELECT plan_key FROM parked_plans WHERE partition IN (SELECT unnest(?::INTEGER[]))",
            [sorted(partitions)]).fetchall()]

    def size(self) -> int:
        """Parked plan keys."""
        return self.db.execute("SELECT count(*) FROM parked_plans").fetchone()[0]
