"""Review: `read_until` (a gained shard's restore) against the embedded broker: it ends, whatever the topic holds."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaProducer

from streams.admin import ensure_topics
from streams.partitions import read_until
from streams.settings import Settings

pytestmark = pytest.mark.timeout(90)


async def _topic(broker, counts: dict[int, int]) -> str:
    settings = Settings(topic_prefix=f"until-{uuid.uuid4().hex[:6]}-", partitions=2)
    await ensure_topics(settings, broker.bootstrap_servers)
    topic = settings.topic("source-changes")
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    await producer.start()
    try:
        for partition, n in counts.items():
            for i in range(n):
                await producer.send_and_wait(topic, f"p{partition}-{i}".encode(), partition=partition)
    finally:
        await producer.stop()
    return topic


async def _read(broker, topic: str, until: dict[int, int]) -> tuple[dict, list[bytes]]:
    seen: list[bytes] = []
    starts = await asyncio.wait_for(
        read_until(broker.bootstrap_servers, topic, until, lambda rs: seen.extend(m.value for m in rs)), 20)
    return starts, seen


async def test_read_until_stops_at_the_file_offsets(broker):
    topic = await _topic(broker, {0: 5, 1: 3})
    starts, seen = await _read(broker, topic, {0: 3, 1: 3})
    assert starts == {0: 0, 1: 0}
    assert sorted(seen) == sorted([b"p0-0", b"p0-1", b"p0-2", b"p1-0", b"p1-1", b"p1-2"])


async def test_read_until_ends_on_a_topic_shorter_than_the_file_offsets(broker):
    """A reset topic (the file's offsets belong to the old one): the restore must end at the high watermark."""
    topic = await _topic(broker, {0: 2, 1: 1})
    _, seen = await _read(broker, topic, {0: 10, 1: 10})
    assert len(seen) == 3


async def test_read_until_ends_on_an_empty_partition(broker):
    """A reset topic whose partition holds nothing yet: the writer must not block for good."""
    topic = await _topic(broker, {0: 2})
    _, seen = await _read(broker, topic, {0: 2, 1: 4})
    assert len(seen) == 2


async def test_a_read_cut_off_from_the_broker_gives_up_after_its_stall_bound():
    """A shard's restore reads on the writer thread: a fault must hand the thread back, not hold it
    for aiokafka's request timeout (40 s, twice) or for as long as the fault lasts."""
    from tests.agents.broker_relay import relayed_broker
    from streams.partitions import ReadStalled

    async with relayed_broker() as (relay, broker):
        topic = await _topic(broker, {0: 3})
        relay.cut = topic.encode()  # reads from the topic's start are dropped on the way
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(ReadStalled, match="(no progress|did not answer)"):
            await read_until(broker.bootstrap_servers, topic, {0: 3}, lambda records: None, stall_seconds=2.0)
        assert loop.time() - started < 15 and relay.dropped
        relay.cut = None
        seen: list = []
        await read_until(broker.bootstrap_servers, topic, {0: 3}, seen.extend, stall_seconds=2.0)
        assert len(seen) == 3
