"""Partition discovery and reading a topic to its end, for every consumer that assigns itself partitions."""

from __future__ import annotations

import asyncio
from typing import Callable, Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaTimeoutError


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


class ReadStalled(Exception):
    """A read to given offsets made no progress for too long (the broker unreachable, or a partition gone)."""


async def read_until(bootstrap: str, topic: str, until: dict[int, int], on_batch: Callable[[list], object],
                     kafka: dict | None = None, fetch_bytes: int = 2_000_000,
                     stall_seconds: float = 15.0) -> dict[int, int]:
    """Feed the records of these partitions, from their beginning up to (not including) `until`, to `on_batch`.

    Returns each partition's first offset still held by the broker: above 0, older records
    were deleted by retention and are missing from what was fed. Raises `ReadStalled` once
    `stall_seconds` pass without a record: a caller holding a thread for the read (a shard's
    restore holds the writer) gets it back and retries later, rather than waiting out a fault.
    """
    wanted = {p: n for p, n in until.items() if n > 0}
    if not wanted:
        return {}
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                                max_partition_fetch_bytes=fetch_bytes,
                                request_timeout_ms=max(1000, int(stall_seconds * 1000)), **(kafka or {}))
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(consumer.start(), stall_seconds)
        tps = [TopicPartition(topic, p) for p in sorted(wanted)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        starts = await asyncio.wait_for(consumer.beginning_offsets(tps), stall_seconds)
        reached = {tp: starts[tp] for tp in tps}
        open_tps = {tp for tp in tps if reached[tp] < wanted[tp.partition]}
        progress = loop.time()
        while open_tps:
            if loop.time() - progress > stall_seconds:
                raise ReadStalled(f"reading {topic} partitions {sorted(tp.partition for tp in open_tps)} made no "
                                  f"progress for {stall_seconds:.0f} s (at {[reached[tp] for tp in sorted(open_tps)]} "
                                  f"of {[wanted[tp.partition] for tp in sorted(open_tps)]})")
            batch = await consumer.getmany(*open_tps, timeout_ms=500, max_records=2000)
            if batch:
                progress = loop.time()
            records = []
            for tp, messages in batch.items():
                for m in messages:
                    if m.offset < wanted[tp.partition]:
                        records.append(m)
                    reached[tp] = max(reached[tp], m.offset + 1)
            if records:
                on_batch(records)
            for tp in list(open_tps):
                # A topic shorter than asked (reset under a file that was not rebased) ends at its high watermark.
                end = consumer.highwater(tp)
                if reached[tp] >= wanted[tp.partition] or (not batch.get(tp) and end is not None
                                                           and reached[tp] >= end):
                    open_tps.discard(tp)
        return {tp.partition: starts[tp] for tp in tps}
    except (asyncio.TimeoutError, KafkaTimeoutError):
        # aiokafka's own request timeout (set to the same bound) may fire before ours: the same stall
        raise ReadStalled(f"the broker did not answer a read of {topic} within {stall_seconds:.0f} s") from None
    finally:
        # Bounded as the read is: a stop waiting on an unreachable broker would hold the caller's thread too.
        stopping = asyncio.ensure_future(consumer.stop())
        if not (await asyncio.wait({stopping}, timeout=3.0))[0]:
            stopping.cancel()
