"""Plans, their heads per plan key, and receipts."""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any, NamedTuple, Sequence

import orjson
import pyarrow as pa

from compiler.pipeline import CompiledPlan
from schemas.timefmt import format_instant
from state.dependency_index import lower_horizon
from state.row_writes import SMALL_INSERT_ROWS, insert_values
from state.store import Store

# Every invalidation of a plan id, in order: after A -> B -> A the id returns, and the plans
# row alone would keep only the latest cause.
_DDL = """
CREATE SEQUENCE IF NOT EXISTS plan_history_seq;
CREATE TABLE IF NOT EXISTS plan_history (seq BIGINT DEFAULT nextval('plan_history_seq'), plan_id VARCHAR,
  reason VARCHAR, cause VARCHAR, successor_plan_id VARCHAR, invalidated_at TIMESTAMPTZ);
CREATE INDEX IF NOT EXISTS plan_history_plan ON plan_history (plan_id);
"""


_WHEN = pa.timestamp("us", tz="UTC")
FEW_SUCCESSORS = 4  # up to this many successors are recorded by point statements (see `set_successors`)
# The three tables of a few plans, written in one transaction (median ms of 80 alternated runs, a parameter per
# value / typed lists through an Arrow table): 1 plan 1.30 / 1.63-1.71, 8 plans 1.99-2.89 / 2.50-3.66, 16 plans
# 2.76-2.85 / 3.00-3.08, 32 plans 4.20-4.39 / 3.66-3.86 (2026-12-07).
FEW_PLAN_ROWS = 16
_SCHEMAS = {  # what `save_many` writes, in each table's column order
    "plans": pa.schema([("plan_id", pa.string()), ("plan_key", pa.string()), ("status", pa.string()),
                        ("live", pa.bool_()), ("valid_until", _WHEN), ("request", pa.string()), ("plan", pa.string()),
                        ("receipt_id", pa.string()), ("reason", pa.string()), ("cause", pa.string()),
                        ("successor_plan_id", pa.string()), ("compiled_at", _WHEN), ("invalidated_at", _WHEN)]),
    "plan_heads": pa.schema([("plan_key", pa.string()), ("plan_id", pa.string()), ("live", pa.bool_()),
                             ("valid_until", _WHEN)]),
    "receipts": pa.schema([("receipt_id", pa.string()), ("plan_id", pa.string()), ("receipt", pa.string()),
                           ("stored_at", _WHEN)])}



class PlanHead(NamedTuple):
    """A plan key's current plan."""

    plan_id: str
    """The plan the key serves."""
    request: Any
    """The request it was compiled for, as JSON text."""
    status: str
    """fresh or invalidated."""


class StampedHead(NamedTuple):
    """A `PlanHead` with when and under which receipt its plan was compiled."""

    plan_id: str
    """The plan the key serves."""
    request: Any
    """The request it was compiled for, as JSON text."""
    status: str
    """fresh or invalidated."""
    receipt_id: str
    """The receipt of its compilation."""
    compiled_at: datetime | None
    """When it was compiled."""


