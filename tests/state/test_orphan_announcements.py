"""Orphan announcements written column-wise: the same records, history and statuses as the row-by-row path."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import pytest

from state import orphan_announcements
from state.invalidations import Invalidation
from state.local_state import LocalState

AT = datetime(2026, 12, 5, 8, 0, tzinfo=timezone.utc)
# Ids JSON must escape (quote, backslash, control characters) or may leave as they are (non-ASCII, a slash).
PAIRS = [("pk-1", "p1"), ('pk-"2"', 'p"2\\'), ("pk-\n3", "p3\t\x01"), ("pk-é/4", "p-日本/4"), ("pk-5", "p1")]


def _sample(plan_id: str, plan_key: str) -> Invalidation:
    cause = {"topic": "x-plan-dependencies", "partition": -1, "offset": -1, "event_id": f"plan:{plan_id}",
             "dependency_key": "plan-dependencies"}
    return Invalidation(plan_id, plan_key, "stale_on_arrival", cause, "2026-12-05T08:00:01.5Z", "2026-12-05T08:00:00Z")


def _state(path) -> LocalState:
    state = LocalState.open(path)
    with state.store.transaction():
        for key, plan_id in PAIRS[:4]:
            state.store.db.execute("INSERT INTO plans VALUES (?, ?, 'fresh', true, NULL, '{}', '{}', NULL, NULL, NULL, "
                                   "NULL, NULL, NULL)", [plan_id, key])
    return state


def _written(state: LocalState) -> tuple[list, list, list]:
    db = state.store.db
    return ([(t, k, v) for _, t, k, v in state.outbox.pending(100)],
            db.execute("SELECT plan_id, reason, cause, successor_plan_id, invalidated_at FROM plan_history "
                       "ORDER BY seq").fetchall(),
            db.execute("SELECT * FROM plans ORDER BY plan_id").fetchall())


def test_the_column_wise_announcements_are_those_of_the_row_path(tmp_path):
    rows, columns = _state(tmp_path / "rows.duckdb"), _state(tmp_path / "columns.duckdb")
    try:
        entries = [_sample(plan_id, key) for key, plan_id in PAIRS]
        with rows.store.transaction():
            rows.outbox.add_many([row for e in entries for row in e.rows("x-plan-invalidations")])
            rows.plans.invalidate_many([e.history_entry() for e in entries], AT)
        with columns.store.transaction():
            orphan_announcements.announce(columns.store, columns.outbox, PAIRS, _sample(*orphan_announcements.holes()),
                                          "x-plan-invalidations", AT)
        expected = _written(rows)
        assert _written(columns) == expected and len(expected[0]) == len(PAIRS)
    finally:
        rows.close()
        columns.close()


def test_a_sample_naming_its_plan_where_no_fill_reaches_is_refused(tmp_path):
    state = _state(tmp_path / "f.duckdb")
    try:
        plan_hole, key_hole = orphan_announcements.holes()
        with pytest.raises(ValueError, match="fill"):  # the successor would name the sample's hole in every record
            orphan_announcements.announce(state.store, state.outbox, PAIRS, replace(
                _sample(plan_hole, key_hole), successor_plan_id=plan_hole), "x-plan-invalidations", AT)
        with pytest.raises(ValueError, match="holes"):  # an id of the caller's own would go into SQL as text
            orphan_announcements.announce(state.store, state.outbox, PAIRS, _sample("p'1", key_hole),
                                          "x-plan-invalidations", AT)
        assert _written(state)[0] == []
    finally:
        state.close()
