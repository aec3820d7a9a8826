"""What a subscriber and a caller see while events stream at fixed rates: announcements read back, selects timed."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.cli.loader import read_scenario
from bench.harness import BenchWorker
from bench.stats import (Announcement, Published, backlog_built, histogram_delta, invalidation_latencies,
                         percentiles, stalls_during, successor_latencies, unapplied)
from bench.workload import Record
from schemas.freshness import encode_token
from streams.admin import producer

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
HOT_RESOURCE = "facility-F102"
HOT_TOPIC = "source-changes"


class Listener:
    """A real consumer of `plan-invalidations`: assigned every partition at its end before anything is sent."""

    def __init__(self, worker: BenchWorker, follow_plans: bool = False) -> None:
        self.worker = worker
        self.follow_plans = follow_plans
        self.seen: list[Announcement] = []
        self.published: list[tuple[float, dict]] = []
        """(seen at, plan record) of every record read from `plans` (with `follow_plans`)."""
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "Listener":
        w = self.worker
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=w.bootstrap, enable_auto_commit=False,
            fetch_max_wait_ms=10,  # a short long-poll: the listener's own wait is not latency
            max_partition_fetch_bytes=8_000_000, **w.settings.kafka.client_kwargs())
        await self._consumer.start()
        self._plans = w.settings.topic("plans")
        names = [w.settings.topic("plan-invalidations")] + ([self._plans] if self.follow_plans else [])
        tps = [TopicPartition(name, p) for name in names for p in range(w.settings.partitions)]
        self._consumer.assign(tps)
        await self._consumer.seek_to_end(*tps)
        for tp in tps:
            await self._consumer.position(tp)  # resolve the end now, not at the first fetch
        self._task = asyncio.create_task(self._listen())
        return self

    async def _listen(self) -> None:
        assert self._consumer is not None
        while True:
            batch = await self._consumer.getmany(timeout_ms=50, max_records=20_000)
            now = time.time()
            for tp, records in batch.items():
                for m in records:
                    doc = orjson.loads(m.value)
                    if tp.topic == self._plans:
                        self.published.append((now, doc))
                        continue
                    cause = doc.get("cause") or {}
                    self.seen.append(Announcement(now, doc.get("plan_key", ""), cause.get("topic", ""),
                                                  cause.get("partition", -1), cause.get("offset", -1),
                                                  cause.get("event_id", ""), doc.get("successor_plan_id"),
                                                  doc.get("plan_id", "")))

    async def settle(self, quiet: float = 0.5) -> None:
        """Wait until nothing new has arrived for `quiet` seconds (the last announcements are read)."""
        count = -1
        while count != len(self.seen):
            count = len(self.seen)
            await asyncio.sleep(quiet)

    async def __aexit__(self, *exc) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._consumer:
            await self._consumer.stop()


@dataclass(frozen=True)
class Sent:
    """One event as the producer saw it."""

    topic: str
    """Logical topic."""
    partition: int
    """Partition the broker put it in."""
    offset: int
    """Offset the broker gave it."""
    event_id: str
    """The event's id."""
    sent_at: float
    """Wall-clock second taken just before the send call."""


@dataclass(frozen=True)
class Stream:
    """What a fixed-rate stream did."""

    sent: list[Sent]
    """Every event, in send order."""
    achieved_rate: float
    """Events per second actually sent."""
    lag_at_end: int
    """Events the worker had not applied when the last one was acknowledged."""
    drain_seconds: float
    """From the last send until the worker had applied everything and emptied its outbox."""


async def send_at_rate(worker: BenchWorker, records: list[Record], rate: float) -> Stream:
    """Produce `records` at `rate` events/s, then wait until the worker has applied and published all of them."""
    send = producer(worker.bootstrap, worker.settings.kafka.client_kwargs())
    await send.start()
    try:
        loop = asyncio.get_running_loop()
        futures, stamps = [], []
        start = loop.time()
        i = 0
        while i < len(records):
            due = min(len(records), int((loop.time() - start) * rate) + 1)
            while i < due:
                topic, key, value = records[i]
                stamps.append(time.time())
                futures.append(await send.send(worker.settings.topic(topic), value, key=key))
                i += 1
            await asyncio.sleep(0.002)
        achieved = len(records) / max(1e-9, loop.time() - start)
        last_sent = time.perf_counter()
        metas = await asyncio.gather(*futures)
        produced: dict[str, dict[int, int]] = {}
        for (topic, _, _), meta in zip(records, metas, strict=True):
            parts = produced.setdefault(topic, {})
            parts[meta.partition] = max(parts.get(meta.partition, 0), meta.offset + 1)
        lag = unapplied(produced, (await worker.health())["applied_offsets"])
    finally:
        await send.stop()
    await worker.caught_up(encode_token(produced, key=b"read-here-only"))  # decoded locally, never sent
    drain = time.perf_counter() - last_sent
    sent = [Sent(topic, meta.partition, meta.offset, orjson.loads(value)["event_id"], at)
            for (topic, _, value), meta, at in zip(records, metas, stamps, strict=True)]
    return Stream(sent, round(achieved, 1), lag, round(drain, 3))


def stream_summary(stream: Stream, rate: float) -> dict:
    """The stream's own figures for a report row."""
    return {"events": len(stream.sent), "achieved_rate": stream.achieved_rate, "lag_at_end": stream.lag_at_end,
            "drain_seconds": stream.drain_seconds, "backlog": backlog_built(stream.lag_at_end, rate)}


