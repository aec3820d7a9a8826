"""Clusters of workers on one set of topics: start, warm, events/s and CPU per worker, take-over after kill -9."""

from __future__ import annotations

import asyncio
import os
import secrets
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Callable

import aiohttp
import orjson

from bench import shards
from bench.harness import BenchWorker, cpu_seconds, start_worker
from bench.stats import lost_invalidations, owns_all
from bench.streaming import Listener
from bench.workload import Record, Workload, resource
from schemas.freshness import decode_token
from streams.settings import INPUT_TOPICS

PER_WORKER = ("FRESHPLAN_STATE_DIR", "FRESHPLAN_WEB_PORT", "FRESHPLAN_TOPIC_PREFIX", "FRESHPLAN_APP_ID")
"""Settings each worker of a cluster has of its own (`start_worker` sets them); the rest a joiner copies."""

Progress = Callable[[str], None]


def cores() -> list[int]:
    """The cores this process may use, in order (workers are pinned one per core when there are enough)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return []


async def cluster(bootstrap: str, directory: Path, http: aiohttp.ClientSession, n: int,
                  **extra: str) -> list[BenchWorker]:
    """`n` workers on one set of topics and one consumer group, each with its own state and port."""
    tag, token = uuid.uuid4().hex[:8], secrets.token_urlsafe(32)
    return list(await asyncio.gather(*(start_worker(bootstrap, directory / f"worker-{i}", http, tag=tag,
                                                    FRESHPLAN_TOKEN=token, FRESHPLAN_TOKEN_KEY_FILE=str(
                                                        directory / "token-keys.json"), **extra) for i in range(n))))


async def join(peer: BenchWorker, directory: Path, http: aiohttp.ClientSession) -> BenchWorker:
    """A fresh worker (empty state) joining `peer`'s cluster: same topics, group, secret and settings."""
    tag = peer.env["FRESHPLAN_APP_ID"].removeprefix("bench-")
    same = {k: v for k, v in peer.env.items() if k.startswith("FRESHPLAN_") and k not in PER_WORKER}
    return await start_worker(peer.bootstrap, directory, http, tag=tag, **same)


async def applied(workers: list[BenchWorker], token: str, timeout: float = 900.0) -> list[dict]:
    """Wait until every worker has applied everything up to `token`, published its own outbox and compiled
    the successors of the plans it announced (its recompile queue is empty: announced first, they follow).

    Unlike `BenchWorker.caught_up`, standby records (kept in case a peer dies) do not count:
    they are pruned on a timer, and waiting for it would charge the timer to the cluster. Where
    workers report shards, a partition of a sharded topic is waited for only at its holder.
    """
    target = decode_token(token)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pending = list(workers)
    healths: dict[int, dict] = {}
    started, left_at_start = loop.time(), None
    prefix = workers[0].settings.topic_prefix
    while pending:
        left = 0
        looked = [(w, await w.health()) for w in pending]
        split = shards.partitioned_topics([h for _, h in looked], prefix)
        for w, health in looked:
            behind = shards.behind(target, health, split, prefix)
            if health["outbox"] == 0 and behind == 0 and not health.get("recompile_queue"):
                healths[id(w)] = health
                pending.remove(w)
            left = max(left, behind)
        if pending:
            if loop.time() > deadline:
                raise TimeoutError(f"{len(pending)} worker(s) not caught up within {timeout}s")
            await asyncio.sleep(_poll_interval(left, left_at_start, loop.time() - started))
            left_at_start = left if left_at_start is None else left_at_start
    return [healths[id(w)] for w in workers]


def _poll_interval(left: int, left_at_start: int | None, elapsed: float) -> float:
    """How long to wait before asking again: half the time the rest should take, 20 ms to 500 ms.

    /healthz runs a dozen queries on the worker's event loop; polling a pinned worker every
    20 ms took a quarter of its core (py-spy), so the bench must not poll fast while far from done.
    """
    if not left_at_start or left <= 0 or elapsed <= 0:
        return 0.02
    if left >= left_at_start:
        return 0.1  # no batch committed yet: nothing to estimate the rest from
    rate = (left_at_start - left) / elapsed
    return min(0.5, max(0.02, left / rate / 2))


async def warm(workers: list[BenchWorker], workload: Workload) -> dict[str, str]:
    """Load the catalog and select every plan on every worker; returns plan key by entity-and-principal."""
    token = await workers[0].publish(workload.catalog)
    await applied(workers, token)
    keys = {}
    for body in workload.requests:
        for w in workers:
            plan = await w.select(body, token)
        keys[f"{body['principal']}@{body['entity']}"] = plan["plan_key"]
    return keys


