"""The embedded broker speaks the Kafka protocol and stops with its owner."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from streams import broker as broker_module
from streams.broker import EmbeddedBroker, free_port
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


def test_the_embedded_broker_never_takes_a_port_its_worker_is_about_to_bind(monkeypatch):
    # A test picks the worker's web port, then the worker picks the broker's: the system may hand
    # out the same free port twice, and the web server then fails with "address already in use".
    offered = iter([41001, 41001, 41002])

    class Socket:
        def __init__(self, *args) -> None:
            self.port = next(offered)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            return None

        def bind(self, address) -> None:
            pass

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(broker_module.socket, "socket", Socket)
    assert free_port() == 41001
    assert free_port(avoid=frozenset({41001})) == 41002
