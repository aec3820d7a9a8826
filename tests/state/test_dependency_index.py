"""The dependency index: edges replaced whole per plan key, and lookups of any number of keys."""

from __future__ import annotations

import pytest

from state import dependency_index
from state.dependency_index import DependencyIndex
from state.store import Store


@pytest.fixture
def index(tmp_path):
    store = Store(tmp_path / "f.duckdb")
    index = DependencyIndex(store)
    index.replace_many({f"pk-{i}": ["policy:p", f"resource:r{i}", f"resource:r{i + 1}"] for i in range(1_200)})
    yield index
    store.close()


@pytest.mark.parametrize("count", [1, dependency_index.LOOKUP_CHUNK, dependency_index.LOOKUP_CHUNK + 1, 100,
                                   dependency_index.SCAN_FROM + 1])
def test_a_lookup_finds_every_edge_of_its_keys_once_however_many_keys(index, count):
    keys = [f"resource:r{i}" for i in range(count)]
    keys += keys[:5] + ["resource:unknown"]  # repeated and unknown keys change nothing
    pairs = index.affected_pairs(keys)
    expected = {(f"pk-{i}", f"resource:r{i}") for i in range(count)} | {
        (f"pk-{i - 1}", f"resource:r{i}") for i in range(1, count)}
    assert len(pairs) == len(expected) and set(pairs) == expected


def test_replacing_a_plan_keys_edges_drops_the_old_ones(index):
    index.replace_many({"pk-7": ["principal:m"]})
    assert set(index.affected_pairs(["resource:r7", "resource:r8"])) == {("pk-6", "resource:r7"),
                                                                       ("pk-8", "resource:r8")}
    assert index.affected_pairs(["principal:m"]) == [("pk-7", "principal:m")]
    index.drop_many(["pk-7", "pk-6"])
    assert index.affected_pairs(["principal:m", "resource:r7"]) == []
    assert len(index.affected_pairs(["policy:p"])) == 1_198


def test_edges_written_from_lists_or_through_arrow_are_the_same(index, monkeypatch):
    monkeypatch.setattr(dependency_index, "LIST_INSERT", 2)
    index.replace_many({"pk-7": ["principal:m", "policy:p", "resource:x"], "pk-9000": ["principal:m"]})
    assert sorted(index.affected_pairs(["principal:m", "resource:x"])) == [
        ("pk-7", "principal:m"), ("pk-7", "resource:x"), ("pk-9000", "principal:m")]


def test_replacing_edges_from_sql_writes_only_what_differs(index):
    db = index.store.db
    before = dict(((k, d), r) for r, d, k in db.execute("SELECT rowid, dep_key, plan_key FROM dependency_index")
                  .fetchall())
    db.execute("CREATE TEMP TABLE wanted AS SELECT * FROM (VALUES ('policy:p', 'pk-1'), ('resource:r1', 'pk-1'), "
               "('resource:new', 'pk-1'), ('policy:p', 'pk-2')) v(dep_key, plan_key)")
    dependency_index.replace_edges(index.store,
                                   "SELECT plan_key FROM (VALUES ('pk-1'), ('pk-2'), ('pk-9')) k(plan_key)",
                                   "SELECT dep_key, plan_key FROM wanted")
    after = dict(((k, d), r) for r, d, k in db.execute("SELECT rowid, dep_key, plan_key FROM dependency_index")
                 .fetchall())
    assert {d for k, d in after if k == "pk-1"} == {"policy:p", "resource:r1", "resource:new"}
    assert {d for k, d in after if k == "pk-2"} == {"policy:p"}
    assert not {d for k, d in after if k == "pk-9"}  # a key given no edges has none left
    # An edge both sides hold is the same row: unchanged edges are neither deleted nor written again.
    assert after[("pk-1", "policy:p")] == before[("pk-1", "policy:p")]
    assert after[("pk-1", "resource:r1")] == before[("pk-1", "resource:r1")]
    assert {k: after[k] for k in after if k[0] not in ("pk-1", "pk-2", "pk-9")} == {
        k: before[k] for k in before if k[0] not in ("pk-1", "pk-2", "pk-9")}


