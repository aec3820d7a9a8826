"""Review of f6e547c (counter increments kept in memory between writes): what a caller and an operator observe.

Two defects the review found, fixed since: a kill -9 lost increments much older than a second (they were written only
by the next writer transaction a second after the last write: on an idle worker, the standby pruning every 5 s), and
a failed write of the pending increments left the writer's connection in an aborted transaction. They are written
now by a timer's writer job of their own, every second once due. Claims that hold: a clean stop without a broker
still writes the pending increments, /metrics counters never go backwards while increments move to the file, and
a rolled-back transaction (a nested one with it) counts nothing.
"""

from __future__ import annotations

import asyncio
import re
import time

import duckdb
import pytest

from state import counts as counts_module
from state.store import Store
from streams.broker import EmbeddedBroker
from tests.conftest import ATLAS_REQUEST, eventually, launch
from tests.events import resource

APPLIED = "applied.source-changes"
WRITING_JOBS = ("prune_standby", "enforce_retention")  # timers whose writer transaction writes what is pending


def _file_rows(path) -> dict[str, int]:
    db = duckdb.connect(str(path))
    try:
        return dict(db.execute("SELECT name, value FROM counters").fetchall())
    finally:
        db.close()


# -- defect 1: a kill -9 loses more than the last second's increments -------------------------------------------


@pytest.mark.timeout(180)
async def test_a_kill_9_keeps_increments_committed_more_than_a_second_before_it(worker):
    """Two events applied a moment apart, then 2.5 s with nothing to apply: the write of counters (a timer's writer
    job, once what is pending waited a second) has put both increments in the file before the kill -9."""
    await worker.select(ATLAS_REQUEST, await worker.load("atlas.jsonl"))
    reported = (await worker.get("/healthz"))["counters"].get(APPLIED, 0)
    for n in range(2):
        await worker.publish_events(resource(f"unrelated-{n}", entity="UNRELATED-ENTITY"))

        async def applied(before=reported):
            health = await worker.get("/healthz")
            return health if health["counters"].get(APPLIED, 0) > before else None

        reported = (await eventually(applied, timeout=15, what="the event applied"))["counters"][APPLIED]
        await asyncio.sleep(0.3)
    counted_at = time.monotonic()
    await asyncio.sleep(2.5)
    assert (await worker.get("/healthz"))["counters"][APPLIED] == reported
    killed_after = time.monotonic() - counted_at
    worker.kill()
    stored = _file_rows(worker.settings.db_path).get(APPLIED, 0)
    assert stored == reported, (f"/healthz counted {reported} applied source changes {killed_after:.1f} s before "
                                f"a kill -9; the file kept {stored}")


# -- defect 2: a failed write of the pending increments is never rolled back --------------------------------------


def _one_write_that_overflows(store: Store) -> None:
    """A counter one increment from the BIGINT limit in the file, and that increment pending: writing it fails
    with a real DuckDB error (as a damaged block or any statement error would)."""
    store.bump_many({"near_limit": 2**63 - 5})  # outside a transaction: written at once
    with store.transaction():
        store.bump_many({"near_limit": 10})  # committed, pending in memory


@pytest.mark.timeout(60)
def test_a_failed_statement_in_a_transaction_is_rolled_back_and_the_next_transaction_works(tmp_path):
    """The contract the flush must keep: a statement failing in the body rolls its transaction back."""
    store = Store(tmp_path / "f.duckdb")
    try:
        store.bump_many({"near_limit": 2**63 - 5})
        with pytest.raises(duckdb.OutOfRangeException), store.transaction():
            store.save_offsets({("source-changes", 0): 3})
            store.db.execute("UPDATE counters SET value = value + 10 WHERE name = 'near_limit'")
        with store.transaction():
            store.save_offsets({("source-changes", 0): 4})
        assert store.next_offsets() == {"source-changes": {0: 4}}
    finally:
        store.close()


@pytest.mark.timeout(60)
def test_a_failed_write_of_pending_counts_leaves_the_writer_usable(tmp_path):
    """The write of what is pending fails with a real DuckDB error: it is rolled back alone, the increments stay
    pending (still read), later transactions work, and the clean stop logs the failure and still closes the file."""
    store = Store(tmp_path / "f.duckdb")
    _one_write_that_overflows(store)
    with pytest.raises(duckdb.OutOfRangeException):
        store.write_counts()
    assert store.counts.pending == {"near_limit": 10} and store.counters()["near_limit"] == 2**63 + 5
    with store.transaction():
        store.save_offsets({("source-changes", 0): 4})
        store.bump_many({"applied": 1})
    assert store.next_offsets() == {"source-changes": {0: 4}}
    store.close()  # logs the failed write: only these increments are lost
    again = Store(tmp_path / "f.duckdb")
    try:
        assert again.next_offsets() == {"source-changes": {0: 4}} and again.counters()["near_limit"] == 2**63 - 5
    finally:
        again.close()


