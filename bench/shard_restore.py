"""A fresh worker joining a group whose shard holds many resources: seconds until it has restored that shard."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Callable

import aiohttp

from bench import shards
from bench.scale_out import applied, cluster, join
from bench.state_size import stop_all
from bench.workload import Record, entity, resource
from schemas.plan_partition import plan_partition

NOT_MEASURABLE = ("not measurable on this build: /healthz reports no `shard` (state is not partitioned by entity, "
                  "so a joining worker has no shard to restore)")
POLL = 0.25
"""Seconds between looks at the joiner: /healthz runs on its loop, which is busy restoring."""


def not_measurable(resources: int) -> dict:
    """What the report says where the build cannot be asked."""
    return {"measured": False, "resources": resources, "reason": NOT_MEASURABLE}


def shard_records(resources: int, partitions: int, gained: int, per_entity: int = 10) -> list[Record]:
    """Entities with resources, as many on every entity partition, so that any `gained` partitions hold
    `resources` of them (rounded up to a whole share per partition)."""
    share = -(-resources // gained)
    counts = [0] * partitions
    records: list[Record] = []
    i = 0
    while min(counts) < share:
        name = f"S{i}"
        i += 1
        partition = plan_partition(name, partitions)
        room = min(per_entity, share - counts[partition])
        if room <= 0:
            continue
        records.append(entity(name, f"shard-{name}"))
        records += [resource(f"{name}-r{j}", name, 1, f"shard-{name}-r{j}-1", "status") for j in range(room)]
        counts[partition] += room
    return records


async def measure(bootstrap: str, directory: Path, http: aiohttp.ClientSession, resources: int,
                  say: Callable[[str], None], timeout: float = 600.0, **extra: str) -> dict:
    """One worker holds every partition's resources; a second, with empty state, joins and is given half.

    Timed from the joiner's start (and from the first /healthz naming its partitions) until the
    group has split the partitions between the two and neither has a partition still restoring.
    """
    [incumbent] = await cluster(bootstrap, directory / "incumbent", http, 1, **extra)
    workers = [incumbent]
    prefix, partitions = incumbent.settings.topic_prefix, incumbent.settings.partitions
    try:
        if shards.shard(await incumbent.health()) is None:
            return not_measurable(resources)
        records = shard_records(resources, partitions, partitions // 2)
        say(f"restore: one worker applies {len(records):,} entities and resources, spread so that any "
            f"{partitions // 2} of {partitions} partitions hold {resources:,} resources")
        token = await incumbent.publish(records)
        await applied([incumbent], token)
        before = shards.figures(await incumbent.health(), prefix)
        say("restore: a fresh worker joins; timing until its shard is restored")
        started = time.perf_counter()
        workers.append(await join(incumbent, directory / "joiner", http))
        answering = time.perf_counter() - started
        assigned = done = None
        mine: dict = {}
        theirs: dict = {}
        while time.perf_counter() - started < timeout:
            mine, theirs = await workers[1].health(), await incumbent.health()
            if assigned is None and shards.held(mine, prefix):
                assigned = time.perf_counter() - started
            if assigned is not None and shards.shared_out([theirs, mine], partitions, prefix):
                # A joiner with empty state restores by reading source-changes from its start: whole once it
                # has applied what the incumbent had (a running worker that gains a partition reads it again).
                await applied([workers[1]], token, timeout=max(1.0, timeout - (time.perf_counter() - started)))
                done = time.perf_counter() - started
                mine, theirs = await workers[1].health(), await incumbent.health()
                break
            await asyncio.sleep(POLL)
        joined, kept = shards.figures(mine, prefix), shards.figures(theirs, prefix)
    finally:
        await stop_all(workers)
    return {"measured": True, "resources": resources, "published_records": len(records),
            "incumbent_before": before, "joiner": joined, "incumbent_after": kept,
            "http_ready_seconds": round(answering, 3), "assigned_seconds": assigned and round(assigned, 3),
            "restored_seconds": done and round(done, 3),
            "restored_after_assigned_seconds": None if done is None or assigned is None else round(done - assigned, 3),
            "timeout_seconds": timeout}
