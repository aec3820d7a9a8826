"""The store's event-id ledger and clock: scoping, conflicts, migration of older files."""

from __future__ import annotations

import duckdb

from state.store import Store


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
