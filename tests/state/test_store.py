"""The DuckDB store: the event-id ledger (scoping, conflicts, migration of older files), all-or-nothing
transactions and offsets, over a real file."""

from __future__ import annotations

import duckdb
import pytest

from state.store import Store


@pytest.fixture
def store(tmp_path):
    opened = Store(tmp_path / "f.duckdb")
    yield opened
    opened.close()


def test_an_event_id_is_claimed_once_across_batches_and_within_one(store):
    with store.transaction():
        assert store.claim_events([("t", "a", "h"), ("t", "b", "h"), ("t", "a", "h")]) == ["new", "new", "duplicate"]
    with store.transaction():
        assert store.claim_events([("t", "b", "h"), ("t", "c", "h"), ("t", "c", "h")]) == [
            "duplicate", "new", "duplicate"]
    assert {r[0] for r in store.db.execute("SELECT event_id FROM applied_events").fetchall()} == {"a", "b", "c"}


def test_a_failed_transaction_rolls_back_offsets_and_claimed_ids(store):
    with store.transaction():
        store.save_offsets({("revocations", 0): 5})
        store.claim_events([("t", "a", "h")])

    class Boom(Exception):
        pass

    with pytest.raises(Boom), store.transaction():
        store.save_offsets({("revocations", 0): 9, ("source-changes", 1): 3})
        store.claim_events([("t", "b", "h")])
        raise Boom
    assert store.next_offsets() == {"revocations": {0: 5}}
    with store.transaction():
        assert store.claim_events([("t", "a", "h"), ("t", "b", "h")]) == ["duplicate", "new"]  # b never applied


def test_offsets_survive_reopening_and_never_move_back(tmp_path):
    first = Store(tmp_path / "f.duckdb")
    with first.transaction():
        first.save_offsets({("clock", 0): 7})
    with first.transaction():
        first.save_offsets({("clock", 0): 4})  # a late, older batch position
    first.close()
    again = Store(tmp_path / "f.duckdb")
    try:
        assert again.next_offsets() == {"clock": {0: 7}}
    finally:
        again.close()


def test_event_ids_are_scoped_by_topic(tmp_path):
    store = Store(tmp_path / "f.duckdb")
    assert store.claim_events([("source-changes", "2002", "a")]) == ["new"]
    assert store.claim_events([("revocations", "2002", "b")]) == ["new"]
    assert store.claim_events([("revocations", "2002", "b"), ("source-changes", "2002", "a")]) == [
        "duplicate", "duplicate"]
    store.close()


def test_a_repeated_id_with_other_content_is_a_conflict_also_within_one_batch(tmp_path):
    store = Store(tmp_path / "f.duckdb")
    assert store.claim_events([("revocations", "e1", "a")]) == ["new"]
    assert store.claim_events([("revocations", "e1", "z")]) == ["conflict"]
    assert store.claim_events([("revocations", "e2", "a"), ("revocations", "e2", "a"),
                               ("revocations", "e2", "b")]) == ["new", "duplicate", "conflict"]
    assert store.claim_events([("revocations", "e2", "a")]) == ["duplicate"]   # the first content stays
    store.close()


def test_a_file_with_global_event_ids_is_migrated(tmp_path):
    path = tmp_path / "old.duckdb"
    db = duckdb.connect(str(path))
    db.execute("CREATE TABLE applied_events (event_id VARCHAR PRIMARY KEY); INSERT INTO applied_events VALUES ('x')")
    db.close()
    store = Store(path)
    # An id applied before the upgrade stays applied on every topic; new ids are scoped.
    assert store.claim_events([("revocations", "x", "a"), ("clock", "x", "b")]) == ["duplicate", "duplicate"]
    assert store.claim_events([("revocations", "y", "a"), ("source-changes", "y", "a")]) == ["new", "new"]
    store.close()
    reopened = Store(path)
    assert reopened.claim_events([("revocations", "y", "b")]) == ["conflict"]
    reopened.close()