# -- claims that hold ---------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_rolled_back_transaction_counts_nothing_even_when_a_write_of_pending_counts_was_due(tmp_path, monkeypatch):
    """Rolled back (a nested transaction's increments with it): nothing of it is counted, what was pending stays
    pending, and the next write of counters writes it with what was committed since, once."""
    store = Store(tmp_path / "f.duckdb")
    view = store.view()
    try:
        with store.transaction():
            store.bump_many({"n": 2})
        monkeypatch.setattr(counts_module, "FLUSH_SECONDS", 0.0)
        with pytest.raises(RuntimeError), store.transaction():
            store.bump_many({"n": 5})
            with store.transaction():  # nested: joins, and dies with, the outer transaction
                store.bump_many({"n": 7})
            raise RuntimeError("rolled back")
        assert store.counters() == view.counters() == {"n": 2}
        with store.transaction():
            store.bump_many({"n": 1})
        store.write_counts()  # the pending 2 with the 1 committed since
        assert dict(store.db.execute("SELECT name, value FROM counters").fetchall()) == {"n": 3}
        assert store.counts.pending == {} and view.counters() == {"n": 3}
    finally:
        store.close()


@pytest.fixture
def own_broker():
    """A broker of this test's own: it is stopped under the worker."""
    with EmbeddedBroker() as running:
        yield running


@pytest.mark.timeout(180)
async def test_sigterm_without_a_broker_still_writes_the_pending_counts(own_broker, tmp_path):
    """Close path: the worker's stop waits out the broker (5 s) and the writer, then `Store.close()` writes what is
    pending, within the 8.5 s watchdog."""
    async with launch(own_broker, tmp_path) as worker:
        await worker.select(ATLAS_REQUEST, await worker.load("atlas.jsonl"))
        for n in range(2):  # the second increment is still pending at the stop (see the kill -9 test)
            await worker.publish_events(resource(f"unrelated-{n}", entity="UNRELATED-ENTITY"))
            await asyncio.sleep(0.2)

        async def applied():
            health = await worker.get("/healthz")
            return health if health["counters"].get(APPLIED, 0) >= 13 else None

        reported = (await eventually(applied, timeout=30, what="both events applied"))["counters"][APPLIED]
        own_broker.stop()
        for _ in range(100):
            if (await worker.get("/healthz"))["revocations"]["state"] == "unknown":
                break
            await asyncio.sleep(0.1)
        worker.proc.terminate()
        assert worker.proc.wait(timeout=20) == 0, worker.log_path.read_text()[-3000:]
        assert _file_rows(worker.settings.db_path).get(APPLIED) == reported


_APPLIED_METRIC = re.compile(rb'^freshplan_events_applied_total\{topic="source-changes"\} ([0-9.e+]+)$', re.M)


@pytest.mark.timeout(180)
async def test_metrics_counters_never_go_backwards_while_pending_counts_are_written(worker, monkeypatch):
    """/metrics is read (file rows + pending, under the commit lock) while events stream in and every second a
    writer transaction moves what is pending into the file: the applied counter only ever grows."""
    await worker.select(ATLAS_REQUEST, await worker.load("atlas.jsonl"))
    seen: list[float] = []
    stop = asyncio.Event()

    async def scrape() -> None:
        while not stop.is_set():
            async with worker.http.get(f"{worker.url}/metrics") as resp:
                assert resp.status == 200
                match = _APPLIED_METRIC.search(await resp.read())
                if match:
                    seen.append(float(match.group(1)))

    scraping = [asyncio.ensure_future(scrape()) for _ in range(3)]
    try:
        for n in range(40):
            await worker.publish_events(resource(f"streamed-{n}", entity="UNRELATED-ENTITY"))
            await asyncio.sleep(0.1)

        async def all_applied():
            return seen and seen[-1] >= 11 + 40

        await eventually(all_applied, timeout=60, what="every event counted")
    finally:
        stop.set()
        await asyncio.gather(*scraping)
    assert len(seen) > 20
    assert seen == sorted(seen), [(a, b) for a, b in zip(seen, seen[1:], strict=False) if b < a][:5]
