"""Plans, heads and receipts: few or many at a time, new or stored before, the same rows."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from state import plan_store
from state.local_state import LocalState

AT = datetime(2026, 8, 30, tzinfo=timezone.utc)


def _plan(plan_id: str, key: str, receipt: str) -> SimpleNamespace:
    request = SimpleNamespace(live=True, as_dict=lambda: {"entity": key})
    return SimpleNamespace(plan_id=plan_id, plan_key=key, request=request, valid_until=AT, plan={"id": plan_id},
                           receipt_id=receipt, receipt={"receipt_id": receipt})


def _rows(state: LocalState) -> tuple:
    db = state.store.db
    return (db.execute("SELECT plan_id, plan_key, status, reason, successor_plan_id, invalidated_at FROM plans "
                       "ORDER BY 1").fetchall(),
            db.execute("SELECT * FROM plan_heads ORDER BY 1").fetchall(),
            db.execute("SELECT receipt_id, plan_id FROM receipts ORDER BY 1").fetchall(),
            db.execute("SELECT plan_id, reason, successor_plan_id FROM plan_history ORDER BY seq").fetchall())


def _flip_flop(state: LocalState) -> tuple:
    plans = state.plans
    with state.store.transaction():
        plans.save_many([_plan("A", "k1", "rA"), _plan("X", "k2", "rX")], AT)
    with state.store.transaction():
        plans.invalidate_many([("A", "resource_changed", {"e": 1}, "B")], AT)
        plans.save_many([_plan("B", "k1", "rB")], AT)
    with state.store.transaction():  # back to A: its row, head and receipt were stored before
        plans.invalidate_many([("B", "resource_changed", {"e": 2}, "A"), ("X", "policy_changed", {}, None)], AT)
        plans.save_many([_plan("A", "k1", "rA"), _plan("Y", "k3", "rY")], AT)
    return _rows(state)


@pytest.mark.parametrize("small", [True, False])
def test_a_plan_id_compiled_again_is_fresh_again_with_its_head_whichever_way_it_is_written(tmp_path, monkeypatch,
                                                                                        small):
    if not small:
        monkeypatch.setattr(plan_store, "SMALL_INSERT_ROWS", 0)  # every write as the many-plans upserts
    state = LocalState.open(tmp_path / "f.duckdb")
    try:
        plans, heads, receipts, history = _flip_flop(state)
    finally:
        state.close()
    assert plans == [("A", "k1", "fresh", None, None, None), ("B", "k1", "invalidated", "resource_changed", "A", AT),
                     ("X", "k2", "invalidated", "policy_changed", None, AT), ("Y", "k3", "fresh", None, None, None)]
    assert heads == [("k1", "A", True, AT), ("k2", "X", True, AT), ("k3", "Y", True, AT)]
    assert receipts == [("rA", "A"), ("rB", "B"), ("rX", "X"), ("rY", "Y")]
    assert history == [("A", "resource_changed", "B"), ("B", "resource_changed", "A"), ("X", "policy_changed", None)]


def _again_with_new_columns(tmp_path, name: str) -> list[tuple]:
    """A plan compiled, invalidated, then compiled again under the same id with a new receipt, text and time."""
    state = LocalState.open(tmp_path / f"{name}.duckdb")
    later = datetime(2026, 9, 1, tzinfo=timezone.utc)
    again = _plan("A", "k1", "rA2")
    again.plan, again.valid_until, again.request.live = {"id": "A", "as_of": 2}, later, False
    try:
        with state.store.transaction():
            state.plans.save_many([_plan("A", "k1", "rA"), _plan("X", "k2", "rX")], AT)
        with state.store.transaction():
            state.plans.invalidate_many([("A", "resource_changed", {"e": 1}, None)], AT)
            state.plans.save_many([again], later)
        return state.store.db.execute("SELECT * FROM plans ORDER BY plan_id").fetchall()
    finally:
        state.close()


def test_a_plan_id_compiled_again_gets_every_column_of_its_new_compilation_as_the_bulk_write_gives_it(
        tmp_path, monkeypatch):
    # The few-plans path writes parameters, the many-plans path an Arrow scan: the same row either way.
    few = _again_with_new_columns(tmp_path, "few")
    monkeypatch.setattr(plan_store, "SMALL_INSERT_ROWS", 0)
    assert few == _again_with_new_columns(tmp_path, "many")
    a, x = few
    assert a[0] == "A" and a[2:5] == ("fresh", False, datetime(2026, 9, 1, tzinfo=timezone.utc))
    assert a[6] == '{"id":"A","as_of":2}' and a[7] == "rA2" and a[8:11] == (None, None, None) and a[12] is None
    assert x[0] == "X" and x[2] == "fresh"