async def refresh(workers: list[BenchWorker], workload: Workload) -> dict[str, str]:
    """Select every plan once more (its owner compiles it if it is not fresh) and wait for what that published.

    After a restart the owners may have moved and recompiles may still be queued: a plan key
    without a fresh plan has nothing for the next edit to invalidate, so it must not be expected.
    """
    keys = {}
    for i, body in enumerate(workload.requests):
        plan = await workers[i % len(workers)].select(body, wait_for_owner=60.0)
        keys[f"{body['principal']}@{body['entity']}"] = plan["plan_key"]
    await applied(workers, (await workers[0].health())["freshness_token"])
    return keys


async def throughput(workers: list[BenchWorker], changes: list[Record], pin: bool) -> dict:
    """Events/s of the cluster over `changes` published while paused, and each worker's recompilations."""
    # A group still rebalancing would charge its take-overs to the run: start once the partitions are shared out.
    settled = await settle(workers)
    available = cores()
    pinned = pin and len(available) >= len(workers)
    if pinned:
        pinned = all(w.pin({available[i]}) for i, w in enumerate(workers))
    try:
        for w in workers:
            for topic in INPUT_TOPICS:
                await w.consumers(topic, "pause")
        looked = [await w.health() for w in workers]
        before = [Counter(h["counters"]) for h in looked]
        watched_before = [_watched(h) for h in looked]
        token = await workers[0].publish(changes)
        started = time.perf_counter()
        cpu_before = [cpu_seconds(w.proc.pid) for w in workers]
        for w in workers:
            for topic in INPUT_TOPICS:
                await w.consumers(topic, "resume")
        after = await applied(workers, token)
        seconds = time.perf_counter() - started
        cpu_after = [cpu_seconds(w.proc.pid) for w in workers]
    finally:
        for w in workers:
            w.pin(None)
    per_worker = []
    prefix = workers[0].settings.topic_prefix
    for b, h, c0, c1, w0 in zip(before, after, cpu_before, cpu_after, watched_before, strict=True):
        delta = Counter(h["counters"]) - b
        # What the worker's process used meanwhile, and that less what the bench's own /healthz polls cost it
        # (their file reads, timed on the worker's status thread): being watched is not work the input caused.
        cpu = None if c0 is None or c1 is None else c1 - c0
        watched = None if w0 is None or _watched(h) is None else _watched(h) - w0
        per_worker.append({"compilations": delta["compilations"], "invalidations": delta["invalidations"],
                           # Input events this worker applied: its shard's, and the replicated ones every worker does.
                           "applied_events": sum(v for k, v in delta.items() if k.startswith("applied.")),
                           "unchanged_recompilations": delta["unchanged_recompilations"],
                           "cpu_seconds": None if cpu is None else round(cpu, 2),
                           "status_cpu_seconds": None if watched is None else round(watched, 3),
                           "cpu_seconds_unwatched": None if cpu is None or watched is None else round(cpu - watched, 2),
                           "shard": shards.figures(h, prefix)})
    return {"workers": len(workers), "pinned": pinned, "settled_seconds": settled,
            "events": len(changes), "seconds": round(seconds, 3),
            "events_per_second": round(len(changes) / seconds, 1), "per_worker": per_worker,
            "total_compilations": sum(p["compilations"] for p in per_worker)}


def _watched(health: dict) -> float | None:
    """CPU seconds the worker's status thread spent answering /healthz and /metrics so far (None: not reported)."""
    return (health.get("status_reads") or {}).get("cpu_seconds")


