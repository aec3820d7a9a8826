"""The dependency index: input key -> plan keys whose current plan depends on it."""

from __future__ import annotations

from datetime import datetime
from typing import Iterable

import duckdb
import pyarrow as pa

from compiler import dependency_keys as dk
from state.store import Store


# DuckDB uses dependency_index_key for a lookup of up to about 50 keys and scans the table
# beyond: at 4M edges, 100 keys took 90-440 ms in one query against 20 ms in chunks of 32
# (0.2 ms a key), each chunk a branch of one UNION ALL. From SCAN_FROM keys on one scan is as
# cheap as the chunks.
LOOKUP_CHUNK = 32
SCAN_FROM = 500
LIST_INSERT = 5_000  # edges written from list parameters; more through an Arrow scan
# Dependency keys the writer looked up and found no edge for (a resource no plan reads, edited
# again): a batch of them needs no lookup. Only the writer adds edges, and each of its writes
# that does drops the keys it adds (or the whole set); a rollback drops it (`Store.forget`).
EDGELESS_MEMO = "index.edgeless"
EDGELESS_ENTRIES = 20_000  # keys remembered before the set starts over (a miss only costs a lookup)

_DIFF = "_edge_diff"  # the edges to delete (by rowid) and to insert, for one statement each


def replace_edges(store: Store, plan_keys: str, edges: str, params: list | None = None) -> None:
    """Make the edges of the plan keys `plan_keys` selects exactly the (dep_key, plan_key) rows `edges` selects.

    Only the difference is written: DuckDB removes each deleted row from `dependency_index_key` at
    commit, about 12 us an edge, so deleting and re-inserting the 800,000 unchanged edges of 20,000
    recompiled plans cost 9.7 s at commit, against 0.7 s for the 20,000 that changed (measured).
    Both queries are SQL over the caller's relations (registered tables or subqueries on `params`).
    """
    db = store.db
    store.forget(EDGELESS_MEMO)  # the edges written are known only to SQL here
    # Both sides of the difference from one full join: an anti join each way read and hashed the
    # 800,000 edges of a 20,000-plan restart twice (0.8 s against 0.5 s, single-threaded).
    db.execute(f"CREATE OR REPLACE TEMP TABLE {_DIFF} AS SELECT h.rid, e.dep_key, e.plan_key "
               f"FROM (SELECT d.rowid AS rid, dep_key, plan_key FROM dependency_index d "
               f"SEMI JOIN ({plan_keys}) k USING (plan_key)) h FULL JOIN ({edges}) e "
               "ON h.dep_key = e.dep_key AND h.plan_key = e.plan_key WHERE h.rid IS NULL OR e.plan_key IS NULL",
               params or [])
    try:
        db.execute(f"DELETE FROM dependency_index WHERE rowid IN (SELECT rid FROM {_DIFF} WHERE rid IS NOT NULL)")
        db.execute(f"INSERT INTO dependency_index SELECT dep_key, plan_key FROM {_DIFF} WHERE rid IS NULL")
    finally:
        try:
            db.execute(f"DROP TABLE IF EXISTS {_DIFF}")
        except duckdb.Error:  # the transaction failed: its rollback drops the table, and the caller sees why
            pass


class DependencyIndex:
    """Edges from dependency keys to plan keys, replaced whole on every (re)compilation."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.db = store.db

    def replace_many(self, edges: dict[str, Iterable[str]]) -> None:
        """Make each plan key's given keys its complete dependency set, in two statements."""
        if not edges:
            return
        self.drop_many(list(edges))
        dep_keys, plan_keys = [], []
        for plan_key, keys in edges.items():
            for key in sorted(set(keys)):
                dep_keys.append(key)
                plan_keys.append(plan_key)
        self.store.cached(EDGELESS_MEMO, set).difference_update(dep_keys)
        if len(dep_keys) <= LIST_INSERT:
            # Two list parameters unnested side by side: a third of registering an Arrow scan at 40 edges.
            if dep_keys:
                self.db.execute("INSERT INTO dependency_index SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[])",
                                [dep_keys, plan_keys])
            return
        self.store.insert_rows("dependency_index", pa.table({"dep_key": dep_keys, "plan_key": plan_keys}),
                               verb="INSERT INTO")

    def drop_many(self, plan_keys: list[str]) -> None:
        """Forget plan keys (their plans can no longer be compiled)."""
        if len(plan_keys) == 1:  # an equality costs half of `IN (SELECT unnest(?))`
            self.db.execute("DELETE FROM dependency_index WHERE plan_key = ?", plan_keys)
        elif plan_keys:
            self.db.execute("DELETE FROM dependency_index WHERE plan_key IN (SELECT unnest(?))", [plan_keys])

    def affected_pairs(self, keys: list[str]) -> list[tuple[str, str]]:
        """Every (plan key, dependency key) edge whose key is in `keys`."""
        edgeless = self.store.cached(EDGELESS_MEMO, set)  # a view's is new each time: it always reads
        keys = [k for k in dict.fromkeys(keys) if k not in edgeless]
        if not keys:
            return []
        if len(keys) <= LOOKUP_CHUNK or len(keys) > SCAN_FROM:
            pairs = self._pairs([keys])
        else:
            pairs = self._pairs([keys[start:start + LOOKUP_CHUNK] for start in range(0, len(keys), LOOKUP_CHUNK)])
        if len(edgeless) + len(keys) > EDGELESS_ENTRIES:
            edgeless.clear()
        edgeless.update(set(keys).difference(d for _, d in pairs))
        return pairs

    def _pairs(self, chunks: list[list[str]]) -> list[tuple[str, str]]:
        # Chunks in one statement, one branch each: every branch still finds its keys through the
        # index (172 keys at 2M edges: 21 ms, against 27 ms for a statement per chunk).
        return self.db.execute(" UNION ALL ".join(["SELECT plan_key, dep_key FROM dependency_index "
                                                   "WHERE dep_key IN (SELECT unnest(?))"] * len(chunks)),
                               chunks).fetchall()

    def due(self, now: datetime) -> dict[str, str]:
        """Live plan keys whose validity horizon `now` has reached, with their time key."""
        rows = self.db.execute(
            "SELECT plan_key, strftime(valid_until AT TIME ZONE 'UTC', '%Y-%m-%dT%H:%M:%SZ') "
            "FROM plan_heads WHERE live AND valid_until IS NOT NULL AND valid_until <= ?", [now]).fetchall()
        return {plan_key: dk.time(instant) for plan_key, instant in rows}

    def size(self) -> int:
        """Number of edges."""
        return self.db.execute("SELECT count(*) FROM dependency_index").fetchone()[0]