def hot_edits(n: int, first_version: int = 1_000) -> list[Record]:
    """`n` edits of the one resource the Atlas plan leans on for its facility limit, each a new version."""
    base = next(orjson.loads(line)["event"] for line in (SCENARIOS / "atlas.jsonl").read_text().splitlines()
                if orjson.loads(line)["event"].get("resource", {}).get("id") == HOT_RESOURCE)
    out = []
    for i in range(n):
        version = first_version + i
        res = dict(base["resource"], version=version, content=f"Approved overdraft limit: 2.0m (revision {version}).")
        out.append(("source-changes", HOT_RESOURCE.encode(),
                    orjson.dumps(dict(base, event_id=f"hot-{version}", resource=res))))
    return out


async def hot_plan(worker: BenchWorker, rate: float, seconds: float) -> dict:
    """One hot plan on the Atlas scenario: every event changes it; latency until an announcement covers it."""
    atlas = orjson.loads((SCENARIOS / "atlas-request.json").read_bytes())
    token = await worker.publish(read_scenario(SCENARIOS / "atlas.jsonl"))
    plan = await worker.select(atlas, token)
    await worker.caught_up(token)
    edits = hot_edits(max(1, int(rate * seconds)))
    before, log_before = await worker.metrics(), (await worker.health()).get("checkpoints") or {}
    async with Listener(worker, follow_plans=True) as listener:
        stream = await send_at_rate(worker, edits, rate)
        await listener.settle()
    after = await worker.metrics()
    stages = {name: histogram_delta(before, after, f"freshplan_{name}_seconds")
              for name in ("batch_wait", "batch_apply")}
    log_after = (await worker.health()).get("checkpoints") or {}
    partition = stream.sent[0].partition
    sends = [(s.offset, s.sent_at) for s in stream.sent]
    published = [Published(at, doc.get("plan_key", ""), doc.get("plan_id", ""), as_of(doc, partition))
                 for at, doc in listener.published]
    waits, uncovered = invalidation_latencies(sends, listener.seen, published, plan["plan_key"], partition,
                                              (plan["plan_id"], as_of(plan, partition)))
    successors = percentiles(successor_latencies(sends, published, plan["plan_key"]))
    named = {a.event_id for a in listener.seen if a.plan_key == plan["plan_key"]}
    return dict(percentiles(waits), **stream_summary(stream, rate), rate=rate, uncovered=uncovered,
                successor={k: successors[k] for k in ("count", "p50_ms", "p99_ms")},
                announcements=len(named & {s.event_id for s in stream.sent}), worker_stages=stages,
                write_ahead_log=log_during(log_before, log_after), loop_stalls=stalls_during(before, after))


def as_of(plan: dict, partition: int) -> int:
    """Next offset of a `source-changes` partition a plan record reflects (0 when it names none)."""
    return int((plan.get("compiled_as_of") or {}).get(HOT_TOPIC, {}).get(str(partition), 0))


def log_during(before: dict, after: dict) -> dict:
    """The worker's write-ahead log across a stream, and whether DuckDB checkpointed at its cap inside it.

    The log only shrinks at a checkpoint; one the worker did not take while idle was DuckDB's own,
    at the cap, and it held the writer for its whole duration.
    """
    shrank = after.get("wal_bytes", 0) < before.get("wal_bytes", 0)
    idle = after.get("idle_checkpoints", 0) - before.get("idle_checkpoints", 0)
    return {"bytes_before": before.get("wal_bytes"), "bytes_after": after.get("wal_bytes"),
            "idle_checkpoints": idle, "cap_checkpoint": bool(before and after and shrank and not idle)}


async def selects_under_stream(worker: BenchWorker, bodies: list[dict], records: list[Record], rate: float,
                               seconds: float, select_rate: float) -> dict:
    """Cached selects over HTTP at `select_rate` while `records` stream at `rate` (0: no stream) for `seconds`.

    Selects are issued open-loop (each at its scheduled time, whether or not the previous one
    returned), so a stalled event loop shows up in the percentiles instead of delaying them.
    """
    timings: list[tuple[str, float]] = []
    failures = 0

    async def one(body: dict) -> None:
        nonlocal failures
        started = time.perf_counter()
        try:
            doc = await worker.select(body)
        except Exception:  # noqa: BLE001 - a refused select is counted, not fatal to the bench
            failures += 1
            return
        timings.append((doc.get("served_from", "?"), time.perf_counter() - started))

    async def issue() -> None:
        loop = asyncio.get_running_loop()
        start, n, tasks = loop.time(), 0, []
        total = max(1, int(select_rate * seconds))
        while n < total:
            await asyncio.sleep(max(0.0, start + n / select_rate - loop.time()))
            tasks.append(asyncio.create_task(one(bodies[n % len(bodies)])))
            n += 1
        await asyncio.gather(*tasks)

    stream = None
    before = await worker.metrics()
    if rate > 0:
        count = max(1, int(rate * seconds))
        stream, _ = await asyncio.gather(send_at_rate(worker, records[:count], rate), issue())
    else:
        await issue()
    cached = [t for served, t in timings if served == "cache"]
    out = dict(percentiles(cached), rate=rate, select_rate=select_rate, failures=failures,
               compiled=sum(served == "compiled" for served, _ in timings),
               # Missing when asked, answered once a recompilation stored it: a wait on the writer, not a hit.
               recompiled=sum(served == "recompiled" for served, _ in timings),
               all_selects=percentiles([t for _, t in timings]),
               loop_stalls=stalls_during(before, await worker.metrics()))
    if stream is not None:
        out["stream"] = stream_summary(stream, rate)
    return out