async def settle(workers: list[BenchWorker], timeout: float = 60.0) -> float | None:
    """Seconds until the group shared every partition out among the workers, once each, none restoring;
    None if it did not (partitions of their shards where workers report them, else of their input duty)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    partitions, prefix = workers[0].settings.partitions, workers[0].settings.topic_prefix
    while loop.time() - started < timeout:
        if shards.shared_out([await w.health() for w in workers], partitions, prefix):
            return round(loop.time() - started, 3)
        await asyncio.sleep(0.2)
    return None


def touch_every_entity(workload: Workload, keys: dict[str, str], version: int) -> tuple[list[Record], set[str]]:
    """One edit of an admitted resource per planned entity; the plan keys those edits must invalidate."""
    entities = sorted({body["entity"] for body in workload.requests})
    edits = [resource(f"{e}-r0", e, version, f"takeover-{e}-{version}") for e in entities]
    return edits, set(keys.values())


async def takeover(survivor: BenchWorker, victim: BenchWorker, workload: Workload, keys: dict[str, str],
                   timeout: float) -> dict:
    """Publish edits that change every plan, kill -9 one worker at once, and time the survivor's take-over.

    Done when the survivor holds every partition (its shard, restored, where reported; else its
    input duty) and every affected plan has been announced on `plan-invalidations` (by either
    worker, before or after the kill). Plans never announced within `timeout` are counted as lost.
    """
    edits, expected = touch_every_entity(workload, keys, version=9_000_000)
    ids = {orjson.loads(v)["event_id"] for _, _, v in edits}
    owned_at = announced_at = assigned_at = None
    partitions, prefix = survivor.settings.partitions, survivor.settings.topic_prefix
    before = health = await survivor.health()
    async with Listener(survivor) as listener:
        await survivor.publish(edits)
        victim.kill9()
        killed = time.perf_counter()
        deadline = killed + timeout
        while time.perf_counter() < deadline and (owned_at is None or announced_at is None):
            if owned_at is None:
                try:
                    health = await survivor.health()
                except aiohttp.ClientError:
                    health = {}
                if assigned_at is None and owns_all(health.get("duty") or {}, ["source-changes"], partitions):
                    assigned_at = time.perf_counter()  # the group's new assignment reached the survivor
                if shards.holds_all(health, partitions, prefix):
                    owned_at = time.perf_counter()
                    # Holding every partition needs the new assignment, even when the input duty follows later.
                    assigned_at = assigned_at or owned_at
            if announced_at is None and not lost_invalidations(
                    expected, {a.plan_key for a in listener.seen if a.event_id in ids}):
                announced_at = time.perf_counter()
            await asyncio.sleep(0.05)
        lost = lost_invalidations(expected, {a.plan_key for a in listener.seen if a.event_id in ids})
        # A lost plan announced for another cause (a take-over's `plan:<id>`) is still lost here: the edit's
        # announcement never came. Which causes came instead says where to look.
        instead = sorted({a.event_id for a in listener.seen if a.plan_key in set(lost)})
    done = None if owned_at is None or announced_at is None else max(owned_at, announced_at) - killed
    restored = (shards.shard(health) or {}).get("last_restore") if owned_at is not None else None
    if restored == (shards.shard(before) or {}).get("last_restore"):
        restored = None  # no restore since the kill: the survivor held the partitions already (a standby copy)
    return {"plans": len(expected), "events": len(edits), "lost": len(lost), "lost_plan_keys": lost[:20],
            "lost_announced_for_other_causes": instead[:20],
            "assigned_seconds": assigned_at and round(assigned_at - killed, 3),
            # The survivor's restore of the partitions it gained, if the take-over needed one.
            "restore": restored,
            "owned_all_seconds": owned_at and round(owned_at - killed, 3),
            "announced_all_seconds": announced_at and round(announced_at - killed, 3),
            "takeover_seconds": done and round(done, 3), "timeout_seconds": timeout}


def ratios(one: dict, two: dict) -> dict:
    """2-worker figures relative to 1 worker: events/s, total recompilations, the busiest worker's share."""
    single = one["total_compilations"]
    return {"events_per_second_2_vs_1": round(two["events_per_second"] / one["events_per_second"], 3)
            if one["events_per_second"] else None,
            "total_compilations_2_vs_1": round(two["total_compilations"] / single, 3) if single else None,
            "busiest_worker_share_of_1": round(max(p["compilations"] for p in two["per_worker"]) / single, 3)
            if single else None, **cpu_bound(one, two)}


def cpu_bound(one: dict, two: dict) -> dict:
    """CPU of the busier of 2 workers against the single worker's, and the events/s ratio that caps on free cores.

    Each worker applies every event to its replicated catalog; only recompiling splits. On cores
    of their own, 2 workers take at least as long as the busier one's CPU time, so events/s 2 vs
    1 is at most the single worker's wall time over that (Amdahl): the ceiling of this design.
    """
    single = [p.get("cpu_seconds") for p in one["per_worker"]]
    pair = [p.get("cpu_seconds") for p in two["per_worker"]]
    if None in single + pair or not single[0] or not max(pair):
        return {}
    return {"cpu_busiest_2_vs_1": round(max(pair) / single[0], 3),
            "events_per_second_2_vs_1_ceiling": round(one["seconds"] / max(pair), 3)}
