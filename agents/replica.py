"""Apply every partition of the input topics to local state, so each worker holds the whole catalog."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.invalidation import Invalidator, RawMessage
from state.store import Store

log = logging.getLogger(__name__)


class Replica:
    """Reads all input partitions (no consumer group) and applies them on standby.

    Selects can then be answered by any worker from its own state. What an event causes
    (invalidations, successors, dead letters) is held on standby in the outbox until the
    worker that the consumer group gave the event's partition promotes it (`wait_applied`
    lets that duty path wait for this replica to reach the event).
    """

    def __init__(self, invalidator: Invalidator, store: Store, bootstrap_servers: str, topics: dict[str, str],
                 batch_size: int = 500, batch_window: float = 0.05, fetch_bytes: int = 2_000_000,
                 after_apply: Callable[[list[RawMessage]], Awaitable[object]] | None = None,
                 kafka: dict | None = None) -> None:
        self.invalidator = invalidator
        self.store = store
        self.bootstrap_servers = bootstrap_servers
        self.topics = topics  # logical name -> broker-side name
        self.batch_size = batch_size
        self.batch_window = batch_window
        self.fetch_bytes = fetch_bytes
        self.after_apply = after_apply
        self.positions: dict[str, dict[int, int]] = store.next_offsets()
        self._progress = asyncio.Condition()
        self._consumer: AIOKafkaConsumer | None = None
        self.paused: set[str] = set()
        self.kafka = kafka or {}  # KafkaSecurity.client_kwargs()

    def applied(self, topic: str, partition: int, offset: int) -> bool:
        """Whether the event at this position has been applied (or skipped) locally."""
        return self.positions.get(topic, {}).get(partition, 0) > offset

    async def wait_applied(self, topic: str, partition: int, offset: int) -> None:
        """Return once the replica has applied the event at this position."""
        waited = 0.0
        async with self._progress:
            while not self.applied(topic, partition, offset):
                try:
                    await asyncio.wait_for(self._progress.wait(), 1.0)
                except asyncio.TimeoutError:
                    waited += 1.0
                    if waited % 10 == 0:
                        log.warning("duty for %s/%d/%d is waiting for the replica (%.0fs)", topic, partition,
                                    offset, waited)

    async def wait_covers(self, offsets: dict[str, dict[str, int] | dict[int, int]]) -> None:
        """Return once local state is at least as fresh as these next-offsets."""
        for topic, parts in offsets.items():
            for partition, nxt in parts.items():
                if nxt > 0:
                    await self.wait_applied(topic, int(partition), nxt - 1)

    def pause(self, topic: str) -> list[int]:
        """Stop applying one input topic (operators; the revocation guard keeps watching its end)."""
        self.paused.add(topic)
        return self._set_paused(topic, True)

    def resume(self, topic: str) -> list[int]:
        """Apply a paused topic again."""
        self.paused.discard(topic)
        return self._set_paused(topic, False)

    def _set_paused(self, topic: str, paused: bool) -> list[int]:
        if self._consumer is None:
            return []
        tps = [tp for tp in self._consumer.assignment() if tp.topic == self.topics[topic]]
        if paused:
            self._consumer.pause(*tps)
        else:
            self._consumer.resume(*tps)
        return sorted(tp.partition for tp in tps)

    async def run(self) -> None:
        """Consume and apply until cancelled."""
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap_servers, enable_auto_commit=False,
                                    auto_offset_reset="earliest", max_partition_fetch_bytes=self.fetch_bytes,
                                    fetch_max_wait_ms=int(self.batch_window * 1000), **self.kafka)
        await consumer.start()
        self._consumer = consumer
        logical = {v: k for k, v in self.topics.items()}
        try:
            tps = await self._partitions(consumer)
            consumer.assign(tps)
            for tp in tps:
                nxt = self.positions.get(logical[tp.topic], {}).get(tp.partition)
                if nxt is None:
                    await consumer.seek_to_beginning(tp)
                else:
                    consumer.seek(tp, nxt)
            for topic in self.paused:
                self._set_paused(topic, True)
            log.info("replica applying %d input partitions", len(tps))
            while True:
                batch = await consumer.getmany(timeout_ms=int(self.batch_window * 1000),
                                               max_records=self.batch_size)
                messages = [RawMessage(logical[tp.topic], tp.partition, m.offset, m.key, m.value,
                                       m.timestamp / 1000 if m.timestamp else None)
                            for tp, records in batch.items() for m in records]
                if messages:
                    self.invalidator.apply(messages, standby=True)
                    self.positions = self.store.next_offsets()
                    async with self._progress:
                        self._progress.notify_all()
                    if self.after_apply:
                        await self.after_apply(messages)
        finally:
            self._consumer = None
            await consumer.stop()

    async def _partitions(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        tps: list[TopicPartition] = []
        for name in self.topics.values():
            for _ in range(100):
                partitions = consumer.partitions_for_topic(name)
                if partitions:
                    break
                await consumer.topics()  # refresh metadata
                await asyncio.sleep(0.1)
            tps.extend(TopicPartition(name, p) for p in sorted(partitions or ()))
        return tps
