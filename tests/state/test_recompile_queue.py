"""The recompile queue drains first queued first, whatever partition and offset announced each plan."""

from __future__ import annotations

import duckdb

from state.store import Store
from state.recompile_queue import RecompileQueue


def test_entries_come_out_in_the_order_they_were_queued_not_by_offset(tmp_path):
    store = Store(tmp_path / "f.duckdb")
    try:
        queue = RecompileQueue(store)
        queue.add_many([("pk-busy", "source-changes", 1, 5_000_000)])  # an old, busy partition: high offsets
        queue.add_many([(f"pk-{i}", "source-changes", 0, 100 + i) for i in range(40)])  # later, lower offsets
        queue.add_many([("pk-busy", "revocations", 0, 1)])  # queued already: keeps its place and first cause
        assert queue.oldest(2) == [("pk-busy", "source-changes", 1, 5_000_000), ("pk-0", "source-changes", 0, 100)]
        queue.remove(["pk-busy", "pk-0"])
        assert [e[0] for e in queue.oldest(3)] == ["pk-1", "pk-2", "pk-3"]
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
        assert queue.oldest(5) == [("pk-a", "source-changes", 0, 3), ("pk-b", "clock", 0, 9)]
        queue.add_many([("pk-c", "source-changes", 1, 0)])
        assert [e[0] for e in queue.oldest(5)] == ["pk-a", "pk-b", "pk-c"]  # new entries after the old ones
    finally:
        store.close()
