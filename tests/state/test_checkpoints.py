"""Checkpoints of the state file: DuckDB's own only at the log cap, the worker's in idle moments."""

from __future__ import annotations

import duckdb

from state.checkpoints import DEFAULT_WAL_LIMIT, Checkpoints
from state.store import Store


def _grow_log(store: Store, rows: int) -> None:
    with store.transaction():
        store.db.execute(f"INSERT INTO receipts SELECT 'r-' || i || '-' || random(), 'p', repeat('x', 1000) "
                         f"FROM range({rows}) r(i)")


def test_duckdb_no_longer_checkpoints_at_its_16_mb_default_inside_the_stream(tmp_path):
    store = Store(tmp_path / "f.duckdb")
    try:
        assert store.checkpoints.wal_limit == DEFAULT_WAL_LIMIT
        assert store.db.execute("SELECT current_setting('checkpoint_threshold')").fetchone()[0] == "64.0 MiB"
        for _ in range(20):  # ~20 MB of log over many commits: past DuckDB's default threshold
            _grow_log(store, 1000)
        assert store.checkpoints.wal_bytes() > 16 * 2**20
    finally:
        store.close()


def test_an_idle_checkpoint_runs_from_a_sixteenth_of_the_limit_and_empties_the_log(tmp_path):
    store = Store(tmp_path / "f.duckdb")
    try:
        store.checkpoints.limit(16 * 2**20)
        _grow_log(store, 200)  # ~0.2 MB: below a sixteenth (1 MB)
        assert not store.checkpoints.when_idle() and store.checkpoints.idle_runs == 0
        _grow_log(store, 2000)
        assert store.checkpoints.wal_bytes() >= 2**20
        assert store.checkpoints.when_idle()
        assert store.checkpoints.wal_bytes() < 2**16 and store.checkpoints.idle_runs == 1
        shown = store.checkpoints.as_dict()
        assert shown["idle_checkpoints"] == 1 and shown["wal_limit_bytes"] == 16 * 2**20
        assert store.db.execute("SELECT count(*) FROM receipts").fetchone()[0] == 2200
    finally:
        store.close()


def test_a_checkpoint_runs_beside_an_open_read_transaction(tmp_path):
    store = Store(tmp_path / "f.duckdb")
    view = store.view()
    try:
        _grow_log(store, 100)
        view.db.execute("BEGIN")
        before = view.db.execute("SELECT count(*) FROM receipts").fetchone()[0]
        _grow_log(store, 100)
        assert Checkpoints(store.db, store.path).when_idle(at_least=1)
        assert view.db.execute("SELECT count(*) FROM receipts").fetchone()[0] == before  # its snapshot holds
        view.db.execute("COMMIT")
    finally:
        store.close()


def test_an_idle_checkpoint_beside_another_write_transaction_is_postponed_not_raised(tmp_path):
    store = Store(tmp_path / "f.duckdb")
    other = store.db.cursor()
    try:
        _grow_log(store, 100)
        other.execute("BEGIN")
        other.execute("UPDATE receipts SET plan_id = 'q' WHERE receipt_id LIKE 'r-1-%'")  # left open
        assert not store.checkpoints.when_idle(at_least=1)
        assert store.checkpoints.refused == 1 and store.checkpoints.idle_runs == 0
        assert "other write transactions active" in store.checkpoints.as_dict()["last_postponed_because"]
        other.execute("COMMIT")
        assert store.checkpoints.when_idle(at_least=1)
        assert store.checkpoints.as_dict()["idle_checkpoints_postponed"] == 1
    finally:
        store.close()


def test_a_limit_below_one_megabyte_is_raised_to_one(tmp_path):
    store = Store(tmp_path / "f.duckdb")
    try:
        for hostile in (0, -5):
            store.checkpoints.limit(hostile)
            assert store.checkpoints.wal_limit == 2**20
            assert store.db.execute("SELECT current_setting('checkpoint_threshold')").fetchone()[0] == "1.0 MiB"
    finally:
        store.close()


def test_a_checkpoint_refused_for_a_snapshot_older_than_the_last_update_is_retried_once_it_ends(tmp_path):
    import threading

    store = Store(tmp_path / "f.duckdb")
    view = store.view()
    try:
        _grow_log(store, 100)
        view.db.execute("BEGIN")  # a select's snapshot ...
        view.db.execute("SELECT count(*) FROM receipts").fetchone()
        with store.transaction():  # ... from before an UPDATE the writer then committed
            store.db.execute("UPDATE receipts SET plan_id = 'q' WHERE receipt_id LIKE 'r-1-%'")
        try:
            store.db.execute("CHECKPOINT")
            raise AssertionError("DuckDB checkpointed beside an older snapshot: this test no longer tests anything")
        except duckdb.TransactionException:
            pass
        ends = threading.Timer(0.004, view.db.execute, ["COMMIT"])  # the select ends a few ms later
        ends.start()
        assert store.checkpoints.when_idle(at_least=1)
        ends.join()
        assert store.checkpoints.refused == 0 and store.checkpoints.idle_runs == 1
    finally:
        store.close()


def test_an_idle_checkpoint_that_finds_input_waiting_when_it_runs_is_passed_over(tmp_path):
    # Queued in a quiet second, it runs after the writer's waiting jobs: a stream begun meanwhile must not stop
    # behind it. The next quiet second takes it.
    store = Store(tmp_path / "f.duckdb")
    try:
        store.checkpoints.limit(16 * 2**20)
        _grow_log(store, 2000)
        logged = store.checkpoints.wal_bytes()
        assert not store.checkpoints.when_idle(still_idle=lambda: False)
        assert store.checkpoints.wal_bytes() == logged and store.checkpoints.idle_runs == 0
        assert store.checkpoints.as_dict()["idle_checkpoints_passed_busy"] == 1
        assert store.checkpoints.when_idle(still_idle=lambda: True)
        assert store.checkpoints.wal_bytes() < 2**16 and store.checkpoints.idle_runs == 1
    finally:
        store.close()
