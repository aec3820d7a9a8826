"""Forgetting old event ids: a generation dropped against the same ids deleted row by row, and what a claim pays."""

from __future__ import annotations

import itertools
import shutil
import statistics
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb

from state import event_generations
from state.event_ids import claim_scoped
from state.store import Store

T0 = datetime(2026, 8, 30, 9, tzinfo=timezone.utc)
SPAN = timedelta(days=7)
CLAIM_BATCH = 8  # new ids per apply batch, as the hot-plan stream coalesces them at 200 events/s


def measure(total: int = 2_000_000, expired: int = 100_000, repeats: int = 3, claims: int = 60) -> dict:
    """Writer seconds (statement and commit) to forget `expired` of `total` ids, median of `repeats` fresh copies.

    Rotation: `prune` drops the older generation that holds the expired ids. Delete: the same
    ids removed from one table holding all `total` by their claim time. Beside them, the median
    ms of claiming a batch of new ids (transaction included) with the other `total - expired`
    ids in the same table, as before generations, and with them in an older generation beside
    an empty current one, as after a rotation (what consulting it costs every batch).
    """
    with tempfile.TemporaryDirectory(prefix="fpbench-event-ids-") as tmp:
        rotated, deleting = _rotated(Path(tmp), total, expired), _deleting(Path(tmp), total, expired)
        rotation = [_prune_once(Path(tmp), rotated) for _ in range(repeats)]
        delete = [_delete_once(Path(tmp), deleting) for _ in range(repeats)]
        claim = _claims(Path(tmp), total - expired, claims)
    rot, dele = statistics.median(r["seconds"] for r in rotation), statistics.median(r["seconds"] for r in delete)
    return {"total": total, "expired": expired, "repeats": repeats, "rotation_seconds": round(rot, 4),
            "delete_seconds": round(dele, 3), "ratio_delete_vs_rotation": round(dele / rot, 1) if rot else None,
            "delete_us_per_id": round(dele / expired * 1e6, 1), "ids_dropped": rotation[-1]["ids"],
            "ids_deleted": delete[-1]["ids"],
            "generations_after": rotation[-1]["generations"], "claim_batch": CLAIM_BATCH, **claim}


def _rows(table: str, n: int, prefix: str, extra: str = "") -> str:
    """SQL inserting `n` ids as the ledger keys them (`event_ids.event_key`)."""
    return (f"INSERT INTO {table} SELECT 'source-changes' || chr(31) || '{prefix}' || i, 'source-changes', "
            f"'{prefix}' || i, md5(i::VARCHAR){extra} FROM range({n}) r(i)")


def _rotated(tmp: Path, total: int, expired: int) -> Path:
    """A ledger whose older generation holds the `expired` ids and whose current one the rest."""
    store = Store(tmp / "rotated.duckdb")
    try:
        store.db.execute(_rows("applied_events", expired, "old-"))
        for at in (T0, T0 + SPAN):  # dated, then rotated: the ids above move to applied_events_0
            with store.transaction():
                event_generations.prune(store.db, at, SPAN)
        store.db.execute(_rows("applied_events", total - expired, "new-"))
        store.db.execute("CHECKPOINT")
    finally:
        store.close()
    return tmp / "rotated.duckdb"


def _deleting(tmp: Path, total: int, expired: int) -> Path:
    """The baseline: one table of all `total` ids with their claim time, the `expired` ones oldest."""
    path = tmp / "deleting.duckdb"
    db = duckdb.connect(str(path))
    try:
        db.execute("SET enable_progress_bar = false")
        db.execute(f"CREATE TABLE applied_events {event_generations.LEDGER_COLUMNS[:-1]}, claimed_at TIMESTAMPTZ)")
        db.execute(_rows("applied_events", expired, "old-", ", TIMESTAMPTZ '2026-08-30 09:00:00+00'"))
        db.execute(_rows("applied_events", total - expired, "new-", ", TIMESTAMPTZ '2026-09-06 09:00:00+00'"))
        db.execute("CHECKPOINT")
    finally:
        db.close()
    return path


def _prune_once(tmp: Path, built: Path) -> dict:
    path = tmp / "prune.duckdb"
    shutil.copy(built, path)
    store = Store(path)
    try:
        started = time.perf_counter()
        with store.transaction():
            pruned = event_generations.prune(store.db, T0 + 2 * SPAN, SPAN)
        seconds = time.perf_counter() - started
        return {"seconds": seconds, "ids": pruned.ids_dropped,
                "generations": event_generations.sizes(store.db)["event_id_generations"]}
    finally:
        store.close()


def _delete_once(tmp: Path, built: Path) -> dict:
    path = tmp / "delete.duckdb"
    shutil.copy(built, path)
    db = duckdb.connect(str(path))
    try:
        db.execute("SET threads = 1; SET enable_progress_bar = false")  # as the store runs
        started = time.perf_counter()
        db.begin()
        deleted = db.execute("DELETE FROM applied_events WHERE claimed_at < TIMESTAMPTZ '2026-09-01 00:00:00+00'"
                             ).fetchone()[0]
        db.commit()
        return {"seconds": time.perf_counter() - started, "ids": deleted}
    finally:
        db.close()


def _claims(tmp: Path, older: int, batches: int) -> dict:
    """Median ms of claiming a batch of new ids, without and with an older generation of `older` ids."""
    store = Store(tmp / "claims.duckdb")
    ids = itertools.count()
    try:
        store.db.execute(_rows("applied_events", older, "kept-"))
        store.db.execute("CHECKPOINT")
        alone = _claim_times(store, [], ids, batches)
        for at in (T0, T0 + SPAN):
            with store.transaction():
                event_generations.prune(store.db, at, SPAN)
        beside = _claim_times(store, event_generations.older_tables(store.db), ids, batches)
    finally:
        store.close()
    return {"claim_ms_without_older": round(alone, 2), "claim_ms_with_older": round(beside, 2),
            "claim_ratio_with_vs_without": round(beside / alone, 2) if alone else None, "older_ids": older}


def _claim_times(store: Store, older: list[str], ids, batches: int) -> float:
    times = []
    for n in range(batches + 3):  # the first batches warm DuckDB's buffers
        events = [("source-changes", f"claim-{next(ids)}", "h") for _ in range(CLAIM_BATCH)]
        started = time.perf_counter()
        with store.transaction():
            claim_scoped(store.db, events, older)
        if n >= 3:
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000
