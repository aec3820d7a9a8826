"""The replica's batching: one fetch while up to date (topped up when it was buffered), up to
`catch_up_size` records while behind."""

from __future__ import annotations

from types import SimpleNamespace

import asyncio
import uuid

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import OffsetOutOfRangeError

from agents.stream.event_apply import EventApplier
from agents.cli.loader import publish, read_scenario
from agents.plans.plan_writer import PlanWriter
from agents.stream.batch_fetcher import BatchFetcher
from agents.stream.replica import Replica
from schemas.freshness import decode_token
from state.local_state import LocalState
from streams.settings import INPUT_TOPICS, Settings
from tests.catalog_double import SCENARIOS
from tests.conftest import token_key_file

A, B = TopicPartition("in", 0), TopicPartition("in", 1)


class _Consumer:
    """Hands out pre-fetched records as aiokafka's getmany does: at most max_records per call."""

    def __init__(self, ready: dict[TopicPartition, list[int]], error_after: int | None = None,
                 in_flight: dict[TopicPartition, list[int]] | None = None, wait: float = 0.0) -> None:
        self.ready = {tp: list(offsets) for tp, offsets in ready.items()}
        self.in_flight = in_flight or {}  # records the fetch sent after the first getmany brings
        self.calls = 0
        self.error_after = error_after
        self.wait = wait  # seconds the first getmany waits for a fetch (0: it was buffered)

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        self.calls += 1
        if self.calls == 1 and self.wait:
            await asyncio.sleep(self.wait)
        if self.error_after is not None and self.calls > self.error_after:
            raise OffsetOutOfRangeError({A: 0})
        if self.calls == 2:
            for tp, offsets in self.in_flight.items():
                self.ready.setdefault(tp, []).extend(offsets)
        out, left = {}, max_records
        for tp, offsets in self.ready.items():
            if offsets and left:
                out[tp], self.ready[tp] = offsets[:left], offsets[left:]
                left -= len(out[tp])
        return out


def _replica(batch_size: int, catch_up_batches: int = 4) -> SimpleNamespace:
    # Only the batching is exercised: no store, no broker.
    return SimpleNamespace(batches=BatchFetcher(batch_size, batch_size * catch_up_batches, 0.0, 0.005))


async def test_an_up_to_date_replica_applies_what_one_fetch_brings():
    batch = await _replica(10).batches.fetch(_Consumer({A: list(range(7))}))
    assert batch == {A: list(range(7))}


async def test_a_replica_behind_takes_up_to_the_catch_up_size_in_partition_order():
    consumer = _Consumer({A: list(range(25)), B: list(range(30))})
    batch = await _replica(10).batches.fetch(consumer)
    assert sum(len(v) for v in batch.values()) == 40
    assert batch[A] == list(range(25)) and batch[B] == list(range(15))
    rest = await _replica(10).batches.fetch(consumer)
    assert rest == {B: list(range(15, 30))}  # nothing skipped, nothing repeated


async def test_a_fetch_error_after_records_were_taken_is_raised_on_the_next_fetch():
    replica = _replica(10)
    consumer = _Consumer({A: list(range(40))}, error_after=1)
    assert await replica.batches.fetch(consumer) == {A: list(range(10))}  # applied first: they are consumed
    with pytest.raises(OffsetOutOfRangeError):
        await replica.batches.fetch(consumer)


async def test_a_batch_handed_over_from_the_buffer_takes_what_the_fetch_in_flight_brings():
    # aiokafka fetched those while the last batch applied: the records sent since are a round trip away.
    consumer = _Consumer({A: [0, 1]}, in_flight={A: [2, 3], B: [0]})
    assert await _replica(10).batches.fetch(consumer) == {A: [0, 1, 2, 3], B: [0]}


async def test_a_batch_the_replica_waited_for_is_applied_as_it_came():
    consumer = _Consumer({A: [0, 1]}, in_flight={A: [2]}, wait=0.02)
    assert await _replica(10).batches.fetch(consumer) == {A: [0, 1]}
    assert consumer.calls == 1


async def test_a_full_or_empty_batch_is_not_topped_up():
    full = _Consumer({A: list(range(10))}, in_flight={B: [0]})
    replica = _replica(10, catch_up_batches=1)
    assert await replica.batches.fetch(full) == {A: list(range(10))} and full.calls == 1
    empty = _Consumer({}, in_flight={A: [0]})
    assert await replica.batches.fetch(empty) == {} and empty.calls == 1


async def test_an_error_while_topping_up_is_raised_after_the_records_taken_are_applied():
    replica = _replica(10)
    consumer = _Consumer({A: [0, 1, 2]}, error_after=1)
    assert await replica.batches.fetch(consumer) == {A: [0, 1, 2]}
    with pytest.raises(OffsetOutOfRangeError):
        await replica.batches.fetch(consumer)


@pytest.mark.timeout(60)
async def test_a_failing_batch_timing_hook_never_stops_the_replica_applying(broker, tmp_path):
    settings = Settings(topic_prefix=f"hook{uuid.uuid4().hex[:8]}-", token_key_file=token_key_file())
    token = await publish(settings, broker.bootstrap_servers, read_scenario(SCENARIOS / "atlas.jsonl"))
    state = LocalState.open(tmp_path / "f.duckdb")
    applier = EventApplier(state, PlanWriter(state, settings.topic))
    calls: list[float] = []

    def broken(waited: float | None, took: float) -> None:
        calls.append(took)
        raise RuntimeError("the metrics backend is down")

    replica = Replica(applier, state.store, broker.bootstrap_servers,
                      {name: settings.topic(name) for name in INPUT_TOPICS}, batch_size=3, auto_rebase=True,
                      on_batch=broken)
    running = asyncio.ensure_future(replica.run())
    try:
        await replica.wait_covers(decode_token(token))  # every event applied, batch after batch
        assert len(calls) >= 2 and not running.done()
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        state.close()
