"""The publisher's batches: records placed on the partitions the producer, or their plan's entity, picks."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import orjson
import pytest
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.record.memory_records import MemoryRecords

from agents.stream.publisher import BATCH_FROM, Publisher
from agents.stream.writer import inline
from schemas.plan_partition import plan_partition
from state.local_state import LocalState
from state.outbox import OutboundLimit
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST, eventually, launch, read_from_start

class Broker:
    """An aiokafka producer double that takes pre-built batches; the broker refuses records over `limit`."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self.down: set[int] = set()  # partitions whose leader cannot take the next batch (once)
        self.batches: list[tuple[str, int, list[tuple[bytes | None, bytes]]]] = []
        self.client = SimpleNamespace(cluster=SimpleNamespace(available_partitions_for_topic=lambda t: {0, 1, 2}))

    async def partitions_for(self, topic):
        return {0, 1, 2}

    async def send_batch(self, builder, topic, *, partition):
        if partition in self.down:
            self.down.discard(partition)
            raise KafkaTimeoutError()
        batch = MemoryRecords(bytes(builder._build())).next_batch()
        records = [(r.key, r.value) for r in batch]
        self.batches.append((topic, partition, records))
        ack = asyncio.get_running_loop().create_future()
        if any(len(v) > self.limit for _, v in records):
            ack.set_exception(MessageSizeTooLargeError())
        else:
            ack.set_result(None)
        return ack


class BatchingProducer:
    """Faust's producer as the publisher sees it: a partitioner, the aiokafka producer, and record-by-record sends."""

    def __init__(self, broker: Broker) -> None:
        self.partitioner = DefaultPartitioner()
        self._producer = broker
        self.sent: list[tuple[str, bytes | None, bytes]] = []

    async def send(self, topic, key, value, partition, timestamp, headers):
        self.sent.append((topic, key, value))
        ack = asyncio.get_running_loop().create_future()
        if len(value) > self._producer.limit:
            ack.set_exception(MessageSizeTooLargeError())
        else:
            ack.set_result(None)
        return ack


