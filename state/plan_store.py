"""Plans, their heads per plan key, and receipts."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from compiler.pipeline import CompiledPlan
from state.store import Store


class PlanStore:
    """Compiled plans by id, the current plan of each plan key, and receipts."""

    def __init__(self, store: Store) -> None:
        self.db = store.db

    def save(self, compiled: CompiledPlan, compiled_at: datetime | None) -> bool:
        """Store a compilation as its key's current plan; False if that plan id was already current."""
        head = self.head(compiled.plan_key)
        unchanged = head is not None and head[0] == compiled.plan_id
        self.db.execute(
            "INSERT OR REPLACE INTO plans VALUES (?, ?, 'fresh', ?, ?, ?, ?, ?, NULL, NULL, NULL, ?, NULL)",
            [compiled.plan_id, compiled.plan_key, compiled.request.live, compiled.valid_until,
             orjson.dumps(compiled.request.as_dict()).decode(), orjson.dumps(compiled.plan).decode(),
             compiled.receipt_id, compiled_at])
        self.db.execute("INSERT OR REPLACE INTO plan_heads VALUES (?, ?, ?, ?)",
                        [compiled.plan_key, compiled.plan_id, compiled.request.live, compiled.valid_until])
        self.db.execute("INSERT OR REPLACE INTO receipts VALUES (?, ?, ?)",
                        [compiled.receipt_id, compiled.plan_id, orjson.dumps(compiled.receipt).decode()])
        return not unchanged

    def head(self, plan_key: str) -> tuple[str, bool, datetime | None] | None:
        """(plan id, live, valid_until) of the key's current plan."""
        return self.db.execute("SELECT plan_id, live, valid_until FROM plan_heads WHERE plan_key = ?",
                               [plan_key]).fetchone()

    def fresh_plan(self, plan_key: str) -> dict[str, Any] | None:
        """The current plan of a key if it is still fresh."""
        row = self.db.execute("SELECT p.plan FROM plan_heads h JOIN plans p USING (plan_id) "
                              "WHERE h.plan_key = ? AND p.status = 'fresh'", [plan_key]).fetchone()
        return orjson.loads(row[0]) if row else None

    def request_of(self, plan_key: str) -> dict[str, Any] | None:
        """The request document the key's current plan was compiled from."""
        row = self.db.execute("SELECT p.request FROM plan_heads h JOIN plans p USING (plan_id) "
                              "WHERE h.plan_key = ?", [plan_key]).fetchone()
        return orjson.loads(row[0]) if row else None

    def invalidate(self, plan_id: str, *, reason: str, cause: dict, at: datetime | None,
                   successor: str | None) -> None:
        """Mark a plan invalidated with why and what replaced it."""
        self.db.execute("UPDATE plans SET status = 'invalidated', reason = ?, cause = ?, "
                        "successor_plan_id = ?, invalidated_at = ? WHERE plan_id = ?",
                        [reason, orjson.dumps(cause).decode(), successor, at, plan_id])

    def drop_head(self, plan_key: str) -> None:
        """The key has no current plan any more."""
        self.db.execute("DELETE FROM plan_heads WHERE plan_key = ?", [plan_key])

    def status(self, plan_id: str) -> dict[str, Any] | None:
        """Public status of a plan id."""
        row = self.db.execute("SELECT status, reason, cause, successor_plan_id FROM plans WHERE plan_id = ?",
                              [plan_id]).fetchone()
        if row is None:
            return None
        return {"plan_id": plan_id, "status": row[0], "reason": row[1],
                "cause": orjson.loads(row[2]) if row[2] else None, "successor_plan_id": row[3]}

    def counts(self) -> dict[str, int]:
        """Plans by status."""
        return dict(self.db.execute("SELECT status, count(*) FROM plans GROUP BY 1").fetchall())
