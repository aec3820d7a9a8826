"""The embedded broker speaks the Kafka protocol and stops with its owner."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from streams.broker import EmbeddedBroker
from streams.settings import Settings
from streams.admin import ensure_topics
from tests.conftest import ROOT


async def test_produce_and_consume_through_the_embedded_broker(broker):
    settings = Settings(topic_prefix="broker-test-", partitions=2)
    created = await ensure_topics(settings, broker.bootstrap_servers)
    assert settings.topic("source-changes") in created
    assert await ensure_topics(settings, broker.bootstrap_servers) == []  # idempotent
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    await producer.start()
    try:
        meta = await producer.send_and_wait(settings.topic("clock"), b"tick", partition=1)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(settings.topic("clock"), 1)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        message = await asyncio.wait_for(consumer.getone(), 10)
        assert message.value == b"tick" and message.offset == meta.offset
    finally:
        await consumer.stop()


def test_broker_process_ends_on_stop():
    broker = EmbeddedBroker().start()
    port = broker.port
    broker.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_broker_dies_with_its_owner_even_on_sigkill():
    code = ("import sys, time; sys.path.insert(0, '.');"
            "from streams.broker import EmbeddedBroker; b = EmbeddedBroker().start();"
            "print(b.port, flush=True); time.sleep(60)")
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    port = int(owner.stdout.readline())
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    owner.kill()
    owner.wait(timeout=10)
    owner.stdout.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return
        time.sleep(0.2)
    raise AssertionError("the embedded broker outlived its owner")
