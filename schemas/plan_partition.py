"""The partition that owns a plan: Kafka's default partitioner applied to its canonical entity id.

Why this hash: it must give the same answer in every worker process and Python run (the
built-in `hash()` of a str is salted per process), and it should be the one Kafka itself uses
for keys (murmur2 of the key bytes, made positive, modulo the partition count; Java's
`DefaultPartitioner`, aiokafka's `DefaultPartitioner`, librdkafka's `murmur2_random`). With it
the owner of an entity's plans is the owner of the input partition a producer keying a record
by that entity id would write to, and Faust's own routing (`app.router.external_topic_key_store`,
which hashes with the producer's partitioner) agrees with ours. It is a wire contract: a
producer in another language can compute it.
"""

from __future__ import annotations

import struct
from functools import lru_cache

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """MurmurHash2 as `org.apache.kafka.common.utils.Utils.murmur2` computes it, as an unsigned 32-bit int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length // 4
    for (k,) in struct.iter_unpack("<I", data[: whole * 4]):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = data[whole * 4:]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


@lru_cache(maxsize=1 << 16)  # a take-over meets each entity once per plan about it
def plan_partition(entity_id: str, partitions: int) -> int:
    """The partition (0 .. partitions-1) owning plans about this canonical entity id."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    return (murmur2(entity_id.encode("utf-8")) & 0x7FFFFFFF) % partitions
