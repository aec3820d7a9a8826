"""Partition discovery and reading a topic to its end, through the embedded broker."""

from __future__ import annotations

import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from streams.admin import ensure_topics
from streams.partitions import discover, read_all
from streams.settings import Settings


async def test_discover_lists_every_partition_in_order_and_a_missing_topic_as_none(broker):
    settings = Settings(topic_prefix=f"parts-{uuid.uuid4().hex[:6]}-", partitions=3)
    await ensure_topics(settings, broker.bootstrap_servers)
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False)
    await consumer.start()
    try:
        clock, plans = settings.topic("clock"), settings.topic("plans")
        assert await discover(consumer, [plans, clock]) == (
            [TopicPartition(plans, p) for p in range(3)] + [TopicPartition(clock, p) for p in range(3)])
        assert await discover(consumer, [settings.topic("no-such-topic")], attempts=2, pause=0) == []
    finally:
        await consumer.stop()


async def test_read_all_feeds_every_record_from_the_start_to_the_end(broker):
    settings = Settings(topic_prefix=f"parts-{uuid.uuid4().hex[:6]}-", partitions=2)
    await ensure_topics(settings, broker.bootstrap_servers)
    topic = settings.topic("receipts")
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    await producer.start()
    try:
        for i in range(7):
            await producer.send_and_wait(topic, f"r{i}".encode(), partition=i % 2)
    finally:
        await producer.stop()
    seen: list[bytes] = []
    progress: list[int] = []
    count = await read_all(broker.bootstrap_servers, topic, lambda records: seen.extend(m.value for m in records),
                           lambda _, done, total: progress.append(done))
    assert count == 7 and sorted(seen) == [f"r{i}".encode() for i in range(7)] and progress[-1] == 7
    assert await read_all(broker.bootstrap_servers, settings.topic("no-such-topic"), seen.extend) == 0
