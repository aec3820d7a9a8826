"""Partition discovery and reading a topic to its end, for every consumer that assigns itself partitions."""

from __future__ import annotations

import asyncio
from typing import Callable, Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition


async def discover(consumer: AIOKafkaConsumer, topics: Iterable[str], attempts: int | None = 100,
                   pause: float = 0.1) -> list[TopicPartition]:
    """Every partition of these broker-side topics, in order, from the consumer's metadata.

    A topic that shows no partitions yet gets its metadata refreshed up to `attempts` times
    (None: until it does), `pause` seconds apart; one that never does contributes none.
    """
    out: list[TopicPartition] = []
    for name in topics:
        partitions = consumer.partitions_for_topic(name)
        tries = 0
        while not partitions and (attempts is None or tries < attempts):
            await consumer.topics()  # refresh metadata
            tries += 1
            partitions = consumer.partitions_for_topic(name)
            if not partitions and pause and (attempts is None or tries < attempts):
                await asyncio.sleep(pause)
        out.extend(TopicPartition(name, p) for p in sorted(partitions or ()))
    return out


async def read_all(bootstrap: str, topic: str, on_batch: Callable[[list], object], progress=None,
                   kafka: dict | None = None) -> int:
    """Feed every record of a topic, from the beginning to its current end, to `on_batch`; returns the count."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **(kafka or {}))
    await consumer.start()
    try:
        tps = await discover(consumer, [topic], attempts=1)
        if not tps:
            return 0
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        starts = await consumer.beginning_offsets(tps)
        reached = dict(starts)  # next offset to see, per partition (positions can run ahead of delivery)
        total, seen = sum(ends[tp] - starts[tp] for tp in tps), 0
        # ListOffsets may under-report the end (Tansu counts batches), so read until the fetch
        # high watermark is reached as well.
        while True:
            batch = await consumer.getmany(timeout_ms=500, max_records=2000)
            records = []
            for tp, messages in batch.items():
                for m in messages:
                    reached[tp] = max(reached[tp], m.offset + 1)
                    records.append(m)
            for tp in tps:
                ends[tp] = max(ends[tp], consumer.highwater(tp) or 0)
            known = all(consumer.highwater(tp) is not None for tp in tps)
            if not records and known and all(reached[tp] >= ends[tp] for tp in tps):
                break
            if records:
                on_batch(records)
                seen += len(records)
                if progress:
                    progress(topic, seen, total)
        return seen
    finally:
        await consumer.stop()
