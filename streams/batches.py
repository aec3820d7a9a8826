"""Outbound records as pre-built per-partition aiokafka batches, partitioned as the producer's default partitioner."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from aiokafka.producer.message_accumulator import BatchBuilder

_SEED = 0x9747B28C
_M = np.uint32(0x5BD1E995)
RECORD_OVERHEAD = 64
"""Bytes a record adds to a v2 batch beyond its key and value, rounded up (varints, attributes)."""
BATCH_OVERHEAD = 61
"""Bytes of a v2 batch header."""


def murmur2_many(keys: Sequence[bytes]) -> np.ndarray:
    """Kafka's murmur2 of each key (as `schemas.plan_partition.murmur2`), vectorised over keys of equal length.

    A fan-out publishes 100,000 keys; hashing them one by one in Python costs 0.3-0.8 s.
    """
    out = np.zeros(len(keys), dtype=np.uint32)
    by_length: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        by_length.setdefault(len(key), []).append(i)
    for length, where in by_length.items():
        data = np.frombuffer(b"".join(keys[i] for i in where), dtype=np.uint8).reshape(len(where), length)
        h = np.full(len(where), (_SEED ^ length) & 0xFFFFFFFF, dtype=np.uint32)
        whole = length // 4
        if whole:
            words = np.ascontiguousarray(data[:, :whole * 4]).view("<u4")
            for column in range(whole):
                k = words[:, column] * _M
                k ^= k >> np.uint32(24)
                k *= _M
                h *= _M
                h ^= k
        tail = data[:, whole * 4:].astype(np.uint32)
        if tail.shape[1] >= 3:
            h ^= tail[:, 2] << np.uint32(16)
        if tail.shape[1] >= 2:
            h ^= tail[:, 1] << np.uint32(8)
        if tail.shape[1]:
            h ^= tail[:, 0]
            h *= _M
        h ^= h >> np.uint32(13)
        h *= _M
        h ^= h >> np.uint32(15)
        out[np.asarray(where, dtype=np.int64)] = h
    return out


@dataclass
class Batch:
    """Records bound for one topic partition, in outbox order, in one pre-built aiokafka batch."""

    topic: str
    """Broker-side topic."""
    partition: int
    """Its partition, as the producer's partitioner would pick it."""
    builder: BatchBuilder
    """The records, framed."""
    rows: list[int] = field(default_factory=list)
    """Positions of the records in the list they were planned from."""


@dataclass
class Plan:
    """How a list of records is sent: batches in order per partition, and records to send one by one."""

    batches: dict[tuple[str, int], list[Batch]]
    """(topic, partition) -> its batches, in outbox order."""
    single: list[int]
    """Positions of records too large for any batch: the producer's own checks refuse or send them."""


def partitions_of(keys: Sequence[bytes | None], partitions: Sequence[int], available: Sequence[int]) -> list[int]:
    """The partition aiokafka's `DefaultPartitioner` picks for each key (a random available one without a key)."""
    keyed = [i for i, k in enumerate(keys) if k is not None]
    hashes = murmur2_many([keys[i] for i in keyed]) & np.uint32(0x7FFFFFFF)
    picks = (hashes % np.uint32(len(partitions))).tolist()
    out = [0] * len(keys)
    for i, pick in zip(keyed, picks, strict=True):
        out[i] = partitions[pick]
    pool = list(available) or list(partitions)
    for i, k in enumerate(keys):
        if k is None:
            out[i] = random.choice(pool)
    return out


def plan_batches(rows: Sequence[tuple[str, bytes | None, bytes | None]], partition_of: Sequence[int],
                 max_bytes: int, plan: Plan | None = None, first: int = 0) -> Plan:
    """Group (topic, key, value) rows into batches of at most `max_bytes`, keeping their order per partition.

    With `plan`, the rows (positions from `first` on) are appended to it: a caller can build a
    large plan in slices and let its event loop run in between.
    """
    plan = plan if plan is not None else Plan({}, [])
    batches, room = plan.batches, max_bytes - BATCH_OVERHEAD
    for i, ((topic, key, value), partition) in enumerate(zip(rows, partition_of, strict=True), first):
        if len(key or b"") + len(value or b"") + RECORD_OVERHEAD > room:
            plan.single.append(i)
            continue
        queue = batches.setdefault((topic, partition), [])
        if not queue or queue[-1].builder.append(timestamp=None, key=key, value=value) is None:
            queue.append(Batch(topic, partition, BatchBuilder(max_bytes, 0)))
            if queue[-1].builder.append(timestamp=None, key=key, value=value) is None:
                raise ValueError("a record that fits alone was refused by an empty batch")
        queue[-1].rows.append(i)
    return plan
