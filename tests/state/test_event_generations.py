"""Event-id generations on real DuckDB files: claims deduplicate across them, a dropped one forgets, ids migrate."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import duckdb
import pytest

from state import event_generations
from state.store import Store

T0 = datetime(2026, 8, 30, 9, 0, tzinfo=timezone.utc)
SPAN = timedelta(days=7)


def _prune(store: Store, at: datetime) -> event_generations.Pruned:
    """One retention pass's part over the ledger, as `Retention.run_pass` runs it."""
    with store.transaction():
        pruned = event_generations.prune(store.db, at, SPAN)
        store.forget(event_generations.OLDER_MEMO, event_generations.LEGACY_MEMO)
    return pruned


def _tables(store: Store) -> list[str]:
    return sorted(t for (t,) in store.db.execute(
        "SELECT table_name FROM duckdb_tables() WHERE starts_with(table_name, 'applied_events')").fetchall())


@pytest.fixture
def store(tmp_path):
    opened = Store(tmp_path / "f.duckdb")
    yield opened
    opened.close()


@pytest.mark.parametrize("many", [False, True], ids=["few", "many"])  # parameters, or an Arrow scan (>32 rows)
def test_claims_across_generations_deduplicate(store, many):
    pad = [("t", f"pad-{i}", "h") for i in range(40)] if many else []
    with store.transaction():
        assert store.claim_events([("t", "a", "h"), *pad]) == ["new"] * (1 + len(pad))
    assert _prune(store, T0) == event_generations.Pruned()  # the first pass dates generation 0
    assert _prune(store, T0 + SPAN).opened
    assert _tables(store) == ["applied_events", "applied_events_0"]
    with store.transaction():
        verdicts = store.claim_events([("t", "a", "h"), ("t", "a", "other"), ("u", "a", "h"), ("t", "b", "h"),
                                       ("t", "b", "h"), *pad])
    assert verdicts == ["duplicate", "conflict", "new", "new", "duplicate"] + ["duplicate"] * len(pad)
    # A repeat is not claimed again: the old generation still dates it, the new one holds only the new ids.
    assert sorted(store.db.execute("SELECT topic, event_id FROM applied_events").fetchall()) == [("t", "b"), ("u", "a")]
    with store.transaction():
        assert store.claim_events([("t", "b", "h"), ("t", "a", "h")]) == ["duplicate", "duplicate"]


def test_a_dropped_generation_forgets_its_ids_and_counts_them(store):
    with store.transaction():
        store.claim_events([("t", "a", "h"), ("t", "b", "h")])
    _prune(store, T0)
    _prune(store, T0 + SPAN)  # a and b now in generation 0, closed at T0 + 7 days
    with store.transaction():
        store.claim_events([("t", "c", "h")])
    assert _prune(store, T0 + 2 * SPAN - timedelta(seconds=1)) == event_generations.Pruned()  # not yet a span old
    with store.transaction():
        assert store.claim_events([("t", "a", "h")]) == ["duplicate"]
    pruned = _prune(store, T0 + 2 * SPAN)
    assert pruned == event_generations.Pruned(generations_dropped=1, ids_dropped=2, opened=True)
    assert _tables(store) == ["applied_events", "applied_events_1"]  # at most one older table after a pass
    with store.transaction():
        assert store.claim_events([("t", "a", "h"), ("t", "c", "h")]) == ["new", "duplicate"]


def test_generations_outlast_a_restart_and_a_rolled_back_pass(store, tmp_path):
    with store.transaction():
        store.claim_events([("t", "a", "h")])
    _prune(store, T0)
    with pytest.raises(RuntimeError), store.transaction():  # a pass that fails after rotating changes nothing
        event_generations.prune(store.db, T0 + SPAN, SPAN)
        raise RuntimeError("the pass failed later")
    assert _tables(store) == ["applied_events"]
    _prune(store, T0 + SPAN)
    store.close()
    again = Store(tmp_path / "f.duckdb")
    try:
        with again.transaction():
            assert again.claim_events([("t", "a", "h"), ("t", "z", "h")]) == ["duplicate", "new"]
        assert event_generations.sizes(again.db) == {"event_id_generations": 2}
    finally:
        again.close()


def test_a_span_under_an_hour_is_an_hour(store):
    with store.transaction():
        store.claim_events([("t", "a", "h")])
    for minutes in (0, 30, 59):
        with store.transaction():
            assert event_generations.prune(store.db, T0 + timedelta(minutes=minutes), timedelta(0)) == (
                event_generations.Pruned())
    with store.transaction():
        assert event_generations.prune(store.db, T0 + timedelta(minutes=60), timedelta(0)).opened


def test_a_migrated_ledger_keeps_its_ids_as_generation_0_and_legacy_ids_still_match_any_topic(tmp_path):
    path = tmp_path / "old.duckdb"
    db = duckdb.connect(str(path))  # a file of before generations, its ids keyed by (topic, id) and some global
    db.execute("CREATE TABLE applied_events (topic VARCHAR, event_id VARCHAR, content_hash VARCHAR, "
               "PRIMARY KEY (topic, event_id)); "
               "INSERT INTO applied_events VALUES ('revocations', 'e1', 'a'), ('', 'legacy', NULL)")
    db.close()
    store = Store(path)
    try:
        assert store.db.execute("SELECT generation, opened_at FROM event_id_generations").fetchall() == [(0, None)]
        _prune(store, T0)  # dated by the first pass: kept at least a span after the upgrade, whatever their age
        _prune(store, T0 + SPAN)
        with store.transaction():
            assert store.claim_events([("revocations", "e1", "a"), ("revocations", "e1", "b"),
                                       ("clock", "legacy", "x"), ("clock", "e2", "c")]) == [
                "duplicate", "conflict", "duplicate", "new"]
        assert _prune(store, T0 + 2 * SPAN).ids_dropped == 2
        with store.transaction():  # the legacy ids went with their generation: the scoped path applies
            assert store.claim_events([("clock", "legacy", "x"), ("clock", "e2", "c")]) == ["new", "duplicate"]
    finally:
        store.close()
