"""What DuckDB compacts past the limit on keyed tables: it counts a table's stored rows, deleted ones included, against
the limit fixed when the file opens (the small table that sheds its rows is in test_store)."""

from __future__ import annotations

import pytest

import state.store as store_module
from state.store import Store


def _replace_all(store: Store, live: int, times: int) -> None:
    for _ in range(times):
        with store.transaction():
            store.db.execute("DELETE FROM receipts")
            store.db.execute(f"INSERT INTO receipts SELECT 'r' || i, 'p', repeat('y', 100) FROM range({live}) t(i)")


def _churn(store: Store, live: int, rounds: int) -> None:
    """Ordinary churn, each batch followed by an idle checkpoint, as the worker does."""
    for round_ in range(rounds):
        with store.transaction():
            store.db.execute(f"DELETE FROM receipts WHERE hash(receipt_id || '{round_}') % 10 = 0")
            store.db.execute(f"INSERT INTO receipts SELECT 'r' || i, 'p', 'z' FROM range({live}) t(i) "
                             f"WHERE hash('r' || i || '{round_}') % 10 = 0")
        assert store.checkpoints.when_idle(at_least=0)


@pytest.mark.xfail(strict=True, reason="DuckDB 1.5 compares stored rows, deleted ones included, with "
                   "vacuum_rebuild_indexes, which cannot change while the file is open: a table a burst took past "
                   "the limit is never compacted again (found in review; see docs/operate.md)")
def test_a_small_keyed_table_is_compacted_again_after_a_burst_of_replacements(tmp_path):
    store = Store(tmp_path / "f.duckdb")
    _replace_all(store, 20_000, 11)  # 220,000 rows stored before the writer is next idle: past the limit
    assert store.checkpoints.when_idle(at_least=0)
    _churn(store, 20_000, 6)
    live, kept = store.checkpoints.kept_rows()["receipts"]
    store.close()
    assert kept <= 5 * live, f"{kept} rows kept for {live} live"


def test_a_table_past_the_limit_is_left_as_it_is(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "COMPACT_STORED_ROWS", 5_000)
    store = Store(tmp_path / "f.duckdb")
    _replace_all(store, 8_000, 3)
    assert store.checkpoints.when_idle(at_least=0)
    assert store.checkpoints.kept_rows()["receipts"] == (8_000, 24_000)  # no rebuild of a table this large
    store.close()