def test_a_key_found_without_edges_is_found_again_once_a_plan_depends_on_it(index):
    assert set(index.affected_pairs(["resource:later", "resource:r3"])) == {("pk-2", "resource:r3"),
                                                                            ("pk-3", "resource:r3")}
    assert index.affected_pairs(["resource:later"]) == []  # remembered without edges: no lookup
    with index.store.transaction():
        index.replace_many({"pk-new": ["resource:later"]})
    assert index.affected_pairs(["resource:later"]) == [("pk-new", "resource:later")]
    index.affected_pairs(["resource:sql"])
    with index.store.transaction():
        dependency_index.replace_edges(index.store, "SELECT 'pk-sql' AS plan_key",
                                       "SELECT 'resource:sql' AS dep_key, 'pk-sql' AS plan_key")
    assert index.affected_pairs(["resource:sql"]) == [("pk-sql", "resource:sql")]
    index.affected_pairs(["resource:rolled-back"])
    with pytest.raises(RuntimeError), index.store.transaction():
        index.replace_many({"pk-gone": ["resource:rolled-back"]})
        raise RuntimeError
    assert index.affected_pairs(["resource:rolled-back"]) == []


def _edges_in_file(index, keys):
    return set(index.store.db.execute("SELECT plan_key, dep_key FROM dependency_index WHERE dep_key IN "
                                      "(SELECT unnest(?))", [keys]).fetchall())


def test_remembered_edges_follow_every_write_of_the_writer(index, monkeypatch):
    """Batch after batch of lookups, replaced and dropped plan keys and a rolled-back batch, a lookup finds
    what the file holds; most lookups after the first are answered without reading it."""
    import random

    monkeypatch.setattr(dependency_index, "MOST_REMEMBERED", 40)  # keys past it are read every time
    rng = random.Random(7)
    keys = [f"resource:r{i}" for i in range(60)] + [f"principal:u{i}" for i in range(5)] + ["policy:p"]
    reads = []
    real = index._pairs
    monkeypatch.setattr(index, "_pairs", lambda chunks: reads.extend(k for c in chunks for k in c) or real(chunks))
    for step in range(300):
        asked = rng.sample(keys, 6)
        assert set(index.affected_pairs(asked)) == _edges_in_file(index, asked), step
        plan_keys = [f"pk-{rng.randrange(80)}" for _ in range(3)]
        if step % 50 == 3:
            with pytest.raises(RuntimeError), index.store.transaction():
                index.replace_many({k: rng.sample(keys, 3) for k in plan_keys})
                assert set(index.affected_pairs(asked)) == _edges_in_file(index, asked), step
                raise RuntimeError
        elif step % 5 == 0:
            index.drop_many(plan_keys)
        else:
            index.replace_many({k: rng.sample(keys, rng.randrange(4)) for k in plan_keys})
    assert set(index.affected_pairs(keys)) == _edges_in_file(index, keys)
    # Each key is read once after each of the 6 rollbacks at most, and the one past the bound each time it is asked.
    assert len(reads) <= 7 * len(keys) + reads.count("policy:p") and reads.count("policy:p") > 10


def test_a_key_many_plans_depend_on_is_read_each_time(index, monkeypatch):
    monkeypatch.setattr(dependency_index, "MOST_REMEMBERED", 100)
    index.affected_pairs(["policy:p", "resource:r5"])
    memo = index.store.cached(dependency_index.EDGES_MEMO, dependency_index.EdgeMemo)
    assert "policy:p" not in memo.plans and memo.plans["resource:r5"] == {"pk-4", "pk-5"}
    index.replace_many({f"pk-x{i}": ["resource:r5"] for i in range(100)})  # past the bound: the key is dropped
    assert "resource:r5" not in memo.plans and memo.size == sum(len(v) + 1 for v in memo.plans.values())
    assert len(index.affected_pairs(["resource:r5"])) == 102


def test_remembered_edges_stay_within_their_bound_as_plans_are_compiled(tmp_path, monkeypatch):
    """Keys remembered without edges gain them as plans are compiled: past the bound the memo starts over."""
    monkeypatch.setattr(dependency_index, "EDGE_ENTRIES", 2_000)
    store = Store(tmp_path / "f.duckdb")
    index = DependencyIndex(store)
    keys = [f"resource:r{i}" for i in range(1_500)]
    with store.transaction():
        assert index.affected_pairs(keys) == []  # 1,500 keys remembered without edges
    with store.transaction():
        index.replace_many({f"pk-{p}": keys[p * 10:p * 10 + 50] for p in range(100)})  # 5,000 edges
        memo = store.cached(dependency_index.EDGES_MEMO, dependency_index.EdgeMemo)
        assert memo.size == sum(len(v) + 1 for v in memo.plans.values()) <= dependency_index.EDGE_ENTRIES
        assert set(index.affected_pairs(keys[:60])) == _edges_in_file(index, keys[:60])
    store.close()


