"""Topic administration and publishing helpers that work without a running worker."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streams.partitions import discover
from streams.settings import COMPACTED_TOPICS, INPUT_TOPICS, INTERNAL_TOPICS, KEPT_TOPICS, OUTPUT_TOPICS, Settings

log = logging.getLogger(__name__)


async def ensure_topics(settings: Settings, bootstrap_servers: str) -> list[str]:
    """Create any of the design's topics that do not exist yet; return the ones created."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **settings.kafka.client_kwargs())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = []
        for name in INPUT_TOPICS + OUTPUT_TOPICS + INTERNAL_TOPICS:
            full = settings.topic(name)
            if full in existing:
                continue
            configs = ({"cleanup.policy": "compact"} if name in COMPACTED_TOPICS else
                       {"retention.ms": "-1"} if name in KEPT_TOPICS else {})
            wanted.append(NewTopic(full, num_partitions=settings.partitions, replication_factor=1,
                                   topic_configs=configs))
        if wanted:
            await admin.create_topics(wanted)
            log.info("created topics: %s", ", ".join(t.name for t in wanted))
        return [t.name for t in wanted]
    finally:
        await admin.close()


async def stop_within(client, seconds: float = 3.0) -> None:
    """Stop an aiokafka consumer or producer, giving up after `seconds` (an unreachable broker must not hold a stop)."""
    task = asyncio.ensure_future(client.stop())
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        log.warning("%s did not stop within %.0fs; abandoned", type(client).__name__, seconds)


def producer(bootstrap_servers: str, kafka: dict[str, Any] | None = None) -> AIOKafkaProducer:
    """A producer with the delivery guarantees the service relies on; `kafka` is KafkaSecurity.client_kwargs()."""
    return AIOKafkaProducer(bootstrap_servers=bootstrap_servers, acks="all", linger_ms=5,
                            max_request_size=2_000_000, **(kafka or {}))



class GroupOffsets:
    """Reads a consumer group's committed offsets without joining the group.

    OffsetFetch through a plain consumer, not the admin client: the embedded Tansu broker's
    answer to the admin client's OffsetFetch version does not decode (seen with Tansu 0.6.0).
    """

    def __init__(self, bootstrap_servers: str, group: str, kafka: dict[str, Any] | None = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.group = group
        self.kafka = kafka or {}
        self._consumer: AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()  # one reader at a time on the one connection (pruning and take-overs share it)

    async def read(self, topics: dict[str, str]) -> dict[tuple[str, int], int]:
        """Committed next offsets keyed by (logical topic, partition); `topics` maps broker names to logical."""
        async with self._lock:
            if self._consumer is None:
                consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap_servers, group_id=self.group,
                                            enable_auto_commit=False, **self.kafka)
                await consumer.start()
                self._consumer = consumer
            out: dict[tuple[str, int], int] = {}
            for tp in await discover(self._consumer, topics, attempts=0):
                offset = await self._consumer.committed(tp)
                if offset is not None and offset >= 0:
                    out[(topics[tp.topic], tp.partition)] = offset
            return out

    async def close(self) -> None:
        """Close the connection."""
        async with self._lock:
            if self._consumer is not None:
                consumer, self._consumer = self._consumer, None
                await stop_within(consumer)
