"""A steady stream of records for the outbox does not hold an announced plan's successor back."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.agents.broker_relay import relayed_broker
from tests.conftest import ATLAS_REQUEST, WorkerProcess, launch
from tests.events import resource

pytestmark = pytest.mark.timeout(150)

SLOW = 0.3  # seconds the relay holds each Produce request: records stay due in the outbox that long
BOUND = 10.0  # seconds from a plan's announcement to its successor, both as the worker stamped them


async def test_a_successor_follows_its_announcement_while_dead_letters_keep_the_outbox_busy(tmp_path):
    """Dead letters arrive faster than the slowed broker acknowledges them: the outbox is never empty.

    Each is published within a round or two; the announced plan's successor must follow as
    promptly, not wait for a moment when nothing at all is due (never, while the stream lasts).
    """
    async with relayed_broker() as (relay, broker), launch(broker, tmp_path) as worker:
        plan = await worker.select(ATLAS_REQUEST, await worker.load("atlas.jsonl"))
        relay.slow_produce = SLOW
        producer = AIOKafkaProducer(bootstrap_servers=worker.bootstrap, linger_ms=0)
        await producer.start()

        async def stream() -> None:
            for n in range(100_000):  # not JSON: each one a dead letter, published by this worker (it owns both)
                await producer.send(worker.settings.topic("source-changes"), b'{"event_id": ', key=b"k%d" % n)
                await asyncio.sleep(0.05)  # 20 a second: a pace, not a wait for an outcome

        streaming = asyncio.create_task(stream())
        try:
            await _first(worker, "dead-letters", lambda r: True)  # the stream is flowing through
            await worker.publish_events(resource("approved-waiver-W2"))
            announced, at = await _first(worker, "plan-invalidations", lambda r: r["plan_id"] == plan["plan_id"])
            assert announced["successor_plan_id"] is None  # announced first
            try:
                _, then = await _first(worker, "plans", lambda r: r["plan_key"] == plan["plan_key"]
                                       and r["plan_id"] != plan["plan_id"], timeout=2 * BOUND)
            except TimeoutError:
                then = float("inf")
            assert not streaming.done()
            assert then - at < BOUND, f"no successor within {BOUND} s of the announcement while the stream ran"
        finally:
            streaming.cancel()
            await asyncio.gather(streaming, return_exceptions=True)
            await producer.stop()
            relay.slow_produce = 0.0


async def _first(w: WorkerProcess, topic: str, match, timeout: float = 60.0) -> tuple[dict, float]:
    """The first record on a topic that matches, and its timestamp in seconds (the worker's clock, at sending)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=w.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = [TopicPartition(w.settings.topic(topic), p) for p in range(w.settings.partitions)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        async with asyncio.timeout(timeout):
            while True:
                for messages in (await consumer.getmany(timeout_ms=200)).values():
                    for m in messages:
                        record = orjson.loads(m.value)
                        if match(record):
                            return record, m.timestamp / 1000
    finally:
        await consumer.stop()
