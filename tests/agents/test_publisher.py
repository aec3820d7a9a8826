"""The publisher: the replica's batches are published in the background, every promoted record exactly once."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.record.memory_records import MemoryRecords

from agents.stream.event_apply import EventApplier, RawMessage
from agents.plans.plan_writer import PlanWriter
from agents.stream.publisher import BATCH_FROM, FORGET_NOW, Publisher
from agents.stream.writer import inline
from schemas.plan_partition import plan_partition
from state.local_state import LocalState
from state.outbox import OutboundLimit
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST, eventually, launch


class SlowProducer:
    """Accepts sends at once and acknowledges them only when the test says so."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.acks: list[asyncio.Future] = []

    async def send(self, topic, key, value, partition, timestamp, headers):
        self.sent.append(value)
        self.acks.append(asyncio.get_running_loop().create_future())
        return self.acks[-1]

    def ack_all(self) -> None:
        for ack in self.acks:
            if not ack.done():
                ack.set_result(None)


class App:
    def __init__(self) -> None:
        self.producer = SlowProducer()


@pytest.fixture
def setup(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    app = App()
    yield state, app, Publisher(state, app, inline, lambda: {"source-changes": [0]})
    state.close()


def _caused(state: LocalState, offset: int) -> RawMessage:
    """A standby record caused by the event at this offset, and that event."""
    with state.store.transaction():
        state.outbox.add_many([("out", b"k", f"caused-by-{offset}".encode())], [("source-changes", 0, offset)],
                              standby=True)
    return RawMessage("source-changes", 0, offset, b"k", b"{}")


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.001)


@pytest.mark.timeout(10)
async def test_the_replica_does_not_wait_for_acknowledgements(setup):
    state, app, publisher = setup
    await asyncio.wait_for(publisher.publish_owned([_caused(state, 0)]), 1)  # returns with the ack still due
    await _until(lambda: app.producer.sent)
    assert state.outbox.size() == 1  # kept until acknowledged
    # Promoted while the first flush waits: the same flush task reads the outbox again for it.
    await publisher.publish_owned([_caused(state, 1)])
    app.producer.ack_all()
    await _until(lambda: len(app.producer.sent) == 2)
    app.producer.ack_all()
    await _until(lambda: state.outbox.size() == 0)
    await publisher._flushing
    assert app.producer.sent == [b"caused-by-0", b"caused-by-1"]


@pytest.mark.timeout(10)
async def test_a_partition_this_worker_does_not_own_stays_on_standby(setup):
    state, app, publisher = setup
    message = _caused(state, 0)
    await publisher.publish_owned([RawMessage("source-changes", 1, 0, b"k", b"{}")])
    assert publisher._flushing is None and state.outbox.standby_size() == 1
    await publisher.publish_owned([message])
    await _until(lambda: app.producer.sent)
    app.producer.ack_all()
    await publisher._flushing
    assert state.outbox.size() == 0 and state.outbox.standby_size() == 0


@pytest.mark.timeout(10)
async def test_events_before_the_offset_a_partition_was_taken_on_at_stay_on_standby(setup):
    state, app, _ = setup
    publisher = Publisher(state, app, inline, lambda: {"source-changes": {0: 5}})  # as `Duty.owned` gives it
    early, late = _caused(state, 2), _caused(state, 7)
    await publisher.publish_owned([early, late])
    await _until(lambda: app.producer.sent)
    app.producer.ack_all()
    await publisher._flushing
    assert app.producer.sent == [b"caused-by-7"]
    assert state.outbox.size() == 0 and state.outbox.standby_size() == 1  # left to pruning


