"""What an apply batch costs the writer before any recompiling: one event, and the 170 of a busy batch."""

from __future__ import annotations

import itertools
import statistics
import tempfile
import time
from pathlib import Path

import orjson

from agents.stream.event_apply import RawMessage
from bench.history_cost import atlas_state
from bench.streaming import SCENARIOS

SIZES = (1, 170)  # 170: the events a batch held at 1,000 events/s in the bench (issue 29's figure)


def measure(batches: int = 30, sizes: tuple[int, ...] = SIZES) -> dict:
    """Median and p90 writer ms per batch of resource upserts that touch no plan, by batch size."""
    with tempfile.TemporaryDirectory(prefix="fpbench-batch-") as tmp:
        state, applier, offsets = atlas_state(Path(tmp) / "f.duckdb")
        try:
            base = next(orjson.loads(line)["event"] for line in (SCENARIOS / "atlas.jsonl").read_text().splitlines()
                        if orjson.loads(line)["event"].get("kind") == "resource")
            versions = itertools.count(1_000)
            out = {}
            for size in sizes:
                times = []
                for n in range(batches + 3):  # the first batches fill the writer's memo
                    version = next(versions)
                    batch = [RawMessage("source-changes", 0, next(offsets), f"bc-{j}".encode(), orjson.dumps(dict(
                        base, event_id=f"bc-{size}-{version}-{j}", resource=dict(
                            base["resource"], id=f"bc-{j}", version=version, entity="BENCH-NO-PLANS"))))
                        for j in range(size)]
                    started = time.perf_counter()
                    applier.apply(batch)
                    if n >= 3:
                        times.append(time.perf_counter() - started)
                times.sort()
                out[str(size)] = {"median_ms": round(statistics.median(times) * 1000, 2),
                                  "p90_ms": round(times[int(0.9 * (len(times) - 1))] * 1000, 2)}
            return {"batches": batches, "by_size": out}
        finally:
            state.close()