@pytest.fixture
def batching(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    state.outbox.limit = OutboundLimit(1_000_000, "dead-letters", frozenset())
    broker = Broker()
    app = SimpleNamespace(producer=BatchingProducer(broker), conf=SimpleNamespace(producer_max_request_size=64_000))
    yield state, broker, app, Publisher(state, app, inline, lambda: {})
    state.close()


@pytest.mark.timeout(10)
async def test_a_large_outbox_goes_out_in_batches_on_the_partitions_the_producer_would_pick(batching):
    state, broker, app, publisher = batching
    rows = [("plan-invalidations", f"plan-{i}".encode(), b"v%d" % i + b"x" * 300) for i in range(1000)]
    state.outbox.add_many(rows)
    assert await publisher.publish() == 1000
    assert app.producer.sent == [] and state.outbox.size() == 0
    assert 3 <= len(broker.batches) < 30  # 64 KB batches, not a request per record
    partitioner = DefaultPartitioner()
    for partition in (0, 1, 2):
        sent = [record for _, p, records in broker.batches if p == partition for record in records]
        assert all(partitioner(key, [0, 1, 2], [0, 1, 2]) == partition for key, _ in sent)
        assert sent == [(k, v) for _, k, v in rows if partitioner(k, [0, 1, 2], [0, 1, 2]) == partition]  # in order


@pytest.mark.timeout(10)
async def test_a_batch_refused_for_one_oversized_record_dead_letters_that_record_only(batching):
    state, broker, app, publisher = batching
    rows = [("plans", f"plan-{i}".encode(), b"x" * (20_000 if i == 50 else 300)) for i in range(200)]
    state.outbox.add_many(rows)
    await publisher.publish()
    assert state.outbox.size() == 0
    acked = {k for t, k, v in app.producer.sent if t == "plans" and len(v) <= broker.limit}
    acked |= {k for t, p, records in broker.batches if t == "plans" and all(len(v) <= broker.limit for _, v in records)
              for k, _ in records}
    assert acked == {k for _, k, _ in rows} - {b"plan-50"}
    [letter] = [orjson.loads(v) for t, k, v in app.producer.sent if t == "dead-letters"]
    assert letter["outbound_key"] == "plan-50" and letter["error_class"] == "record_too_large"


@pytest.mark.timeout(10)
async def test_a_partition_that_cannot_take_a_batch_keeps_all_its_records_queued_in_order(batching):
    state, broker, app, publisher = batching
    broker.down = {1}
    rows = [("plans", f"plan-{i}".encode(), b"x" * 300) for i in range(1000)]
    state.outbox.add_many(rows)
    partitioner = DefaultPartitioner()
    on_1 = [(k, v) for _, k, v in rows if partitioner(k, [0, 1, 2], [0, 1, 2]) == 1]
    assert await publisher.publish() == len(rows) - len(on_1)
    assert [(k, v) for _, _, k, v in state.outbox.pending(10_000)] == on_1  # nothing of partition 1 left early
    assert await publisher.publish() == len(on_1)
    assert [r for _, p, records in broker.batches if p == 1 for r in records] == on_1


@pytest.mark.timeout(240)
async def test_a_fan_out_is_announced_through_the_broker_on_the_partitions_its_keys_hash_to(broker, tmp_path):
    async with launch(broker, tmp_path, FRESHPLAN_EAGER_RECOMPILE_LIMIT="0") as worker:
        loaded = await worker.load("atlas.jsonl")
        plans = {(await worker.select(dict(ATLAS_REQUEST, query=f"copy {i}"), loaded))["plan_id"]
                 for i in range(BATCH_FROM + 16)}
        bundle = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
        await worker.publish_events(("policy-versions", dict(bundle, event_id="fan-v2", version=2)))
        consumer = await read_from_start(worker.bootstrap, worker.settings.topic("plan-invalidations"),
                                         worker.settings.partitions)
        seen: dict[str, int] = {}
        try:
            while not plans <= set(seen):
                for tp, messages in (await asyncio.wait_for(consumer.getmany(timeout_ms=200), 60)).items():
                    for m in messages:
                        doc = orjson.loads(m.value)
                        if doc["cause"]["event_id"] == "fan-v2":
                            assert doc["successor_plan_id"] is None and m.key == doc["plan_id"].encode()
                            seen[doc["plan_id"]] = tp.partition
        finally:
            await consumer.stop()
        everything = list(range(worker.settings.partitions))
        assert all(DefaultPartitioner()(plan_id.encode(), everything, everything) == partition
                   for plan_id, partition in seen.items())
        assert len(set(seen.values())) == len(everything)
        await eventually(lambda: _outbox_empty(worker), 30, "an empty outbox")
        # Their successors' internal records go where the plans' entity is owned, not where their keys hash to.
        internal = await worker.everything("plan-dependencies")
        assert len({r["plan_key"] for r in internal}) == len(plans) and len({r["entity_id"] for r in internal}) == 1
        assert {r["_partition"] for r in internal} == {plan_partition(internal[0]["entity_id"], len(everything))}


class TransactionalProducer:
    """Faust's producer over a transactional aiokafka producer: records go one by one, each where `send` is told."""

    def __init__(self) -> None:
        async def partitions_for(topic):
            return {0, 1, 2}

        self._producer = SimpleNamespace(send_batch=None, _txn_manager=object(), partitions_for=partitions_for)
        self.sent: list[tuple[str, bytes | None, int | None]] = []

    async def send(self, topic, key, value, partition, timestamp, headers):
        self.sent.append((topic, key, partition))
        ack = asyncio.get_running_loop().create_future()
        if partition is not None and partition not in (0, 1, 2):  # aiokafka: "Unrecognized partition"
            ack.set_exception(AssertionError("Unrecognized partition"))
        else:
            ack.set_result(None)
        return ack


@pytest.mark.timeout(10)
async def test_record_by_record_a_placed_record_goes_to_its_partition_unless_the_topic_lacks_it(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    app = SimpleNamespace(producer=TransactionalProducer(), conf=SimpleNamespace(producer_max_request_size=64_000))
    try:
        # FRESHPLAN_PARTITIONS=8 against a topic of 3: sent there, it would fail and hold its key's records for ever.
        state.outbox.add_many([("deps", b"pk-1", b"{}"), ("deps", b"pk-2", b"{}"), ("plans", b"p", b"{}")],
                              partitions=[7, 1, None])
        assert await Publisher(state, app, inline, lambda: {}).publish() == 3 and state.outbox.size() == 0
        assert app.producer.sent == [("deps", b"pk-1", None), ("deps", b"pk-2", 1), ("plans", b"p", None)]
    finally:
        state.close()


@pytest.mark.timeout(10)
async def test_records_placed_on_a_partition_of_their_own_go_there_in_order_and_the_rest_where_keys_hash(batching):
    state, broker, app, publisher = batching
    rows = [(t, f"k-{i}".encode(), b"v%d" % i + b"x" * 300) for i in range(300) for t in ("plans", "deps")]
    places = [None if t == "plans" else (7 if i == 299 else i % 2) for i in range(300) for t in ("plans", "deps")]
    state.outbox.add_many(rows, partitions=places)
    assert await publisher.publish() == len(rows) and state.outbox.size() == 0
    partitioner = DefaultPartitioner()
    for partition in (0, 1, 2):
        sent = [record for t, p, records in broker.batches if p == partition and t == "deps" for record in records]
        # 7 is past the topic's 3 partitions: that record goes where its key hashes, as if it had none.
        assert sent == [(k, v) for (t, k, v), place in zip(rows, places, strict=True) if t == "deps" and (
            place == partition if place != 7 else partitioner(k, [0, 1, 2], [0, 1, 2]) == partition)]
        assert [r for t, p, records in broker.batches if p == partition and t == "plans" for r in records] == [
            (k, v) for t, k, v in rows if t == "plans" and partitioner(k, [0, 1, 2], [0, 1, 2]) == partition]


async def _outbox_empty(worker) -> bool:
    return (await worker.get("/healthz"))["outbox"] == 0


@pytest.mark.timeout(10)
async def test_records_of_a_batch_refused_at_acknowledgement_stay_ahead_of_the_partition_s_later_records(batching):
    # One key, one partition: a plan's older record must not land after its newer one (compaction keeps the last).
    state, broker, app, publisher = batching
    rows = [("plans", b"plan-1", b"%05d" % i + b"x" * (20_000 if i == 10 else 300)) for i in range(600)]
    state.outbox.add_many(rows)
    await publisher.publish()
    await publisher.publish()  # whatever the first flush left queued
    assert state.outbox.size() == 0
    log = [r for t, _, records in broker.batches if t == "plans" and all(len(v) <= broker.limit for _, v in records)
           for r in records]
    log += [(k, v) for t, k, v in app.producer.sent if t == "plans" and len(v) <= broker.limit]
    assert len(broker.batches[0][2]) < len(rows)  # the round was framed in several batches, the first refused
    assert log == [(k, v) for i, (_, k, v) in enumerate(rows) if i != 10]
