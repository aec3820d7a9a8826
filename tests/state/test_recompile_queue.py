"""The recompile queue drains first queued first, whatever partition and offset announced each plan."""

from __future__ import annotations

import duckdb

from state.store import Store
from state.recompile_queue import RecompileQueue


def test_entries_come_out_in_the_order_they_were_queued_not_by_offset(tmp_path):
    store = Store(tmp_path / "f.duckdb")
    try:
        queue = RecompileQueue(store)
        queue.add_many(["pk-busy"])  # announced by an old, busy partition: high offsets
        queue.add_many([f"pk-{i}" for i in range(40)])  # later, by lower offsets of another partition
        queue.add_many(["pk-busy", "pk-z", "pk-y", "pk-z"])  # queued already: keeps its place; repeats go
        assert queue.oldest(44)[-2:] == ["pk-z", "pk-y"]  # in the order the batch gave them
        queue.remove(["pk-z", "pk-y"])
        assert queue.oldest(2) == ["pk-busy", "pk-0"]
        queue.remove(["pk-busy", "pk-0"])
        assert queue.oldest(3) == ["pk-1", "pk-2", "pk-3"] and queue.size() == 39
    finally:
        store.close()


def test_a_queue_written_before_its_order_was_kept_keeps_its_entries(tmp_path):
    path = tmp_path / "old.duckdb"
    db = duckdb.connect(str(path))
    db.execute("CREATE TABLE recompile_queue (plan_key VARCHAR PRIMARY KEY, src_topic VARCHAR, "
               "src_partition INTEGER, src_offset BIGINT)")
    db.execute("INSERT INTO recompile_queue VALUES ('pk-b', 'clock', 0, 9), ('pk-a', 'source-changes', 0, 3)")
    db.close()
    store = Store(path)
    try:
        queue = RecompileQueue(store)
        assert queue.oldest(5) == ["pk-a", "pk-b"]  # in the order of their offsets then
        queue.add_many(["pk-c"])
        assert queue.oldest(5) == ["pk-a", "pk-b", "pk-c"]  # new entries after the old ones
    finally:
        store.close()
