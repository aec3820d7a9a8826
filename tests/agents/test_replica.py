"""The replica's batching: one fetch while up to date, up to `catch_up_size` records while behind."""

from __future__ import annotations

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import OffsetOutOfRangeError

from agents.replica import Replica

A, B = TopicPartition("in", 0), TopicPartition("in", 1)


class _Consumer:
    """Hands out pre-fetched records as aiokafka's getmany does: at most max_records per call."""

    def __init__(self, ready: dict[TopicPartition, list[int]], error_after: int | None = None) -> None:
        self.ready = {tp: list(offsets) for tp, offsets in ready.items()}
        self.calls = 0
        self.error_after = error_after

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        self.calls += 1
        if self.error_after is not None and self.calls > self.error_after:
            raise OffsetOutOfRangeError({A: 0})
        out, left = {}, max_records
        for tp, offsets in self.ready.items():
            if offsets and left:
                out[tp], self.ready[tp] = offsets[:left], offsets[left:]
                left -= len(out[tp])
        return out


def _replica(batch_size: int, catch_up_batches: int = 4) -> Replica:
    replica = Replica.__new__(Replica)  # only the batching is exercised: no store, no broker
    replica.batch_size, replica.catch_up_size = batch_size, batch_size * catch_up_batches
    replica.batch_window, replica._deferred = 0.0, None
    return replica


async def test_an_up_to_date_replica_applies_what_one_fetch_brings():
    batch = await _replica(10)._fetch(_Consumer({A: list(range(7))}))
    assert batch == {A: list(range(7))}


async def test_a_replica_behind_takes_up_to_the_catch_up_size_in_partition_order():
    consumer = _Consumer({A: list(range(25)), B: list(range(30))})
    batch = await _replica(10)._fetch(consumer)
    assert sum(len(v) for v in batch.values()) == 40
    assert batch[A] == list(range(25)) and batch[B] == list(range(15))
    rest = await _replica(10)._fetch(consumer)
    assert rest == {B: list(range(15, 30))}  # nothing skipped, nothing repeated


async def test_a_fetch_error_after_records_were_taken_is_raised_on_the_next_fetch():
    replica = _replica(10)
    consumer = _Consumer({A: list(range(40))}, error_after=1)
    assert await replica._fetch(consumer) == {A: list(range(10))}  # applied first: they are consumed
    with pytest.raises(OffsetOutOfRangeError):
        await replica._fetch(consumer)
