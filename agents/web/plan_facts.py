"""What plan status and health read from the state file, beside the select path."""

from __future__ import annotations

from typing import Any

import duckdb

from state.file_size import file_size
from state.local_state import LocalState


def plan_facts(state: LocalState, plan_id: str) -> tuple[dict[str, Any] | None, str | None, str | None]:
    """What a plan status reads from the file: status (or eviction), entity unless invalidated, principal."""
    status = state.plans.status(plan_id) or state.retention.evicted_status(plan_id)
    entity_id, principal = _owner_of(state, plan_id)  # a plan only parked here has an entity and no status
    return status, None if status is not None and status["status"] == "invalidated" else entity_id, principal


def _owner_of(state: LocalState, plan_id: str) -> tuple[str | None, str | None]:
    """The canonical entity and principal of a plan stored here or parked from `plan-dependencies`, if any."""
    db = state.store.db
    row = db.execute("SELECT json_extract_string(plan, '$.entity_id'), json_extract_string(plan, "
                     "'$.request.principal') FROM plans WHERE plan_id = ?", [plan_id]).fetchone()
    if row is None:
        try:
            row = db.execute("SELECT json_extract_string(record, '$.entity_id'), json_extract_string(record, "
                             "'$.request.principal') FROM parked_plans WHERE plan_id = ? LIMIT 1",
                             [plan_id]).fetchone()
        except duckdb.CatalogException:  # a file no plan feed ever wrote to (replay, a lone worker's tools)
            return None, None
    return (row[0], row[1]) if row else (None, None)


def file_health(state: LocalState) -> dict[str, Any]:
    """What the health document reads from the state file (through `state`'s own cursor, on any one thread)."""
    store = state.store
    now = store.now()
    return {"now": now and now.isoformat().replace("+00:00", "Z"), "applied_offsets": store.next_offsets(),
            "position": store.position(), "plans": state.plans.counts(), "index_edges": state.index.size(),
            "outbox": state.outbox.size(), "retention": state.retention.sizes(), "counters": store.counters(),
            "state_file": file_size(store.db)}