def test_a_file_with_only_the_latest_policy_version_and_unversioned_revocations_is_migrated(tmp_path):
    path = tmp_path / "old.duckdb"
    db = duckdb.connect(str(path))
    db.execute("CREATE TABLE policy_bundles (bundle_id VARCHAR PRIMARY KEY, version BIGINT, effective_at TIMESTAMPTZ, "
               "cedar VARCHAR, decision_types VARCHAR); "
               "CREATE TABLE contracts (decision_type VARCHAR PRIMARY KEY, bundle_id VARCHAR, body VARCHAR); "
               "CREATE TABLE source_rules (bundle_id VARCHAR, provenance_group VARCHAR, classes VARCHAR[], "
               "PRIMARY KEY (bundle_id, provenance_group)); "
               "CREATE TABLE principals (id VARCHAR PRIMARY KEY, roles VARCHAR[], attributes VARCHAR, "
               "delegation_version BIGINT, deleted BOOLEAN NOT NULL DEFAULT false); "
               "CREATE TABLE revoked (principal VARCHAR, kind VARCHAR, value VARCHAR, effective_at TIMESTAMPTZ, "
               "issued_by VARCHAR, event_id VARCHAR, PRIMARY KEY (principal, kind, value)); "
               "INSERT INTO policy_bundles VALUES ('credit', 2, '2026-01-01T00:00:00Z', 'permit(principal, action, "
               "resource);', '{}'); INSERT INTO contracts VALUES ('credit.review', 'credit', '{\"purposes\": []}'); "
               "INSERT INTO source_rules VALUES ('credit', 'committee', ['approved_waiver']); "
               "INSERT INTO principals VALUES ('maya', ['credit_analyst'], '{}', 3, false); "
               "INSERT INTO revoked VALUES ('maya', 'role', 'credit_analyst', '2026-08-30T00:00:00Z', 'iam', NULL)")
    db.close()
    for _ in range(2):  # migrating twice changes nothing
        store = Store(path)
        assert store.db.execute("SELECT bundle_id, version, cedar, sources FROM policy_versions").fetchall() == [
            ("credit", 2, "permit(principal, action, resource);", '{"committee":["approved_waiver"]}')]
        assert store.db.execute("SELECT * FROM contract_versions").fetchall() == [
            ("credit", 2, "credit.review", '{"purposes": []}')]
        # Revoked before revocations carried a version: as of the principal's version then.
        assert store.db.execute("SELECT delegation_version FROM revoked").fetchall() == [(3,)]
        store.close()


def test_position_is_the_offsets_and_incarnation_in_one_read(store):
    assert store.position() == ({}, None, 0) == (store.next_offsets(), *store.incarnation())
    store.record_cluster("c1")
    assert store.position() == ({}, "c1", 0)
    with store.transaction():
        store.save_offsets({("revocations", 0): 9, ("source-changes", 1): 3, ("source-changes", 0): 4})
    assert store.position() == ({"revocations": {0: 9}, "source-changes": {0: 4, 1: 3}}, "c1", 0)
    assert store.position() == (store.next_offsets(), *store.incarnation())


class Boom(Exception):
    pass


def test_nothing_the_writer_remembers_from_a_rolled_back_transaction_survives_it(store):
    from datetime import datetime, timezone
    t0, t1 = datetime(2026, 1, 1, tzinfo=timezone.utc), datetime(2026, 1, 2, tzinfo=timezone.utc)
    with store.transaction():
        store.record_cluster("c1")
        store.set_clocks({0: t0})
        store.save_offsets({("a", 0): 1}, {("a", 0): (0, "m0")})
        store.bump_many({"seen": 1})
    with pytest.raises(Boom), store.transaction():
        store.rebase("c2", ["a"])
        store.set_clocks({0: t1})
        store.save_offsets({("a", 0): 7, ("b", 0): 3}, {("a", 0): (6, "m6"), ("b", 0): (2, "m2")})
        store.bump_many({"seen": 1, "fresh": 2})
        assert (store.incarnation(), store.now(), store.next_offsets()) == (("c2", 1), t1, {"a": {0: 7}, "b": {0: 3}})
        raise Boom
    assert (store.incarnation(), store.now(), store.next_offsets()) == (("c1", 0), t0, {"a": {0: 1}})
    # Rows the rolled-back transaction created are written again, not updated in place (a no-op).
    with store.transaction():
        store.save_offsets({("b", 0): 4}, {("b", 0): (3, "m3")})
        store.bump_many({"fresh": 5})
    assert store.offset_marks() == {("a", 0): (0, "m0"), ("b", 0): (3, "m3")}
    assert store.counters() == {"fresh": 5, "seen": 1}
    assert store.db.execute("SELECT topic, next_offset FROM offsets ORDER BY 1").fetchall() == [("a", 1), ("b", 4)]


