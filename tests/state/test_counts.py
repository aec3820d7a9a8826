"""Counter increments: read as soon as committed, written to the file a second later or at a clean stop."""

from __future__ import annotations

import threading

import pytest

from state import counts as counts_module
from state.store import Store
from tests.conftest import ATLAS_REQUEST


def _rows(store: Store) -> dict[str, int]:
    return dict(store.db.execute("SELECT name, value FROM counters").fetchall())


def test_committed_increments_are_read_at_once_and_a_rolled_back_one_never(tmp_path):
    store = Store(tmp_path / "f.duckdb")
    view = store.view()
    try:
        with store.transaction():
            store.bump_many({"applied": 2, "zero": 0})
            assert store.counters() == {"applied": 2}  # the writer reads its own transaction
            assert view.counters() == {}  # a view reads what is committed
        with pytest.raises(RuntimeError), store.transaction():
            store.bump_many({"applied": 5, "lost": 1})
            raise RuntimeError("rolled back")
        assert store.counters() == view.counters() == {"applied": 2}
        assert _rows(store) == {}  # not written yet: the first transaction a second from now writes it
    finally:
        store.close()


def test_pending_increments_go_out_in_a_write_of_their_own_once_due_and_at_a_clean_stop(tmp_path, monkeypatch):
    store = Store(tmp_path / "f.duckdb")
    monkeypatch.setattr(counts_module, "FLUSH_SECONDS", 3600.0)
    with store.transaction():
        store.bump_many({"applied": 1})
    assert not store.counts.due()  # a second has not passed since the last write (the file's opening)
    monkeypatch.setattr(counts_module, "FLUSH_SECONDS", 0.0)
    with store.transaction():
        store.bump_many({"applied": 2, "new": 1})
    assert store.counts.due() and _rows(store) == {}  # the transactions write no counter
    store.write_counts()  # the writer's timer job
    assert _rows(store) == {"applied": 3, "new": 1} and store.counts.pending == {} and not store.counts.due()
    assert store.counters() == {"applied": 3, "new": 1}
    with store.transaction():
        store.bump_many({"applied": 4})
    store.bump_many({"outside": 1})  # no transaction: written at once, as before
    assert _rows(store) == {"applied": 3, "new": 1, "outside": 1} and store.counters()["applied"] == 7
    store.close()  # a clean stop writes what is pending
    again = Store(tmp_path / "f.duckdb")
    try:
        assert _rows(again) == again.counters() == {"applied": 7, "new": 1, "outside": 1}
    finally:
        again.close()


@pytest.mark.timeout(60)
def test_a_reader_neither_counts_an_increment_twice_nor_misses_one_while_the_writer_writes_them(tmp_path):
    store = Store(tmp_path / "f.duckdb")
    view = store.view()
    done, seen, stop = [0], [], threading.Event()

    def read() -> None:
        while not stop.is_set():
            before = done[0]
            value = view.counters().get("n", 0)
            seen.append((before, value, done[0]))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(300):
            with store.transaction():
                store.bump_many({"n": 1})
            done[0] += 1
            if i % 2:
                store.write_counts()  # as the writer's timer job does
    finally:
        stop.set()
        reader.join()
        store.close()
    assert len(seen) > 10
    # Each read lies between the transactions committed before it began and those committed (or committing) after.
    assert all(before <= value <= after + 1 for before, value, after in seen), [s for s in seen if not
                                                                              s[0] <= s[1] <= s[2] + 1][:5]
    assert [v for _, v, _ in seen] == sorted(v for _, v, _ in seen)


@pytest.mark.timeout(120)
async def test_a_worker_reports_counts_at_once_and_a_clean_stop_leaves_them_in_its_file(worker):
    """Through the broker: a clean stop writes every count of applied events /healthz showed before it."""
    await worker.select(ATLAS_REQUEST, await worker.load("atlas.jsonl"))
    # The apply counts are the file's (the loop adds counts of selects of its own, never written).
    reported = {n: v for n, v in (await worker.get("/healthz"))["counters"].items() if n.startswith("applied.")}
    assert reported.get("applied.source-changes", 0) >= 1, reported
    worker.stop()
    store = Store(worker.settings.db_path)
    try:
        stored = _rows(store)
    finally:
        store.close()
    assert {n: stored.get(n, 0) for n in reported if n != "applied.clock"} == {
        n: v for n, v in reported.items() if n != "applied.clock"}  # the clock keeps ticking until the stop
