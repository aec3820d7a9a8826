"""The invalidation path through the broker: events/s against a bare Faust agent, latency at fixed rates, fan-out."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import aiohttp
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from bench.harness import BenchWorker, run_ceiling, start_worker
from bench.workload import Workload, bundle, generate, request
from schemas.freshness import encode_token
from streams.admin import producer
from streams.settings import INPUT_TOPICS

Progress = Callable[[str], None]


def percentiles(values: list[float]) -> dict:
    """p50/p95/p99 and max in milliseconds (None when there is nothing to measure)."""
    if not values:
        return {"count": 0, "p50_ms": None, "p95_ms": None, "p99_ms": None, "max_ms": None}
    ordered = sorted(values)
    q = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 else ordered * 99
    return {"count": len(ordered), "p50_ms": round(q[49] * 1000, 2), "p95_ms": round(q[94] * 1000, 2),
            "p99_ms": round(q[98] * 1000, 2), "max_ms": round(ordered[-1] * 1000, 2)}


async def measure(bootstrap: str, workload: Workload, directory: Path, *, rates: tuple[int, ...],
                  rate_seconds: float, fanout_plans: int, say: Progress) -> dict:
    """Run every broker-side comparison on one worker; returns the report section."""
    async with aiohttp.ClientSession() as http:
        worker = await start_worker(bootstrap, directory / "freshplan", http)
        try:
            say(f"warming {len(workload.requests)} plans")
            token = await worker.publish(workload.catalog)
            for body in workload.requests:
                await worker.select(body, token)
            await worker.caught_up(token)
            say(f"freshplan: applying {len(workload.changes)} events")
            throughput = await _throughput(worker, workload)
            say("ceiling: a bare Faust agent over the same topics")
            ceiling = await run_ceiling(bootstrap, [worker.settings.topic(t) for t in INPUT_TOPICS],
                                        len(workload.catalog) + len(workload.changes), directory)
            latency = {}
            for k, rate in enumerate(rates):
                say(f"latency at {rate} events/s for {rate_seconds:g}s")
                latency[str(rate)] = await _latency(worker, rate, rate_seconds, version_base=1_000_000 * (k + 1))
            say(f"fan-out: one policy version over {fanout_plans} plans")
            fanout = await _fanout(worker, fanout_plans)
            health = await worker.health()
        finally:
            worker.stop()
    ratio = throughput["events_per_second"] / ceiling["events_per_second"] if ceiling["events_per_second"] else None
    return {"throughput": {"freshplan": throughput, "ceiling_bare_faust": ceiling,
                           "ratio_to_ceiling": ratio and round(ratio, 4)},
            "latency_by_rate": latency, "fanout": fanout,
            "worker_counters": {k: v for k, v in health["counters"].items() if not k.startswith("selects")}}


async def _throughput(worker: BenchWorker, workload: Workload) -> dict:
    # Events are published while the worker is paused, so the clock measures applying, not producing.
    for topic in INPUT_TOPICS:
        await worker.consumers(topic, "pause")
    before = Counter((await worker.health())["counters"])
    token = await worker.publish(workload.changes)
    started = time.perf_counter()
    for topic in INPUT_TOPICS:
        await worker.consumers(topic, "resume")
    health = await worker.caught_up(token)
    seconds = time.perf_counter() - started
    delta = Counter(health["counters"]) - before
    recompiles = delta["invalidations"] + delta["unchanged_recompilations"]
    return {"events": len(workload.changes), "seconds": round(seconds, 3),
            "events_per_second": round(len(workload.changes) / seconds),
            "invalidations": delta["invalidations"], "identical_recompilations": delta["unchanged_recompilations"],
            "recompilations_per_second": round(recompiles / seconds, 1)}


async def _latency(worker: BenchWorker, rate: int, seconds: float, version_base: int) -> dict:
    """Publish at a fixed rate; time from each send to the first invalidation that names it as cause."""
    stream = generate(changes=max(1, int(rate * seconds)), seed=rate, prefix=f"lat{rate}-",
                      version_base=version_base).changes
    ids = [orjson.loads(v)["event_id"] for _, _, v in stream]
    sent: dict[str, float] = {}
    got: dict[str, float] = {}
    consumer = AIOKafkaConsumer(bootstrap_servers=worker.bootstrap, enable_auto_commit=False,
                                fetch_max_wait_ms=10)  # a short long-poll: the listener's own wait is not latency
    await consumer.start()
    name = worker.settings.topic("plan-invalidations")
    tps = [TopicPartition(name, p) for p in range(worker.settings.partitions)]
    consumer.assign(tps)
    await consumer.seek_to_end(*tps)
    for tp in tps:
        await consumer.position(tp)

    async def listen() -> None:
        while True:
            batch = await consumer.getmany(timeout_ms=50)
            now = time.time()
            for records in batch.values():
                for m in records:
                    eid = orjson.loads(m.value)["cause"]["event_id"]
                    got.setdefault(eid, now)

    listener = asyncio.create_task(listen())
    send = producer(worker.bootstrap)
    await send.start()
    futures = []
    try:
        loop = asyncio.get_running_loop()
        start = loop.time()
        i = 0
        while i < len(stream):
            due = min(len(stream), int((loop.time() - start) * rate) + 1)
            while i < due:
                topic, key, value = stream[i]
                futures.append((topic, await send.send(worker.settings.topic(topic), value, key=key)))
                sent[ids[i]] = time.time()
                i += 1
            await asyncio.sleep(0.005)
        achieved = len(stream) / (loop.time() - start)
        metas = [(topic, await f) for topic, f in futures]
        offsets: dict[str, dict[int, int]] = {}
        for topic, meta in metas:
            parts = offsets.setdefault(topic, {})
            parts[meta.partition] = max(parts.get(meta.partition, 0), meta.offset + 1)
        await worker.caught_up(encode_token(offsets))
        await asyncio.sleep(0.5)  # let the listener read the last announcements
    finally:
        listener.cancel()
        await send.stop()
        await consumer.stop()
    waits = [got[e] - sent[e] for e in ids if e in got]
    return dict(percentiles(waits), events=len(stream), achieved_rate=round(achieved, 1),
                events_that_invalidated=len(waits))


async def _fanout(worker: BenchWorker, plans: int) -> dict:
    """Time from publishing a policy version to the last of its invalidations on the topic."""
    token = await worker.publish([("source-changes", f"F{i}".encode(), orjson.dumps(
        {"event_id": f"fan-e{i}", "schema_version": 1, "occurred_at": "2026-09-01T00:00:00Z", "kind": "entity",
         "op": "upsert", "entity": {"id": f"F{i}", "aliases": []}})) for i in range(plans)])
    for i in range(plans):
        await worker.select(request("u0", f"F{i}"), token if i == 0 else None)
    health = await worker.caught_up(token)
    expected = health["plans"].get("fresh", 0)  # a new policy version changes every fresh plan
    consumer = AIOKafkaConsumer(bootstrap_servers=worker.bootstrap, enable_auto_commit=False,
                                fetch_max_wait_ms=10)  # a short long-poll: the listener's own wait is not latency
    await consumer.start()
    name = worker.settings.topic("plan-invalidations")
    tps = [TopicPartition(name, p) for p in range(worker.settings.partitions)]
    consumer.assign(tps)
    await consumer.seek_to_end(*tps)
    for tp in tps:
        await consumer.position(tp)
    seen: set[str] = set()
    try:
        started = time.perf_counter()
        await worker.publish([bundle(version=2)])
        first = None
        deadline = started + 900
        while len(seen) < expected and time.perf_counter() < deadline:
            batch = await consumer.getmany(timeout_ms=100)
            for records in batch.values():
                for m in records:
                    doc = orjson.loads(m.value)
                    if doc["cause"]["event_id"] == "bench-bundle-2":
                        first = first or time.perf_counter()
                        seen.add(doc["plan_id"])
        last = time.perf_counter()
    finally:
        await consumer.stop()
    return {"fanout_plans": expected, "invalidations_seen": len(seen),
            "first_invalidation_seconds": first and round(first - started, 3),
            "all_published_seconds": round(last - started, 3),
            "seconds_per_plan_ms": round((last - started) / max(1, len(seen)) * 1000, 3)}
