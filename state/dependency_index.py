"""The dependency index: input key -> plan keys whose current plan depends on it."""

from __future__ import annotations

from datetime import datetime
from typing import Iterable


from state.store import Store

class DependencyIndex:
    """Edges from dependency keys to plan keys, replaced whole on every (re)compilation."""

    def __init__(self, store: Store) -> None:
        self.db = store.db

    def replace(self, plan_key: str, keys: Iterable[str]) -> None:
        """Make `keys` the complete dependency set of the plan key's current plan."""
        self.db.execute("DELETE FROM dependency_index WHERE plan_key = ?", [plan_key])
        keys = sorted(set(keys))
        if keys:
            self.db.execute("INSERT INTO dependency_index SELECT unnest(?), ?", [keys, plan_key])

    def drop(self, plan_key: str) -> None:
        """Forget a plan key (its plan can no longer be compiled)."""
        self.db.execute("DELETE FROM dependency_index WHERE plan_key = ?", [plan_key])

    def affected(self, keys: Iterable[str]) -> dict[str, str]:
        """Plan keys depending on any of `keys`, each with the first matching key (in `keys` order)."""
        ordered = list(dict.fromkeys(keys))
        if not ordered:
            return {}
        rows = self.db.execute(
            "SELECT d.plan_key, d.dep_key, k.pos FROM dependency_index d "
            "JOIN (SELECT unnest(?) AS dep_key, generate_subscripts(?, 1) AS pos) k USING (dep_key) "
            "ORDER BY k.pos", [ordered, ordered]).fetchall()
        out: dict[str, str] = {}
        for plan_key, dep_key, _ in rows:
            out.setdefault(plan_key, dep_key)
        return out

    def due(self, now: datetime) -> dict[str, str]:
        """Live plan keys whose validity horizon `now` has reached, with their time key."""
        rows = self.db.execute(
            "SELECT plan_key, strftime(valid_until AT TIME ZONE 'UTC', '%Y-%m-%dT%H:%M:%SZ') "
            "FROM plan_heads WHERE live AND valid_until IS NOT NULL AND valid_until <= ?", [now]).fetchall()
        return {plan_key: f"time:{instant}" for plan_key, instant in rows}

    def size(self) -> int:
        """Number of edges."""
        return self.db.execute("SELECT count(*) FROM dependency_index").fetchone()[0]