def test_a_view_reads_committed_offsets_clock_and_incarnation_while_the_writer_holds_newer(store):
    from datetime import datetime, timezone
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    view = store.view()
    with store.transaction():
        store.record_cluster("c1")
        store.set_clocks({0: t0})
        store.save_offsets({("a", 0): 1})
        assert (store.incarnation(), store.now(), store.next_offsets()) == (("c1", 0), t0, {"a": {0: 1}})
        assert (view.incarnation(), view.now(), view.next_offsets()) == ((None, 0), None, {})
    assert (view.incarnation(), view.now(), view.next_offsets()) == (("c1", 0), t0, {"a": {0: 1}})


def test_offsets_marks_and_counters_in_place_keep_their_rules(store):
    with store.transaction():
        store.save_offsets({("a", 0): 5, ("a", 1): 2}, {("a", 0): (4, "m4"), ("a", 1): (1, "m1")})
        store.bump_many({"x": 1, "y": 1})
    with store.transaction():  # both partitions known now: updated in place, never moved back
        store.save_offsets({("a", 0): 3, ("a", 1): 9}, {("a", 0): (2, "m2"), ("a", 1): (8, "m8")})
        store.bump_many({"x": 2, "y": 3, "z": 1})
    assert store.next_offsets() == {"a": {0: 5, 1: 9}}
    assert store.offset_marks() == {("a", 0): (4, "m4"), ("a", 1): (8, "m8")}
    assert store.counters() == {"x": 3, "y": 4, "z": 1}


def test_a_large_batch_of_event_ids_is_claimed_like_a_small_one(store):
    with store.transaction():
        assert store.claim_events([("t", f"e{i}", "h") for i in range(20)]) == ["new"] * 20
    batch = [("t", f"e{i}", "h" if i % 2 else "x") for i in range(10, 50)] + [("t", "e45", "h"), ("t", "e46", "y")]
    with store.transaction():
        verdicts = store.claim_events(batch)
    expected = ["duplicate" if i % 2 else "conflict" for i in range(10, 20)] + ["new"] * 30 + ["duplicate", "conflict"]
    assert verdicts == expected


def test_a_file_with_marks_in_their_own_table_keeps_them_beside_its_offsets(tmp_path):
    path = tmp_path / "f.duckdb"
    old = duckdb.connect(str(path))
    old.execute("CREATE TABLE offsets (topic VARCHAR, partition INTEGER, next_offset BIGINT, "
                "PRIMARY KEY (topic, partition)); INSERT INTO offsets VALUES ('a', 0, 5), ('a', 1, 2); "
                "CREATE TABLE offset_marks (topic VARCHAR, partition INTEGER, record_offset BIGINT, mark VARCHAR, "
                "PRIMARY KEY (topic, partition)); INSERT INTO offset_marks VALUES ('a', 0, 4, 'm4')")
    old.close()
    store = Store(path)
    try:
        assert store.next_offsets() == {"a": {0: 5, 1: 2}}
        assert store.offset_marks() == {("a", 0): (4, "m4")}
        with store.transaction():
            store.save_offsets({("a", 0): 6, ("a", 1): 3}, {("a", 0): (3, "old"), ("a", 1): (2, "m2")})
        assert store.offset_marks() == {("a", 0): (4, "m4"), ("a", 1): (2, "m2")}
        assert not store.db.execute("SELECT 1 FROM duckdb_tables() WHERE table_name = 'offset_marks'").fetchone()
    finally:
        store.close()


