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
