"""The state file's size and free bytes, as /healthz and /metrics report them, on a real DuckDB file."""

from __future__ import annotations

import os

import duckdb

from state.file_size import file_size
from state.local_state import LocalState


def _fill(db: duckdb.DuckDBPyConnection, table: str, rows: int) -> None:
    # Random text: DuckDB would compress repeated text to almost nothing.
    db.execute(f"CREATE TABLE {table} (id BIGINT, body VARCHAR)")
    db.executemany(f"INSERT INTO {table} VALUES (?, ?)", [(i, os.urandom(500).hex()) for i in range(rows)])
    db.execute("CHECKPOINT")


def test_a_dropped_tables_blocks_stay_in_the_file_as_free_bytes_and_new_data_reuses_them(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    try:
        db = state.store.db
        _fill(db, "kept", 500)
        _fill(db, "gone", 4000)  # as an expired event-id generation table: dropped whole
        full = file_size(db)
        assert full["block_size"] == 16 * 1024 and full["bytes"] > 4000 * 500
        assert full["bytes"] <= os.path.getsize(tmp_path / "f.duckdb") and full["free_bytes"] < full["bytes"] // 10
        db.execute("DROP TABLE gone")
        db.execute("CHECKPOINT")
        dropped = file_size(db)
        # Its blocks are free, and the file keeps them (only free blocks at its very end are given back).
        assert dropped["free_bytes"] > 4000 * 500 and dropped["bytes"] > dropped["free_bytes"]
        assert file_size(state.reader().store.db) == dropped  # the status thread's cursor sees the same
        _fill(db, "new", 3000)
        refilled = file_size(db)
        assert refilled["free_bytes"] < dropped["free_bytes"] // 2 and refilled["bytes"] <= dropped["bytes"]
    finally:
        state.close()


def test_a_database_that_is_not_a_file_has_no_blocks():
    assert file_size(duckdb.connect()) == {"bytes": 0, "free_bytes": 0, "block_size": 0}
