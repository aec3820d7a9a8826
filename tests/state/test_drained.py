"""Read connections that leave no query open: DuckDB checkpoints beside them."""

from __future__ import annotations

import threading

from state.drained import Rows
from state.store import Store


def test_rows_fetch_like_a_cursor():
    rows = Rows([(1,), (2,), (3,)])
    assert rows.fetchone() == (1,) and rows.fetchall() == [(2,), (3,)]
    assert rows.fetchone() is None and rows.fetchall() == []
    assert Rows([]).fetchone() is None


def test_a_view_read_in_part_does_not_keep_later_updates_from_a_checkpoint(tmp_path):
    store = Store(tmp_path / "f.duckdb")
    view = store.view()
    try:
        store.db.execute("INSERT INTO counters VALUES ('a', 1)")
        seen = []
        # As the HTTP loop reads: on its own thread, one row of a count.
        reader = threading.Thread(target=lambda: seen.append(
            view.db.execute("SELECT count(*) FROM counters WHERE value > ?", [0]).fetchone()))
        reader.start()
        reader.join()
        store.db.execute("UPDATE counters SET value = 2 WHERE name = 'a'")
        store.db.execute("CHECKPOINT")  # refused ("other write transactions active") if the read stayed open
        assert seen == [(1,)] and store.checkpoints.wal_bytes() == 0
        assert view.db.execute("SELECT value FROM counters").fetchall() == [(2,)]
        assert view.db.execute("CREATE TEMP TABLE t (x INTEGER)").fetchone() is None  # statements without rows
    finally:
        store.close()