def _primary_key(db, table: str) -> list[str]:
    return db.execute("SELECT constraint_column_names FROM duckdb_constraints() WHERE table_name = ? "
                      "AND constraint_type = 'PRIMARY KEY'", [table]).fetchone()[0]


def test_a_file_with_event_ids_keyed_by_topic_and_id_is_rekeyed_on_one_column(tmp_path):
    # DuckDB scans the table to find rows of a composite key: a duplicate batch cost 62 ms at 2M ids.
    path = tmp_path / "composite.duckdb"
    db = duckdb.connect(str(path))
    db.execute("CREATE TABLE applied_events (topic VARCHAR, event_id VARCHAR, content_hash VARCHAR, "
               "PRIMARY KEY (topic, event_id)); "
               "INSERT INTO applied_events VALUES ('revocations', 'e1', 'a'), ('', 'legacy', NULL), "
               "('clock', 'odd\x1fid', 'c')")
    db.close()
    store = Store(path)
    try:
        assert _primary_key(store.db, "applied_events") == ["event_key"]
        assert store.claim_events([("revocations", "e1", "a"), ("revocations", "e1", "b"), ("clock", "e1", "a"),
                                   ("source-changes", "legacy", "x"), ("clock", "odd\x1fid", "c"),
                                   ("clock", "odd", "c")]) == [
            "duplicate", "conflict", "new", "duplicate", "duplicate", "new"]
    finally:
        store.close()


def test_a_new_file_keys_event_ids_on_one_column_and_ids_with_the_separator_stay_apart(store):
    assert _primary_key(store.db, "applied_events") == ["event_key"]
    # A topic never holds the separator, so an id that does cannot pose as another topic's id.
    assert store.claim_events([("a", "b\x1fc", "h"), ("a", "b", "h"), ("b", "c", "h")]) == ["new", "new", "new"]
    assert store.claim_events([("a", "b\x1fc", "z")]) == ["conflict"]
    with pytest.raises(ValueError, match="separator"):
        store.claim_events([("a\x1fb", "c", "h")])


def test_a_migration_that_fails_half_way_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    import state.store_migrations as migrations

    path = tmp_path / "old.duckdb"
    db = duckdb.connect(str(path))
    db.execute("CREATE TABLE applied_events (event_id VARCHAR PRIMARY KEY); INSERT INTO applied_events VALUES ('x')")
    db.close()

    def broken(db):
        raise RuntimeError("disk full")

    monkeypatch.setattr(migrations, "_offset_marks", broken)  # runs after the event ids were rekeyed
    with pytest.raises(RuntimeError):
        Store(path)
    monkeypatch.undo()
    db = duckdb.connect(str(path))
    assert [r[0] for r in db.execute("SELECT column_name FROM duckdb_columns() "
                                     "WHERE table_name = 'applied_events'").fetchall()] == ["event_id"]
    db.close()
    store = Store(path)  # the next start migrates all of it
    try:
        assert store.claim_events([("revocations", "x", "a")]) == ["duplicate"]
    finally:
        store.close()


def test_a_new_file_has_small_blocks_and_an_older_file_keeps_its_own(tmp_path):
    fresh = Store(tmp_path / "new.duckdb")
    with fresh.transaction():
        fresh.save_offsets({("revocations", 0): 5})
    assert fresh.db.execute("PRAGMA database_size").fetchone()[2] == 16 * 1024
    fresh.close()
    older = duckdb.connect(str(tmp_path / "old.duckdb"))  # what a worker before 16 KiB blocks created
    older.execute("CREATE TABLE kept (a INTEGER)")
    older.execute("INSERT INTO kept VALUES (42)")
    older.close()
    reopened = Store(tmp_path / "old.duckdb")
    assert reopened.db.execute("PRAGMA database_size").fetchone()[2] == 256 * 1024
    assert reopened.db.execute("SELECT a FROM kept").fetchall() == [(42,)]
    with reopened.transaction():
        reopened.save_offsets({("revocations", 0): 7})
    reopened.close()
    again = Store(tmp_path / "old.duckdb")
    assert again.next_offsets()["revocations"] == {0: 7}
    again.close()


