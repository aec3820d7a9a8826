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
# Dependency keys the writer looked up, each with the plan keys depending on it (none: a resource no
# plan reads, edited again): a batch of them needs no lookup. Only the writer writes edges, and each
# of its writes keeps the memo exact (the plan keys whose edges it replaces or drops are taken out of
# every remembered key and put back under the keys they now have) or drops it (edges written by SQL,
# retention's deletes); a rollback drops it (`Store.forget`).
EDGES_MEMO = "index.edges"
# Each plan key's complete set of dependency keys as this writer last wrote it: a recompilation almost always depends
# on the keys its predecessor did, and then no edge is written at all. Deleting and writing them again cost two
# statements a batch, and left deleted rows that an index past `checkpoints.COMPACT_STORED_ROWS` rows never sheds.
# Dropped with `EDGES_MEMO` wherever that is (SQL writes, retention, rollbacks).
WRITTEN_MEMO = "index.written"
WRITTEN_EDGES = 200_000  # edges remembered before the memo starts over (a plan key it lacks is written whole)
EDGE_ENTRIES = 50_000  # keys plus edges remembered before the memo starts over (a miss only costs a lookup)
MOST_REMEMBERED = 1_000  # a key more plans depend on (a policy bundle's) is looked up each time


class EdgeMemo:
    """The writer's remembered edges of some dependency keys: all of each key's edges, or none of the key."""

    def __init__(self) -> None:
        self.plans: dict[str, set[str]] = {}  # dependency key -> every plan key depending on it
        self.keys: dict[str, set[str]] = {}  # plan key -> the remembered dependency keys it depends on
        self.size = 0  # keys plus edges held

    def found(self, keys: list[str], pairs: list[tuple[str, str]]) -> None:
        """Remember what a lookup of `keys` found: `pairs` holds every edge of each of them."""
        plans: dict[str, set[str]] = {k: set() for k in keys}
        for plan_key, dep_key in pairs:
            plans[dep_key].add(plan_key)
        plans = {k: v for k, v in plans.items() if len(v) <= MOST_REMEMBERED}
        held = sum(len(v) + 1 for v in plans.values())
        if held > EDGE_ENTRIES:  # a lookup this wide (a catch-up batch) is not worth the memory
            return
        if self.size + held > EDGE_ENTRIES:
            self.__init__()
        for dep_key, plan_keys in plans.items():
            self.plans[dep_key] = plan_keys
            for plan_key in plan_keys:
                self.keys.setdefault(plan_key, set()).add(dep_key)
        self.size += held

    def dropped(self, plan_keys: Iterable[str]) -> None:
        """These plan keys lost every edge."""
        for plan_key in plan_keys:
            for dep_key in self.keys.pop(plan_key, ()):
                self.plans[dep_key].discard(plan_key)
                self.size -= 1

    def added(self, plan_key: str, dep_keys: Iterable[str]) -> None:
        """A plan key gained edges to these keys (after `dropped`, they are its only ones)."""
        for dep_key in dep_keys:
            plans = self.plans.get(dep_key)
            if plans is None:
                continue
            if len(plans) >= MOST_REMEMBERED:
                self._drop_key(dep_key)
                continue
            plans.add(plan_key)
            self.keys.setdefault(plan_key, set()).add(dep_key)
            self.size += 1
        if self.size > EDGE_ENTRIES:  # plans compiled against remembered keys grew it: start over
            self.__init__()

    def _drop_key(self, dep_key: str) -> None:
        for plan_key in self.plans.pop(dep_key):
            self.keys[plan_key].discard(dep_key)
            self.size -= 1
        self.size -= 1


class WrittenEdges:
    """The writer's record of the complete dependency set it last wrote for some plan keys."""

    def __init__(self) -> None:
        self.sets: dict[str, frozenset[str]] = {}
        self.size = 0  # edges held

    def get(self, plan_key: str) -> frozenset[str] | None:
        """The keys last written for this plan key, if remembered (None: the file may hold any)."""
        return self.sets.get(plan_key)

    def put(self, plan_key: str, dep_keys: list[str]) -> None:
        """These are now all of the plan key's edges in the file."""
        self.size -= len(self.sets.pop(plan_key, ()))
        if self.size + len(dep_keys) > WRITTEN_EDGES:
            self.__init__()
        self.sets[plan_key] = frozenset(dep_keys)
        self.size += len(dep_keys)

    def dropped(self, plan_keys: Iterable[str]) -> None:
        """These plan keys have no edge left."""
        for plan_key in plan_keys:
            self.size -= len(self.sets.pop(plan_key, ()))


# The earliest horizon of any live head as of the writer's last `due` read (None: no live head has one): a tick
# before it finds no plan due without reading. A head the writer stores lowers it (`lower_horizon`); heads written
# by SQL (restores) drop it, as a rollback does. A head removed or no longer live can only make the earliest
# horizon later, so the remembered one stays a bound.
HORIZON_MEMO = "index.earliest_horizon"

_DIFF = "_edge_diff"  # the edges to delete (by rowid) and to insert, for one statement each


