"""Bytes of a stopped worker's DuckDB state, and of the part every worker keeps whatever its shard holds."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import duckdb
import orjson

from bench.harness import BenchWorker
from bench.scale_out import applied, cluster, throughput
from bench.workload import Record, Workload

REPLICATED_HOW = ("file bytes of one worker fed the same input without the resources of entities (policy "
                  "bundle, principals, entities, revocations, clock) and asked for no plan, after a clean stop: "
                  "what the design replicates to every worker")


def state_bytes(worker: BenchWorker) -> dict:
    """The DuckDB file and its write-ahead log of a stopped worker (a clean stop checkpoints: the log is empty)."""
    path = worker.settings.db_path

    def size(p: Path) -> int | None:
        try:
            return p.stat().st_size
        except FileNotFoundError:
            return None

    file, wal = size(path), size(Path(f"{path}.wal"))
    return {"file_bytes": file, "wal_bytes": wal or 0,
            "bytes": None if file is None else file + (wal or 0), "used_bytes": used_bytes(path)}


def used_bytes(path: Path) -> int | None:
    """Bytes of a stopped worker's file in blocks DuckDB uses: the file less the blocks its checkpoints freed, which
    it keeps for reuse (up to a third of a file in the bench), so they say what the file grows to, not what it holds."""
    if not path.exists():
        return None
    db = duckdb.connect(str(path), read_only=True)
    try:
        _, _, block_size, _, used, *_ = db.execute("PRAGMA database_size").fetchone()
        return int(block_size) * int(used)
    finally:
        db.close()


def entity_resource(record: Record) -> bool:
    """Whether a record is a resource of an entity: the state the design splits between workers."""
    topic, _, value = record
    if topic != "source-changes":
        return False
    doc = orjson.loads(value)
    return doc.get("kind") == "resource" and bool((doc.get("resource") or {}).get("entity"))


def replicated_only(workload: Workload) -> list[Record]:
    """The workload's catalog and changes without entity resources, in order."""
    return [r for r in workload.catalog + workload.changes if not entity_resource(r)]


def bound(one: int | None, replicated: int | None, workers: int) -> float | None:
    """Issue 28's most a worker of `workers` may hold: the replicated part plus 1/N of the rest of one worker's."""
    if one is None or replicated is None:
        return None
    return replicated + max(0, one - replicated) / workers


async def stop_all(workers: list[BenchWorker]) -> None:
    """SIGTERM every worker at once and wait for each (a clean stop checkpoints its file)."""
    await asyncio.gather(*(asyncio.to_thread(w.stop) for w in workers if w.proc.poll() is None))


async def replicated_part(bootstrap: str, workload: Workload, directory: Path, http: aiohttp.ClientSession,
                          **extra: str) -> dict:
    """A lone worker fed `replicated_only(workload)`: its state's bytes after a clean stop, and the CPU seconds
    its change stream cost, timed as the clusters' are (`throughput`): what every worker spends whatever it owns."""
    [worker] = await cluster(bootstrap, directory, http, 1, **extra)
    try:
        await applied([worker], await worker.publish([r for r in workload.catalog if not entity_resource(r)]))
        changes = [r for r in workload.changes if not entity_resource(r)]
        [timed] = (await throughput([worker], changes, pin=True))["per_worker"]
    finally:
        await stop_all([worker])
    return dict(state_bytes(worker), events=len(replicated_only(workload)), change_events=len(changes),
                cpu_seconds=timed["cpu_seconds"], cpu_seconds_unwatched=timed["cpu_seconds_unwatched"],
                how=REPLICATED_HOW)