def _rows_kept(store: Store, table: str, column: str) -> int:
    """Rows the file holds for a table, deleted ones included (what DuckDB has not vacuumed)."""
    return store.db.execute(f"SELECT sum(count) FROM pragma_storage_info('{table}') WHERE column_name = ? "
                            "AND segment_type <> 'VALIDITY'", [column]).fetchone()[0] or 0


def test_rows_deleted_from_a_keyed_table_leave_the_file_at_a_checkpoint(tmp_path):
    # Receipts have a primary key: before, DuckDB kept every deleted row of such a table in the file for good.
    store = Store(tmp_path / "f.duckdb")
    for round_ in range(8):
        ids = [f"r{round_}-{i}" for i in range(400)]
        with store.transaction():
            store.db.execute("INSERT INTO receipts SELECT unnest(?::VARCHAR[]), 'p', repeat('x', 200)", [ids])
        with store.transaction():
            store.db.execute("DELETE FROM receipts WHERE receipt_id IN (SELECT unnest(?::VARCHAR[]))", [ids[:380]])
        store.db.execute("CHECKPOINT")
    assert store.db.execute("SELECT count(*) FROM receipts").fetchone()[0] == 8 * 20
    assert _rows_kept(store, "receipts", "receipt") <= 8 * 20 + 400  # at most the last round's deletes wait
    with pytest.raises(duckdb.ConstraintException):  # the rebuilt key still refuses a duplicate
        store.db.execute("INSERT INTO receipts VALUES ('r7-399', 'p', 'again')")
    assert store.db.execute("SELECT receipt FROM receipts WHERE receipt_id = 'r3-390'").fetchone() == ("x" * 200,)
    store.close()


def test_clock_ticks_update_known_partitions_insert_new_ones_and_survive_reopening(tmp_path):
    from datetime import datetime, timedelta, timezone
    t0 = datetime(2026, 9, 1, tzinfo=timezone.utc)
    store = Store(tmp_path / "f.duckdb")
    try:
        with store.transaction():
            store.set_clocks({0: t0})  # a partition seen first: inserted
        with store.transaction():
            store.set_clocks({0: t0 + timedelta(seconds=1), 1: t0 + timedelta(seconds=5)})  # updated, inserted
        assert store.clocks() == {0: t0 + timedelta(seconds=1), 1: t0 + timedelta(seconds=5)}
        assert store.view().clocks() == store.clocks() and store.now() == t0 + timedelta(seconds=5)
        store.db.execute("DELETE FROM clock WHERE id = 0")  # behind the writer's memo: its next tick still lands
        with store.transaction():
            store.set_clocks({0: t0 + timedelta(seconds=2)})
        assert store.view().clocks()[0] == t0 + timedelta(seconds=2)
    finally:
        store.close()
    reopened = Store(tmp_path / "f.duckdb")
    try:
        assert reopened.clocks() == {0: t0 + timedelta(seconds=2), 1: t0 + timedelta(seconds=5)}
    finally:
        reopened.close()


def test_a_long_statement_draws_nothing_on_stdout_through_the_writer_or_a_view(store, capfd):
    # DuckDB's Python client draws a progress bar past `progress_bar_time` (2 s by default): 0 here (which turns
    # the bar itself back on), so that a short statement would draw one too if the store let it print.
    view = store.view()
    for db in (store.db, view.db):
        db.execute("SET progress_bar_time = 0")
        assert db.execute("SELECT count(*) FROM range(50000000)").fetchone()[0] == 50_000_000
    out, err = capfd.readouterr()
    assert out == "" and err == ""
