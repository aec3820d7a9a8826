"""Topic administration and publishing helpers that work without a running worker."""

from __future__ import annotations

import logging

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streams.settings import INPUT_TOPICS, OUTPUT_TOPICS, Settings

log = logging.getLogger(__name__)


async def ensure_topics(settings: Settings, bootstrap_servers: str) -> list[str]:
    """Create any of the design's topics that do not exist yet; return the ones created."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = []
        for name in INPUT_TOPICS + OUTPUT_TOPICS:
            full = settings.topic(name)
            if full in existing:
                continue
            configs = {"cleanup.policy": "compact"} if name == "plans" else {}
            wanted.append(NewTopic(full, num_partitions=settings.partitions, replication_factor=1,
                                   topic_configs=configs))
        if wanted:
            await admin.create_topics(wanted)
            log.info("created topics: %s", ", ".join(t.name for t in wanted))
        return [t.name for t in wanted]
    finally:
        await admin.close()


def producer(bootstrap_servers: str) -> AIOKafkaProducer:
    """A producer with the delivery guarantees the service relies on."""
    return AIOKafkaProducer(bootstrap_servers=bootstrap_servers, acks="all", linger_ms=5,
                            max_request_size=2_000_000)
