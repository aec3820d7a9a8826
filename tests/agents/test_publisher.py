"""The publisher: the replica's batches are published in the background, every promoted record exactly once."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from aiokafka.errors import KafkaTimeoutError

from agents.stream.event_apply import EventApplier, RawMessage
from agents.plans.plan_writer import PlanWriter
from agents.stream.publisher import FORGET_NOW, Publisher
from agents.stream.writer import inline
from state.local_state import LocalState
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST, launch


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