class PlanStore:
    """Compiled plans by id, the current plan of each plan key, and receipts."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.db = store.db
        if not self.db.execute("SELECT 1 FROM duckdb_tables() WHERE table_name = 'plan_history'").fetchone():
            self.db.execute(_DDL)
            self.db.execute("CHECKPOINT")  # as the store does: DDL must not wait in the WAL

    def save_many(self, plans: Sequence[CompiledPlan], compiled_at: datetime | None) -> None:
        """Store compilations as their keys' current plans, with receipts.

        A few plans (an apply batch's) take four statements: one read of which rows exist, then
        plain inserts of new rows and an update of existing heads; an upsert costs several times
        either in DuckDB (a plan row: 1.9 ms against 0.5). Many take three upserts.
        """
        if not plans:
            return
        texts = [orjson.dumps(p.plan) for p in plans]
        applied = functools.cache(self.store.next_offsets)  # read once, and only if a watcher asks
        for p, text in zip(plans, texts, strict=True):
            # Shown to cached selects once this commits; the offsets say what this transaction applied so far.
            self.store.heads.stored(p.plan_key, p.plan_id, text, p.plan, applied)
        rows = {"plans": [(p.plan_id, p.plan_key, "fresh", p.request.live, p.valid_until,
                           orjson.dumps(p.request.as_dict()).decode(), text.decode(), p.receipt_id,
                           None, None, None, compiled_at, None) for p, text in zip(plans, texts, strict=True)],
                "plan_heads": [(p.plan_key, p.plan_id, p.request.live, p.valid_until) for p in plans],
                # retention counts a receipt's age from stored_at
                "receipts": [(p.receipt_id, p.plan_id, orjson.dumps(p.receipt).decode(), compiled_at) for p in plans]}
        self._write(rows)
        lower_horizon(self.store, [p.valid_until for p in plans if p.request.live])
        self.store.heads_changed()

    def _write(self, rows: dict[str, list[tuple]]) -> None:
        ids = {table: [r[0] for r in table_rows] for table, table_rows in rows.items()}
        n = len(ids["plans"])
        if n > SMALL_INSERT_ROWS or any(len(set(v)) < n for v in ids.values()):
            for table, table_rows in rows.items():
                self.store.insert_rows(table, pa.table(list(zip(*table_rows, strict=True)), schema=_SCHEMAS[table]))
            return
        held = self._held(ids)
        for table, table_rows in rows.items():
            self._insert(table, [r for r in table_rows if r[0] not in held[table]], "INSERT INTO")
            old = [r for r in table_rows if r[0] in held[table]]
            if old and table == "plan_heads":
                self.store.update_rows("plan_heads", ("plan_key",), ("plan_id", "live", "valid_until"), old,
                                       "plan_id = {plan_id}, live = CAST({live} AS BOOLEAN), "
                                       "valid_until = CAST({valid_until} AS TIMESTAMPTZ)")
            elif old:
                # A plan id compiled again (mostly a recompilation that came out the same as the plan it announced)
                # or a receipt repeated. An update in place cost less in process (1 row 1.5 ms against 4.5), but in
                # a worker the bench workload's p99 at 100 events/s went from 45-57 ms to 156-209 ms with it.
                self._insert(table, old, "INSERT OR REPLACE INTO")

    def _insert(self, table: str, rows: list[tuple], verb: str) -> None:
        """Rows of one of `save_many`'s tables, in the form cheapest for their number: up to `FEW_PLAN_ROWS` a
        parameter per value, more as typed lists (`state.row_writes`)."""
        if len(rows) > FEW_PLAN_ROWS:
            self.store.insert_rows(table, pa.table(list(zip(*rows, strict=True)), schema=_SCHEMAS[table]), verb=verb)
        elif rows:
            insert_values(self.db, table, rows, verb=verb)

    def _held(self, ids: dict[str, list[str]]) -> dict[str, set[str]]:
        """Which of these plan ids, plan keys and receipt ids have rows, in one read by their keys."""
        key = {"plans": "plan_id", "plan_heads": "plan_key", "receipts": "receipt_id"}
        held: dict[str, set[str]] = {table: set() for table in ids}
        for table, found in self.db.execute(" UNION ALL ".join(
                f"SELECT '{table}', {key[table]} FROM {table} WHERE {key[table]} IN ({', '.join('?' * len(v))})"
                for table, v in ids.items()), [i for v in ids.values() for i in v]).fetchall():
            held[table].add(found)
        return held

    def admitted(self, plan_ids: list[str]) -> dict[str, set[str]]:
        """Resource ids each of these plans admitted."""
        if not plan_ids:
            return {}
        rows = self.db.execute("SELECT plan_id, plan FROM plans WHERE plan_id IN (SELECT unnest(?))",
                               [sorted(set(plan_ids))]).fetchall()
        return {plan_id: {item["resource_id"] for item in orjson.loads(text).get("admitted") or ()}
                for plan_id, text in rows}

    def head_ids(self, plan_keys: list[str]) -> dict[str, str]:
        """The current plan id of each of these plan keys that has one."""
        if not plan_keys:
            return {}
        return dict(self.db.execute("SELECT plan_key, plan_id FROM plan_heads WHERE plan_key IN (SELECT unnest(?))",
                                    [plan_keys]).fetchall())

    def heads(self, plan_keys: list[str]) -> dict[str, PlanHead]:
        """Current plan id, request (JSON text: parsed by the callers that compile it) and status of each plan key."""
        return {key: PlanHead(*head[:3]) for key, head in self.heads_stamped(plan_keys).items()}

    def heads_stamped(self, plan_keys: list[str]) -> dict[str, StampedHead]:
        """As `heads`, followed by each current plan's receipt id and the time it was compiled at."""
        if not plan_keys:
            return {}
        rows = self.db.execute("SELECT h.plan_key, h.plan_id, p.request, p.status, p.receipt_id, p.compiled_at "
                               "FROM plan_heads h JOIN plans p USING (plan_id) WHERE h.plan_key IN (SELECT unnest(?))",
                               [plan_keys]).fetchall()
        return {key: StampedHead(*rest) for key, *rest in rows}

    def discoverable(self, plan_ids: list[str]) -> dict[str, set[str]]:
        """Resource ids each plan's principal may learn of: what the plan admitted or rejected by name."""
        if not plan_ids:
            return {}
        rows = self.db.execute("SELECT plan_id, plan FROM plans WHERE plan_id IN (SELECT unnest(?))",
                               [list(set(plan_ids))]).fetchall()
        out: dict[str, set[str]] = {}
        for plan_id, text in rows:
            plan = orjson.loads(text)
            out[plan_id] = {item["resource_id"] for part in ("admitted", "rejected") for item in plan.get(part) or ()}
        return out

    def set_successors(self, pairs: list[tuple[str, str]]) -> None:
        """Record successors found after the invalidation was announced: (old plan id, new plan id).

        Two set-wise statements: row by row, each history update scanned the whole history (the
        backlog of a 100,000-plan fan-out spent half a second per 100 successors here).
        """
        first = dict(reversed([(old, new) for old, new in pairs if old != new]))  # the first pair of an old id
        if not first:
            return
        if len(first) <= FEW_SUCCESSORS:
            # A select's compile or a small backlog step: point statements find the rows through the primary
            # key and the history's plan id index, where a join with a registered table scans both tables.
            for old, new in first.items():
                self.db.execute("UPDATE plans SET successor_plan_id = ? WHERE plan_id = ? "
                                "AND successor_plan_id IS NULL", [new, old])
                self.db.execute("UPDATE plan_history SET successor_plan_id = ? WHERE plan_id = ? AND seq = (SELECT "
                                "max(seq) FROM plan_history WHERE plan_id = ?) AND successor_plan_id IS NULL",
                                [new, old, old])
            return
        self.db.register("_successors", pa.table({"old": list(first), "new": list(first.values())}))
        try:
            self.db.execute("UPDATE plans SET successor_plan_id = s.new FROM _successors s "
                            "WHERE plans.plan_id = s.old AND plans.successor_plan_id IS NULL")
            self.db.execute("UPDATE plan_history SET successor_plan_id = latest.new FROM (SELECT s.new, max(h.seq) "
                            "AS seq FROM _successors s JOIN plan_history h ON h.plan_id = s.old "
                            "GROUP BY s.old, s.new) latest "
                            "WHERE plan_history.seq = latest.seq AND plan_history.successor_plan_id IS NULL")
        finally:
            self.db.unregister("_successors")

    def headed(self, plan_keys: list[str]) -> set[str]:
        """Which of these plan keys have a current plan here."""
        if not plan_keys:
            return set()
        return {r[0] for r in self.db.execute("SELECT plan_key FROM plan_heads WHERE plan_key IN (SELECT unnest(?))",
                                              [plan_keys]).fetchall()}

    def known(self, plan_ids: list[str]) -> set[str]:
        """Which of these plan ids this worker has stored, whatever their status."""
        if not plan_ids:
            return set()
        return {r[0] for r in self.db.execute("SELECT plan_id FROM plans WHERE plan_id IN (SELECT unnest(?))",
                                              [plan_ids]).fetchall()}

    def fresh_plan(self, plan_key: str) -> dict[str, Any] | None:
        """The current plan of a key if it is still fresh (read inside the caller's transaction).

        Two primary-key lookups: a join, or a filter on `status` beside `plan_id`, makes DuckDB
        scan every stored plan (5 ms at 100,000 plans, on the event loop of every cached select).
        """
        head = self.db.execute("SELECT plan_id FROM plan_heads WHERE plan_key = ?", [plan_key]).fetchone()
        if head is None:
            return None
        row = self.db.execute("SELECT plan, status FROM plans WHERE plan_id = ?", [head[0]]).fetchone()
        return orjson.loads(row[0]) if row and row[1] == "fresh" else None

    def invalidate_many(self, invalidated: list[tuple[str, str, dict, str | None]], at: datetime | None) -> None:
        """Mark plans invalidated: (plan id, reason, cause, successor plan id)."""
        if not invalidated:
            return
        self.store.heads.remove_plans([i[0] for i in invalidated])
        if len(invalidated) <= SMALL_INSERT_ROWS and len({i[0] for i in invalidated}) == len(invalidated):
            # An apply batch's few: parameters, and a keyed update (a third of a join with an Arrow scan).
            rows = [(i[0], i[1], orjson.dumps(i[2]).decode(), i[3], at) for i in invalidated]
            self.db.execute("INSERT INTO plan_history (plan_id, reason, cause, successor_plan_id, invalidated_at) "
                            "VALUES " + ", ".join(["(?, ?, ?, ?, ?)"] * len(rows)), [x for r in rows for x in r])
            self.store.update_rows("plans", ("plan_id",), ("reason", "cause", "successor", "at"), rows,
                                   "status = 'invalidated', reason = {reason}, cause = {cause}, "
                                   "successor_plan_id = {successor}, invalidated_at = CAST({at} AS TIMESTAMPTZ)")
        else:
            self._invalidate_set(invalidated, at)
        self.store.heads_changed()

    def _invalidate_set(self, invalidated: list[tuple[str, str, dict, str | None]], at: datetime | None) -> None:
        rows = pa.table({"plan_id": [i[0] for i in invalidated], "reason": [i[1] for i in invalidated],
                         "cause": [orjson.dumps(i[2]).decode() for i in invalidated],
                         "successor": pa.array([i[3] for i in invalidated], pa.string())})
        self.db.register("_invalidated", rows)
        try:
            self.db.execute("INSERT INTO plan_history (plan_id, reason, cause, successor_plan_id, invalidated_at) "
                            "SELECT plan_id, reason, cause, successor, ? FROM _invalidated", [at])
            self.db.execute("UPDATE plans SET status = 'invalidated', reason = i.reason, cause = i.cause, "
                            "successor_plan_id = i.successor, invalidated_at = ? FROM _invalidated i "
                            "WHERE plans.plan_id = i.plan_id", [at])
        finally:
            self.db.unregister("_invalidated")

    def drop_heads(self, plan_keys: list[str]) -> None:
        """These keys have no current plan any more."""
        if plan_keys:
            self.store.heads.remove_keys(plan_keys)
            self.db.execute("DELETE FROM plan_heads WHERE plan_key IN (SELECT unnest(?))", [plan_keys])
            self.store.heads_changed()

    def status(self, plan_id: str) -> dict[str, Any] | None:
        """Public status of a plan id: the latest invalidation, and every one in `history`, oldest first."""
        row = self.db.execute("SELECT status, reason, cause, successor_plan_id FROM plans WHERE plan_id = ?",
                              [plan_id]).fetchone()
        if row is None:
            return None
        history = self.db.execute("SELECT reason, cause, successor_plan_id, invalidated_at FROM plan_history "
                                  "WHERE plan_id = ? ORDER BY seq", [plan_id]).fetchall()
        return {"plan_id": plan_id, "status": row[0], "reason": row[1],
                "cause": orjson.loads(row[2]) if row[2] else None, "successor_plan_id": row[3],
                "history": [{"reason": reason, "cause": orjson.loads(cause) if cause else None,
                             "successor_plan_id": successor,
                             "invalidated_at": at and format_instant(at)} for reason, cause, successor, at in history]}

    def receipt(self, receipt_id: str) -> dict[str, Any] | None:
        """A stored receipt (withheld items by id and reason class, never content)."""
        row = self.db.execute("SELECT receipt FROM receipts WHERE receipt_id = ?", [receipt_id]).fetchone()
        return orjson.loads(row[0]) if row else None

    def counts(self) -> dict[str, int]:
        """Plans by status."""
        return dict(self.db.execute("SELECT status, count(*) FROM plans GROUP BY 1").fetchall())