def replace_edges(store: Store, plan_keys: str, edges: str, params: list | None = None) -> None:
    """Make the edges of the plan keys `plan_keys` selects exactly the (dep_key, plan_key) rows `edges` selects.

    Only the difference is written: DuckDB removes each deleted row from `dependency_index_key` at
    commit, about 12 us an edge, so deleting and re-inserting the 800,000 unchanged edges of 20,000
    recompiled plans cost 9.7 s at commit, against 0.7 s for the 20,000 that changed (measured).
    Both queries are SQL over the caller's relations (registered tables or subqueries on `params`).
    """
    db = store.db
    store.forget(EDGES_MEMO, WRITTEN_MEMO)  # the edges written are known only to SQL here
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
        """Make each plan key's given keys its complete dependency set: only what differs from the set this writer
        last wrote for it, else every edge of the key (at most three statements, none when nothing differs)."""
        if not edges:
            return
        sets = {plan_key: sorted(set(keys)) for plan_key, keys in edges.items()}
        written = self.store.cached(WRITTEN_MEMO, WrittenEdges)
        before = {plan_key: written.get(plan_key) for plan_key in sets}
        self._drop_edges([k for k, old in before.items() if old is None],
                         [(k, d) for k, old in before.items() if old is not None for d in old.difference(sets[k])])
        new = {k: [d for d in keys if d not in old] if (old := before[k]) is not None else keys
               for k, keys in sets.items()}
        dep_keys = [key for keys in new.values() for key in keys]
        plan_keys = [plan_key for plan_key, keys in new.items() for _ in keys]
        if len(dep_keys) <= LIST_INSERT:
            # Two list parameters unnested side by side: a third of registering an Arrow scan at 40 edges.
            if dep_keys:
                self.db.execute("INSERT INTO dependency_index SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[])",
                                [dep_keys, plan_keys])
        else:
            self.store.insert_rows("dependency_index", pa.table({"dep_key": dep_keys, "plan_key": plan_keys}),
                                   verb="INSERT INTO")
        memo = self.store.cached(EDGES_MEMO, EdgeMemo)  # once written: a failed write leaves it as the file is
        memo.dropped(sets)
        for plan_key, keys in sets.items():
            memo.added(plan_key, keys)
            written.put(plan_key, keys)

    def drop_many(self, plan_keys: list[str]) -> None:
        """Forget plan keys (their plans can no longer be compiled)."""
        if not plan_keys:
            return
        self._drop_edges(plan_keys, [])
        self.store.cached(EDGES_MEMO, EdgeMemo).dropped(plan_keys)
        self.store.cached(WRITTEN_MEMO, WrittenEdges).dropped(plan_keys)

    def _drop_edges(self, plan_keys: list[str], pairs: list[tuple[str, str]]) -> None:
        """Delete every edge of `plan_keys` and the (plan key, dependency key) edges `pairs`."""
        if len(plan_keys) == 1:  # an equality costs half of `IN (SELECT unnest(?))`
            self.db.execute("DELETE FROM dependency_index WHERE plan_key = ?", plan_keys)
        elif plan_keys:
            self.db.execute("DELETE FROM dependency_index WHERE plan_key IN (SELECT unnest(?))", [plan_keys])
        if pairs:
            self.db.execute("DELETE FROM dependency_index d USING (SELECT unnest(?::VARCHAR[]) AS plan_key, unnest("
                            "?::VARCHAR[]) AS dep_key) g WHERE d.plan_key = g.plan_key AND d.dep_key = g.dep_key",
                            [[k for k, _ in pairs], [d for _, d in pairs]])

    def affected_pairs(self, keys: list[str]) -> list[tuple[str, str]]:
        """Every (plan key, dependency key) edge whose key is in `keys`."""
        memo = self.store.cached(EDGES_MEMO, EdgeMemo)  # a view's is new each time: it always reads
        pairs, unknown = [], []
        for key in dict.fromkeys(keys):
            plans = memo.plans.get(key)
            if plans is None:
                unknown.append(key)
            else:
                pairs += [(plan_key, key) for plan_key in plans]
        if not unknown:
            return pairs
        if len(unknown) <= LOOKUP_CHUNK or len(unknown) > SCAN_FROM:
            found = self._pairs([unknown])
        else:
            found = self._pairs([unknown[start:start + LOOKUP_CHUNK] for start in range(0, len(unknown), LOOKUP_CHUNK)])
        memo.found(unknown, found)
        return pairs + found

    def _pairs(self, chunks: list[list[str]]) -> list[tuple[str, str]]:
        # Chunks in one statement, one branch each: every branch still finds its keys through the
        # index (172 keys at 2M edges: 21 ms, against 27 ms for a statement per chunk).
        return self.db.execute(" UNION ALL ".join(["SELECT plan_key, dep_key FROM dependency_index "
                                                   "WHERE dep_key IN (SELECT unnest(?))"] * len(chunks)),
                               chunks).fetchall()

    def due(self, now: datetime) -> dict[str, str]:
        """Live plan keys whose validity horizon `now` has reached, with their time key."""
        memo = self.store.cached(HORIZON_MEMO, dict)  # a view's is new each time: it always reads
        if "earliest" in memo and (memo["earliest"] is None or now < memo["earliest"]):
            return {}
        # The due heads and the earliest horizon of all, in one scan of the heads.
        due, memo["earliest"] = self.db.execute(
            "SELECT list({'k': plan_key, 't': strftime(valid_until AT TIME ZONE 'UTC', '%Y-%m-%dT%H:%M:%SZ')}) "
            "FILTER (WHERE valid_until <= $1), min(valid_until) FROM plan_heads "
            "WHERE live AND valid_until IS NOT NULL", [now]).fetchone()
        return {row["k"]: dk.time(row["t"]) for row in due or ()}

    def size(self) -> int:
        """Number of edges."""
        return self.db.execute("SELECT count(*) FROM dependency_index").fetchone()[0]


def lower_horizon(store: Store, horizons: Iterable[datetime | None]) -> None:
    """The writer stored live heads with these horizons: the earliest it remembers is no later than theirs."""
    memo = store.cached(HORIZON_MEMO, dict)
    if "earliest" not in memo:
        return
    known = [h for h in horizons if h is not None]
    if any(h.tzinfo is None for h in known):  # not comparable with the file's: read it next time
        store.forget(HORIZON_MEMO)
    elif known:
        memo["earliest"] = min(known) if memo["earliest"] is None else min(memo["earliest"], *known)
