"""What an apply batch costs the writer before any recompiling: one event, the 170 of a busy batch, one announcement."""

from __future__ import annotations

import itertools
import statistics
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import duckdb
import orjson

import state.store as store_module
from agents.stream.event_apply import RawMessage
from bench.history_cost import atlas_state
from bench.streaming import SCENARIOS

SIZES = (1, 170)  # 170: the events a batch held at 1,000 events/s in the bench (issue 29's figure)
WARM = 3  # the first batches fill the writer's memo


class CountingConnection:
    """A DuckDB connection that counts the statements run through it (a call costs about a microsecond)."""

    def __init__(self, db: duckdb.DuckDBPyConnection) -> None:
        self._db = db
        self.statements = 0

    def execute(self, *args, **kwargs):
        self.statements += 1
        return self._db.execute(*args, **kwargs)

    def executemany(self, *args, **kwargs):
        self.statements += 1
        return self._db.executemany(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._db, name)


@contextmanager
def counting_connections() -> Iterator[list[CountingConnection]]:
    """Every DuckDB connection a `Store` opens meanwhile counts its statements; the first is the writer's."""
    opened: list[CountingConnection] = []
    real = store_module.duckdb.connect

    def connect(*args, **kwargs):
        opened.append(CountingConnection(real(*args, **kwargs)))
        return opened[-1]

    store_module.duckdb.connect = connect
    try:
        yield opened
    finally:
        store_module.duckdb.connect = real


def _summary(times: list[float], statements: list[int]) -> dict:
    times = sorted(times)
    return {"median_ms": round(statistics.median(times) * 1000, 2),
            "p90_ms": round(times[int(0.9 * (len(times) - 1))] * 1000, 2),
            "statements": round(statistics.median(statements))}


def measure(batches: int = 30, sizes: tuple[int, ...] = SIZES) -> dict:
    """Median and p90 writer ms and DuckDB statements per batch of resource upserts that touch no plan, by
    batch size; and of one upsert that touches one plan, which is announced and left to the backlog."""
    with tempfile.TemporaryDirectory(prefix="fpbench-batch-") as tmp, counting_connections() as opened:
        state, applier, offsets = atlas_state(Path(tmp) / "f.duckdb")
        db = opened[0]
        try:
            events = [orjson.loads(line)["event"] for line in (SCENARIOS / "atlas.jsonl").read_text().splitlines()]
            base = next(e for e in events if e.get("kind") == "resource")
            versions = itertools.count(1_000)

            def timed(batch: list[RawMessage]) -> tuple[float, int]:
                start, started = db.statements, time.perf_counter()
                applier.apply(batch)
                return time.perf_counter() - started, db.statements - start

            def upsert(size: int, entity: str, rid: str) -> list[RawMessage]:
                version = next(versions)
                return [RawMessage("source-changes", 0, next(offsets), f"{rid}-{j}".encode(), orjson.dumps(dict(
                    base, event_id=f"bc-{size}-{version}-{j}", resource=dict(
                        base["resource"], id=f"{rid}-{j}" if size > 1 else rid, version=version, entity=entity))))
                    for j in range(size)]

            out = {}
            for size in sizes:
                runs = [timed(upsert(size, "BENCH-NO-PLANS", "bc")) for _ in range(batches + WARM)][WARM:]
                out[str(size)] = _summary([t for t, _ in runs], [s for _, s in runs])
            request, counts = orjson.loads((SCENARIOS / "atlas-request.json").read_bytes()), Counter()
            announced = []
            for _ in range(batches + WARM):
                plan = applier.plans.compile_select(request, counts)  # the plan is fresh (again)
                announced.append(timed(upsert(1, base["resource"]["entity"], base["resource"]["id"])))
                with state.store.transaction():
                    state.queue.remove([plan.plan_key])  # compiled by the next select, not the backlog
            announced = announced[WARM:]
            return {"batches": batches, "by_size": out,
                    "one_plan_announced": _summary([t for t, _ in announced], [s for _, s in announced])}
        finally:
            state.close()
