"""The head cache shows only what the file committed, and a reader's fill never brings back a stale head."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from state.head_cache import Head, HeadCache
from state.local_state import LocalState

PLAN = b'{"plan_id": "p1", "admitted": []}'


def _plan(plan_id: str) -> bytes:
    return b'{"plan_id": "%s", "admitted": []}' % plan_id.encode()


def test_a_stored_head_shows_only_once_its_transaction_commits():
    cache = HeadCache()
    cache.stored("k", "p1", PLAN)
    assert cache.head("k") is None
    cache.committed()
    assert cache.head("k") == Head("p1", PLAN)


def test_a_rolled_back_store_never_shows():
    cache = HeadCache()
    cache.stored("k", "p1", PLAN)
    cache.rolled_back()
    cache.committed()  # the next transaction commits: nothing of the rolled-back one comes with it
    assert cache.head("k") is None


def test_a_removal_in_the_same_transaction_cancels_a_store_before_it():
    cache = HeadCache()
    cache.stored("k", "p1", PLAN)
    cache.remove_plans(["p1"])
    cache.committed()
    assert cache.head("k") is None
    cache.stored("k", "p2", _plan("p2"))
    cache.remove_keys(["k"])
    cache.committed()
    assert cache.head("k") is None


def test_a_store_after_a_removal_in_the_same_transaction_stands():
    cache = HeadCache()
    cache.stored("k", "p1", PLAN)
    cache.committed()
    cache.remove_plans(["p1"])  # invalidated, then its successor stored
    cache.stored("k", "p2", _plan("p2"))
    assert cache.head("k") is None  # removed at once, the successor not shown before the commit
    cache.committed()
    assert cache.head("k").plan_id == "p2"


def test_a_fill_read_before_a_removal_is_refused():
    cache = HeadCache()
    generation = cache.generation
    cache.remove_plans(["p1"])  # nothing held, yet a reader may be reading p1 as fresh right now
    assert not cache.fill(generation, "k", Head("p1", PLAN))
    assert cache.head("k") is None


def test_a_fill_between_a_removal_and_its_commit_is_removed_at_the_commit():
    cache = HeadCache()
    cache.remove_plans(["p1"])  # the writer, before its commit
    generation = cache.generation  # a reader starts now, its snapshot still shows p1 fresh
    assert cache.fill(generation, "k", Head("p1", PLAN))
    cache.committed()  # the invalidation commits: the repeat removal takes the fill back
    assert cache.head("k") is None
    assert not cache.fill(generation, "k", Head("p1", PLAN))


def test_a_key_removed_while_a_reader_filled_it_goes_at_the_commit():
    cache = HeadCache()
    cache.remove_keys(["k"])
    generation = cache.generation
    cache.fill(generation, "k", Head("p1", PLAN))
    cache.committed()
    assert cache.head("k") is None


def test_names_go_with_an_entity_write_and_a_stale_fill_is_refused():
    cache = HeadCache()
    generation = cache.generation
    assert cache.fill(generation, name="acme", entity_id="E1")
    assert cache.entity("acme") == "E1"
    cache.remove_names()
    assert cache.entity("acme") is None
    assert not cache.fill(generation, name="acme", entity_id="E1")
    generation = cache.generation
    assert cache.fill(generation, name="acme", entity_id="E1")  # read before the entity write committed
    cache.committed()
    assert cache.entity("acme") is None


def test_remove_all_drops_held_and_pending_heads():
    cache = HeadCache()
    cache.stored("a", "p1", PLAN)
    cache.committed()
    cache.stored("b", "p2", _plan("p2"))
    cache.remove_all()
    cache.stored("c", "p3", _plan("p3"))  # stored after the removal: it stands
    cache.committed()
    assert cache.head("a") is None and cache.head("b") is None and cache.head("c").plan_id == "p3"


def test_the_oldest_heads_go_past_the_bound():
    cache = HeadCache(max_heads=2)
    for i in range(3):
        cache.stored(f"k{i}", f"p{i}", _plan(f"p{i}"))
    cache.committed()
    assert cache.head("k0") is None and cache.head("k2") is not None
    cache.remove_plans(["p0"])  # an id no longer held is no error


@pytest.fixture
def state(tmp_path):
    opened = LocalState.open(tmp_path / "state.duckdb")
    yield opened
    opened.close()


def test_the_store_publishes_at_commit_and_drops_at_rollback(state):
    heads = state.store.heads
    with state.store.transaction():
        heads.stored("k", "p1", PLAN)
    assert heads.head("k") is not None
    with pytest.raises(RuntimeError):
        with state.store.transaction():
            heads.stored("j", "p2", _plan("p2"))
            raise RuntimeError("boom")
    assert heads.head("j") is None


def test_a_readers_transaction_never_publishes_the_writers_pending_heads(state):
    reader = state.reader()
    with state.store.transaction():
        state.store.heads.stored("k", "p1", PLAN)
        with reader.store.transaction():  # the event loop's snapshot read, while the writer is mid-transaction
            pass
        assert reader.store.heads.head("k") is None
    assert reader.store.heads.head("k") is not None


def test_plan_store_invalidation_and_dropped_heads_leave_the_cache(state):
    heads = state.store.heads
    with state.store.transaction():
        heads.stored("k", "p1", PLAN)
        heads.stored("j", "p2", _plan("p2"))
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with state.store.transaction():
        state.plans.invalidate_many([("p1", "source_changed", {"x": 1}, None)], at)
        assert heads.head("k") is None  # gone before the commit, not after
    state.plans.drop_heads(["j"])  # outside a transaction: the statement commits, the removal is repeated
    assert heads.head("j") is None


def test_invalidating_the_old_plan_after_storing_its_successor_keeps_the_successor():
    cache = HeadCache()
    cache.stored("k", "p1", PLAN)
    cache.committed()
    cache.stored("k", "p2", _plan("p2"))  # the recompile stores the successor, then marks the old plan
    cache.remove_plans(["p1"])
    assert cache.head("k") is None
    cache.committed()
    assert cache.head("k").plan_id == "p2"


def test_a_fill_read_before_a_commit_that_stored_the_key_never_replaces_what_it_stored():
    # A recompilation with the same outcome keeps the plan id but stores a new document (its
    # decision_time, valid_until and receipt_id move): no removal, yet a snapshot read before
    # the commit holds the document the file replaced.
    old, new = b'{"plan_id": "p1", "valid_until": "old"}', b'{"plan_id": "p1", "valid_until": "new"}'
    cache = HeadCache()
    generation = cache.generation  # a reader starts; its snapshot shows the old document
    cache.stored("k", "p1", new)
    cache.committed()
    assert not cache.fill(generation, "k", Head("p1", old))
    assert cache.head("k").plan == new


def test_a_fill_while_a_commit_is_in_flight_is_refused():
    cache = HeadCache()
    cache.remove_plans(["p2"])  # the writer brings p1 back: p2 invalidated, p1 stored again
    cache.stored("k", "p1", PLAN)
    generation = cache.generation  # a reader starts after the removal; its snapshot may show the commit
    cache.committing()
    assert not cache.fill(generation, "k", Head("p1", PLAN))  # `position` still names the state p1 was stale at
    cache.committed(({"source-changes": {0: 2}}, "c", 0))
    assert cache.head("k").plan_id == "p1" and cache.position == ({"source-changes": {0: 2}}, "c", 0)


def test_the_store_publishes_the_position_its_commit_moved(state):
    with state.store.transaction():
        state.store.save_offsets({("clock", 0): 5})
        assert state.store.heads.position[0] == {}  # not before the commit
    assert state.store.heads.position == state.store.position()
    with pytest.raises(RuntimeError):
        with state.store.transaction():
            state.store.save_offsets({("clock", 0): 9})
            raise RuntimeError("boom")
    assert state.store.heads.position[0] == {"clock": {0: 5}}
    state.store.save_offsets({("clock", 0): 7})  # outside a transaction: committed at once
    assert state.store.heads.position[0] == {"clock": {0: 7}}


def test_the_oldest_heads_go_past_the_byte_bound_and_a_larger_one_is_never_held():
    cache = HeadCache(max_bytes=3 * len(PLAN))
    for i in range(4):
        cache.stored(f"k{i}", f"p{i}", _plan(f"p{i}"))
    cache.stored("huge", "ph", b"x" * (4 * len(PLAN)))
    cache.committed()
    assert cache.head("k0") is None and cache.head("huge") is None
    assert all(cache.head(f"k{i}") is not None for i in (1, 2, 3))
    assert cache.sizes()["bytes"] == sum(len(_plan(f"p{i}")) for i in (1, 2, 3))
    cache.remove_keys(["k1"])
    cache.remove_all()
    assert cache.sizes()["bytes"] == 0
