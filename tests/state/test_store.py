"""The DuckDB store: event-id ledger and all-or-nothing transactions, over a real file."""

from __future__ import annotations

import pytest

from state.store import Store


@pytest.fixture
def store(tmp_path):
    opened = Store(tmp_path / "f.duckdb")
    yield opened
    opened.close()


def test_an_event_id_is_claimed_once_across_batches_and_within_one(store):
    with store.transaction():
        assert store.claim_events(["a", "b", "a"]) == {"a", "b"}
    with store.transaction():
        assert store.claim_events(["b", "c", "c"]) == {"c"}
    assert {r[0] for r in store.db.execute("SELECT event_id FROM applied_events").fetchall()} == {"a", "b", "c"}


def test_a_failed_transaction_rolls_back_offsets_and_claimed_ids(store):
    with store.transaction():
        store.save_offsets({("revocations", 0): 5})
        store.claim_events(["a"])

    class Boom(Exception):
        pass

    with pytest.raises(Boom), store.transaction():
        store.save_offsets({("revocations", 0): 9, ("source-changes", 1): 3})
        store.claim_events(["b"])
        raise Boom
    assert store.next_offsets() == {"revocations": {0: 5}}
    with store.transaction():
        assert store.claim_events(["a", "b"]) == {"b"}  # b was never applied, so it is still new


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
