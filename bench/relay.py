"""The broker's share of subscriber-visible latency: a bare relay with a fixed serial stage, on the same broker."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.stats import percentiles
from streams.admin import producer, stop_within


async def relay(bootstrap: str, kafka: dict[str, Any], partitions: int, rate: float, events: int,
                stage_ms: float, fetch_wait_ms: int, keys: int = 1) -> dict:
    """Latency from a producer's send to a consumer reading the record that a bare relay passed on.

    The relay reads as the worker's replica does (the same long-poll wait, batches of what
    arrived), holds each batch for `stage_ms` in a thread (as the writer thread holds an apply
    batch, the loop free to prefetch), then produces the batch without awaiting it. The reader
    is the bench's `Listener` setting (a 10 ms long-poll). With no stage this is the floor two
    broker hops put under the hot-plan figure; with one, what a batch of that length costs.
    The sender is the bench's producer (`send_at_rate`), the relay's the worker's (no linger).
    `keys` > 1 spreads the records over that many keys (so over the partitions), as a stream of
    many plans' inputs is spread; 1 is the hot plan's single key.
    """
    inbound, outbound = await relay_topics(bootstrap, kafka, "bench-relay", partitions)
    source = _consumer(bootstrap, kafka, inbound, partitions, fetch_wait_ms)
    reader = _consumer(bootstrap, kafka, outbound, partitions, 10)
    # The sender is the bench's (as `send_at_rate`); the relay's sends as the worker's Faust producer (no linger).
    send, relay_send = producer(bootstrap, kafka), AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", **kafka)
    seen: dict[bytes, float] = {}
    tasks: list[asyncio.Task] = []
    try:
        for client in (source, reader, send, relay_send):
            await client.start()
        for consumer, topic in ((source, inbound), (reader, outbound)):
            tps = [TopicPartition(topic, p) for p in range(partitions)]
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, 0)
        tasks = [asyncio.create_task(_pass_on(source, relay_send, outbound, stage_ms / 1000, fetch_wait_ms)),
                 asyncio.create_task(_read(reader, seen))]
        sent = await _send_at_rate(send, inbound, rate, events, keys)
        deadline = time.monotonic() + 30
        while len(seen) < len(sent) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        waits = [seen[value] - at for value, at in sent.items() if value in seen]
        return dict(percentiles(waits), stage_ms=stage_ms, events=len(sent), fetch_wait_ms=fetch_wait_ms,
                    lost=len(sent) - len(waits), rate=rate, keys=keys)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for client in (source, reader, send, relay_send):
            await stop_within(client)


async def relay_topics(bootstrap: str, kafka: dict[str, Any], prefix: str, partitions: int) -> tuple[str, str]:
    """Create a fresh inbound and outbound topic for one relay run; their names."""
    tag = uuid.uuid4().hex[:8]
    inbound, outbound = f"{prefix}-in-{tag}", f"{prefix}-out-{tag}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **kafka)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(inbound, partitions, 1), NewTopic(outbound, partitions, 1)])
    finally:
        await admin.close()
    return inbound, outbound


async def sweep(bootstrap: str, kafka: dict[str, Any], partitions: int, rate: float, seconds: float,
                stages_ms: Sequence[float], fetch_wait_ms: int) -> list[dict]:
    """`relay` once per stage length, each for `seconds` at `rate` events/s."""
    events = max(1, int(rate * seconds))
    return [await relay(bootstrap, kafka, partitions, rate, events, stage, fetch_wait_ms) for stage in stages_ms]


def _consumer(bootstrap: str, kafka: dict[str, Any], topic: str, partitions: int, wait_ms: int) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=wait_ms,
                            **kafka)


async def _pass_on(source: AIOKafkaConsumer, send, topic: str, stage: float, wait_ms: int) -> None:
    while True:
        batch = await source.getmany(timeout_ms=wait_ms, max_records=500)
        records = [m for ms in batch.values() for m in ms]
        if not records:
            continue
        if stage:
            await asyncio.to_thread(time.sleep, stage)
        for m in records:
            await send.send(topic, m.value, key=m.key)


async def _read(reader: AIOKafkaConsumer, seen: dict[bytes, float]) -> None:
    while True:
        batch = await reader.getmany(timeout_ms=50, max_records=5_000)
        now = time.time()
        for records in batch.values():
            for m in records:
                seen.setdefault(m.value, now)


async def _send_at_rate(send, topic: str, rate: float, events: int, keys: int = 1) -> dict[bytes, float]:
    """Send `events` records at `rate` per second, round robin over `keys` keys (1: one partition, as the hot
    plan's edits); send stamps."""
    loop = asyncio.get_running_loop()
    stamps: dict[bytes, float] = {}
    futures = []
    start, i = loop.time(), 0
    while i < events:
        due = min(events, int((loop.time() - start) * rate) + 1)
        while i < due:
            value = b"relay-%d" % i
            stamps[value] = time.time()
            key = b"hot" if keys == 1 else b"key-%d" % (i % keys)
            futures.append(await send.send(topic, value, key=key))
            i += 1
        await asyncio.sleep(0.002)
    await asyncio.gather(*futures)
    return stamps
