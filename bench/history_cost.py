"""What one small apply batch costs once the event-id ledger and key changes hold a long history, vs a new file."""

from __future__ import annotations

import itertools
import statistics
import tempfile
import time
from pathlib import Path
from typing import Iterator

import duckdb
import orjson

from agents.stream.event_apply import EventApplier, RawMessage
from agents.cli.loader import read_scenario
from agents.plans.plan_writer import PlanWriter
from agents.web.query import QueryService
from bench.streaming import SCENARIOS, hot_edits
from state.local_state import LocalState

BATCH = 8  # events per batch: what the hot-plan stream coalesces at 200 events/s


def measure(history: int = 1_000_000, batches: int = 30) -> dict:
    """Median apply time of hot-plan batches (new events, then repeats of them) on a new file and after `history`
    ids and key changes are recorded; and the two ledger statements on the composite keys used before, as a baseline."""
    with tempfile.TemporaryDirectory(prefix="fpbench-history-") as tmp:
        state, applier, offsets = atlas_state(Path(tmp) / "f.duckdb")
        try:
            QueryService(state, applier.plans).select(orjson.loads((SCENARIOS / "atlas-request.json").read_bytes()))
            edits = iter(hot_edits(4 * batches * BATCH + 3 * BATCH))
            _apply_times(applier, edits, offsets, 3)  # warm: the first batches fill the writer's memo
            fresh = _apply_times(applier, edits, offsets, batches)
            _grow(state.store.db, history)
            grown = _apply_times(applier, edits, offsets, batches)
        finally:
            state.close()
        composite = {str(size): _composite_statements(Path(tmp) / f"composite-{size}.duckdb", size)
                     for size in (1_000, history)}  # string keys, as the JSON result holds them
    ratio = {kind: round(grown[kind] / fresh[kind], 2) for kind in fresh}
    return {"history": history, "batch_events": BATCH, "batches": batches, "fresh_file_ms": fresh,
            "with_history_ms": grown, "ratio_history_vs_fresh": ratio,
            "composite_keys_baseline_ms": composite,
            "composite_ratio_history_vs_fresh": {
                kind: round(composite[str(history)][kind] / composite["1000"][kind], 2) for kind in composite["1000"]}}


def atlas_state(path: Path) -> tuple[LocalState, EventApplier, Iterator[int]]:
    """A state file with the Atlas scenario applied, its applier, and the offsets to go on from."""
    state = LocalState.open(path)
    applier = EventApplier(state, PlanWriter(state, lambda name: f"bench-{name}"))
    offsets = itertools.count()
    applier.apply([RawMessage(topic, 0, next(offsets), key, value)
                   for topic, key, value in read_scenario(SCENARIOS / "atlas.jsonl")])
    return state, applier, offsets


def _apply_times(applier: EventApplier, edits, offsets, batches: int) -> dict:
    """Median ms of a batch of new hot-plan events, and of a batch repeating one already applied."""
    new, repeats = [], []
    for _ in range(batches):
        batch = [RawMessage(topic, 0, next(offsets), key, value)
                 for topic, key, value in itertools.islice(edits, BATCH)]
        started = time.perf_counter()
        applier.apply(batch)
        new.append(time.perf_counter() - started)
        again = [RawMessage(m.topic, 0, next(offsets), m.key, m.value) for m in batch]  # a producer's retry
        started = time.perf_counter()
        applier.apply(again)
        repeats.append(time.perf_counter() - started)
    return {"new_events": round(statistics.median(new) * 1000, 2),
            "repeated_events": round(statistics.median(repeats) * 1000, 2)}


def _grow(db: duckdb.DuckDBPyConnection, rows: int) -> None:
    """Ids and key changes as a worker that applied `rows` events over months holds them (keys as `event_key` and
    `change_key` build them)."""
    db.execute(f"INSERT INTO applied_events SELECT 'source-changes' || chr(31) || 'past-' || i, 'source-changes', "
               f"'past-' || i, md5(i::VARCHAR) FROM range({rows}) r(i)")
    db.execute(f"INSERT INTO key_changes SELECT 'source-changes' || chr(31) || (i % 4) || chr(31) || 'resource:past-' "
               f"|| i, 'resource:past-' || i, 'source-changes', i % 4, i, NULL FROM range({rows}) r(i)")
    db.execute("CHECKPOINT")


def _composite_statements(path: Path, rows: int, repeats: int = 30) -> dict:
    """The baseline: the ledger statements of one batch on (topic, event id) and (key, topic, partition) keys."""
    db = duckdb.connect(str(path))
    try:
        db.execute("SET threads = 1")
        db.execute("CREATE TABLE applied_events (topic VARCHAR, event_id VARCHAR, content_hash VARCHAR, "
                   "PRIMARY KEY (topic, event_id)); CREATE TABLE key_changes (dep_key VARCHAR, topic VARCHAR, "
                   "partition INTEGER, change_offset BIGINT, event_id VARCHAR, "
                   "PRIMARY KEY (dep_key, topic, partition))")
        db.execute(f"INSERT INTO applied_events SELECT 'source-changes', 'past-' || i, md5(i::VARCHAR) "
                   f"FROM range({rows}) r(i)")
        db.execute(f"INSERT INTO key_changes SELECT 'resource:past-' || i, 'source-changes', i % 4, i, NULL "
                   f"FROM range({rows}) r(i)")
        db.execute("CHECKPOINT")
        ids = ", ".join(["(?, ?, ?)"] * BATCH)
        keys = ", ".join(["(?, ?, ?, ?, ?)"] * BATCH)
        repeat_ids = [x for i in range(BATCH) for x in ("source-changes", f"past-{i}", "h")]
        times: dict[str, list[float]] = {"repeated_ids": [], "key_changes": []}
        for n in range(repeats):
            changes = [x for i in range(BATCH) for x in (f"resource:past-{i}", "source-changes", i % 4, rows + n, None)]
            db.execute("BEGIN")
            started = time.perf_counter()
            db.execute(f"INSERT INTO applied_events VALUES {ids} ON CONFLICT DO NOTHING RETURNING topic, event_id",
                       repeat_ids).fetchall()
            db.execute("SELECT topic, event_id, content_hash FROM applied_events WHERE event_id IN (SELECT unnest(?)) "
                       "AND topic IN (SELECT unnest(?))", [[f"past-{i}" for i in range(BATCH)], ["source-changes"]]
                       ).fetchall()  # DuckDB 2 runs a query only as far as its rows are read
            times["repeated_ids"].append(time.perf_counter() - started)
            started = time.perf_counter()
            db.execute(f"INSERT INTO key_changes VALUES {keys} ON CONFLICT (dep_key, topic, partition) DO UPDATE SET "
                       "change_offset = greatest(key_changes.change_offset, excluded.change_offset)", changes)
            times["key_changes"].append(time.perf_counter() - started)
            db.execute("COMMIT")
        return {kind: round(statistics.median(ts) * 1000, 2) for kind, ts in times.items()}
    finally:
        db.close()