@pytest.mark.timeout(10)
async def test_records_due_at_once_are_published_before_the_group_assigns_anything(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    try:
        app = App()
        publisher = Publisher(state, app, inline, lambda: {})  # restarted: no assignment yet
        with state.store.transaction():  # a fan-out over owned plans: due at once, not on standby
            state.outbox.add_many([("out", b"k", b"announced")], [("policy-versions", 0, 7)])
        await publisher.publish_owned([RawMessage("policy-versions", 0, 7, b"k", b"{}")])
        await _until(lambda: app.producer.sent)
        app.producer.ack_all()
        await publisher._flushing
        assert app.producer.sent == [b"announced"] and state.outbox.size() == 0
    finally:
        state.close()


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
        consumer = AIOKafkaConsumer(bootstrap_servers=worker.bootstrap, enable_auto_commit=False)
        await consumer.start()
        seen: dict[str, int] = {}
        try:
            parts = [TopicPartition(worker.settings.topic("plan-invalidations"), p)
                     for p in range(worker.settings.partitions)]
            consumer.assign(parts)
            await consumer.seek_to_beginning(*parts)
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


def _recorded(state: LocalState, app) -> tuple[Publisher, list[str]]:
    """A publisher whose writer jobs are recorded by name."""
    jobs: list[str] = []

    async def run(fn, *args, **kwargs):
        jobs.append(fn.__name__)
        return fn(*args, **kwargs)

    return Publisher(state, app, run, lambda: {"source-changes": [0]}), jobs


async def _announce_owned(state: LocalState, app, publisher: Publisher) -> None:
    """Queue what a batch of owned plans queues (due at once) and publish it until acknowledged."""
    with state.store.transaction():
        state.outbox.add_many([("out", b"k", b"announced")], [("source-changes", 0, 3)])
    await publisher.publish_owned([RawMessage("source-changes", 0, 3, b"k", b"{}")], held=False)
    await _until(lambda: app.producer.sent)
    app.producer.ack_all()
    await publisher._flushing


@pytest.mark.timeout(10)
async def test_a_batch_that_held_nothing_on_standby_is_published_without_a_promotion(setup):
    state, app, _ = setup
    publisher, jobs = _recorded(state, app)
    await _announce_owned(state, app, publisher)
    assert "promote" not in jobs and app.producer.sent == [b"announced"] and state.outbox.size() == 0
    await publisher.publish_owned([_caused(state, 4)])  # a dead letter held on standby: promoted, then sent
    await _until(lambda: len(app.producer.sent) == 2)
    app.producer.ack_all()
    await publisher._flushing
    assert "promote" in jobs and app.producer.sent[-1] == b"caused-by-4"


@pytest.mark.timeout(10)
async def test_acknowledged_rows_go_with_the_next_apply_batch_and_a_flush_reads_the_outbox_once(setup):
    state, app, _ = setup
    publisher, jobs = _recorded(state, app)
    await _announce_owned(state, app, publisher)
    # One read of the outbox, and no transaction of its own to forget the acknowledged row.
    assert jobs == ["due"] and state.outbox.size() == 0 and len(state.outbox.acked) == 1
    stored = "SELECT count(*) FROM outbox"
    assert state.store.db.execute(stored).fetchone()[0] == 1

    lines = (SCENARIOS / "atlas.jsonl").read_text().splitlines()
    EventApplier(state, PlanWriter(state, lambda name: name)).apply(
        [RawMessage(item["topic"], 0, offset, b"k", orjson.dumps(item["event"]))
         for offset, item in enumerate(map(orjson.loads, lines))])
    assert state.store.db.execute(stored).fetchone()[0] == 0 and len(state.outbox.acked) == 0

    with state.store.transaction():
        state.outbox.add_many([("out", b"k", b"idle")])
    flush = asyncio.create_task(publisher.publish())
    await _until(lambda: len(app.producer.sent) == 2)
    app.producer.ack_all()
    assert await flush == 1
    await publisher.forget_acknowledged()  # no batch comes: the idle timer deletes it
    assert state.store.db.execute(stored).fetchone()[0] == 0 and len(state.outbox.acked) == 0


@pytest.mark.timeout(30)
async def test_a_round_of_many_records_is_forgotten_by_number_not_left_for_every_read_to_pass_over(setup):
    state, app, _ = setup
    jobs: list[str] = []

    async def run_noting_the_set(fn, *args, **kwargs):
        jobs.append(f"{fn.__name__} with {len(state.outbox.acked)} waiting")
        return fn(*args, **kwargs)

    publisher = Publisher(state, app, run_noting_the_set, lambda: {"source-changes": [0]})
    with state.store.transaction():
        state.outbox.add_many([("out", b"k", f"r{i}".encode()) for i in range(FORGET_NOW)])
    flush = asyncio.create_task(publisher.publish())
    await _until(lambda: len(app.producer.sent) == FORGET_NOW)
    app.producer.ack_all()
    assert await flush == FORGET_NOW
    # The round's numbers go straight to the job: no read ever passed over thousands of them.
    assert "_forget_sent with 0 waiting" in jobs and len(state.outbox.acked) == 0
    assert state.store.db.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0


@pytest.mark.timeout(10)
async def test_after_a_transient_failure_later_records_of_its_key_wait_for_the_next_flush(tmp_path):
    from aiokafka.errors import KafkaTimeoutError

    from agents.stream.publisher import HeldBack

    class Flaky(SlowProducer):
        async def send(self, topic, key, value, partition, timestamp, headers):
            if value == b"v1-older":
                raise KafkaTimeoutError()
            return await super().send(topic, key, value, partition, timestamp, headers)

    state = LocalState.open(tmp_path / "f.duckdb")
    try:
        app = App()
        app.producer = Flaky()
        publisher = Publisher(state, app, inline, lambda: {})
        sending = asyncio.ensure_future(publisher._send_each(
            [("t", b"pk-1", b"v1-older"), ("t", b"pk-2", b"other"), ("t", b"pk-1", b"v2-newer")]))
        await _until(lambda: app.producer.sent)
        app.producer.ack_all()
        results = await sending
        assert app.producer.sent == [b"other"]  # the newer record of pk-1 did not overtake the older one
        assert isinstance(results[0], KafkaTimeoutError) and isinstance(results[2], HeldBack)
    finally:
        state.close()


@pytest.mark.timeout(10)
async def test_a_select_waits_for_its_own_records_and_not_for_those_queued_after_them(setup):
    state, app, publisher = setup
    with state.store.transaction():
        state.outbox.add_many([("plans", b"p1", b"the select's plan"), ("plan-dependencies", b"k1", b"its record")])
    mine = state.outbox.newest()
    waiting = asyncio.ensure_future(publisher.published(mine, 5.0))
    await _until(lambda: len(app.producer.sent) == 2)
    # A stream goes on queueing records while the select's are in flight.
    with state.store.transaction():
        state.outbox.add_many([("plan-invalidations", f"o{i}".encode(), b"later") for i in range(5)])
    publisher.kick()
    await asyncio.sleep(0.05)
    assert not waiting.done()  # not acknowledged yet
    for ack in app.producer.acks[:2]:
        ack.set_result(None)
    assert await waiting is True
    assert app.producer.acks[2:] == [] or not all(a.done() for a in app.producer.acks[2:])  # the rest still out
    assert publisher.acknowledged_through == mine
    app.producer.ack_all()
    await _until(lambda: publisher.acknowledged_through > mine)


@pytest.mark.timeout(10)
async def test_a_select_whose_record_fails_to_send_is_answered_after_the_bounded_wait(tmp_path):
    from aiokafka.errors import KafkaTimeoutError

    class Down(SlowProducer):
        async def send(self, topic, key, value, partition, timestamp, headers):
            raise KafkaTimeoutError()

    state = LocalState.open(tmp_path / "f.duckdb")
    try:
        app = App()
        app.producer = Down()
        publisher = Publisher(state, app, inline, lambda: {})
        with state.store.transaction():
            state.outbox.add_many([("plans", b"p1", b"v")])
        assert await publisher.published(state.outbox.newest(), 0.3) is False
        assert publisher.acknowledged_through == -1 and state.outbox.size() == 1  # still queued for the timer
    finally:
        state.close()


@pytest.mark.timeout(120)
async def test_a_compiled_select_is_answered_once_its_plan_s_records_are_on_the_broker(broker, tmp_path):
    async with launch(broker, tmp_path) as worker:
        loaded = await worker.load("atlas.jsonl")
        for i in range(3):
            answer = await worker.select(dict(ATLAS_REQUEST, query=f"published {i}"), loaded)
            assert answer["served_from"] == "compiled"
            # Read right after the answer: a worker killed now has left its successor the plan to judge.
            assert answer["plan_id"] in {r["plan_id"] for r in await worker.everything("plan-dependencies")}
            assert answer["plan_id"] in {r["plan_id"] for r in await worker.everything("plans")}
        compiles = (await worker.get("/healthz"))["select_compiles"]
        assert compiles["selects"] >= 3 and 1 <= compiles["jobs"] <= compiles["selects"]


@pytest.mark.timeout(20)
async def test_a_select_s_record_sent_beside_an_earlier_failure_is_known_acknowledged_after_the_retry(tmp_path):
    from aiokafka.errors import KafkaTimeoutError

    class FailsOnce(SlowProducer):
        failed = False

        async def send(self, topic, key, value, partition, timestamp, headers):
            if key == b"earlier" and not self.failed:
                self.failed = True
                raise KafkaTimeoutError()
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            self.sent.append(key)
            return done

    state = LocalState.open(tmp_path / "f.duckdb")
    try:
        app = App()
        app.producer = FailsOnce()
        publisher = Publisher(state, app, inline, lambda: {})
        with state.store.transaction():
            state.outbox.add_many([("out", b"earlier", b"another key's record, first")])
            state.outbox.add_many([("plan-dependencies", b"mine", b"the select's record")])
        mine = state.outbox.newest()
        waiting = asyncio.ensure_future(publisher.published(mine, 5.0))
        await _until(lambda: app.producer.sent == [b"mine"])
        assert not waiting.done()  # a record before it is not acknowledged yet
        await publisher.publish()  # the retry (the flush timer's)
        assert await asyncio.wait_for(waiting, 1.0) is True
    finally:
        state.close()
