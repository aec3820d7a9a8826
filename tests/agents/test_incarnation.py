"""Judging recorded offsets against the broker as it is now (pure decisions over a real store)."""

from __future__ import annotations

import pytest

from agents.stream.incarnation import Recorded, judge
from state.store import Store
from streams.incarnation import record_mark

TOPICS = ("source-changes", "revocations")


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "s.duckdb")
    with s.transaction():
        s.record_cluster("cluster-a")
        s.save_offsets({("revocations", 0): 5, ("source-changes", 1): 3},
                       {("revocations", 0): (4, record_mark(b"maya", b"r-4", 1000)),
                        ("source-changes", 1): (2, record_mark(b"doc", b"s-2", 2000))})
    yield s
    s.close()


def test_the_same_records_on_the_same_cluster_are_no_reset(store):
    recorded = Recorded.read(store, TOPICS)
    assert recorded.targets == {("revocations", 0): 4, ("source-changes", 1): 2}
    firsts = {("revocations", 0): (4, record_mark(b"maya", b"r-4", 1000)),
              ("source-changes", 1): (2, record_mark(b"doc", b"s-2", 2000))}
    assert judge(recorded, "cluster-a", TOPICS, firsts, {("revocations", 0): 9, ("source-changes", 1): 3}) == {}


def test_another_cluster_resets_every_topic(store):
    assert judge(Recorded.read(store, TOPICS), "cluster-b", TOPICS, {}, {}) == {
        "source-changes": "cluster_changed", "revocations": "cluster_changed"}


def test_an_end_below_the_applied_offset_is_a_reset(store):
    recorded = Recorded.read(store, TOPICS)
    assert judge(recorded, "cluster-a", TOPICS, {}, {("revocations", 0): 1}) == {"revocations": "end_below_applied"}


def test_another_record_at_an_applied_offset_is_a_reset(store):
    recorded = Recorded.read(store, TOPICS)
    firsts = {("revocations", 0): (4, record_mark(b"maya", b"something else", 1000))}
    assert judge(recorded, "cluster-a", TOPICS, firsts, {("revocations", 0): 50}) == {"revocations": "record_changed"}


def test_a_consumer_that_fell_back_to_the_log_start_is_a_reset(store):
    recorded = Recorded.read(store, TOPICS)
    firsts = {("source-changes", 1): (0, record_mark(b"x", b"y", 1))}
    assert judge(recorded, "cluster-a", TOPICS, firsts, {}) == {"source-changes": "position_out_of_range"}


def test_partitions_not_heard_from_are_not_judged(store):
    assert judge(Recorded.read(store, TOPICS), "cluster-a", TOPICS, {}, {}) == {}


def test_a_rebase_forgets_offsets_and_bumps_the_epoch(store):
    with store.transaction():
        epoch = store.rebase("cluster-b", ["revocations", "source-changes", "plans"])
    assert epoch == 1 and store.incarnation() == ("cluster-b", 1)
    assert store.next_offsets() == {} and store.offset_marks() == {}
