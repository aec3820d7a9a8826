"""Which incarnation of the broker and its topics an offset belongs to: cluster id and record marks."""

from __future__ import annotations

import hashlib
import logging

from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.metadata import MetadataRequest

log = logging.getLogger(__name__)


def record_mark(key: bytes | None, value: bytes | None, timestamp_ms: int | None) -> str:
    """A short digest naming one record: the same offset holding another record is another topic."""
    h = hashlib.blake2b(digest_size=10)
    for part in (key, value):
        h.update(b"\x00" if part is None else b"\x01" + len(part).to_bytes(8, "big") + part)
    h.update(str(int(timestamp_ms or 0)).encode())
    return h.hexdigest()


async def read_cluster_id(bootstrap_servers: str, **client_options) -> str:
    """The cluster id the broker reports in its metadata (Apache Kafka and Tansu both send one)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap_servers, **client_options)
    await client.bootstrap()
    try:
        response = await client.send(client.get_random_node(), MetadataRequest([]))
        cluster = getattr(response, "cluster_id", None)
        # A broker too old to name its cluster (Metadata v0/v1) gets a stable placeholder; topic
        # marks and end offsets still detect a reset.
        return cluster or "unnamed-cluster"
    finally:
        await client.close()