def _file_edges(index) -> list[tuple[str, str]]:
    return sorted(index.store.db.execute("SELECT plan_key, dep_key FROM dependency_index").fetchall())


def test_a_recompilation_on_the_same_keys_writes_no_edge_and_a_changed_one_only_the_difference(index):
    db = index.store.db
    index.replace_many({"pk-5": ["policy:p", "resource:r5", "resource:r6", "principal:m"]})
    rows = dict(((k, d), r) for r, d, k in db.execute("SELECT rowid, dep_key, plan_key FROM dependency_index "
                                                      "WHERE plan_key = 'pk-5'").fetchall())
    statements = []
    real = index.db

    class Counting:
        def execute(self, *args, **kwargs):
            statements.append(args[0])
            return real.execute(*args, **kwargs)

    index.db = Counting()
    index.replace_many({"pk-5": ["principal:m", "resource:r6", "resource:r5", "policy:p"]})
    assert statements == []  # the set this writer wrote last: nothing to write
    index.replace_many({"pk-5": ["policy:p", "resource:r5", "resource:r7", "principal:m"]})
    index.db = real
    assert len(statements) == 2  # one edge deleted, one written
    after = dict(((k, d), r) for r, d, k in db.execute("SELECT rowid, dep_key, plan_key FROM dependency_index "
                                                       "WHERE plan_key = 'pk-5'").fetchall())
    assert set(after) == {("pk-5", d) for d in ("policy:p", "resource:r5", "resource:r7", "principal:m")}
    assert all(after[k] == rows[k] for k in after if k in rows)  # kept edges are the same rows
    assert index.affected_pairs(["resource:r6"]) == [("pk-6", "resource:r6")]


@pytest.mark.parametrize("bound", [30, 100_000])
def test_the_file_holds_exactly_each_plan_keys_last_set_whatever_wrote_it(tmp_path, monkeypatch, bound):
    """Replacements remembered or not (a small bound starts the memo over), drops, rolled-back batches, SQL
    replacements and retention's deletes: after each, the file holds each plan key's last set once."""
    import random

    monkeypatch.setattr(dependency_index, "WRITTEN_EDGES", bound)
    store = Store(tmp_path / "f.duckdb")
    index = DependencyIndex(store)
    rng = random.Random(11)
    keys = [f"resource:r{i}" for i in range(12)] + ["policy:p", "principal:m"]
    truth: dict[str, set[str]] = {}
    for step in range(400):
        plan_keys = [f"pk-{rng.randrange(15)}" for _ in range(rng.randrange(1, 4))]
        sets = {k: rng.sample(keys, rng.randrange(5)) for k in plan_keys}
        roll = rng.choices(range(6), weights=[0, 1, 3, 3, 2, 12])[0]
        if roll == 1:
            with pytest.raises(RuntimeError), store.transaction():
                index.replace_many(sets)
                raise RuntimeError
        elif roll == 2:
            index.drop_many(plan_keys)
            for k in plan_keys:
                truth.pop(k, None)
        elif roll == 3:
            key = plan_keys[0]
            with store.transaction():
                dependency_index.replace_edges(store, f"SELECT '{key}' AS plan_key",
                                               "SELECT unnest(?::VARCHAR[]) AS dep_key, ? AS plan_key",
                                               [sets[key], key])
            truth[key] = set(sets[key])
        elif roll == 4:  # retention's way: a plain delete, then the memos forgotten
            with store.transaction():
                store.db.execute("DELETE FROM dependency_index WHERE plan_key = ?", [plan_keys[0]])
                store.forget(dependency_index.EDGES_MEMO, dependency_index.WRITTEN_MEMO)
            truth.pop(plan_keys[0], None)
        else:
            with store.transaction():
                index.replace_many(sets)
            truth.update({k: set(v) for k, v in sets.items()})
        expected = sorted((k, d) for k, ds in truth.items() for d in ds)
        assert _file_edges(index) == expected, step
    store.close()
