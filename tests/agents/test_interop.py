"""A librdkafka client (confluent-kafka) produces source changes and reads invalidations."""

from __future__ import annotations

import asyncio

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.conftest import ATLAS_REQUEST
from tests.events import resource


async def test_librdkafka_producer_and_consumer(worker):
    fresh = await worker.load("atlas.jsonl")
    old = await worker.select(ATLAS_REQUEST, fresh)

    producer = Producer({"bootstrap.servers": worker.bootstrap, "acks": "all"})
    topic, event = resource("approved-waiver-W2")
    delivered = []
    producer.produce(worker.settings.topic(topic), key=b"approved-waiver-W2", value=orjson.dumps(event),
                     on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    assert producer.flush(30) == 0 and delivered and delivered[0][0] is None

    # Direct assignment: librdkafka's first group join against the embedded broker takes ~20 s.
    consumer = Consumer({"bootstrap.servers": worker.bootstrap, "group.id": "interop-reader",
                         "enable.auto.commit": False})
    name = worker.settings.topic("plan-invalidations")
    consumer.assign([TopicPartition(name, p, 0) for p in range(worker.settings.partitions)])
    found = None
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while found is None and loop.time() < deadline:
            message = await loop.run_in_executor(None, consumer.poll, 0.5)
            if message is None or message.error():
                continue
            record = orjson.loads(message.value())
            if record["plan_id"] == old["plan_id"]:
                found = (message.key(), record)
    finally:
        consumer.close()
    assert found is not None, "no invalidation read by librdkafka"
    key, record = found
    assert key == old["plan_id"].encode() and record["cause"]["event_id"] == event["event_id"]
    assert record["successor_plan_id"] is None  # announced before its successor was compiled
